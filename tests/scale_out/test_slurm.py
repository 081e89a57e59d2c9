"""The Slurm executor on a real single-node Slurm (tests/slurm_cluster.py): the same tables as the local
executor, each run trained once (file leases on the shared ``--out``), failed and cancelled jobs reported
with their job id, state and log, bad input as one line before anything is written.

Without Slurm's binaries these skip (under CI, which installs them, they fail).
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
from tests.conftest import TINY_HYPOTHESIS, TINY_SWEEP, env_for

REPO = Path(__file__).resolve().parents[2]
TWO_RUNS = TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
ONE_RUN = TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0]")  # the default suite's: one task
# a run long enough to be caught mid-epoch on a loaded host: 2048 images an epoch, 6 epochs
LONG_RUNS = TWO_RUNS.replace("epochs: 2", "epochs: 6").replace("n_train: 64", "n_train: 2048")
# a run that outlasts the cancel by far: submitit lets the task's SIGTERM pass, so it trains on until
# SIGKILL, which came 8 s after scancel on this single-node cluster (KillWait 2 s, srun waits 4 s more for
# its step); a LONG_RUNS epoch takes 0.5-1 s, and at 24 epochs a victim cancelled at its second finished
# in that window once (CI, 0.5 s an epoch). At 64 epochs at least 30 s of training are left at the cancel
CANCEL_EPOCHS = 64
CANCEL_RUNS = LONG_RUNS.replace("epochs: 6", f"epochs: {CANCEL_EPOCHS}")
TABLE_COLS = ["run_key", "epoch", "layer", "token_set", "metric"]


def _table(outcome) -> pd.DataFrame:
    return outcome.table.sort_values(TABLE_COLS).reset_index(drop=True)


def trained_once(out: Path, keys: list[str]) -> None:
    """Every run's lease (file leases under ``out/leases``) finished after exactly one attempt."""
    by_key = {le.run_key.split("@")[0]: le for le in open_lease_store(str(out / "leases")).leases()}
    assert {k: (by_key[k].state, by_key[k].attempts) for k in keys} == {k: ("finished", 1) for k in keys}


def test_a_study_on_slurm_gives_the_local_executor_s_tables_bit_for_bit(tmp_path, slurm_cluster, capsys):
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import Placement, RunOptions
    from study.schema import load_hypothesis

    hyp_path = tmp_path / "one.yaml"
    hyp_path.write_text(ONE_RUN)  # one run: one Slurm task, and the local run in this process (cheap)
    hyp = load_hypothesis(hyp_path)
    place = Placement("slurm", options=(("partition", "debug"),))  # one CPU, so one torch thread, per run
    on_slurm = run_study(
        hyp, hyp_path, tmp_path / "slurm", RunOptions(track=False, report=False, placement=place)
    )
    # the local default on CPU: one torch thread per run (one run: in this process)
    local = run_study(hyp, hyp_path, tmp_path / "local", RunOptions(track=False, report=False))
    assert len(on_slurm.trained) == 1 and not on_slurm.failed
    pd.testing.assert_frame_equal(_table(on_slurm), _table(local), check_exact=True)
    assert [r.verdict for r in on_slurm.results] == [r.verdict for r in local.results]
    trained_once(tmp_path / "slurm", on_slurm.trained)
    logs = sorted((tmp_path / "slurm" / "slurm").glob("*/*_log.out"))
    assert len(logs) == 1, logs  # one array task per run, its log under <out>/slurm/<job id>/
    from study.cli import main

    jobs = (tmp_path / "slurm" / "slurm" / "jobs.jsonl").read_text().splitlines()
    [job] = [json.loads(ln)["job_id"] for ln in jobs]
    for _ in range(120):  # its result is back; Slurm may still be ending the task's step
        capsys.readouterr()
        assert main(["status", "--out", str(tmp_path / "slurm")]) == 0
        shown = capsys.readouterr().out
        if "RUNNING" not in shown and "COMPLETING" not in shown:
            break
        time.sleep(0.5)
    # the run with its Slurm job id, state and label
    assert any(ln.split()[:3] == [job, "COMPLETED", "objects/seed0"] for ln in shown.splitlines()), shown


def _study(tmp_path: Path, text: str, *extra: str) -> subprocess.Popen:
    hyp = tmp_path / "study.yaml"
    hyp.write_text(text)
    cmd = [
        sys.executable,
        "-m",
        "study",
        "run",
        str(hyp),
        "--out",
        str(tmp_path / "out"),
        "--executor",
        "slurm",
    ]
    cmd += ["--no-mlflow", "--no-report", *extra]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(), cwd=REPO
    )


