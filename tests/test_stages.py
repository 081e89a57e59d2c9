"""Each stage of ``study.pipeline.stages`` on its own: what it reads, what it returns, what it leaves on disk."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from study.pipeline import evaluation, outputs, stages
from study.pipeline import tables as run_tables
from study.pipeline import triage as run_triage
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS, write_runs
from vitstudy_core.runfolder import RunFolder


@pytest.fixture
def tiny(tmp_path):
    hyp_path, out = write_runs(tmp_path)
    hyp = parse_hypothesis(yaml.safe_load(TINY_HYPOTHESIS))
    return hyp, hyp_path, out, run_triage.plan(hyp)


def test_plan_is_one_run_per_dataset_and_seed(tiny):
    hyp, _, _, specs = tiny
    assert [s.seed for s in specs] == [0, 1, 2] and len({s.key for s in specs}) == 3
    assert all(s.source == "train" for s in specs)


def test_triage_sorts_finished_stored_and_todo_without_touching_disk(tiny):
    hyp, _, out, specs = tiny
    runs = out / "runs"
    shutil.rmtree(runs / specs[1].key)
    (runs / specs[2].key / "result.json").write_text(json.dumps({"status": "failed"}))
    stored = {specs[1].key: SimpleNamespace(info=SimpleNamespace(run_id="abc"))}
    tri = run_triage.triage(specs, runs, stored)
    assert tri.finished == [specs[0].key] and list(tri.stored) == [specs[1].key]
    assert tri.todo == [specs[2]]
    assert tri.reused_from == {specs[0].key: "local", specs[1].key: "mlflow:abc"}
    assert (runs / specs[2].key / "result.json").exists()  # triage removes nothing
    assert [s.key for s in run_triage.triage(specs, runs, stored, force=True).todo] == [s.key for s in specs]


def test_fetch_stored_replaces_a_partial_attempt(tiny):
    _, _, out, specs = tiny
    runs = out / "runs"
    partial = runs / specs[1].key
    (partial / "result.json").unlink()
    fetched = []

    class Store:
        def fetch_run(self, run, spec, run_dir):
            assert not run_dir.exists()  # the partial attempt is gone first
            fetched.append((run, spec.key))

    tri = run_triage.Triage(stored={specs[1].key: "run-1"})
    run_triage.fetch_stored(tri, specs, runs, Store())
    assert fetched == [("run-1", specs[1].key)]


def test_clear_for_training_keeps_interrupted_runs_and_drops_ended_ones(tiny):
    _, _, out, specs = tiny
    runs = out / "runs"
    (runs / specs[0].key / "result.json").write_text(json.dumps({"status": "failed"}))
    (runs / specs[1].key / "result.json").unlink()  # interrupted: resumes
    run_triage.clear_for_training(specs[:2], runs)
    assert not (runs / specs[0].key).exists() and (runs / specs[1].key / "spectra.npz").exists()
    run_triage.clear_for_training(specs[1:2], runs, force=True)
    assert not (runs / specs[1].key).exists()


def test_prepare_data_makes_each_dataset_once(tiny, tmp_path):
    _, _, _, specs = tiny
    lines = []
    records = stages.prepare_data(specs, tmp_path / "data", lines.append)
    assert len(records) == 1 and len(lines) == 1  # three runs, one dataset
    (rec,) = records.values()
    assert rec.name == "objects" and rec.profile["train"] == [64, 8, 8, 3] and rec.profile["probe"][0] == 16
    assert records == {run_triage.dataset_key(specs[0].dataset): rec}
    assert len(list((tmp_path / "data").glob("*.npz"))) == 3  # train, test, probe caches


def test_execute_reports_failures_and_calls_back(tiny, tmp_path, monkeypatch):
    import runners.executors.jobs

    _, _, _, specs = tiny

    def fake(run, run_dir, data_dir, label=""):
        if run["seed"] == 1:
            raise RuntimeError("boom")
        if run["seed"] == 0:  # a finished run is a finished folder (the driver checks it sees it)
            import numpy as np

            folder = RunFolder(run_dir)
            folder.path.mkdir(parents=True, exist_ok=True)
            folder.write_spectra({"0/norm/all": np.ones(3)})
            folder.write_result({"status": "finished"})
        return {"status": "finished" if run["seed"] == 0 else "failed", "failed_epoch": 1, "error": "nan"}

    monkeypatch.setattr(runners.executors.jobs, "execute_run", fake)
    seen = []
    failed = stages.execute(
        specs, tmp_path, tmp_path, workers=1, log=lambda _: None, on_result=lambda s, r: seen.append(s.seed)
    )
    assert failed == {specs[1].key: "RuntimeError: boom", specs[2].key: "failed at epoch 1: nan"}
    assert seen == [0, 1, 2]
    assert stages.execute([], tmp_path, tmp_path) == {}


def test_a_run_s_progress_lines_lead_with_its_condition(tiny, tmp_path, monkeypatch, capsys):
    """A source says ``[objects/seed0] ...``; in a design with conditions the study's label leads instead
    (docs/conditions.md: ``shuffled/objects/seed3``), and the run dict the source gets has no condition."""
    import numpy as np

    import runners.executors.jobs

    _, _, _, specs = tiny
    got = []

    class Source:
        def fill(self, run, run_dir, data_dir, progress=None, bar=False):
            got.append(run)
            progress(f"[objects/seed{run['seed']}] epoch 1/8 loss 1.000")
            folder = RunFolder(run_dir)
            folder.path.mkdir(parents=True, exist_ok=True)
            folder.write_spectra({"0/norm/all": np.ones(3)})
            folder.write_result({"status": "finished"})
            return {"status": "finished"}

    monkeypatch.setattr(runners.executors.jobs, "get_source", lambda name: Source())
    run_specs = [specs[0].model_copy(update={"condition": "shuffled"}), specs[1]]
    assert stages.execute(run_specs, tmp_path, tmp_path, workers=1, log=lambda _: None) == {}
    lines = capsys.readouterr().out.splitlines()
    assert "[shuffled/objects/seed0] epoch 1/8 loss 1.000" in lines
    assert "[objects/seed1] epoch 1/8 loss 1.000" in lines  # a design without conditions: as before
    assert all("condition" not in run and "label" not in run for run in got)


def test_collect_table_leaves_out_unfinished_and_failed_runs(tiny):
    hyp, _, out, specs = tiny
    runs = out / "runs"
    (runs / specs[2].key / "result.json").unlink()
    got = run_tables.collect_table(specs, runs, hyp.design.layers, failed={specs[1].key: "boom"})
    assert list(got.rows) == [specs[0].key] and set(got.table.seed) == {0}
    assert got.failed_seeds == {"objects": {1: "boom", 2: "run did not finish"}}
    assert [s.key for s in got.missing] == [specs[1].key, specs[2].key]


def test_evaluate_and_write_outputs(tiny, tmp_path):
    hyp, hyp_path, out, specs = tiny
    got = run_tables.collect_table(specs, out / "runs", hyp.design.layers)
    results = evaluation.evaluate(hyp, got.table, str(hyp_path), got.failed_seeds)
    assert [r.name for r in results] == ["u"] and results[0].n_seeds == 3
    tri = run_triage.triage(specs, out / "runs")
    outcome = outputs.Outcome(hyp_path, stages.Filled(specs, tri, {}), got.table, results, "cmd")
    paths = outputs.write_outputs(tmp_path / "studies" / "tiny", outcome, {"hypothesis": "tiny"})
    verdicts = json.loads(paths["verdicts"].read_text())
    assert verdicts["runs"] == [s.key for s in specs] and verdicts["reused"] == verdicts["runs"]
    assert verdicts["claims"][0]["verdict"] == results[0].verdict and verdicts["command"] == "cmd"
    pd.testing.assert_frame_equal(pd.read_parquet(paths["table"]), got.table)
    assert paths["hypothesis"].read_text() == hyp_path.read_text()
    assert paths["text"].read_text().startswith("claim")
    assert not list((tmp_path / "studies" / "tiny").glob(".*"))  # no temporary file left behind
    html, md = outputs.write_study_report(tmp_path / "studies" / "tiny", hyp, outcome, out / "runs")
    assert "<h3>Details</h3>" in html.read_text() and RunFolder(out / "runs" / specs[0].key).is_finished()


@pytest.mark.parametrize(
    "name", ["u_shape", "rank_grows", "texture_depth", "texture_flat", "cls_highest", "controls"]
)
def test_verdicts_json_holds_a_mean_profile_for_every_claim(tmp_path, name):
    """Before: only a u_shape claim had a mean profile (``details.profile``), where the README promises
    one per claim."""
    from analysis.verdicts import evaluate_claims
    from study.schema import load_hypothesis
    from tests.conftest import BEHAVIOUR, REPO

    hyp = load_hypothesis(REPO / "hypotheses" / f"{name}.yaml")
    table = pd.read_parquet(BEHAVIOUR / f"table_{name}.parquet")
    results = evaluate_claims(hyp, table)
    out = outputs.Outcome(
        REPO / "hypotheses" / f"{name}.yaml", stages.Filled(), table, results, None, list(hyp.claims)
    )
    outputs.write_outputs(tmp_path, out, {"hypothesis": name})
    written = json.loads((tmp_path / "verdicts.json").read_text())["claims"]
    assert len(written) == len(hyp.claims)
    for entry, claim in zip(written, hyp.claims, strict=True):
        profiles = entry["mean_profile"]
        assert profiles, claim.kind
        for prof in profiles:
            assert prof["token_set"] == claim.subset.token_set or claim.operands()
            assert [row["layer"] for row in prof["layers"]][:1] == ["patch_embed"] or prof[
                "token_set"
            ] == "cls"
            assert all(row["mean"] is not None and row["n"] >= 2 for row in prof["layers"])
        named = claim.datasets_named()
        assert {p["dataset"] for p in profiles} == set(named or table.dataset.unique())
