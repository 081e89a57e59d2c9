"""Regressions found in review: each test was first a failing repro of a defect, and passes since its fix.

Each docstring says ("Was:") what the defect did; the assertions are the behaviour that replaced it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from study.sweep import _heartbeat as sweep_heartbeat
from study.sweep import storage as sweep_storage
from study.sweep import trials as sweep_trials
from tests.sweep.test_sweep_trials import _asked_on, _hyp, _sqlite_sweep


# ---- 1. study/sweep/trials.py restamp_start: optuna 5's RDB column is naive *UTC*, restamp writes naive *local* ----
def test_restamp_start_on_a_database_storage_outside_utc(tmp_path, monkeypatch):
    """Was: on a host whose time zone is not UTC, a restamped trial on a database storage (sqlite here,
    PostgreSQL alike) starts hours away from its first run's start: optuna >= 5 keeps
    ``trials.datetime_start`` as naive UTC, restamp_start writes the naive local time into the column."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        hyp = _hyp()
        url = f"sqlite:///{tmp_path / 'optuna.db'}"
        study = sweep_storage.open_optuna_study(hyp, tmp_path, url, "s.yaml")
        (point,) = sweep_trials._ask(study, hyp, 1, tmp_path / "data")
        started = time.time() + 2.0  # the trial's first run began 2 s after it was asked
        assert sweep_trials.restamp_start(point.trial, started)
        again = sweep_storage.open_optuna_study(hyp, tmp_path, url, "s.yaml")
        got = again.trials[point.number].datetime_start.timestamp()  # naive local, as optuna returns it
        assert got == pytest.approx(started, abs=0.01), f"off by {got - started:+.0f} s"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# ---- 2. runners/executors/local.py ProcessExecutor._collect: a dead worker with a job sent back ------------------
def _die_or_wait(kind: str) -> dict:
    if kind == "die":
        time.sleep(0.5)
        os._exit(1)  # the worker is killed (OOM killer, segfault)
    return {"status": "waiting"}


@pytest.mark.slow  # a spawned pool that imports this module (~8 s)
def test_a_dead_worker_while_a_job_is_sent_back_fails_that_job_not_the_map():
    """Was: a worker that dies while another job waits to be sent again (its run leased elsewhere) makes
    ``map_jobs`` itself raise BrokenProcessPool when that job is resubmitted to the broken pool: the study
    stops with a traceback and the sent-back run is never reported. Before the requeue, a broken pool
    failed each job (``(i, None, BrokenProcessPool)``) and the study went on to test its claims."""
    from runners.executors.local import ProcessExecutor

    def requeue(i, result, times):
        # sent back until the pool breaks (up to 20 s): under load the dying job's worker may start seconds
        # after the other has served the waiting job, which with 5 sends (1 s) then ended normally
        return 0.2 if times < 100 and result.get("status") == "waiting" else None

    seen = {}
    for i, _, exc in ProcessExecutor(2, threads=1).map_jobs(_die_or_wait, [("die",), ("wait",)], requeue):
        seen[i] = type(exc).__name__ if exc else None
    assert seen == {0: "BrokenProcessPool", 1: "BrokenProcessPool"}


# ---- 3. leases written before per-folder keys: never reconciled, counted as another output folder -------
def test_a_folder_s_leases_from_before_the_token_scope_are_reconciled(tmp_path):
    """Was: a folder whose lease store holds leases from before ``<run key>@<token>`` (a worker of it died
    mid-run: its bare-key lease stalled) keeps them forever after the upgrade: reconcile_leases marks only
    the scoped keys, and ``status`` calls the one folder '(2 output folders)' with a stalled and a todo
    run on top of the 2 finished ones (4 runs for a 2-run study)."""
    from runners.leases.store import open_lease_store
    from runners.shared_out import lease_key, write_token
    from study.cluster.jobs import status_counts
    from study.pipeline.stages import Placement, reconcile_leases

    out, runs = tmp_path / "out", tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    store = open_lease_store(out / "leases")
    store.announce("demo", ["k1", "k2"])  # the old code's keys
    assert store.acquire("k1", "host:1", 0.01, "demo")  # its worker then died
    token = write_token(out)
    for k in ("k1", "k2"):  # the upgraded rerun trains both under this folder's keys
        store.announce("demo", [lease_key(k, token)])
        assert store.acquire(lease_key(k, token), "host:2", 60, "demo")
        store.release(lease_key(k, token), "host:2", "finished")
    time.sleep(0.05)
    reconcile_leases(Placement(), runs, ["k1", "k2"])  # the next rerun: both finished on disk
    assert {s: dict(c) for s, c in status_counts(out / "leases").items()} == {"demo": {"finished": 2}}


# ---- 4. study/tracking/cleanup.py heartbeat_s: STUDY_HEARTBEAT_S <= 0 is not refused -----------------------
@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
def test_a_parent_heartbeat_period_that_is_not_positive_is_refused_not_a_busy_loop(monkeypatch, value):
    """Was: STUDY_HEARTBEAT_S=0 made ParentHeartbeat write the tag in a busy loop (~600,000 writes a second
    against the tracking store); a negative value too, and its tag then made every other invocation judge
    the live parent stale at once and mark it KILLED; a non-number was a bare ValueError. Now each is one
    line naming the variable, found before anything is written (``run`` exits 2)."""
    from study.tracking.cleanup import heartbeat_s
    from vitstudy_core.errors import StudyError

    monkeypatch.setenv("STUDY_HEARTBEAT_S", value)
    with pytest.raises(StudyError, match=r"STUDY_HEARTBEAT_S='.*': expected a number of seconds > 0"):
        heartbeat_s()
    monkeypatch.setenv("STUDY_HEARTBEAT_S", "0.5")
    assert heartbeat_s() == 0.5