def _task_logs(out: Path) -> str:
    """What every Slurm task of the study printed (its runs' progress lines)."""
    return "".join(p.read_text(errors="replace") for p in sorted((out / "slurm").glob("*/*_log.out")))


def _running_past_first_epoch(out: Path, timeout: float = 600) -> str:
    """The run key of a run past its first epoch (``resume.pt``) and not finished, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in (out / "runs").glob("*"):
            if (run / "resume.pt").exists() and not (run / "result.json").exists():
                return run.name
        time.sleep(0.2)
    raise AssertionError("no run reached its first checkpoint")


def _job_of(run_key: str) -> str:
    """The Slurm job id (``12_0``) of the task training ``run_key`` (its name is in the task's log)."""
    for _ in range(100):
        out = subprocess.run(
            ["squeue", "--noheader", "--array", "--format=%i %T"], capture_output=True, text=True
        )
        running = [ln.split()[0] for ln in out.stdout.splitlines() if ln.split()[1:] == ["RUNNING"]]
        if running:
            return running[0] if len(running) == 1 else _job_by_log(run_key, running)
        time.sleep(0.2)
    raise AssertionError(f"no running job for {run_key}")


def _job_by_log(run_key: str, jobs: list[str]) -> str:
    for job in jobs:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        path = next((f.split("=", 1)[1] for f in out.split() if f.startswith("StdOut=")), "")
        if path and run_key in Path(path).read_text(errors="replace"):
            return job
    return jobs[0]


@pytest.mark.slow
def test_a_job_cancelled_mid_epoch_fails_with_its_job_and_a_rerun_resumes_it(tmp_path, slurm_cluster):
    out = tmp_path / "out"
    proc = _study(tmp_path, CANCEL_RUNS, "--slurm-array-parallelism", "1")
    victim = _running_past_first_epoch(out)
    job = _job_of(victim)
    subprocess.run(["scancel", job], check=True)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 1, stdout + stderr
    assert f"Slurm job {job} CANCELLED on node" in stdout, stdout
    assert "1 run(s) failed" in stderr
    again = _study(tmp_path, CANCEL_RUNS)
    stdout, stderr = again.communicate(timeout=900)
    assert again.returncode == 0, stdout + stderr
    assert "resuming after epoch" in _task_logs(out), _task_logs(out)
    result = json.loads((out / "runs" / victim / "result.json").read_text())
    assert [h["epoch"] for h in result["history"]] == list(range(1, CANCEL_EPOCHS + 1))  # each once


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_from_its_last_epoch(tmp_path, slurm_cluster):
    # what Slurm sends before a time limit or on preemption (--signal=USR2@90): submitit requeues the task
    out = tmp_path / "out"
    proc = _study(tmp_path, LONG_RUNS, "--slurm-array-parallelism", "1")
    victim = _running_past_first_epoch(out)
    job = _job_of(victim)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout + stderr
    assert "resuming after epoch" in _task_logs(out), _task_logs(out)
    result = json.loads((out / "runs" / victim / "result.json").read_text())
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4, 5, 6]
    leases = {le.run_key.split("@")[0]: le for le in open_lease_store(str(out / "leases")).leases()}
    assert leases[victim].state == "finished" and leases[victim].attempts == 2  # the requeued task took it
    assert all(le.attempts == 1 for k, le in leases.items() if k != victim)
    states = [e for e in slurm_cluster.ended() if e.get("ArrayJobId") == job.split("_")[0]]
    assert any(e["JobState"] == "REQUEUED" or e["JobState"] == "PREEMPTED" for e in states) or states, states


@pytest.mark.slow
def test_two_drivers_on_one_out_train_each_run_once(tmp_path, slurm_cluster):
    procs = [_study(tmp_path, TWO_RUNS) for _ in range(2)]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stdout + stderr
    trained_once(tmp_path / "out", [p.name for p in (tmp_path / "out" / "runs").iterdir() if p.is_dir()])


@pytest.mark.slow
def test_ctrl_c_on_a_waiting_run_cancels_its_jobs_and_exits_130(tmp_path, slurm_cluster):
    proc = _study(tmp_path, LONG_RUNS)
    _running_past_first_epoch(tmp_path / "out")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stdout + stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted (SIGINT): stopped "), stderr
    left = subprocess.run(
        ["squeue", "--noheader", "--states=PENDING,RUNNING"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--slurm-partition", "nope"],
            "--slurm-partition: unknown partition 'nope'; this cluster has ['debug']",
        ),
        (["--gpus-per-run", "1"], "--executor slurm: Slurm would refuse the runs' jobs"),
        (["--gpus-per-run", "0.5"], "Slurm allocates whole CPUs and GPUs"),
        (["--slurm-arg", "account"], "--slurm-arg: expected KEY=VALUE"),
    ],
)
def test_bad_slurm_input_is_one_line_before_anything_is_written(tmp_path, slurm_cluster, flags, expected):
    proc = _study(tmp_path, TWO_RUNS, *flags)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stdout + stderr
    assert expected in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # sinfo retries for ~10 s before it gives up
