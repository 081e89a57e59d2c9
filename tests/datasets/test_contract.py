"""One contract over every registered dataset kind (as the claim kinds have one over every kind).

A kind passes when its settings model carries its ``kind`` and a ``name``, its example validates through
the real hypothesis schema (and an unknown key in it is one line naming the field), and its loader reads
it: an on-disk layout from the tiny fixture its own test writes in the publisher's format
(``tests/datasets/conftest.py`` says how), a missing folder being one line; a generated kind from its
example. A kind without images says so in one line. Every kind with images trains a tiny ViT.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from runners.datasets import (
    DATASETS,
    DEFAULT_KIND,
    check_dataset_folder,
    load_split,
    num_classes,
)
from runners.objectives import OBJECTIVES
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.datasets.conftest import DISK_HYPOTHESIS, N_CLASSES, PER_CLASS, disk_spec
from vitstudy.testing import built_in, parametrize_with_checks
from vitstudy.testing.runs import check_dataset_reads
from vitstudy_core.errors import StudyError

KINDS = built_in("datasets")  # an installed plug-in's layouts are its package's to give fixtures and test
WITH_IMAGES = [k for k in KINDS if DATASETS[k].load is not None]
ON_DISK = [k for k in KINDS if DATASETS[k].layout is not None]


def _doc(entry: dict) -> dict:
    """A hypothesis with one dataset ``entry`` (a kind without images: its runs come from a table)."""
    design = {"datasets": [entry], "seeds": [0, 1, 2], "model": {"depth": 3}}
    if DATASETS[entry.get("kind", DEFAULT_KIND)].load is None:
        design["source"] = {"kind": "table", "path": "log_{seed}.csv"}
    regions = {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]}
    claim = {"name": "u", "kind": "u_shape", "metric": "eed_pct", "subset": {"dataset": entry["name"]}}
    return {"name": "t", "design": design, "claims": [{**claim, "regions": regions}]}


def _spec(kind: str, roots) -> dict:
    """The spec dict the planner hands a loader: the example (on disk: the fixture, 8 px), validated."""
    entry = DATASETS[kind]
    raw = disk_spec(kind, roots) if kind in ON_DISK else entry.example
    return entry.model.model_validate(raw).model_dump()


@parametrize_with_checks("datasets")
def test_dataset_contract(name, check):
    """The shipped checks (vitstudy.testing.runs): the model, the example validated through the schema."""
    check(name)


@pytest.mark.parametrize("kind", WITH_IMAGES)
def test_loader_reads_its_data(kind, roots, tmp_path):
    spec = _spec(kind, roots)
    size = spec["image_size"]
    check_dataset_reads(kind, spec, tmp_path / "shipped")  # the shipped check a plug-in's package calls
    xtr, ytr = load_split(spec, "train", tmp_path)
    xte, yte = load_split(spec, "test", tmp_path)
    for x, y in ((xtr, ytr), (xte, yte)):
        assert x.shape[1:] == (size, size, 3) and x.dtype == np.uint8 and y.dtype == np.int64
        assert len(x) == len(y) and 0 <= y.min() and y.max() < num_classes(spec)
    probe, _ = load_split(spec, "probe", tmp_path, 8, 5)
    assert probe.shape == (8, size, size, 3)
    np.testing.assert_array_equal(load_split(spec, "probe", tmp_path, 8, 5)[0], probe)  # cached
    np.testing.assert_array_equal(load_split(spec, "probe", tmp_path / "fresh", 8, 5)[0], probe)  # seeded
    if kind in ON_DISK:  # the fixture's convention: N_CLASSES classes, PER_CLASS images a split each
        assert set(ytr.tolist()) == set(yte.tolist()) == set(range(N_CLASSES))
        assert len(xtr) + len(xte) == 2 * N_CLASSES * PER_CLASS
        # labels survive decoding and resizing: each class's dominant channel is its class index mod 3
        for x, y in ((xtr, ytr), (xte, yte)):
            assert (x.reshape(len(x), -1, 3).mean(1).argmax(1) == y % 3).all()
        assert all(any((p == t).all() for t in xte) for p in probe)  # drawn from the held-out split


@pytest.mark.parametrize("kind", ON_DISK)
def test_missing_folder_is_one_line_error(kind, roots, tmp_path):
    spec = disk_spec(kind, roots, tmp_path / "nowhere")
    for call in (lambda: load_split(spec, "train", tmp_path), lambda: check_dataset_folder(spec)):
        with pytest.raises(StudyError) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "folder not found" in msg
        assert f"expected {kind} layout: {DATASETS[kind].layout}" in msg


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in WITH_IMAGES])
def test_a_kind_without_images_says_so(kind, tmp_path):
    spec = DATASETS[kind].model.model_validate(DATASETS[kind].example).model_dump()
    check_dataset_folder(spec)  # nothing to check: its runs are imported
    for call in (lambda: load_split(spec, "train", tmp_path), lambda: num_classes(spec)):
        with pytest.raises(StudyError, match=f"dataset kind {kind} has no images") as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("objective", OBJECTIVES.names())
@pytest.mark.parametrize("kind", WITH_IMAGES)
def test_tiny_training_on_each_kind(kind, objective, roots, tmp_path, monkeypatch):
    """A depth-2 ViT trains 2 steps with each objective on each kind and yields spectra."""
    from runners.train import train_run

    data = yaml.safe_load(DISK_HYPOTHESIS)
    if kind in ON_DISK:
        monkeypatch.setenv("STUDY_TEST_DATA", str(roots[kind][0]))
        entry = {**disk_spec(kind, roots), "name": "ds", "path": "${STUDY_TEST_DATA}"}
    else:
        entry = {**DATASETS[kind].example, "name": "ds", "image_size": 8}
    data["design"]["datasets"] = [entry]
    data["claims"][0]["subset"]["dataset"] = "ds"
    if objective == "dino":
        # at 8 px a crop holds a 4 px patch from a quarter of the area on (validate refuses smaller ones)
        data["design"]["objective"] = {"kind": "dino", "preset": "dino_small", "out_dim": 32, "hidden_dim": 16,
                                       "bottleneck_dim": 8, "n_local_crops": 2, "local_crop_scale": [0.25, 0.5],
                                       "global_crop_scale": [0.5, 1.0]}  # fmt: skip
    spec = plan_runs(parse_hypothesis(data))[0].model_dump()
    result = train_run(spec, tmp_path / "run", tmp_path / "data")
    assert result["status"] == "finished", result.get("error")
    assert np.isfinite(result["history"][0]["loss"])
    assert ("knn_acc" if objective == "dino" else "test_acc") in result["history"][0]
    with np.load(tmp_path / "run" / "spectra.npz") as f:
        assert "1/block_02/all" in f.files and (f["1/block_02/all"] >= 0).all()