def test_a_negative_heartbeat_period_does_not_make_a_live_parent_stale():
    """Was: a parent whose tag study.heartbeat_s is negative (STUDY_HEARTBEAT_S=-1) is stale to every other
    host right after a beat, so its live invocation is marked KILLED (is_stale: now - beat > 4 * -1)."""
    from types import SimpleNamespace as NS

    from study.tracking.cleanup import is_stale

    now = time.time()
    tags = {"study.host": "other", "study.heartbeat": f"{now:.3f}", "study.heartbeat_s": "-1"}
    run = NS(data=NS(tags=tags), info=NS(run_id="x"))
    assert not is_stale(run, Path("/nonexistent"), "me", now + 0.5)


# ---- 5. study/sweep/_heartbeat.py fail_stale: a trial another driver failed meanwhile crashes the sweep ----------------
def test_fail_stale_when_another_driver_failed_the_trial_first(tmp_path, monkeypatch):
    """Was: two restarted drivers that both fail a gone driver's trial without heartbeat (one asked by a
    driver from before heartbeats): the second one's set_trial_state_values raises
    UpdateFinishedTrialError out of recover_stale (optuna's own fail_stale_trials catches exactly this
    race). Simulated by a fail_stale_trials that, as the other driver would, fails the trial first."""
    import optuna

    hyp, url, study = _sqlite_sweep(tmp_path)
    old = _asked_on(monkeypatch, study, hyp, "node-b", tmp_path, "none")
    monkeypatch.setattr(sweep_heartbeat, "_hostname", lambda: "node-c")
    again = sweep_storage.open_optuna_study(hyp, tmp_path, url, "s.yaml")
    other = sweep_storage.open_optuna_study(hyp, tmp_path, url, "s.yaml")  # the other restarted driver
    real = optuna.storages.fail_stale_trials

    def racing(s):
        real(s)
        other._storage.set_trial_state_values(old.trial._trial_id, optuna.trial.TrialState.FAIL)

    monkeypatch.setattr(optuna.storages, "fail_stale_trials", racing)
    sweep_heartbeat.fail_stale(again, print)  # raises UpdateFinishedTrialError


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---- 6. study/doctor.py check_store: a folder's copy from before the study.out tag is never a duplicate ----
def test_doctor_counts_a_pre_tag_copy_and_a_forced_relog_of_one_folder_as_duplicates(tmp_path):
    """Was: a folder whose store holds a run logged before the ``study.out`` tag existed and the same run
    logged again after it (``run --force``, which retrains and logs it again) has two FINISHED copies of one
    run key from one folder, but doctor's key (run key, study.out) is (k, None) vs (k, <out>): no
    ``duplicate`` finding, so ``--repair`` keeps both (before 1f6fb84..: reported and the older deleted)."""
    from mlflow.tracking import MlflowClient

    from study.doctor import check_store

    out = tmp_path / "out"
    (out / "mlartifacts").mkdir(parents=True)
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.create_experiment("demo", artifact_location=(out / "mlartifacts" / "demo").as_uri())
    (tmp_path / "spectra.npz").write_bytes(b"x")
    (tmp_path / "result.json").write_text("{}")
    for extra in ({}, {"study.out": str(out.resolve())}):  # before the tag, then --force after it
        tags = {"run_key": "k", "study.role": "training", **extra}
        rid = client.create_run(exp, tags=tags).info.run_id
        client.log_artifact(rid, str(tmp_path / "spectra.npz"))
        client.log_artifact(rid, str(tmp_path / "result.json"))
        client.set_terminated(rid, "FINISHED")
    kinds = [f.kind for f in check_store(out, client)]
    assert kinds.count("duplicate") == 1, kinds


@pytest.mark.parametrize(
    ("verb", "var"),
    [
        ("run", "STUDY_HEARTBEAT_S"),
        ("run", "STUDY_LEASE_TTL"),
        ("sweep", "STUDY_HEARTBEAT_S"),
        ("sweep", "STUDY_LEASE_TTL"),
        ("sweep", "STUDY_TRIAL_HEARTBEAT"),  # `run` has no trials: it never reads this one
    ],
)
def test_a_period_variable_that_is_not_positive_stops_run_and_sweep_before_anything_is_written(
    tmp_path, monkeypatch, capsys, var, verb
):
    """Was: only the lease and parent periods were checked up front; a sweep's STUDY_TRIAL_HEARTBEAT was read
    only when a database storage opened (a journal sweep ignored it). Now each is one line, exit 2, no
    output folder, for both verbs."""
    from study.cli import main
    from tests.conftest import TINY_HYPOTHESIS, TINY_SWEEP

    file, out = tmp_path / "h.yaml", tmp_path / "out"
    file.write_text(TINY_SWEEP if verb == "sweep" else TINY_HYPOTHESIS)
    monkeypatch.setenv(var, "0")
    assert main([verb, str(file), "--out", str(out), "--no-mlflow"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{var}='0': expected a number of seconds > 0" in line, line
    assert not out.exists()