def test_a_controller_that_does_not_answer_is_one_line(tmp_path, monkeypatch, capsys):
    from study.cli import main

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    (tmp_path / "slurm.conf").write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=1\n")
    if not any(Path(p, "sinfo").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("no sinfo here")
    hyp = tmp_path / "two.yaml"
    hyp.write_text(TWO_RUNS)
    code = main(["run", str(hyp), "--out", str(tmp_path / "out"), "--executor", "slurm", "--no-mlflow"])
    err = capsys.readouterr().err
    assert (
        code == 2 and "the Slurm controller did not answer" in err and len(err.strip().splitlines()) == 1
    ), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_submit_returns_at_once_and_the_driver_job_runs_the_study(tmp_path, slurm_cluster):
    hyp = tmp_path / "study.yaml"
    hyp.write_text(TWO_RUNS)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "study", "submit", str(hyp), "--executor", "slurm", "--out", str(out)]
    cmd += ["--no-mlflow", "--no-report", "--slurm-partition", "debug"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env_for(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    job = done.stdout.split("Slurm job ")[1].split()[0]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "--noheader", "--states=all", "--jobs", job, "--format=%T"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if state and state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            break
        time.sleep(1)
    log = (out / "slurm" / f"driver-{job}.log").read_text()
    assert state == "COMPLETED", log
    assert (out / "studies" / "tiny" / "verdicts.json").exists(), log
    trained_once(out, [p.name for p in (out / "runs").iterdir() if p.is_dir()])
    status = [sys.executable, "-m", "study", "status", "--out", str(out)]
    for _ in range(60):  # the runs' results are back; Slurm may still be ending their steps
        shown = subprocess.run(status, capture_output=True, text=True, env=env_for(), cwd=REPO).stdout
        if shown.count("COMPLETED") == 2:
            break
        time.sleep(1)
    assert shown.count("COMPLETED") == 2, shown  # each run's array task, with its job id


@pytest.mark.slow
def test_a_sweep_runs_its_trials_runs_as_array_tasks(tmp_path, slurm_cluster):
    hyp = tmp_path / "sweep.yaml"
    hyp.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "study", "sweep", str(hyp), "--out", str(out), "--executor", "slurm"]
    done = subprocess.run(
        [*cmd, "--no-mlflow", "--no-report"], capture_output=True, text=True, env=env_for(), cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3/3 trials complete" in done.stdout, done.stdout
    runs = [p.name for p in (out / "runs").iterdir() if p.is_dir()]
    trained_once(out, runs)
    tasks = [json.loads(ln) for ln in (out / "slurm" / "jobs.jsonl").read_text().splitlines()]
    assert sorted(t["run"] for t in tasks) == sorted(runs)  # one Slurm task per run


def test_submit_to_ray_without_an_address_is_one_line(tmp_path, capsys):
    from study.cli import main

    hyp = tmp_path / "two.yaml"
    hyp.write_text(TWO_RUNS)
    assert main(["submit", str(hyp), "--out", str(tmp_path / "out")]) == 2
    assert "--address is required with --executor ray" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_task_that_does_not_see_out_fails_with_one_line_naming_its_node(tmp_path, slurm_cluster):
    import socket

    from runners.executors.jobs import execute_claimed_run
    from runners.executors.local import make_executor
    from runners.shared_out import OutNotShared, write_token

    out = tmp_path / "out"
    write_token(out)  # the task is handed another study's token: as a node whose --out is a private folder
    job = (
        {"key": "k", "seed": 0},
        str(out / "runs" / "k"),
        str(out / "data"),
        str(out / "leases"),
        "s",
        "other",
    )
    executor = make_executor(1, 1, False, "slurm", out=out, options={"partition": "debug"})
    [(i, result, exc)] = list(executor.map_jobs(execute_claimed_run, [job]))
    assert result is None and isinstance(exc, OutNotShared), exc
    assert str(exc).startswith(f"host {socket.gethostname()} does not see the study's output folder"), exc
    assert "\n" not in str(exc) and not (out / "runs" / "k").exists()
