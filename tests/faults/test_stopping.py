"""How a study stops: Ctrl-C and SIGTERM stop the workers (none left behind, no queued run started), a full
disk or a lost store stops the study instead of costing a seed, a run's thread count does not depend on
what else is pending, and a partial child run in the store is retired once the run is FINISHED.

Everything here is in-process or spawns a few sleeping workers (seconds); the same behaviour through the
CLI, with real training, is in tests/faults/test_faults.py.
"""

from __future__ import annotations

import errno
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from runners.executors.local import InlineExecutor, ProcessExecutor, make_executor, run_threads
from vitstudy_core.errors import Interrupted, MachineError, RunFailedError, StudyError, machine_fault


# ---- thread counts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", ["auto", 1, 2, 3])
def test_a_runs_thread_count_does_not_depend_on_what_is_pending(monkeypatch, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    seen = set()
    for n_jobs in range(1, 10):  # a fresh study, a resume with fewer runs left, a last run alone
        ex = make_executor(workers, n_jobs, cuda=False)
        seen.add(ex.threads)
    assert seen == {run_threads(workers, 8)} == {1 if workers == "auto" else 8 // workers}


def test_gpu_auto_keeps_torch_default_threads():
    assert run_threads("auto", 8, cuda=True) is None
    assert isinstance(make_executor("auto", 3, cuda=True), InlineExecutor)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_inline_jobs_get_their_threads_and_the_process_keeps_its_own():
    import torch

    before = torch.get_num_threads()
    out = list(InlineExecutor(threads=1).map_jobs(torch_threads, [(), ()]))
    assert out == [(0, 1, None), (1, 1, None)]
    assert torch.get_num_threads() == before


# ---- signals -----------------------------------------------------------------------------------------
def start_then_sleep(marker_dir: str, i: int) -> int:
    """A job that says it started (a file), then sleeps: long enough to be interrupted."""
    Path(marker_dir, f"started{i}").write_text(str(os.getpid()))
    time.sleep(60)
    return i


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_ctrl_c_stops_every_worker_and_starts_no_queued_job(tmp_path):
    # Python's own Ctrl-C handler, as a terminal user's process has it, whatever an earlier test in this
    # worker process left installed
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_case(tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)


def _ctrl_c_case(tmp_path) -> None:
    ex = ProcessExecutor(2, threads=1)
    started = lambda: sorted(tmp_path.glob("started*"))  # noqa: E731

    def interrupt() -> None:  # Ctrl-C once both workers are busy, as a terminal sends it
        _wait_for(lambda: len(started()) == 2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(ex.map_jobs(start_then_sleep, [(str(tmp_path), i) for i in range(4)]))
    assert time.monotonic() - t0 < 50  # not after the 60 s jobs ran out
    pids = [int(p.read_text()) for p in started()]
    assert len(pids) == 2 and ex.stopped == 2  # the two queued jobs never started
    assert not any(_alive(pid) for pid in pids)  # and the two running ones are gone


WATCHED = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from runners.executors.local import ProcessExecutor
from tests.faults.test_stopping import start_then_sleep

if __name__ == "__main__":
    list(ProcessExecutor(2, threads=1).map_jobs(start_then_sleep, [({tmp!r}, i) for i in range(2)]))
"""


def test_workers_exit_when_their_caller_is_killed(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(WATCHED.format(root=str(Path(__file__).parents[2]), tmp=str(tmp_path))))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        _wait_for(lambda: len(list(tmp_path.glob("started*"))) == 2)
        pids = [int(p.read_text()) for p in tmp_path.glob("started*")]
        proc.kill()  # SIGKILL: the caller cannot stop its workers itself
        proc.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=10)
    finally:
        proc.kill()


def test_sigterm_is_an_interruption_and_a_second_signal_does_not_cut_the_stop_short():
    from study.pipeline.stopping import stopping_cleanly

    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or what an earlier test's library installed (Ray)
    with pytest.raises(Interrupted) as got, stopping_cleanly():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert (got.value.signum, got.value.exit_code) == (signal.SIGTERM, 143)
    assert got.value.line() == (
        "interrupted (SIGTERM): stopped 0 running run(s); rerun the same command to resume"
    )
    with pytest.raises(Interrupted) as got, stopping_cleanly():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:  # the clean-up after the first signal: a second one is ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
    assert got.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers before are restored


# ---- a full disk or a lost store --------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_refused_write_is_the_machines_fault_and_names_the_path(code):
    fault = machine_fault(OSError(code, os.strerror(code), "/out/runs/k/spectra.npz"))
    assert isinstance(fault, MachineError) and fault.file == "/out/runs/k/spectra.npz"
    assert os.strerror(code) in str(fault)


def test_a_lost_store_is_the_machines_fault_through_the_libraries_wrapping():
    # what MLflow raises: its own exception, from SQLAlchemy's, from sqlite's
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            raise RuntimeError("INTERNAL_ERROR: log_batch failed") from exc
    except RuntimeError as exc:
        fault = machine_fault(exc, store="/out/mlflow.db")
    assert fault is not None and fault.file == "/out/mlflow.db" and "database or disk is full" in str(fault)
    # torch's writer hides the errno: the OSError is the exception it was raised during
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # noqa: B904
    except RuntimeError as exc:
        assert machine_fault(exc) is not None


@pytest.mark.parametrize(
    "exc",
    [
        RunFailedError("loss is NaN at epoch 2", 2),
        ValueError("a bug"),
        StudyError("expected a positive integer", "h.yaml", "seeds"),
        OSError(errno.ENOENT, "No such file or directory", "x"),
    ],
)
def test_a_runs_own_failure_is_not_the_machines(exc):
    assert machine_fault(exc) is None


def test_a_machine_error_reaches_the_study_whole_from_a_worker():
    err = MachineError("cannot write (No space left on device)", "/out/runs/k/result.json")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MachineError and back.file == err.file and str(back) == str(err)
    assert back.exit_code == 2


class _FullDisk:
    """Stands in for the ``train`` source: seed 1 meets a full disk, seed 2 fails on its own (NaN)."""

    def __init__(self, disk_full: bool):
        from tests.planted import PlantedSource

        self.planted, self.disk_full = PlantedSource(0.5), disk_full

    def fill(self, run, run_dir, data_dir, progress=None, bar=False):
        from vitstudy_core.runfolder import RunFolder

        if run["seed"] == 1 and self.disk_full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(run_dir) / "resume.pt"))
        if run["seed"] == 2:
            result = {"status": "failed", "failed_epoch": 1, "error": "loss is NaN", "run": run}
            RunFolder(run_dir).write_result(result)
            return result
        return self.planted.fill(run, run_dir, data_dir, progress, bar)


def _run_planted(monkeypatch, tmp_path, source):
    import runners.sources
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import RunOptions
    from study.schema import load_hypothesis
    from tests.planted import DIFF, write_planted

    train = runners.sources.SOURCES["train"]
    for method in ("check", "prepare"):
        monkeypatch.setattr(train, method, getattr(source.planted, method))
    monkeypatch.setattr(train, "fill", source.fill)
    hyp = write_planted(tmp_path, [DIFF], seeds=(0, 1, 2, 3))
    opts = RunOptions(workers=1, track=False, report=False)
    return run_study(load_hypothesis(hyp), Path(hyp), tmp_path / "out", opts, log=lambda s: None)


def test_a_full_disk_stops_the_study_instead_of_dropping_the_seed(monkeypatch, tmp_path):
    with pytest.raises(MachineError) as got:
        _run_planted(monkeypatch, tmp_path, _FullDisk(disk_full=True))
    assert got.value.file.endswith("resume.pt") and "while filling run objects/seed1" in str(got.value)
    assert "rerun the same command to resume" in str(got.value)
    assert not (tmp_path / "out" / "studies" / "tiny" / "verdicts.json").exists()  # no verdict on fewer seeds
    # space freed: the same command goes on; the seed that failed on its own (NaN) is the only one left out
    outcome = _run_planted(monkeypatch, tmp_path, _FullDisk(disk_full=False))
    assert list(outcome.failed.values()) == ["failed at epoch 1: loss is NaN"]
    assert (outcome.study_dir / "verdicts.json").exists() and len(outcome.table.seed.unique()) == 3


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every run has one thread anyway")
def test_a_resumed_run_is_bitwise_the_undisturbed_one_whatever_else_is_pending(tmp_path):
    # undisturbed: seeds 0 and 1 side by side (two workers); resumed: seed 0's finished folder copied into a
    # fresh output folder, so seed 1 trains alone (in-process). Same key, same thread count, same bits.
    import shutil

    import numpy as np

    from study.runspecs import plan_runs
    from study.schema import load_hypothesis
    from tests.conftest import TINY_HYPOTHESIS
    from tests.studyproc import run

    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1]"))
    keys = [s.key for s in plan_runs(load_hypothesis(hyp))]

    def study(out: Path) -> None:
        cmd = [sys.executable, "-m", "study", "run", str(hyp), "--out", str(out), "--workers", "auto"]
        done = run([*cmd, "--no-mlflow", "--no-report"])
        assert done.returncode == 0, done.stderr

    study(tmp_path / "a")
    shutil.copytree(tmp_path / "a" / "runs" / keys[0], tmp_path / "b" / "runs" / keys[0])
    study(tmp_path / "b")
    with np.load(tmp_path / "a" / "runs" / keys[1] / "spectra.npz") as a:
        with np.load(tmp_path / "b" / "runs" / keys[1] / "spectra.npz") as b:
            assert sorted(a.files) == sorted(b.files)
            for k in a.files:
                assert a[k].tobytes() == b[k].tobytes(), k


def test_a_killed_partial_child_is_retired_once_its_run_is_logged_finished(tmp_path, monkeypatch):
    # an invocation died while logging seed 0: its child run was left, then marked KILLED (close_stale);
    # the next run logs the FINISHED child, and the partial one is no longer shown beside it
    import json

    from study.doctor import doctor
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import RunOptions
    from study.schema import load_hypothesis
    from study.tracking.tracker import Tracker, training_runs
    from tests.conftest import BEHAVIOUR, write_runs

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    hyp, out = write_runs(tmp_path)  # finished run folders: nothing trains
    key = json.loads((BEHAVIOUR / "tiny_keys.json").read_text())["0"]
    with Tracker(out, "tiny") as t:
        tags = {"run_key": key, "study.role": "training", "mlflow.parentRunId": t.parent_id}
        stale = t.client.create_run(t.experiment_id, tags=tags).info.run_id
        t.client.set_terminated(stale, "KILLED")
    run_study(load_hypothesis(hyp), hyp, out, RunOptions(workers=1, report=False), log=lambda s: None)
    client = t.client
    assert client.get_run(stale).info.lifecycle_stage == "deleted"
    assert [r.data.tags["run_key"] for r in training_runs(client, "KILLED")] == []
    assert sum(r.data.tags["run_key"] == key for r in training_runs(client)) == 1
    client.restore_run(stale)  # one left behind (an older version): doctor finds it and agrees
    lines: list[str] = []
    assert doctor(out, repair=True, log=lines.append) == 0
    assert any(line.startswith("superseded_child") and "[repaired]" in line for line in lines), lines
    assert client.get_run(stale).info.lifecycle_stage == "deleted"
