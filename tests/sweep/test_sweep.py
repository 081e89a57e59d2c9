"""Sweeps: the ``sweep:`` section's validation, claims over a knob on a synthetic sweep table, a tiny sweep
end to end (table, trial table, MLflow links, verdict over the knob), and a sweep killed mid-trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.kinds._parts.curves import crossing
from analysis.verdicts import evaluate_claims
from study.cli import main
from study.schema import parse_hypothesis
from tests.conftest import TINY_SWEEP

ROOT = Path(__file__).parents[2]


def _doc(**sweep) -> dict:
    doc = yaml.safe_load(TINY_SWEEP)
    doc["sweep"].update(sweep)
    return doc


@pytest.mark.parametrize(
    ("edit", "field", "says"),
    [
        ({"space": {"texture_reliance": []}}, "sweep.space.texture_reliance", "empty list"),
        (
            {"space": {"texture_reliance": {"low": 0.5, "high": 0.5}}, "sampler": "random", "n_trials": 2},
            "sweep.space",
            "empty range",
        ),
        ({"space": {"wobble": [1.0]}}, "sweep.space", "wobble"),
        (
            {"space": {"texture_reliance": [0.0, 1.5]}},
            "sweep.space.texture_reliance",
            "outside the knob's domain",
        ),
        (
            {"space": {"texture_reliance": {"low": 0.0, "high": 1.0}}},
            "sweep.space.texture_reliance",
            "grid sampler needs a list",
        ),
        ({"space": {"clutter": [0.0, 1.0]}}, "claims[0].over", "needs a sweep that varies it"),
        ({"dataset": "nope"}, "sweep.dataset", "procedural design dataset"),
        ({"objective": {"metric": "eed_pct", "claim": "x"}}, "sweep.objective", "either metric"),
        # issue 27: each of these was a traceback, or silently wrong, before
        (
            {
                "space": {"texture_reliance": {"low": 0.0, "high": 1.0, "log": True}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.texture_reliance",
            "a log range needs low > 0",
        ),
        (
            {
                "space": {"texture_reliance": {"low": 0.1, "high": 1.0, "log": True, "step": 0.1}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.texture_reliance",
            "give log or step, not both",
        ),
        (
            {"space": {"texture_reliance": [0.0, 1.0], "n_classes": [2.5, 4]}},
            "sweep.space.n_classes",
            "integers",
        ),
        (
            {
                "space": {"texture_reliance": [0.0, 1.0], "n_classes": {"low": 2.5, "high": 4.7}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.n_classes",
            "takes integers, got 2.5",
        ),
        ({"objective": {"metric": "eed_pct", "epoch": 3}}, "sweep.objective.epoch", "a checkpoint epoch [1]"),
        (
            {"space": {"texture_reliance": [0.0, 1.0], "image_size": [8, 10]}},
            "sweep.space.image_size",
            "divisible by the model's patch size 4",
        ),
        (
            {
                "space": {"texture_reliance": [0.0, 1.0], "image_size": {"low": 11, "high": 13}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.image_size",
            "divisible by the model's patch size 4",
        ),
        ({"n_trials": 7}, "sweep.n_trials", "at most the grid's 3 points"),
        # issue 39: each of these trained before (two trials of one level; true as 1; "0.0" as 0.0; a step
        # that optuna warned about and moved high for)
        (
            {"space": {"texture_reliance": [0.0, 0.5, 0.5, 1.0]}},
            "sweep.space.texture_reliance[2]",
            "expected each level once; 0.5 is the level of [1] (0.5) again",
        ),
        (
            {"space": {"texture_reliance": [0, 0.0, 1]}},
            "sweep.space.texture_reliance[1]",
            "0.0 is the level of [0] (0) again",
        ),
        (
            {"space": {"texture_reliance": [True, False]}},
            "sweep.space.texture_reliance[0]",
            "expected a number, got true (a boolean)",
        ),
        (
            {"space": {"texture_reliance": ["0.0", "1.0"]}},
            "sweep.space.texture_reliance[0]",
            "expected a number, got '0.0' (a string, quoted)",
        ),
        (
            {
                "space": {"texture_reliance": {"low": "0.0", "high": 1.0}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.texture_reliance.low",
            "expected a number",
        ),
        (
            {
                "space": {"texture_reliance": {"low": 0.0, "high": 1.0, "step": 0.3}},
                "sampler": "random",
                "n_trials": 2,
            },
            "sweep.space.texture_reliance",
            "step 0.3 from 0 ends at 0.9, not high 1",
        ),
    ],
)
def test_bad_sweep_sections_are_one_line_and_write_nothing(tmp_path, capsys, edit, field, says):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_doc(**edit)))
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and field in err and says in err, err
    assert not out.exists()


def test_unopenable_storage_is_one_line_and_trains_nothing(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    (tmp_path / "a_file").write_text("")  # a folder that cannot exist: its parent is a file
    storage = f"sqlite:///{tmp_path / 'a_file' / 'x.db'}"
    assert main(["sweep", str(path), "--out", str(out), "--storage", storage]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --storage: the SQLite file's folder"), err
    assert not (out / "runs").exists()


def test_run_refuses_a_sweep_file(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "study sweep" in capsys.readouterr().err


def _sweep_table(
    slope: float, n_seeds: int = 5, seed: int = 0, layers=("block_01", "block_02", "block_03")
) -> pd.DataFrame:
    """Trial datasets at texture_reliance 0..1, per-seed curves with a known mean slope, tidy rows."""
    rng = np.random.default_rng(seed)
    rows = []
    knob = [0.0, 0.25, 0.5, 0.75, 1.0]
    offsets = rng.normal(0, 2, n_seeds)
    for s in range(n_seeds):
        for k in knob:
            for li, layer in enumerate(layers):
                rows.append(
                    {
                        "run_key": f"k{s}{k}",
                        "dataset": f"objects-texture_reliance{k:g}",
                        "seed": s,
                        "epoch": 1,
                        "layer": layer,
                        "layer_index": li + 2,
                        "token_set": "all",
                        "n_tokens": 80,
                        "metric": "eed_pct",
                        "value": 40 + offsets[s] + slope * k + li + rng.normal(0, 0.5),
                        "texture_reliance": k,
                    }  # fmt: skip
                )
    return pd.DataFrame(rows)


def test_claims_over_a_knob_find_a_planted_slope_and_its_crossing():
    hyp = parse_hypothesis(yaml.safe_load(TINY_SWEEP))
    up, flat = evaluate_claims(hyp, _sweep_table(8.0)), evaluate_claims(hyp, _sweep_table(0.0, seed=1))
    assert [r.verdict for r in up] == ["ACCEPTED", "ACCEPTED"]
    assert up[1].effect == pytest.approx(8.0, abs=1.5) and up[1].details["curve"]["x"] == [
        0.0,
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    assert all(r.verdict != "ACCEPTED" for r in flat)
    # the trend's level 50: mean curve ~ 41 + 8 k reaches it near k = 1.1 (beyond the sweep) or not at all
    assert up[1].details["crossing"]["level"] == 50.0


def test_crossing_interpolates_per_seed_and_on_the_mean():
    x = np.array([0.0, 1.0, 2.0])
    y = np.array([[0.0, 2.0, 4.0], [1.0, 3.0, 5.0], [5.0, 5.0, 5.0]])  # reach 3 at 1.5, 1.0, never
    c = crossing(x, y, 3.0)
    assert c["per_seed"][:2] == [1.5, 1.0] and np.isnan(c["per_seed"][2])
    assert (
        c["mean_curve"] == pytest.approx(0.75) and c["n_crossing"] == 2 and c["mean"] == pytest.approx(1.25)
    )


def test_tiny_sweep_end_to_end(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "2"]) == 0
    sweep_dir = out / "sweeps" / "tiny_sweep"
    trials = pd.read_csv(sweep_dir / "trials.csv")
    assert sorted(trials.texture_reliance.unique()) == [0.0, 0.5, 1.0] and len(trials) == 6
    assert trials.objective.notna().all() and trials.test_acc.between(0, 1).all()
    table = pd.read_parquet(sweep_dir / "table.parquet")
    assert set(table.texture_reliance) == {0.0, 0.5, 1.0} and set(table.seed) == {0, 1}
    assert "Sweep" in (sweep_dir / "report.html").read_text()
    md = (sweep_dir / "report.md").read_text()
    # issue 27: the report counts the trials' runs, shows their covariances and environment
    assert "6 runs (0 reused, 0 failed)." in md, md
    assert "covariance snapshots not recorded" not in md and "run environment" in md
    assert "## Sweep" in md and "figures/sweep_texture_reliance.png" in md and "figures/claim1_knob" in md
    import json

    claims = json.loads((sweep_dir / "verdicts.json").read_text())["claims"]
    assert [c["details"]["curve"]["knob"] for c in claims] == ["texture_reliance"] * 2
    assert all(c["verdict"] in ("ACCEPTED", "REJECTED", "INCONCLUSIVE") for c in claims)
    # trials <-> runs, both ways
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny_sweep.sweep")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    children = client.search_runs([exp.experiment_id], "tags.`study.role` = 'training'")
    assert sorted(r.data.tags["run_key"] for r in children) == sorted(trials.run_key)
    for r in children:
        row = trials[trials.run_key == r.data.tags["run_key"]].iloc[0]
        assert (
            int(r.data.tags["trial"]) == row.trial
            and float(r.data.tags["knob.texture_reliance"]) == row.texture_reliance
        )
    (parent,) = client.search_runs([exp.experiment_id], "tags.`study.role` = 'sweep'")
    assert parent.info.run_name.startswith("tiny_sweep.sweep: ")
    assert "trials.csv" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    # `report` on the sweep folder rewrites the same report: its sweep section, no figure gone missing
    Path(sweep_dir / "report.md").unlink()
    assert main(["report", str(sweep_dir)]) == 0
    again = (sweep_dir / "report.md").read_text()
    assert "6 runs (0 reused, 0 failed)." in again and "missing:" not in again.lower(), again
    assert (
        "## Sweep" in again
        and "figures/sweep_texture_reliance.png" in again
        and "figures/claim1_knob" in again
    )
    # editing the grid (3 -> 5 levels) and rerunning into the same --out: one line, the journal untouched
    path.write_text(TINY_SWEEP.replace("[0.0, 0.5, 1.0]", "[0.0, 0.25, 0.5, 0.75, 1.0]"))
    assert main(["sweep", str(path), "--out", str(out), "--no-mlflow"]) == 2
    path.write_text(TINY_SWEEP)
    # a rerun trains nothing
    t0 = time.perf_counter()
    assert main(["sweep", str(path), "--out", str(out), "--no-mlflow", "--no-report"]) == 0
    assert pd.read_csv(sweep_dir / "trials.csv").equals(trials) and time.perf_counter() - t0 < 60
    # doctor on the healthy sweep folder: nothing found (its trials' runs are no orphans; issue 27)
    capsys.readouterr()
    assert main(["doctor", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "orphan" not in said and "doctor: 0 finding(s)" in said, said
    # a sweep parent left RUNNING by a dead invocation, and a child run gone from the store: both named
    import socket

    stale = client.create_run(
        exp.experiment_id, tags={"study.role": "sweep", "study.host": socket.gethostname()}
    )
    client.delete_run(children[0].info.run_id)
    assert main(["doctor", "--out", str(out)]) == 1
    said = capsys.readouterr().out
    assert f"sweep parent run {stale.info.run_id}" in said and "orphan" not in said, said
    (missing,) = [line for line in said.splitlines() if line.startswith("missing_child")]
    assert children[0].data.tags["run_key"] in missing and "[report only]" in missing, said
    _rerun_logs_the_missing_child(path, out, client, exp, children[0], capsys)


def _rerun_logs_the_missing_child(path, out, client, exp, gone, capsys) -> None:
    """Issue 27: a rerun of a finished sweep logs the complete trials' runs the store lacks (``gone``,
    deleted from it), tagged with their trial, trains nothing, and leaves nothing for doctor."""
    assert main(["sweep", str(path), "--out", str(out), "--no-report"]) == 0
    said = capsys.readouterr().out
    assert "epoch 1/1" not in said and "] finished (" not in said, said
    (back,) = [
        r
        for r in client.search_runs([exp.experiment_id], "tags.`study.role` = 'training'")
        if r.data.tags["run_key"] == gone.data.tags["run_key"]
    ]
    assert back.info.status == "FINISHED" and back.data.tags["trial"] == gone.data.tags["trial"]
    assert back.data.tags["knob.texture_reliance"] == gone.data.tags["knob.texture_reliance"]
    assert main(["doctor", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "doctor: 0 finding(s)" in said, said


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_a_sweep_killed_mid_trial_resumes_and_trains_each_run_once(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP.replace("[0.0, 0.5, 1.0]", "[0.0, 1.0]"))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "study",
        "sweep",
        str(path),
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-report",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    lines = []
    for line in first.stdout:  # kill as soon as the first run has finished: its trial is left RUNNING
        lines.append(line)
        if "] finished (" in line:
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=120)
    first.stdout.close()
    assert first.returncode == -signal.SIGKILL
    # doctor on the killed sweep's folder: its parent is stale, its trial's runs are no orphans (issue 27)
    done = subprocess.run(
        [sys.executable, "-m", "study", "doctor", "--out", str(out)], capture_output=True, text=True, env=env
    )
    assert "sweep parent run" in done.stdout and "stale_parent" in done.stdout, done.stdout
    assert "orphan" not in done.stdout, done.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "left running by a process that is gone" in second.stdout
    trained = [x.split("]")[0] for x in lines + second.stdout.splitlines(True) if "] epoch 1/1 " in x]
    assert (
        sorted(trained) == sorted(set(trained)) and len(trained) == 4
    )  # 2 trials x 2 seeds, each trained once
    trials = pd.read_csv(out / "sweeps" / "tiny_sweep" / "trials.csv")
    assert sorted(trials.texture_reliance.unique()) == [0.0, 1.0] and trials.objective.notna().all()
    # MLflow: the run finished before the kill reached the store (as it ended, or caught up by the rerun),
    # every run is there once, tagged with the trial that reports it; the killed sweep's parent is KILLED
    from mlflow.tracking import MlflowClient

    from study.tracking.tracker import training_runs

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    children = training_runs(client)
    assert sorted(r.data.tags["run_key"] for r in children) == sorted(trials.run_key), trials
    for r in children:
        assert int(r.data.tags["trial"]) in set(trials[trials.run_key == r.data.tags["run_key"]].trial)
    exp = client.get_experiment_by_name("tiny_sweep.sweep")
    parents = client.search_runs([exp.experiment_id], "tags.`study.role` = 'sweep'")
    assert sorted(r.info.status for r in parents) == ["FINISHED", "KILLED"]
    finished = next(r for r in parents if r.info.status == "FINISHED")
    assert finished.data.tags["spec_hash"] and finished.data.tags["command"].startswith(
        "python -m study sweep"
    )
    assert finished.data.params["n_runs"] == "4" and finished.data.tags["n_reused"] == "1"


def test_shipped_sweep_validates_and_its_claims_run_on_a_sweep_table():
    from study.schema import load_hypothesis

    hyp = load_hypothesis(ROOT / "hypotheses" / "complexity_sweep.yaml")
    assert hyp.sweep.grid_size() == 5 and len(hyp.design.seeds) >= 3
    assert set(hyp.sweep.space["texture_reliance"]) >= {0.0, 1.0}
    # every block rises with the knob by the same amount: the floor rises, the dip (range) does not shrink
    table = _sweep_table(8.0, layers=[f"block_{i:02d}" for i in range(1, 13)])
    # the adjusted claim reads each run's test accuracy: here noise unrelated to the metric (one per run)
    runs = table.run_key.unique()
    accuracy = dict(zip(runs, np.random.default_rng(1).uniform(0.3, 0.6, len(runs)), strict=True))
    table["test_accuracy"] = table.run_key.map(accuracy)
    floor, dip, adjusted = evaluate_claims(hyp, table)
    assert floor.verdict == "ACCEPTED" and floor.details["curve"]["knob"] == "texture_reliance"
    assert dip.verdict != "ACCEPTED"
    # accuracy does not explain the slope, so the floor still rises at equal accuracy
    assert adjusted.details["adjusted"]["for"] == "test_accuracy" and adjusted.verdict == "ACCEPTED"
    # the text table (terminal, verdicts.txt, MLflow) gives a slope's unit as the report does
    from analysis.verdicts import format_verdicts

    table_text = format_verdicts([floor, dip])
    assert table_text.count(" pp per unit of texture_reliance (") == 2, table_text


def _begun(tmp_path, text: str = TINY_SWEEP):
    """A sweep whose first pass has begun in ``out``: its optuna study records what its trials run under
    (as ``run_sweep`` records it before asking the first trial)."""
    from study.sweep.storage import check_unchanged, open_optuna_study

    path, out = tmp_path / "s.yaml", tmp_path / "out"
    path.write_text(text)
    hyp = parse_hypothesis(yaml.safe_load(text), str(path))
    check_unchanged(open_optuna_study(hyp, out, None, str(path)), hyp, str(path))
    return path, out


@pytest.mark.parametrize(
    ("edits", "field"),
    [
        ({"[0.0, 0.5, 1.0]": "[0.0, 0.25, 0.5, 0.75, 1.0]"}, "sweep.space.texture_reliance"),  # more levels
        ({"seeds: [0, 1]": "seeds: [0, 1, 2]"}, "design.seeds"),  # an added seed
        ({"epochs: 1,": "epochs: 2,", "checkpoints: [1]": "checkpoints: [2]"}, "design.training.epochs"),
    ],
)
def test_an_edited_sweep_rerun_into_the_same_out_is_refused_with_one_line(tmp_path, capsys, edits, field):
    import optuna

    path, out = _begun(tmp_path)
    text = TINY_SWEEP
    for old, new in edits.items():
        text = text.replace(old, new)
    path.write_text(text)
    assert main(["sweep", str(path), "--out", str(out), "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and field in err and "start a new sweep" in err, err
    assert not (out / "runs").exists()  # nothing trained, and no trial asked (none left RUNNING)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "sweeps" / "tiny_sweep" / "journal.log"))
    )
    assert optuna.load_study(study_name="tiny_sweep", storage=storage).trials == []


def test_sweep_edits_its_trials_do_not_depend_on_are_accepted(tmp_path):
    from study.sweep.storage import check_unchanged, open_optuna_study

    path, out = _begun(tmp_path)
    # the swept knob's design point (each trial replaces it) and the claims change nothing of the trials
    doc = yaml.safe_load(TINY_SWEEP)
    doc["design"]["datasets"][0]["texture_reliance"] = 0.9
    doc["claims"][1]["level"] = 40.0
    hyp = parse_hypothesis(doc, str(path))
    check_unchanged(open_optuna_study(hyp, out, None, str(path)), hyp, str(path))


def test_n_trials_over_a_grid_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY_SWEEP)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--n-trials", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--n-trials" in err and "at most the grid's 3 points" in err, err
    assert not (tmp_path / "out").exists()


def test_validate_accepts_the_shipped_sweep(capsys):
    assert main(["validate", str(ROOT / "hypotheses" / "complexity_sweep.yaml")]) == 0
    assert "a sweep of 5 trial(s) x 3 seeds = 15 run(s)" in capsys.readouterr().out


def test_optuna_figures_leave_the_matplotlib_style_alone():
    import matplotlib.pyplot as plt
    import optuna

    from analysis.report.knob_figures import optuna_figures

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("a", 0, 1) + t.suggest_float("b", 0, 1), n_trials=6)
    with plt.rc_context():  # from matplotlib's defaults (a leak elsewhere in this process would hide one)
        plt.rcdefaults()
        before = {k: plt.rcParams[k] for k in ("axes.facecolor", "axes.prop_cycle", "axes.grid")}
        figures = optuna_figures(study)
        after = {k: plt.rcParams[k] for k in before}
    assert [f.png is not None for f in figures] == [True, True], [f.missing for f in figures]
    assert after == before  # optuna's global ggplot style does not leak into the report's later figures


# ---- issue 28 case 8: a submitted sweep's database passwords never reach Ray, nor the head's `ps` ------
def test_submit_keeps_database_passwords_out_of_everything_ray_records(tmp_path, monkeypatch, capsys):
    import json
    import shlex
    import stat

    import ray.job_submission

    from study.cluster import jobs as cluster

    sent: dict = {}

    class Client:  # what Ray keeps of a job: its entrypoint, runtime_env, metadata and id (GCS, dashboard)
        def __init__(self, address):
            sent["address"] = address

        def submit_job(self, **job):
            sent.update(job)
            return job["submission_id"]

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://ml:Tr4ckPW@db/mlflow")
    path, out = tmp_path / "s.yaml", tmp_path / "out"
    path.write_text(TINY_SWEEP)
    db = "postgresql://study:S3cretPW@db:5432/study"
    monkeypatch.setenv("STUDY_LEASES", db)  # submit's --leases from the variable; --storage as a flag
    argv = ["submit", str(path), "--address", "http://head:8265", "--out", str(out), "--storage", db]
    assert main(argv) == 0
    printed = capsys.readouterr()
    recorded = json.dumps(sent, default=str) + printed.out + printed.err
    assert "S3cretPW" not in recorded and "Tr4ckPW" not in recorded, recorded
    _lead, python = sent["entrypoint"].split(shlex.quote(sys.executable))
    for url_ref in ("--leases", "--storage", "$", "://"):  # the job's python gets no URL, nor a reference
        assert url_ref not in python, python
    assert not {"STUDY_LEASES", "STUDY_STORAGE"} & set(sent["runtime_env"]["env_vars"])
    # the job reads them from a file in --out only this user can read, and deletes it as it starts
    (secrets,) = (out / cluster.SECRETS_DIR).iterdir()
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    # the head runs the entrypoint: a stand-in for the interpreter writes the argv `ps` would show
    # (/proc/PID/cmdline, readable by every local user) and the environment it got (its user's only)
    stub = tmp_path / "python"
    stub.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$0" "$@" > {tmp_path / "argv"}\n'
        f'printf "%s %s %s" "$STUDY_LEASES" "$STUDY_STORAGE" "$MLFLOW_TRACKING_URI" > {tmp_path / "env"}\n'
    )
    stub.chmod(0o755)
    entrypoint = sent["entrypoint"].replace(shlex.quote(sys.executable), shlex.quote(str(stub)), 1)
    got = subprocess.run(
        ["bash", "-c", entrypoint], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert got.returncode == 0 and not secrets.exists(), got
    argv_seen = (tmp_path / "argv").read_text().splitlines()
    assert argv_seen[1:5] == ["-m", "study", "sweep", str(path)], argv_seen
    assert not [a for a in argv_seen if "S3cretPW" in a or "Tr4ckPW" in a or "://" in a], argv_seen
    assert (tmp_path / "env").read_text() == f"{db} {db} postgresql://ml:Tr4ckPW@db/mlflow"
