"""Fault injection: a kill (or an exception) at every named point of a study, then the same command again.

After the rerun the verdicts equal an undisturbed run's, every planned run is FINISHED in the store exactly
once and is its key's only visible child run, no parent run is left RUNNING, no half-written file remains,
and ``doctor`` finds nothing. Ctrl-C and SIGTERM (``STUDY_FAULT=...:sigint`` / ``:sigterm``, sent from inside
a run as a terminal or a process manager would) stop the study with one line and exit 130 / 143, leaving
no process behind; a full disk or a lost store (``:enospc`` / ``:dbfull``) stops it with one line naming
the path and exit 2, never a verdict over fewer seeds. One kill-and-rerun and one Ctrl-C run in the
default suite; the rest are ``slow``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from study.runspecs import plan_runs
from study.schema import load_hypothesis
from tests.studyproc import half_written, run, start, store_state, study_cmd, verdicts
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import POINTS, InjectedFault, check_env, fault_point


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    from tests.conftest import TINY_HYPOTHESIS

    root = tmp_path_factory.mktemp("baseline")
    hyp = root / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    done = run(study_cmd(hyp, root / "out"))
    assert done.returncode == 0, done.stderr
    keys = {s.key for s in plan_runs(load_hypothesis(hyp))}
    return hyp, verdicts(root / "out"), keys


def _kill_and_rerun(baseline, tmp_path, fault: str, report: bool = False, workers: int = 1, after=None):
    """The command with ``fault``, then again without; ``after(first, pid)`` checks the first before."""
    hyp, expected, keys = baseline
    out = tmp_path / "out"
    proc = start(study_cmd(hyp, out, report=report, workers=workers), fault=fault)
    stdout, stderr = proc.communicate(timeout=600)
    first = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if after is not None:
        after(first, proc.pid)
    # a kill ends the invocation; an exception inside a run fails that run and the study goes on
    assert first.returncode != 0 or "injected fault" in first.stdout, (
        f"the fault {fault} never fired, or the study went on past it (exit 0)"
    )
    again = run(study_cmd(hyp, out, report=report, workers=workers))
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert verdicts(out) == expected
    assert half_written(out) == []
    state = store_state(out)
    assert state["finished"] == dict.fromkeys(keys, 1), state  # every run once: none lost, none twice
    assert state["visible"] == dict.fromkeys(keys, 1), state  # and no partial copy beside it
    assert state["parents"].get("RUNNING", 0) == 0, state  # the killed invocation's parent: KILLED
    assert state["running_children"] == 0, state
    from study.doctor import doctor

    lines: list[str] = []
    assert doctor(out, log=lines.append) == 0 and lines == ["doctor: 0 finding(s)"], lines
    return first


def test_kill_during_training_then_rerun(baseline, tmp_path):
    # seed 1's first epoch: seed 0 finished before the kill and must still reach the store; seed 1's lease
    # belonged to a process that is gone, so the rerun takes it at once (not after the 60 s lease time)
    _kill_and_rerun(baseline, tmp_path, "train.epoch@3:kill")


def _one_line(first, code: int, starts: str) -> None:
    assert first.returncode == code, (first.returncode, first.stderr)
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), first.stderr


def test_ctrl_c_stops_the_study_then_rerun(baseline, tmp_path):
    # Ctrl-C (SIGINT to the whole process group) in seed 1's first epoch: seed 2 never starts, the
    # parent is KILLED, one line and 130; the rerun resumes seed 1 and matches an undisturbed study
    first = _kill_and_rerun(baseline, tmp_path, "train.epoch@3:sigint")
    _one_line(first, 130, "interrupted (SIGINT): stopped 1 running run(s); rerun the same command")
    assert "[objects/seed2]" not in first.stdout and "[objects/seed1] spectra at epoch 0" in first.stdout
    assert store_state(tmp_path / "out")["parents"] == {"KILLED": 1, "FINISHED": 1}


def _group_left(pgid: int) -> list[int]:
    """Processes still alive (zombies aside) in process group ``pgid``."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            left.append(int(stat.parent.name))
    return left


