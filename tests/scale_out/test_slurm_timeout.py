"""A Slurm job past its time limit (``--slurm-time 1``, Slurm's least) on a real single-node Slurm
(tests/slurm_cluster.py): requeued, or failed as TIMEOUT with its job id and log and resumed by a
rerun, it ends with the tables of an undisturbed local run, every epoch trained once.

``--slurm-time 1`` with submitit's ``--signal=USR2@90``: the controller signals the task at its first
time-limit check (every 30 s), before the limit; the task requeues itself (at most
``runners.executors.slurm.MAX_TIMEOUT_REQUEUES`` times) and resumes from its last complete epoch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from runners.leases.store import open_lease_store
from tests.scale_out.test_slurm import LONG_RUNS, TABLE_COLS, _running_past_first_epoch, _study, _task_logs

# one run of about 60 s undisturbed (8192 images an epoch, 40 epochs): past its first signal at least once
EPOCHS = 40
ONE_LONG = (
    LONG_RUNS.replace("seeds: [0, 1]", "seeds: [0]")
    .replace("epochs: 6", f"epochs: {EPOCHS}")
    .replace("n_train: 2048", "n_train: 8192")
)


@pytest.mark.slow
def test_a_job_past_its_time_limit_is_requeued_or_rerun_and_ends_with_the_local_tables(
    tmp_path, slurm_cluster
):
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import RunOptions
    from study.schema import load_hypothesis

    out = tmp_path / "out"
    proc = _study(tmp_path, ONE_LONG, "--slurm-time", "1")
    stdout, stderr = proc.communicate(timeout=900)
    assert (out / "slurm" / "jobs.jsonl").exists(), stdout + stderr
    [job] = {json.loads(ln)["job_id"] for ln in (out / "slurm" / "jobs.jsonl").read_text().splitlines()}
    if proc.returncode != 0:  # every requeue spent before the run ended: one line, and a rerun resumes it
        assert proc.returncode == 1, stdout + stderr
        [line] = [ln for ln in stdout.splitlines() if "FAILED: SlurmJobFailed: " in ln]
        assert (
            f"Slurm job {job} TIMEOUT on node " in line and "time limit reached after 3 requeues" in line
        ), line
        assert "; log " in line and "; last lines: " in line, line
        assert "1 run(s) failed" in stderr, stderr
        again = _study(tmp_path, ONE_LONG)
        stdout, stderr = again.communicate(timeout=900)
        assert again.returncode == 0, stdout + stderr
    logs = _task_logs(out)
    assert "resuming after epoch" in logs, logs  # the time limit interrupted it at least once
    [run] = [p for p in (out / "runs").iterdir() if p.is_dir()]
    result = json.loads((run / "result.json").read_text())
    assert [h["epoch"] for h in result["history"]] == list(range(1, EPOCHS + 1))  # every epoch once
    [lease] = open_lease_store(str(out / "leases")).leases()
    assert lease.state == "finished"
    hyp_path = tmp_path / "study.yaml"
    local = run_study(
        load_hypothesis(hyp_path), hyp_path, tmp_path / "local", RunOptions(track=False, report=False)
    )
    on_slurm = pd.read_parquet(out / "studies" / "tiny" / "table.parquet")
    pd.testing.assert_frame_equal(
        on_slurm.sort_values(TABLE_COLS).reset_index(drop=True),
        local.table.sort_values(TABLE_COLS).reset_index(drop=True),
        check_exact=True,
    )


class _FakeJob:
    """What ``runners.executors.slurm._outcome`` reads of a submitit job: its id, paths and state watcher."""

    def __init__(self, folder, value):
        import pickle
        from types import SimpleNamespace

        self.job_id = "7_0"
        self.paths = SimpleNamespace(
            result_pickle=folder / "7_0_result.pkl",
            stderr=folder / "7_0_log.err",
            stdout=folder / "7_0_log.out",
        )
        self.paths.result_pickle.write_bytes(pickle.dumps(value))
        self.paths.stderr.write_text(
            "[objects/seed0] epoch 3/40 loss 2.1\nsrun: error: n1: task 0: Exited with exit code 255\n"
        )
        self.watcher = SimpleNamespace(
            get_info=lambda *a, **k: {"NodeList": "n1"}, get_state=lambda *a, **k: "FAILED"
        )


def test_a_task_past_its_last_requeue_fails_as_timeout_with_its_job_and_log(tmp_path):
    UncompletedJobError = pytest.importorskip("submitit.core.utils").UncompletedJobError

    from runners.executors.slurm import SlurmJobFailed, _outcome

    why = "Job not requeued because: timed-out too many times."
    # raised by submitit's signal handler inside the run (sent back as the run's own error), or outside it
    for value in [
        ("success", (False, UncompletedJobError(why))),
        ("error", f"Traceback ...\nsubmitit.core.utils.UncompletedJobError: {why}\n"),
    ]:
        result, exc = _outcome(_FakeJob(tmp_path, value))
        assert result is None and isinstance(exc, SlurmJobFailed), exc
        text = str(exc)
        assert text.startswith("Slurm job 7_0 TIMEOUT on node n1 (time limit reached after 3 requeues: "), (
            text
        )
        assert f"; log {tmp_path / '7_0_log.err'}; last lines: " in text and "exit code 255" in text, text


def _task_pids(out) -> list[int]:
    """The process ids of the Slurm tasks running jobs of ``out`` (submitit's ``_submit`` processes)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in cmd and any(str(out).encode() in c for c in cmd):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_a_task_killed_by_a_signal_is_reported_with_its_job_state_and_log(tmp_path, slurm_cluster):
    # as the kernel's OOM killer ends a task: SIGKILL to its process, no chance to write a result
    import os
    import signal

    out = tmp_path / "out"
    proc = _study(tmp_path, ONE_LONG)
    _running_past_first_epoch(out)
    [job] = {json.loads(ln)["job_id"] for ln in (out / "slurm" / "jobs.jsonl").read_text().splitlines()}
    pids = _task_pids(out)
    assert pids, "no task process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stdout + stderr
    [line] = [ln for ln in stdout.splitlines() if "FAILED: SlurmJobFailed: " in ln]
    assert f"Slurm job {job} FAILED on node " in line, line
    assert f"; log {out / 'slurm'}" in line and "; last lines: " in line, line
