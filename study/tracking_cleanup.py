"""Cleaning stale runs from the MLflow store: parent runs left RUNNING by an invocation that died (killed,
out of memory), with their RUNNING children (``study.tracking``'s clean-up role; ``doctor --repair``).
A stale child whose run key the store holds FINISHED is a partial copy of that run: deleted, not kept
beside it (``study.tracking_write.RunWriter._retire_superseded``)."""

from __future__ import annotations

import socket
from pathlib import Path

from study.tracking_reuse import active_experiments
from vitstudy_core.locks import is_locked

ROLES = ("study", "sweep")  # the parent runs' ``study.role`` tags: one per ``run`` or ``sweep`` invocation


def parent_lock_path(out_dir: Path, run_id: str) -> Path:
    """The lock a live invocation holds on its own parent run (free once the invocation has died)."""
    return Path(out_dir) / ".locks" / f"study-{run_id}.lock"


def stale_parents(client, out_dir: Path, exclude: str | None = None) -> list:
    """RUNNING parent runs in the store whose invocation is dead: started on this host, and their lock
    (:func:`parent_lock_path`) is free. A run from another host is left alone (its liveness is unknowable
    here); ``exclude`` is the caller's own parent run."""
    exp_ids = active_experiments(client)
    if not exp_ids:
        return []
    running = [  # a ``run`` parent and a ``sweep`` parent alike (a killed sweep's stayed RUNNING)
        r
        for role in ROLES
        for r in client.search_runs(
            exp_ids, f"tags.`study.role` = '{role}' and attributes.status = 'RUNNING'", max_results=1000
        )
    ]
    host = socket.gethostname()
    return [
        r
        for r in running
        if r.data.tags.get("study.host") == host
        and r.info.run_id != exclude
        and not is_locked(parent_lock_path(out_dir, r.info.run_id))
    ]


def close_stale(client, out_dir: Path, exclude: str | None = None) -> list[str]:
    """Mark every stale RUNNING parent (:func:`stale_parents`) and its RUNNING children KILLED.

    Returns:
        the run ids marked.
    """
    marked = []
    for parent in stale_parents(client, out_dir, exclude):
        children = client.search_runs(
            [parent.info.experiment_id],
            f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and attributes.status = 'RUNNING'",
            max_results=1000,
        )
        for r in [*children, parent]:
            client.set_terminated(r.info.run_id, "KILLED")
            marked.append(r.info.run_id)
        for r in children:  # a partial record of a run the store holds whole is deleted at once
            if _has_finished(client, r.data.tags.get("run_key")):
                client.delete_run(r.info.run_id)
        parent_lock_path(out_dir, parent.info.run_id).unlink(missing_ok=True)
    return marked


def _has_finished(client, key: str | None) -> bool:
    """True when the store holds a FINISHED child run with ``run_key`` ``key``."""
    if not key:
        return False
    found = client.search_runs(
        active_experiments(client),
        f"tags.run_key = '{key}' and tags.`study.role` = 'training' and attributes.status = 'FINISHED'",
        max_results=1,
    )
    return bool(found)