@pytest.fixture(scope="module")
def baseline2(tmp_path_factory):
    """The undisturbed study with two worker processes (one torch thread per run)."""
    from tests.conftest import TINY_HYPOTHESIS

    root = tmp_path_factory.mktemp("baseline2")
    hyp = root / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    done = run(study_cmd(hyp, root / "out", workers=2))
    assert done.returncode == 0, done.stderr
    keys = {s.key for s in plan_runs(load_hypothesis(hyp))}
    return hyp, verdicts(root / "out"), keys


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [("sigint", 130), ("sigterm", 143)])
def test_a_signal_stops_every_worker_then_rerun(baseline2, tmp_path, sig, code):
    # two workers each send it in their first epoch (SIGINT to the group as a terminal does, SIGTERM to
    # the main process as a process manager does): both runs stop, seed 2 never starts, nothing is left

    def after(first, pgid: int) -> None:
        _one_line(first, code, "interrupted (SIG")
        assert "stopped 2 running run(s)" in first.stderr and "[objects/seed2]" not in first.stdout
        deadline = time.monotonic() + 10  # the workers went with it (multiprocessing's tracker just after)
        while _group_left(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _group_left(pgid) == []
        assert store_state(tmp_path / "out")["parents"] == {"KILLED": 1}

    _kill_and_rerun(baseline2, tmp_path, f"train.epoch@1:{sig}", workers=2, after=after)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault", ["checkpoint.write@2:enospc", "train.epoch@3:enospc", "mlflow.log@2:dbfull"]
)
def test_a_full_disk_stops_the_study_then_rerun(baseline, tmp_path, fault):
    # the disk fills (or the store does) partway: exit 2 with one line naming the path, no verdict over
    # fewer seeds; with space again, the same command matches an undisturbed study
    first = _kill_and_rerun(baseline, tmp_path, fault)
    where = "mlflow.db: the tracking store failed" if "dbfull" in fault else "cannot write (No space left"
    _one_line(first, 2, f"error: {tmp_path / 'out'}")
    assert where in first.stderr and "rerun the same command to resume" in first.stderr
    assert "FAILED" not in first.stdout
    assert store_state(tmp_path / "out")["parents"] == {"FAILED": 1, "FINISHED": 1}


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    [
        "train.epoch@1:kill",
        "checkpoint.write@2:kill",
        "extract@2:kill",
        "mlflow.log@2:kill",
        "table.write:kill",
        "report.write:kill",
        "store.create:kill",
        "train.epoch@2:raise",
        "mlflow.log:raise",
        "table.write:raise",
    ],
)
def test_fault_at_every_stage_then_rerun(baseline, tmp_path, fault):
    _kill_and_rerun(baseline, tmp_path, fault, report=fault.startswith("report"))


def test_fault_env_is_checked(monkeypatch):
    monkeypatch.setattr("vitstudy_core.faults._hits", {})
    monkeypatch.setenv("STUDY_FAULT", "nowhere:kill")
    with pytest.raises(StudyError, match="STUDY_FAULT"):
        check_env()
    monkeypatch.setenv("STUDY_FAULT", "table.write@2:raise")
    check_env()
    fault_point("table.write")  # the first hit passes
    with pytest.raises(InjectedFault):
        fault_point("table.write")
    fault_point("extract")  # another point never fires
    assert "table.write" in POINTS


@pytest.mark.slow
def test_ctrl_c_stops_a_sweep_then_rerun(tmp_path):
    # the same through `sweep`: one line, 130, the sweep's parent KILLED; the rerun finishes every trial
    from mlflow.tracking import MlflowClient

    from tests.conftest import TINY_SWEEP

    hyp, out = tmp_path / "sweep.yaml", tmp_path / "out"
    hyp.write_text(TINY_SWEEP)
    cmd = [
        sys.executable,
        "-m",
        "study",
        "sweep",
        str(hyp),
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-report",
    ]
    first = run(cmd, fault="train.epoch@2:sigint")
    _one_line(first, 130, "interrupted (SIGINT): stopped 1 running run(s)")
    again = run(cmd)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny_sweep.sweep")
    parents = client.search_runs([exp.experiment_id], "tags.`study.role` = 'sweep'")
    assert sorted(r.info.status for r in parents) == ["FINISHED", "KILLED"]
    assert store_state(out)["visible"] == store_state(out)["finished"]
    assert set(store_state(out)["finished"].values()) == {1}
