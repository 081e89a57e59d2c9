"""The shipped contract suite tests behaviour: each broken part the plug-in issue met is caught by a check
(or refused at registration) with a line saying what the part did and what was expected."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Literal

import numpy as np
import pytest

import vitstudy_core.plugins as plugins
from runners.datasets import DATASETS
from runners.objectives.supervised import SupervisedTrainer
from runners.sources import SOURCES
from vitstudy.testing import checks
from vitstudy.testing.objectives import check_objective_learns
from vitstudy.testing.runs import (
    CLAIM,
    DESIGN,
    check_dataset_loads,
    check_dataset_model,
    check_dataset_split,
    check_source_fills,
)
from vitstudy_core.plugins import Broken
from vitstudy_core.settings import Strict


class FrozenTrainer(SupervisedTrainer):
    """The supervised trainer with its learning rate forced to 0 at every step."""

    def __init__(self, setup, device):
        import torch

        super().__init__(setup, device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: 0.0)


@pytest.mark.slow  # two tiny trainings (~10 s each on 2 busy cores)
def test_an_objective_that_never_steps_is_caught(monkeypatch):
    from runners.objectives import OBJECTIVES

    check_objective_learns("supervised")  # the built-in learns ...
    monkeypatch.setattr(OBJECTIVES["supervised"], "trainer", f"{__name__}:FrozenTrainer")
    with pytest.raises(AssertionError, match="supervised: training left every weight of the measured model"):
        check_objective_learns("supervised")  # ... the same with a learning rate of 0 does not


SPEC = {"image_size": 8, "n_classes": 4}


@pytest.mark.parametrize(
    ("images", "labels", "expected"),
    [
        (
            np.zeros((5, 3, 8, 8), np.uint8),
            np.zeros(5, np.int64),
            r"shape \(5, 3, 8, 8\); expected \(N, 8, 8, 3\)",
        ),
        (np.zeros((5, 8, 8, 3), np.float32), np.zeros(5, np.int64), "images are float32; expected uint8"),
        (np.zeros((5, 8, 8, 3), np.uint8), np.arange(5, dtype=np.int64), r"labels span 0..4; expected 0..3"),
        (np.zeros((5, 8, 8, 3), np.uint8), np.zeros(5, np.int32), "labels are int32; expected int64"),
        (np.zeros((5, 16, 16, 3), np.uint8), np.zeros(5, np.int64), r"expected \(N, 8, 8, 3\)"),
    ],
)
def test_a_loaders_bad_split_is_caught(images, labels, expected):
    check_dataset_split("procedural", SPEC, np.zeros((5, 8, 8, 3), np.uint8), np.zeros(5, np.int64))
    with pytest.raises(AssertionError, match=expected):
        check_dataset_split("procedural", SPEC, images, labels)


def test_the_dataset_check_calls_the_loader(monkeypatch):
    import runners.datasets as datasets

    check_dataset_loads("procedural")
    real = datasets.load_split

    def channel_first(spec, split, cache_dir, *probe):
        x, y = real(spec, split, cache_dir, *probe)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y

    monkeypatch.setattr(datasets, "load_split", channel_first)
    with pytest.raises(AssertionError, match=r"procedural: the loader's images have shape \(\d+, 3, 8, 8\)"):
        check_dataset_loads("procedural")


def test_a_dataset_model_without_image_size_is_refused_at_registration():
    from runners.datasets.base import DatasetSettings

    class NoSize(DatasetSettings):  # the base of a kind without images: no image_size, n_train, n_test
        kind: Literal["no_size"] = "no_size"

    entry = dataclasses.replace(
        DATASETS["procedural"], name="no_size", model=NoSize, example={"name": "x", "kind": "no_size"}
    )
    line = (
        "dataset kind 'no_size': a kind with images (a loader) needs a model subclassing "
        "runners.datasets.base.ImageDatasetSettings (it declares image_size, n_train and n_test)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
        DATASETS.register("no_size", entry)
    assert "no_size" not in DATASETS


def test_a_dataset_model_outside_the_documented_base_is_refused_at_registration():
    class Loose(Strict):  # every field the core reads, but not the documented base
        name: str
        kind: Literal["loose"] = "loose"
        image_size: int = 8

    entry = dataclasses.replace(
        DATASETS["procedural"], name="loose", model=Loose, example={"name": "x", "kind": "loose"}
    )
    with pytest.raises(ValueError, match=r"^dataset kind 'loose': its model must subclass runners\.datasets"):
        DATASETS.register("loose", entry)
    assert "loose" not in DATASETS


def test_the_dataset_contract_names_the_base_class_a_model_lacks(monkeypatch):
    from runners.datasets.base import DatasetSettings

    class NoSize(DatasetSettings):
        kind: Literal["procedural"] = "procedural"

    # past the registry's check (as a part registered before it existed would be): the contract says it too
    monkeypatch.setitem(
        DATASETS._entries, "procedural", dataclasses.replace(DATASETS["procedural"], model=NoSize)
    )
    with pytest.raises(
        AssertionError,
        match="procedural: its settings model NoSize does not subclass "
        "runners.datasets.base.ImageDatasetSettings",
    ):
        check_dataset_model("procedural")


def test_a_source_whose_fill_writes_nothing_is_caught(tmp_path, monkeypatch):
    from study.runspecs import plan_runs
    from study.schema import parse_hypothesis

    doc = {"name": "c", "design": {**copy.deepcopy(DESIGN), "checkpoints": [0, 1]}, "claims": [CLAIM]}
    (run,) = [r.model_dump() for r in plan_runs(parse_hypothesis(doc))]
    # on the registered instance: tests that plant a source (tests/planted.py) leave an instance attribute
    # behind once monkeypatch restores it, which a patch of the class would not reach
    monkeypatch.setattr(SOURCES["train"], "fill", lambda *a, **k: {"status": "finished"})
    with pytest.raises(
        AssertionError, match="train: fill returned finished but .* is not a finished run folder"
    ):
        check_source_fills("train", run, tmp_path / "run", tmp_path / "data")


def test_a_kind_with_a_wrong_kind_literal_is_refused_at_registration():
    from analysis.kinds import KINDS, register_kind

    # a name no installed plug-in takes (docs/plugins.md's example registers "higher")
    entry = dataclasses.replace(KINDS["compare"], name="a_tests_kind", calibration={})
    with pytest.raises(
        ValueError, match=r"^claim kind 'a_tests_kind': its model needs kind: Literal\['a_tests_kind'\]"
    ):
        register_kind(entry)
    assert "a_tests_kind" not in KINDS


def test_a_part_that_failed_to_load_says_so_not_key_error(monkeypatch):
    line = "ModuleNotFoundError: No module named 'gone_pkg'"
    monkeypatch.setattr(plugins, "BROKEN", [Broken("vitstudy.metrics", "gone", "gone-dist 0.1", line)])
    first = checks("metrics")[0]
    with pytest.raises(AssertionError) as err:
        first("gone")
    assert str(err.value) == (
        "metrics 'gone' is not registered: vitstudy: plug-in 'gone' (vitstudy.metrics) of distribution "
        f"gone-dist 0.1 not loaded: {line}"
    )
    monkeypatch.setattr(plugins, "BROKEN", [])
    with pytest.raises(AssertionError, match=r"^metrics 'gone' is not registered; registered: \["):
        first("gone")
