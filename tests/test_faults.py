"""Fault injection: a kill (or an exception) at every named point of a study, then the same command again.

After the rerun the verdicts equal an undisturbed run's, every planned run is FINISHED in the store exactly
once, no parent run is left RUNNING, and no half-written file remains. One kill-and-rerun runs in the
default suite; the rest are ``slow``.
"""

from __future__ import annotations

import pytest

from study.runspecs import plan_runs
from study.schema import load_hypothesis
from tests.studyproc import half_written, run, store_state, study_cmd, verdicts
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


def _kill_and_rerun(baseline, tmp_path, fault: str, report: bool = False) -> None:
    hyp, expected, keys = baseline
    out = tmp_path / "out"
    first = run(study_cmd(hyp, out, report=report), fault=fault)
    # a kill ends the invocation; an exception inside a run fails that run and the study goes on
    assert first.returncode != 0 or "injected fault" in first.stdout, f"the fault {fault} never fired"
    again = run(study_cmd(hyp, out, report=report))
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert verdicts(out) == expected
    assert half_written(out) == []
    state = store_state(out)
    assert state["finished"] == dict.fromkeys(keys, 1), state  # every run once: none lost, none twice
    assert state["parents"].get("RUNNING", 0) == 0, state  # the killed invocation's parent: KILLED
    assert state["running_children"] == 0, state


def test_kill_during_training_then_rerun(baseline, tmp_path):
    # seed 1's first epoch: seed 0 finished before the kill and must still reach the store
    _kill_and_rerun(baseline, tmp_path, "train.epoch@3:kill")


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
