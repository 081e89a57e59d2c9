"""A rerun of a finished study (``study.rerun``): unchanged, it reads its outputs back and touches neither
the study folder nor MLflow; a changed claim, changed code or a changed run recomputes the verdicts."""

from __future__ import annotations

import json
import shutil

import pytest

import study.rerun as rerun
from study.cli import main
from tests.conftest import TINY_HYPOTHESIS

UNCHANGED = "unchanged since the last run"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerun")
    hyp = root / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    out = root / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 0
    return hyp, out


def _stats(folder) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.iterdir()) if p.is_file()}


def _mlflow_runs(out) -> int:
    import sqlite3

    with sqlite3.connect(out / "mlflow.db") as db:
        return db.execute("select count(*) from runs").fetchone()[0]


@pytest.fixture
def copied(finished, tmp_path, capsys):
    """The finished study's runs in a fresh output folder (file times kept), run once without MLflow:
    stamped, so the next run of the same command is an unchanged rerun."""
    hyp, out = finished
    mine = tmp_path / "out"
    for sub in ("runs", "data"):
        shutil.copytree(out / sub, mine / sub)
    path = tmp_path / "tiny.yaml"
    path.write_text(hyp.read_text())
    argv = ["run", str(path), "--out", str(mine), "--workers", "1", "--no-mlflow"]
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out
    return path, mine, argv


def test_an_unchanged_rerun_reads_its_outputs_and_touches_nothing(finished, capsys):
    hyp, out = finished
    study = out / "studies" / "tiny"
    before, runs, verdicts = (
        _stats(study),
        _mlflow_runs(out),
        json.loads((study / "verdicts.json").read_text()),
    )
    capsys.readouterr()
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert UNCHANGED in printed and "3 reused, 0 to train" in printed
    assert verdicts["claims"][0]["verdict"] in printed and "report:" in printed
    assert _stats(study) == before  # nothing rewritten: not the verdicts, not the report
    assert _mlflow_runs(out) == runs  # no new parent run in the store


def test_a_changed_claim_recomputes_the_verdicts(copied, capsys):
    path, out, argv = copied
    path.write_text(TINY_HYPOTHESIS.replace("  - name: u\n", "  - name: u renamed\n"))
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert [c["name"] for c in verdicts["claims"]] == ["u renamed"]
    assert main(argv) == 0  # and now, unchanged again
    assert UNCHANGED in capsys.readouterr().out


def test_changed_analysis_code_recomputes_the_verdicts(copied, capsys, monkeypatch):
    path, out, argv = copied
    verdicts = out / "studies" / "tiny" / "verdicts.json"
    written = verdicts.stat().st_mtime_ns
    monkeypatch.setattr(rerun, "code_digest", lambda: "the analysis code of another version")
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out
    assert verdicts.stat().st_mtime_ns != written


def test_a_changed_run_folder_or_output_recomputes(copied, capsys):
    path, out, argv = copied
    run = next((out / "runs").iterdir())
    result = run / "result.json"
    result.write_text(result.read_text())  # same content, a new modification time
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out
    (out / "studies" / "tiny" / "report.md").unlink()
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out and (out / "studies" / "tiny" / "report.md").is_file()


def test_a_rerun_that_asks_for_more_than_was_recorded_takes_the_full_path(copied, capsys):
    path, out, argv = copied
    stamp = json.loads((out / "studies" / "tiny" / rerun.STAMP).read_text())
    assert stamp["track"] is False and stamp["report"] is True
    assert not rerun.unchanged(
        out / "studies" / "tiny", stamp["digest"], rerun.Asked(True, True, False, "python -m study run")
    )
    assert rerun.unchanged(out / "studies" / "tiny", stamp["digest"], rerun.Asked(False, False, False, None))
    assert main([*argv, "--force"]) == 0  # --force retrains: never an unchanged rerun
    assert UNCHANGED not in capsys.readouterr().out


def test_the_code_digest_sees_any_change_to_an_analysis_source(tmp_path, monkeypatch):
    copy = tmp_path / "analysis"
    shutil.copytree(rerun._package_dir("analysis"), copy)
    real = rerun._package_dir
    monkeypatch.setattr(rerun, "_package_dir", lambda name: copy if name == "analysis" else real(name))
    first = rerun.code_digest()
    assert rerun.code_digest() == first
    source = copy / "verdicts.py"
    source.write_text(source.read_text() + "\n# a comment is a change\n")
    assert rerun.code_digest() != first


def test_a_rerun_that_recomputes_plans_once_and_resolves_the_families_once(copied, capsys, monkeypatch):
    """One plan per study (the rerun check's is the first look's) and one families() per look, handed
    to the verdicts (the values' single place: study.pipeline.orchestrate)."""
    import analysis.verdicts as verdicts
    import study.pipeline.orchestrate as orchestrate
    import study.pipeline.triage as triage

    path, out, argv = copied
    planned, resolved = [], []
    plan_runs, families = triage.plan_runs, verdicts.families
    monkeypatch.setattr(triage, "plan_runs", lambda *a, **k: planned.append(1) or plan_runs(*a, **k))
    monkeypatch.setattr(orchestrate, "families", lambda *a, **k: resolved.append(1) or families(*a, **k))
    monkeypatch.setattr(verdicts, "families", lambda *a, **k: pytest.fail("families resolved again"))
    path.write_text(TINY_HYPOTHESIS.replace("  - name: u\n", "  - name: u once\n"))
    assert main(argv) == 0
    assert UNCHANGED not in capsys.readouterr().out
    assert (len(planned), len(resolved)) == (1, 1)
