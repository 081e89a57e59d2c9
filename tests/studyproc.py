"""Helpers for tests that run ``python -m study`` as separate processes and inspect what they left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def study_cmd(hyp: Path, out: Path, *extra: str, report: bool = False, workers: int = 1) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "study",
        "run",
        str(hyp),
        "--out",
        str(out),
        "--workers",
        str(workers),
        *extra,
    ]
    return cmd if report else [*cmd, "--no-report"]


def start(cmd: list[str], fault: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (a ``kill`` fault kills that group, never the test)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("STUDY_FAULT", None)
    if fault:
        env["STUDY_FAULT"] = fault
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run(cmd: list[str], fault: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = start(cmd, fault)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def verdicts(out: Path, name: str = "tiny") -> list[tuple]:
    """(name, verdict, effect, ci_low, ci_high, p_value) of every claim in a study's verdicts.json."""
    data = json.loads((out / "studies" / name / "verdicts.json").read_text())
    return [
        tuple(c.get(k) for k in ("name", "verdict", "effect", "ci_low", "ci_high", "p_value"))
        for c in data["claims"]
    ]


def store_state(out: Path) -> dict:
    """What the sqlite store holds: FINISHED child runs per run key, child runs of any status per run key
    (``visible``: what the MLflow UI lists; deleted runs aside), and parent runs per status."""
    from mlflow.tracking import MlflowClient

    from study.tracking.store import default_tracking_uri
    from study.tracking.tracker import training_runs

    client = MlflowClient(default_tracking_uri(out))
    finished = Counter(r.data.tags["run_key"] for r in training_runs(client))
    exps = [e.experiment_id for e in client.search_experiments()]
    parents = Counter(r.info.status for r in client.search_runs(exps, "tags.`study.role` = 'study'"))
    running_children = len(training_runs(client, "RUNNING"))
    visible = Counter(
        r.data.tags["run_key"]
        for st in ("FINISHED", "FAILED", "KILLED", "RUNNING")
        for r in training_runs(client, st)
    )
    return {
        "finished": dict(finished),
        "visible": dict(visible),
        "parents": dict(parents),
        "running_children": running_children,
    }


def half_written(out: Path) -> list[Path]:
    """Temporary files of interrupted atomic writes left anywhere in the output folder."""
    return [p for p in out.rglob(".*.tmp*")]
