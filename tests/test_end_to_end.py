"""The whole path on a tiny study: plan -> train -> spectra -> table -> test -> verdict -> files + MLflow."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from study.cli import main
from study.runspecs import plan_runs
from study.schema import load_hypothesis


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    from tests.conftest import TINY_HYPOTHESIS

    root = tmp_path_factory.mktemp("e2e")
    hyp = root / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    out = root / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 0
    return hyp, out


def test_outputs_written(finished_study):
    hyp, out = finished_study
    study = out / "studies" / "tiny"
    verdicts = json.loads((study / "verdicts.json").read_text())
    assert len(verdicts["claims"]) == 1
    claim = verdicts["claims"][0]
    assert claim["verdict"] in {"ACCEPTED", "REJECTED", "INCONCLUSIVE"}
    assert claim["n_seeds"] == 3 and claim["seeds_used"] == [0, 1, 2]
    table = pd.read_parquet(study / "table.parquet")
    assert set(table.seed) == {0, 1, 2} and set(table.epoch) == {0, 2}
    assert set(table.layer) == {"patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"}
    assert set(table.token_set) == {"all", "cls", "patch"}
    eed = table[(table.metric == "eed_pct")].value
    assert eed.between(0, 100).all() and eed.notna().all()
    # every run of the plan has a finished result and its spectra on disk
    for spec in plan_runs(load_hypothesis(hyp)):
        result = json.loads((out / "runs" / spec.key / "result.json").read_text())
        assert result["status"] == "finished" and len(result["history"]) == 2
        assert set(result["measure_s"]) == {
            "0",
            "2",
        }  # each checkpoint's measurement seconds (plan reads them)


def test_mlflow_records(finished_study):
    from mlflow.tracking import MlflowClient

    _, out = finished_study
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("study.role") == "study"]
    children = [r for r in runs if r.data.tags.get("study.role") == "training"]
    assert len(parents) == 1 and len(children) == 3
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    child = children[0]
    # {metric}/{token_set}/{layer}: the metrics tab shows each metric's layers in one section (issue 27)
    assert "eed_pct/all/block_02" in child.data.metrics and "train/loss" in child.data.metrics
    assert not any(name.endswith("/all") for name in child.data.metrics)
    hist = client.get_metric_history(child.info.run_id, "eed_pct/all/block_02")
    assert sorted(m.step for m in hist) == [0, 2]
    # each child run spans its own training, not the moment it was logged (issue 27)
    for c in children:
        result = json.loads((out / "runs" / c.data.tags["run_key"] / "result.json").read_text())
        assert result["started_at"] < result["finished_at"]
        assert (c.info.start_time, c.info.end_time) == (
            int(result["started_at"] * 1000),
            int(result["finished_at"] * 1000),
        )
    spans = sorted((c.info.start_time, c.info.end_time) for c in children)
    assert all(a[1] <= b[0] for a, b in zip(spans[:-1], spans[1:], strict=True)), (
        spans
    )  # --workers 1: one after another
    arts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"tiny.yaml", "table.parquet", "verdicts.json"} <= arts


def test_rerun_reuses_and_analyze_agrees(finished_study, capsys):
    hyp, out = finished_study
    before = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1", "--no-mlflow"]) == 0
    assert "3 reused, 0 to train" in capsys.readouterr().out
    after = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert after["claims"][0]["p_value"] == before["claims"][0]["p_value"]
    assert (
        main(["analyze", str(hyp), "--table", str(out / "studies" / "tiny" / "table.parquet"), "--json"]) == 0
    )
    analyzed = json.loads(capsys.readouterr().out)
    assert analyzed[0]["verdict"] == before["claims"][0]["verdict"]
    assert np.isclose(analyzed[0]["effect"], before["claims"][0]["effect"])


def test_interrupted_run_resumes_to_identical_result(tmp_path):
    """A run stopped after epoch 1 and started again ends with the same spectra as one uninterrupted run."""
    from runners.train import train_run
    from tests.conftest import TINY_HYPOTHESIS

    (tmp_path / "h.yaml").write_text(TINY_HYPOTHESIS)
    spec = plan_runs(load_hypothesis(tmp_path / "h.yaml"))[0].model_dump()

    class Stop(Exception):
        pass

    def stop_at(marker: str):
        def progress(line: str) -> None:
            if marker in line:
                raise Stop

        return progress

    # stopped while reporting epoch 1, before its resume checkpoint: nothing to resume from
    with pytest.raises(Stop):
        train_run(spec, tmp_path / "a", tmp_path / "data", progress=stop_at("epoch 1/2"))
    assert not (tmp_path / "a" / "resume.pt").exists() and not (tmp_path / "a" / "result.json").exists()
    # stopped during epoch 2's report, after epoch 1's resume checkpoint
    with pytest.raises(Stop):
        train_run(spec, tmp_path / "a", tmp_path / "data", progress=stop_at("epoch 2/2"))
    assert (tmp_path / "a" / "resume.pt").exists()
    lines: list[str] = []
    resumed = train_run(spec, tmp_path / "a", tmp_path / "data", progress=lines.append)
    assert any("resuming after epoch 1" in ln for ln in lines)
    assert not (tmp_path / "a" / "resume.pt").exists()
    straight = train_run(spec, tmp_path / "b", tmp_path / "data")
    keys = ("epoch", "loss", "train_acc", "test_acc", "lr")  # images_per_s is wall-clock, not a result
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [
        {k: h[k] for k in keys} for h in straight["history"]
    ]
    with np.load(tmp_path / "a" / "spectra.npz") as fa, np.load(tmp_path / "b" / "spectra.npz") as fb:
        assert sorted(fa.files) == sorted(fb.files)
        for k in fa.files:
            np.testing.assert_array_equal(fa[k], fb[k])


def test_ui_prints_the_runs_table_address_and_starts_a_lean_server(finished_study, capsys, monkeypatch):
    """``study ui`` (issue 27): the address of each study's runs table (MLflow 3.17 opens an experiment
    on its GenAI overview otherwise), the study logged last first; one worker, no job consumers, no
    telemetry (tests/tracking/test_ui.py has the rest)."""
    from mlflow.tracking import MlflowClient

    from study.tracking.tracker import open_tracker

    _, out = finished_study
    study_id = MlflowClient(f"sqlite:///{out / 'mlflow.db'}").get_experiment_by_name("tiny").experiment_id
    with open_tracker(True, out, "tiny_sweep.sweep", role="sweep") as t:  # a sweep logged after the study
        sweep_id = t.experiment_id
    calls = []
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr("study.cli.verbs._serve", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    capsys.readouterr()
    assert main(["ui", "--out", str(out), "--port", "5077", "--no-browser"]) == 0
    said = capsys.readouterr().out.splitlines()
    runs = "http://127.0.0.1:5077/#/experiments/{}/runs?workflowType=machine_learning"
    # every study of the store, the one logged last first
    assert said[1:] == [
        f"runs of tiny_sweep.sweep: {runs.format(sweep_id)}",
        f"runs of tiny: {runs.format(study_id)}",
    ]
    cmd, kw = calls[0]
    assert cmd[cmd.index("--workers") + 1] == "1" and said[0] == "starting: mlflow " + " ".join(cmd[3:])
    assert kw["env"] == {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    # it opens the study logged last, or --study's (a sweep by its hypothesis name too)
    from study.tracking.ui import ui_plan

    assert ui_plan(out, 5077).url == runs.format(sweep_id)
    assert ui_plan(out, 5077, "tiny").url == runs.format(study_id)
    assert ui_plan(out, 5077, "tiny_sweep").url == runs.format(sweep_id)
    # an unknown study is one line, and no server
    assert main(["ui", "--out", str(out), "--study", "nope"]) == 2 and len(calls) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nope'" in err and "tiny_sweep.sweep, tiny" in err, err
