"""A damaged run folder and a copied output folder (issue 29, ``doctor``): ``run`` restores a truncated
run from the tracking store's intact copy (or retrains that run alone), and refuses a store copied from
another folder rather than write into the original's artifacts. The tiny study (seconds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from study.cli import main

ARGS = ["--workers", "1", "--no-report"]


def _run(tiny_yaml: Path, out: Path, *extra: str) -> int:
    return main(["run", str(tiny_yaml), "--out", str(out), *ARGS, *extra])


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _claims(out: Path) -> list:
    return json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())["claims"]


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: its modification time (ns) and bytes."""
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def _own_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.mark.parametrize("name", ["spectra.npz", "scalars.json", "result.json"])
def test_triage_does_not_trust_a_damaged_finished_folder(tmp_path, name):
    """Triage reads each ended folder in full: a damaged one goes to the store's copy, else to training."""
    from types import SimpleNamespace

    from study.pipeline.triage import clear_for_training, plan, triage
    from study.schema import load_hypothesis
    from tests.conftest import write_runs
    from vitstudy_core.runfolder import RunFolder

    hyp_path, out = write_runs(tmp_path)
    specs, runs = plan(load_hypothesis(hyp_path)), out / "runs"
    bad = runs / specs[1].key
    _truncate(bad / name)
    assert RunFolder(bad).damage().startswith(name) and RunFolder(runs / specs[0].key).damage() is None
    stored = {specs[1].key: SimpleNamespace(info=SimpleNamespace(run_id="abc"))}
    tri = triage(specs, runs, stored)
    assert list(tri.damaged) == [specs[1].key] and list(tri.stored) == [specs[1].key]
    assert tri.finished == [specs[0].key, specs[2].key] and tri.todo == []
    tri = triage(specs, runs, {})
    assert tri.todo == [specs[1]] and list(tri.damaged) == [specs[1].key]
    clear_for_training(tri.todo, runs)  # removed, so it trains anew rather than "resuming" a finished run
    assert not bad.exists() and (runs / specs[0].key).is_dir()


def test_run_restores_a_damaged_run_from_the_store(tiny_yaml, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(tiny_yaml, out) == 0
    key = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())[0]
    spectra, result = out / "runs" / key / "spectra.npz", out / "runs" / key / "result.json"
    intact, finished, claims = spectra.read_bytes(), result.read_bytes(), _claims(out)
    _truncate(spectra)
    capsys.readouterr()
    assert _run(tiny_yaml, out) == 0
    said = capsys.readouterr().out
    assert spectra.read_bytes() == intact, said  # bitwise the store's copy
    assert result.read_bytes() == finished  # the same finished_at: not retrained
    assert "3 reused, 0 to train" in said and "restored from MLflow run" in said, said
    assert _claims(out) == claims


def test_without_a_store_only_the_damaged_run_retrains(tiny_yaml, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(tiny_yaml, out, "--no-mlflow") == 0
    keys = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    results = {k: (out / "runs" / k / "result.json").read_bytes() for k in keys}
    claims = _claims(out)
    (out / "runs" / keys[1] / "scalars.json").write_text('{"values": {"0/block_01/all/x": ')
    capsys.readouterr()
    assert _run(tiny_yaml, out, "--no-mlflow") == 0
    said = capsys.readouterr().out
    assert "2 reused, 1 to train" in said and "retraining this run only" in said, said
    assert [line for line in said.splitlines() if "damaged run folder" in line][0].count(keys[1]) == 1
    for k in keys:
        again = (out / "runs" / k / "result.json").read_bytes()
        assert (again == results[k]) == (k != keys[1]), k  # the others untouched, the damaged one anew
    assert _claims(out) == claims  # CPU training is deterministic: the same verdicts


def _copied(tiny_yaml, tmp_path):
    """A study run into ``a``, copied to ``b``; returns both and a snapshot of ``a``'s files."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run(tiny_yaml, a) == 0
    shutil.copytree(a, b)
    return a, b, _snapshot(a)


def test_a_copied_folder_does_not_write_into_the_original(tiny_yaml, tmp_path, capsys):
    a, b, before = _copied(tiny_yaml, tmp_path)
    capsys.readouterr()
    assert _run(tiny_yaml, b, "--force") == 2  # refused before anything trains or is logged
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "copied or moved" in err and str(a / "mlartifacts") in err, err
    # another study, new to the copy, is refused the same way (it would reuse the copied runs, whose
    # artifacts load from the original: issue 39)
    other = tmp_path / "other.yaml"
    other.write_text(tiny_yaml.read_text().replace("name: tiny", "name: tiny_other", 1))
    assert _run(other, b) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "copied or moved" in err and "'tiny'" in err, err
    main(["doctor", "--out", str(b)])
    assert "moved_store" in capsys.readouterr().out  # doctor names it too (report only)
    assert _snapshot(a) == before  # not one file of the original changed


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_a_copied_folder_with_a_fresh_store_reuses_its_runs(tiny_yaml, tmp_path):
    # what the refusal says to do: a fresh store for the copy; its runs are reused and logged into it. In a
    # new process, as a user would: MLflow caches this process's engine on the moved-aside file
    from tests.studyproc import run, study_cmd

    a, b, before = _copied(tiny_yaml, tmp_path)
    (b / "mlflow.db").rename(tmp_path / "mlflow.db.from-a")
    shutil.rmtree(b / "mlartifacts")
    done = run(study_cmd(tiny_yaml, b))
    assert done.returncode == 0 and "3 reused, 0 to train" in done.stdout, done.stderr
    assert _snapshot(a) == before  # not one file of the original changed
    assert list((b / "mlartifacts").rglob("spectra.npz")), "the copy's store holds its own artifacts"


def test_mlflow_resolves_a_relative_artifact_location(tmp_path, monkeypatch):
    """Why a copied store is refused rather than made relative: MLflow's sqlite store turns a relative
    ``artifact_location`` into an absolute one (against the working directory) when it creates the
    experiment, so no location written today moves with the folder."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id = client.create_experiment("rel", artifact_location="mlartifacts/rel")
    loc = client.get_experiment(exp_id).artifact_location
    assert loc != "mlartifacts/rel" and str(tmp_path / "mlartifacts" / "rel") in loc, loc
