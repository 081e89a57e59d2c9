"""Disk full, read-only folders, the doctor, the ui's process group and quiet library logs."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from study.cli import main
from vitstudy_core.errors import StudyError
from vitstudy_core.io import atomic_write_text


def _fail_write(code: int):
    def write_text(self, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(self))

    return write_text


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_failed_write_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch, code):
    target = tmp_path / "verdicts.txt"
    atomic_write_text(target, "old")
    monkeypatch.setattr("pathlib.Path.write_text", _fail_write(code))
    with pytest.raises(StudyError, match=str(target)) as info:
        atomic_write_text(target, "new")
    assert os.strerror(code) in str(info.value) and "\n" not in str(info.value)
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["verdicts.txt"]  # no temporary file left


def test_disk_full_during_a_study_exits_2_naming_the_path(tiny_yaml, tmp_path, monkeypatch, capsys):
    import pandas as pd

    def full(self, path, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    out = tmp_path / "out"
    rc = main(["run", str(tiny_yaml), "--out", str(out), "--workers", "1", "--no-mlflow", "--no-report"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "table.parquet" in err, err
    assert "No space left on device" in err
    assert not (out / "studies" / "tiny" / "table.parquet").exists()
    assert all((p / "result.json").is_file() for p in (out / "runs").iterdir() if p.is_dir())


def test_doctor_finds_and_repairs(tiny_yaml, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from study.tracking.store import default_tracking_uri
    from study.tracking.tracker import training_runs

    out = tmp_path / "out"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--workers", "1", "--no-report"]) == 0
    client = MlflowClient(default_tracking_uri(out))
    child = training_runs(client)[0]
    # a run key recorded twice, a stale RUNNING parent, a table that no longer matches, an orphan folder
    dup = client.create_run(child.info.experiment_id, tags={**child.data.tags})
    for name in ("spectra.npz", "result.json"):
        client.log_artifact(dup.info.run_id, str(out / "runs" / child.data.tags["run_key"] / name))
    client.set_terminated(dup.info.run_id, "FINISHED")
    broken = client.create_run(child.info.experiment_id, tags={**child.data.tags, "run_key": "f" * 16})
    client.set_terminated(broken.info.run_id, "FINISHED")
    stale = client.create_run(
        child.info.experiment_id, tags={"study.role": "study", "study.host": os.uname()[1]}
    )
    (out / "runs" / "0123456789abcdef").mkdir()
    (out / "studies" / "tiny" / "table.parquet").write_bytes(b"junk")
    capsys.readouterr()
    assert main(["doctor", "--out", str(out)]) == 1
    report = capsys.readouterr().out
    for kind in (
        "duplicate",
        "stale_parent",
        "table_mismatch",
        "orphan",
        "stale_partial",
        "missing_artifacts",
    ):
        assert kind in report, report
    assert main(["doctor", "--out", str(out), "--repair"]) == 0
    assert client.get_run(stale.info.run_id).info.status == "KILLED"
    capsys.readouterr()
    assert main(["doctor", "--out", str(out)]) == 0
    assert "0 left" in capsys.readouterr().out


def test_doctor_counts_a_report_only_finding_as_reported_not_as_repaired(tmp_path):
    """An unplanned, unfinished folder without a lock (orphan, stale_partial) is only reported: the summary
    says so, rather than "2 finding(s), 0 repaired, 0 left"."""
    from study.doctor import doctor

    (tmp_path / "runs" / "0123456789abcdef").mkdir(parents=True)
    for repair in (False, True):
        lines: list[str] = []
        assert doctor(tmp_path, repair=repair, log=lines.append) == 0
        assert lines[0].startswith("orphan"), lines
        assert all("report only" in line for line in lines[:-1] if not line.startswith("repair:")), lines
        assert lines[-1] == "doctor: 2 finding(s): 0 repaired, 2 report only, 0 left to repair", lines


def test_fresh_store_prints_no_library_logs(tmp_path):
    from tests.studyproc import run

    code = f"from pathlib import Path; from study.tracking.tracker import Tracker; Tracker(Path({str(tmp_path)!r}), 'x')"
    done = run([sys.executable, "-c", code])
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    assert (tmp_path / "mlflow.db").is_file()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def test_ui_sigterm_stops_the_server_group(tmp_path):
    from tests.studyproc import ROOT

    (tmp_path / "mlflow.db").write_bytes(b"")
    # a stand-in server: the ui verb starts `python -m mlflow ui`; a fake mlflow that forks a worker
    fake = tmp_path / "fake" / "mlflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(
        "import subprocess, sys, time\n"
        "import os\n"
        "open(os.environ['FAKE_PID_FILE'], 'w').write(str(subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(300)']).pid))\n"
        "time.sleep(300)\n"
    )
    env_path = f"{fake.parent}{os.pathsep}{ROOT}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "study", "ui", "--out", str(tmp_path), "--port", "5999"],
        env={**os.environ, "PYTHONPATH": env_path, "FAKE_PID_FILE": str(tmp_path / "w.pid")},
        start_new_session=True,
    )
    pid_file = tmp_path / "w.pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    for _ in range(50):
        if not _alive(worker):
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the server's worker outlived `python -m study ui`")


def test_bad_tracking_uri_is_one_line(tiny_yaml, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://nowhere")
    rc = main(["run", str(tiny_yaml), "--out", str(tmp_path / "out"), "--workers", "1", "--no-report"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "MLFLOW_TRACKING_URI" in err, err
    assert not (tmp_path / "out" / "runs").exists()  # nothing trained


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_doctor_reports_every_damage_before_repairing_any(tiny_yaml, tmp_path, capsys):
    """A truncated spectra.npz is one finding among the others (no crash); --repair touches nothing until
    the whole report is printed, then restores the run from the store's intact copy."""
    from mlflow.tracking import MlflowClient

    from study.doctor import doctor
    from study.tracking.store import default_tracking_uri
    from study.tracking.tracker import training_runs
    from vitstudy_core.locks import run_lock_path

    out = tmp_path / "out"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--workers", "1", "--no-report"]) == 0
    client = MlflowClient(default_tracking_uri(out))
    children = training_runs(client)
    key = children[0].data.tags["run_key"]
    spectra = out / "runs" / key / "spectra.npz"
    intact = spectra.read_bytes()
    _truncate(spectra)
    partial = out / "runs" / "0123456789abcdef"
    partial.mkdir()
    lock = run_lock_path(out / "runs", partial.name)
    lock.write_text("")
    # a RUNNING child under a FINISHED parent, and a child whose run_key tag was deleted
    parent_id = children[0].data.tags["mlflow.parentRunId"]
    ghost = client.create_run(
        children[0].info.experiment_id, tags={**children[0].data.tags, "run_key": "e" * 16}
    )
    untagged = children[1].info.run_id
    client.delete_tag(untagged, "run_key")
    assert client.get_run(parent_id).info.status == "FINISHED"

    capsys.readouterr()
    assert main(["doctor", "--out", str(out)]) == 1
    report = capsys.readouterr().out
    for kind in ("damaged_run", "orphan", "stale_partial", "running_child", "untagged_child"):
        assert kind in report, report
    assert "the store holds a copy" in report and lock.exists()

    lines: list[str] = []

    def log(line: str) -> None:
        if not any(x.startswith("repair:") for x in lines):
            assert lock.exists(), f"deleted before the report was complete (at {line!r})"
        lines.append(line)

    assert doctor(out, repair=True, log=log) in (0, 1)
    assert not lock.exists() and spectra.read_bytes() == intact, "\n".join(lines)
    assert client.get_run(ghost.info.run_id).info.status == "KILLED"
    assert client.get_run(untagged).info.lifecycle_stage == "deleted"
    fixed = lines[next(i for i, x in enumerate(lines) if x.startswith("repair:")) :]
    assert all(
        "[repaired]" in line
        for line in fixed
        if line.startswith(("damaged_run", "running_child", "untagged"))
    ), fixed
    assert len([x for x in lines[: len(lines) - len(fixed)] if x.startswith("damaged_run")]) == 1


def test_doctor_never_shrinks_a_table(tiny_yaml, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["run", str(tiny_yaml), "--out", str(out), "--workers", "1", "--no-report", "--no-mlflow"]) == 0
    )
    table = out / "studies" / "tiny" / "table.parquet"
    before = table.read_bytes()
    key = sorted(p for p in (out / "runs").iterdir() if p.is_dir())[0]
    (key / "result.json").unlink()
    capsys.readouterr()
    main(["doctor", "--out", str(out), "--repair"])
    report = capsys.readouterr().out
    assert "rebuild 2 of the 3" in report and "report only" in report, report
    assert table.read_bytes() == before  # not rewritten with 2 of 3 seeds while verdicts.json says 3
