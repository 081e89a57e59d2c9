"""Scale out on real services: a loopback Ray cluster, PostgreSQL for MLflow, optuna and run leases.

Each run is trained exactly once: by two concurrent invocations, by two sweep processes sharing one
optuna study, and when a Ray worker dies mid-run (the run is taken over and resumed from its checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from runners.leases.store import open_lease_store
from tests.conftest import TINY_HYPOTHESIS, TINY_SWEEP, env_for, fresh_database

REPO = Path(__file__).resolve().parents[2]
FOUR_RUNS = TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2, 3]")


def trained_once(leases: str, keys: list[str]) -> None:
    # a lease is "<run key>@<output folder's token>" (runners.shared_out.lease_key)
    by_key = {lease.run_key.split("@")[0]: lease for lease in open_lease_store(leases).leases()}
    assert {k: (by_key[k].state, by_key[k].attempts) for k in keys} == {k: ("finished", 1) for k in keys}


def test_the_local_default_imports_neither_ray_nor_a_database_driver():
    code = (
        "import sys, study.cli.verbs, study.pipeline.stages, study.pipeline.orchestrate, study.sweep.loop, study.cluster.jobs, "
        "runners.executors.local, runners.executors.jobs, runners.leases.store; "
        "print(sorted(m for m in ('ray', 'psycopg', 'psycopg2') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env_for(), cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_two_concurrent_invocations_train_each_run_once(tmp_path, postgres_url):
    db = fresh_database(postgres_url, "concurrent")
    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    import mlflow

    mlflow.MlflowClient(db).search_experiments()  # create MLflow's tables once, before two processes race
    cmd = [sys.executable, "-m", "study", "run", str(hyp), "--out", str(tmp_path / "out"), "--workers", "1"]
    cmd += ["--leases", db, "--no-report"]
    env = env_for(MLFLOW_TRACKING_URI=db)
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n=====\n".join(log[-3000:] for log in logs)
    both = "\n".join(logs)
    for seed in (0, 1, 2):  # the last epoch of each run is trained in one of the two processes only
        assert both.count(f"[objects/seed{seed}] epoch 2/2") == 1, both
    verdicts = json.loads((tmp_path / "out" / "studies" / "tiny" / "verdicts.json").read_text())
    trained_once(db, verdicts["runs"])


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_two_sweep_processes_share_one_optuna_study_and_train_each_run_once(tmp_path, postgres_url):
    db = fresh_database(postgres_url, "sweeps")
    hyp = tmp_path / "s.yaml"
    hyp.write_text(TINY_SWEEP)
    cmd = [sys.executable, "-m", "study", "sweep", str(hyp), "--out", str(tmp_path / "out"), "--workers", "1"]
    cmd += ["--storage", db, "--no-mlflow", "--no-report"]
    procs = [
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(), cwd=REPO
        )
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n=====\n".join(log[-3000:] for log in logs)
    leases = open_lease_store(db).leases()
    assert len(leases) == 6  # 3 grid points x 2 seeds, each claimed (and trained) once
    assert {(le.state, le.attempts) for le in leases} == {("finished", 1)}
    both = "\n".join(logs)
    assert both.count("epoch 1/1") == 6, both


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_a_study_on_ray_matches_the_local_executor(tmp_path, postgres_url, ray_address):
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import Placement, RunOptions
    from study.schema import load_hypothesis

    db = fresh_database(postgres_url, "raystudy")
    hyp_path = tmp_path / "four.yaml"
    hyp_path.write_text(FOUR_RUNS)
    hyp = load_hypothesis(hyp_path)
    os.environ["MLFLOW_TRACKING_URI"] = db
    try:
        on_ray = run_study(
            hyp,
            hyp_path,
            tmp_path / "ray",
            RunOptions(report=False, placement=Placement("ray", ray_address, leases=db)),
        )
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    local = run_study(hyp, hyp_path, tmp_path / "local", RunOptions(workers=2, track=False, report=False))
    assert len(on_ray.trained) == 4 and not on_ray.failed
    trained_once(db, on_ray.trained)
    cols = ["run_key", "epoch", "layer", "token_set", "metric"]
    a, b = (o.table.sort_values(cols).reset_index(drop=True) for o in (on_ray, local))
    pd.testing.assert_frame_equal(a, b, rtol=1e-4)  # one torch thread per run on both; float order may differ
    assert [r.verdict for r in on_ray.results] == [r.verdict for r in local.results]
    import mlflow

    runs = mlflow.MlflowClient(db).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(db).search_experiments()], "tags.run_key != ''"
    )
    assert {r.data.tags["run_key"] for r in runs} >= set(on_ray.trained)  # logged to MLflow on PostgreSQL


@pytest.mark.slow
def test_a_run_whose_worker_dies_is_taken_over_and_resumed(tmp_path, postgres_url, ray_address):
    db = fresh_database(postgres_url, "killed")
    hyp = tmp_path / "two.yaml"
    # 2048 training images (not 64): an epoch of the tiny model then takes ~0.3 s, not ~0.01 s, so the kill
    # below lands mid-run; with 64 the run could end between the look and the kill (a loaded host
    # deschedules this process for longer than the whole run), killing an idle worker: attempts == 1
    hyp.write_text(
        TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
        .replace("epochs: 2", "epochs: 6")
        .replace("n_train: 64", "n_train: 2048")
    )
    cmd = [sys.executable, "-m", "study", "run", str(hyp), "--out", str(tmp_path / "out")]
    cmd += ["--executor", "ray", "--address", ray_address, "--leases", db, "--no-mlflow", "--no-report"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(), cwd=REPO
    )
    store, victim = open_lease_store(db), None
    deadline = time.monotonic() + 600
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        for lease in store.leases():  # a run past its first epoch (resume.pt written) and still running
            if (
                lease.state == "running"
                and (tmp_path / "out" / "runs" / lease.run_key.split("@")[0] / "resume.pt").exists()
            ):
                victim = lease
                break
        time.sleep(0.2)
    assert victim is not None, "no run reached its first checkpoint"
    os.kill(int(victim.owner.split(":")[1]), signal.SIGKILL)  # the Ray worker process training it
    assert not (tmp_path / "out" / "runs" / victim.run_key.split("@")[0] / "result.json").exists(), (
        "killed after it ended"
    )
    log = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, log
    leases = {le.run_key: le for le in store.leases()}
    assert leases[victim.run_key].attempts == 2 and leases[victim.run_key].state == "finished"
    assert all(le.attempts == 1 for k, le in leases.items() if k != victim.run_key)
    assert "resuming after epoch" in log, log
    result = json.loads(
        (tmp_path / "out" / "runs" / victim.run_key.split("@")[0] / "result.json").read_text()
    )
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4, 5, 6]  # every epoch once, to the end
