"""Run keys of on-disk datasets hold the folder's content fingerprint, recorded where the runs are, never
its path: the same keys with the data moved, absent, or on another host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from runners.datasets import dataset_fingerprint
from study.runspecs import plan_runs
from study.schema import parse_hypothesis, with_data_roots
from tests.datasets.conftest import DISK_HYPOTHESIS
from vitstudy_core.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]


def test_run_key_uses_content_not_path(roots, tmp_path, monkeypatch):
    hyp = parse_hypothesis(yaml.safe_load(DISK_HYPOTHESIS))
    monkeypatch.delenv("STUDY_TEST_DATA", raising=False)
    assert plan_runs(hyp)[0].dataset["fingerprint"] is None  # plans without the data present
    monkeypatch.setenv("STUDY_TEST_DATA", str(roots["ucmerced"][0]))
    key = plan_runs(hyp)[0].key
    copy = tmp_path / "elsewhere"
    shutil.copytree(roots["ucmerced"][0], copy)
    moved = with_data_roots(hyp, {"ucm": str(copy)})
    assert plan_runs(moved)[0].dataset["path"] == str(copy) and plan_runs(moved)[0].key == key
    next((copy / "Images" / "beach").iterdir()).unlink()
    assert plan_runs(moved)[0].key != key
    assert dataset_fingerprint({"path": str(tmp_path / "absent")}) is None
    with pytest.raises(StudyError, match="--data-root"):
        with_data_roots(hyp, {"nope": "/x"})


def test_run_key_does_not_depend_on_the_data_being_present(roots, tmp_path, monkeypatch):
    """The fingerprint is recorded in the data folder when runs are planned for training and reused."""
    hyp = parse_hypothesis(yaml.safe_load(DISK_HYPOTHESIS))
    data = tmp_path / "ucm"
    shutil.copytree(roots["ucmerced"][0], data)
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    (trained,) = plan_runs(hyp, tmp_path / "out" / "data", record=True)
    assert trained.dataset["fingerprint"] == dataset_fingerprint(trained.dataset)
    monkeypatch.delenv("STUDY_TEST_DATA")
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == trained.key  # variable unset
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    shutil.rmtree(data)
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == trained.key  # folder gone
    assert plan_runs(hyp, tmp_path / "elsewhere")[0].dataset["fingerprint"] is None  # nothing recorded
    # data present again but changed: `run` keys it by its content and records the change
    shutil.copytree(roots["ucmerced"][0], data)
    next((data / "Images" / "beach").iterdir()).unlink()
    (changed,) = plan_runs(hyp, tmp_path / "out" / "data", record=True)
    assert changed.key != trained.key
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == changed.key
    book = json.loads((tmp_path / "out" / "data" / "fingerprints.json").read_text())
    assert book["ucmerced:ucm"]["history"] == [trained.dataset["fingerprint"]]


def test_table_finds_runs_on_a_host_without_the_data(roots, tmp_path, monkeypatch, capsys):
    """Train on a fixture folder, delete the folder: `table` still finds the runs by their recorded keys."""
    from study.cli import main

    data = tmp_path / "in100"
    shutil.copytree(roots["imagefolder"][0], data)
    text = DISK_HYPOTHESIS.replace(
        '{name: ucm, kind: ucmerced, path: "${STUDY_TEST_DATA}", image_size: 8, test_fraction: 0.5}',
        '{name: ucm, kind: imagefolder, path: "${STUDY_TEST_DATA}", image_size: 8}',
    )
    hyp = tmp_path / "h.yaml"
    hyp.write_text(text)
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
    shutil.rmtree(data)
    monkeypatch.delenv("STUDY_TEST_DATA")
    capsys.readouterr()
    assert main(["table", str(hyp), "--out", str(out)]) == 0
    assert "1 run(s)" in capsys.readouterr().out
    (tmp_path / "other").mkdir()  # a folder with nothing recorded in it (a missing one is refused first)
    assert main(["table", str(hyp), "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fingerprint" in err and "ucm" in err


@pytest.mark.parametrize("path", sorted((ROOT / "hypotheses" / "paper").glob("*.yaml")), ids=lambda p: p.name)
def test_paper_hypotheses_validate_and_plan_without_data(path, monkeypatch):
    from study.schema import load_hypothesis

    for var in ("CIFAR100_DIR", "TINY_IMAGENET_DIR", "UCMERCED_DIR", "IMAGENET100_DIR", "TGO_I_LOG"):
        monkeypatch.delenv(var, raising=False)
    hyp = load_hypothesis(path)
    runs = plan_runs(hyp)
    if hyp.design.source is not None:  # an imported log: one run per seed, fingerprinted once it is there
        assert len(runs) == len(hyp.design.seeds) and all(r.imported["fingerprint"] is None for r in runs)
        return
    trained = sum(1 for c in hyp.design.cells() if not c.untrained)  # a factorial file: its trained cells
    assert len(runs) == trained * len(hyp.design.datasets) * len(hyp.design.seeds) >= 5
    assert all(r.model["name"] == "vit_small_patch16_224" and r.dataset["image_size"] == 224 for r in runs)
    kinds = {
        r.objective if isinstance(r.objective, str) else r.objective["kind"] for r in runs
    }  # plain: a str
    assert kinds <= {"supervised", "dino"}
