"""One contract over every registered run source (as ``tests/plugins/test_kind_contract.py`` has one over every
claim kind).

A source passes when it is registered under its own name with a settings model whose ``kind`` is that name
(or none, for the source of designs without a ``source`` section), its example design validates through the
real hypothesis schema and selects it, ``check`` refuses a missing path with one line naming it, and
``fill`` on a tiny fixture leaves a finished run folder as ``vitstudy_core.runfolder`` defines it. A new
source of this repository adds its fixture to :data:`FIXTURES` (the test fails until it does); an installed
plug-in's source is tested by its own package (:func:`vitstudy.testing.built_in`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runners.sources import DEFAULT_SOURCE, SOURCES
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from study.schema._unions import SOURCE_TAGS
from vitstudy.testing import built_in, parametrize_with_checks
from vitstudy.testing.runs import (  # the design and claim the shipped checks use
    CLAIM,
    DESIGN,
    check_source_fills,
)
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import layer_names


def _doc(**design) -> dict:
    kind = (design.get("source") or {}).get("kind")
    claim = getattr(SOURCES[kind], "example_claim", None) if kind in SOURCES else None
    claim = claim or CLAIM  # a source's example may need its own claim (published models: unit: images)
    return {"name": "contract", "design": {**copy.deepcopy(DESIGN), **design}, "claims": [claim]}


def _run(doc: dict) -> dict:
    (spec,) = plan_runs(parse_hypothesis(doc, "contract.yaml"))
    return spec.model_dump()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny run filled by the training source (its ``checkpoints/`` feed the checkpoints fixture)."""
    root = tmp_path_factory.mktemp("trained")
    run = _run(_doc(checkpoints=[0, 1]))
    result = SOURCES["train"].fill(run, root / "run", root / "data")
    assert result["status"] == "finished", result.get("error")
    return root / "run"


def _train_fixture(tmp_path: Path, trained: Path) -> dict:
    return _doc(checkpoints=[0, 1])


def _checkpoints_fixture(tmp_path: Path, trained: Path) -> dict:
    return _doc(checkpoints=[0, 1], source={"kind": "checkpoints", "path": str(trained / "checkpoints")})


def _table_fixture(tmp_path: Path, trained: Path) -> dict:
    lines = [
        {
            "epoch": ep,
            "layers": {layer: {"effective_rank": 1.0 + ep + i} for i, layer in enumerate(layer_names(3))},
        }
        for ep in (1, 2)
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return _doc(
        datasets=[{"name": "objects", "kind": "external"}], source={"kind": "table", "path": str(log)}
    )


def _pretrained_fixture(tmp_path: Path, trained: Path) -> dict:
    from tests.zoo_cache import DESIGN_MODEL, MODEL_ARGS, checkpoint_file

    checkpoint_file(tmp_path / "w" / "a.safetensors", 0)
    args = {k: v for k, v in MODEL_ARGS.items() if k != "num_classes"}
    entry = {"timm": "vit_tiny_patch16_224", "file": "a.safetensors", "model_args": args}
    return _doc(
        datasets=[{"name": "objects", "n_train": 32, "n_test": 256, "image_size": 8}],
        model=DESIGN_MODEL,
        probe={"size": 256, "blocks": 8},
        source={"kind": "pretrained", "path": str(tmp_path / "w"), "models": {"a": entry}},
    )


BUILT_IN = built_in("sources")  # an installed plug-in's sources are its package's to fill and test
FIXTURES: dict[str, Callable[[Path, Path], dict]] = {
    "pretrained": _pretrained_fixture,
    "train": _train_fixture,
    "checkpoints": _checkpoints_fixture,
    "table": _table_fixture,
}


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_source_has_a_fixture(name):
    assert name in FIXTURES, f"source {name!r}: add the fixture that fills its example to FIXTURES"


@parametrize_with_checks("sources")
def test_source_contract(name, check):
    """The shipped checks (vitstudy.testing.runs): the entry and its example validated through the schema."""
    check(name)


@pytest.mark.parametrize("name", BUILT_IN)
def test_check_refuses_a_missing_path_with_one_line(name, tmp_path):
    entry, missing = SOURCES.get(name), tmp_path / "nowhere"
    doc = _doc(**copy.deepcopy(entry.example))
    if entry.settings is None:  # training reads a dataset folder
        doc["design"]["datasets"] = [{"name": "objects", "kind": "imagefolder", "path": str(missing)}]
    else:  # an imported source reads its files: the example's path, moved under a folder that is not there
        doc["design"]["source"]["path"] = str(missing) + doc["design"]["source"]["path"]
    with pytest.raises(StudyError) as err:
        entry.check(_run(doc))
    assert "\n" not in str(err.value) and str(missing) in str(err.value)


@pytest.mark.parametrize("name", BUILT_IN)
def test_fill_leaves_a_finished_run_folder(name, tmp_path, trained):
    run = _run(FIXTURES[name](tmp_path, trained))
    assert run["source"] == name
    result = check_source_fills(name, run, tmp_path / "run", tmp_path / "data")  # the shipped check
    assert "n_tokens" in result
    if name != DEFAULT_SOURCE:
        assert (
            result["source"]["kind"] == name
            and result["source"]["fingerprint"] == run["imported"]["fingerprint"]
        )


@pytest.mark.parametrize(
    "design,expected",
    [
        (
            {"checkpoints": [0, 9]},
            "design.checkpoints: checkpoint epoch 9 outside 0..1 (0 = initialisation, 1 = training.epochs)",
        ),
        (
            {"datasets": [{"name": "objects", "kind": "external"}]},
            "design.datasets: dataset 'objects' (kind external) needs a "
            + " or ".join(n for n, s in SOURCES.items() if s.accepts_dataset("external"))  # table, plug-ins'
            + " source",
        ),
        (
            {"checkpoints": [1], "source": {"kind": "checkpoints", "path": "/c"}, "seeds": [0, 1]},
            "design.source.path: expected {seed} in the path (one folder per seed), got '/c'",
        ),
        (
            {
                "checkpoints": [1],
                "source": {"kind": "checkpoints", "path": "/c/{seed}"},
                "datasets": [{"name": "objects"}, {"name": "b"}],
            },
            "design.source.path: expected {dataset} in the path (several datasets)",
        ),
        (
            {"checkpoints": [1], "source": {"kind": "checkpoints", "paths": {0: "/a"}}, "seeds": [0, 1]},
            "design.source.paths: expected one path per seed [0, 1], got seeds [0]",
        ),
        (
            {"source": {"kind": "checkpoints", "path": "/c"}},
            "design.checkpoints: required with a checkpoints source (the epochs to import)",
        ),
        (
            {"source": {"kind": "table", "path": "/c", "layers": {"x": "block_99/cls"}}},
            "design.source.layers.x: unknown layer 'block_99'; expected one of "
            "['patch_embed', 'pos_embed', 'block_01', 'block_02', 'block_03', 'norm']",
        ),
        (
            {"source": {"kind": "nope", "path": "/c"}},
            "design.source.kind: unknown source kind 'nope'; expected one of "
            + ", ".join(tag.removesuffix("_source") for tag in SOURCE_TAGS),  # every imported source's kind
        ),
    ],
)
def test_design_checks_keep_their_words(design, expected):
    """The plug-ins' design checks give the messages the schema gave when it held them (same words)."""
    with pytest.raises(StudyError) as err:
        parse_hypothesis(_doc(**design), "f.yaml")
    assert str(err.value) == f"f.yaml: {expected}"
