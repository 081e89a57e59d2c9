"""Cleaning stale runs from the MLflow store: parent runs left RUNNING by an invocation that died (killed,
out of memory, its host lost), with their RUNNING children (``study.tracking.tracker``'s clean-up role;
``doctor --repair``). A stale child whose run key the store holds FINISHED is a partial copy of that run:
deleted, not kept beside it (``study.tracking._write.RunWriter._retire_superseded``).

A store may be shared by invocations on several hosts and output folders (one database for a cluster), so
a parent run says where it lives (tags ``study.host``, ``study.out``) and that it lives: a live
invocation renews its tag ``study.heartbeat`` (unix seconds) every ``study.heartbeat_s`` seconds
(:class:`ParentHeartbeat`). A RUNNING parent is stale when

* it ran on this host and its lock (:func:`parent_lock_path`, in its own output folder) is there and
  free: its process is gone (at once, without waiting for heartbeats); else
* its heartbeat is older than :data:`GRACE_BEATS` of its own heartbeat periods (another host's or another
  folder's invocation that stopped beating: dead, or cut off from the store that long).

A parent from before heartbeats is judged as it was: stale when it ran on this host and its lock in this
output folder is free; another host's is left alone. Hosts keep their clocks synchronised (NTP) to well
under the grace time, as for the run leases (``runners.leases.store``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from study.tracking.reuse import active_experiments
from vitstudy_core.errors import env_seconds
from vitstudy_core.locks import is_locked

ROLES = ("study", "sweep")  # the parent runs' ``study.role`` tags: one per ``run`` or ``sweep`` invocation
HEARTBEAT_TAG = "study.heartbeat"  # unix seconds of the parent's last heartbeat
HEARTBEAT_S_TAG = "study.heartbeat_s"  # the parent's heartbeat period, seconds (the judge uses the writer's)
OUT_TAG = "study.out"  # the output folder (resolved path) of the invocation that made the run
HEARTBEAT_ENV = "STUDY_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30.0  # a tag write per 30 s per invocation: nothing for a store
GRACE_BEATS = 4  # a parent silent for 4 periods (2 minutes by default) is dead: rides out a slow store


def parent_lock_path(out_dir: Path, run_id: str) -> Path:
    """The lock a live invocation holds on its own parent run (free once the invocation has died)."""
    return Path(out_dir) / ".locks" / f"study-{run_id}.lock"


def heartbeat_s() -> float:
    """This invocation's heartbeat period: ``STUDY_HEARTBEAT_S`` or :data:`DEFAULT_HEARTBEAT_S` seconds."""
    return env_seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)


class ParentHeartbeat:
    """Renews a parent run's :data:`HEARTBEAT_TAG` every ``period`` seconds from a daemon thread.

    A failed write (the store away for a moment) is retried at the next beat: a store away for longer
    than the grace time lets another invocation close the parent, which is what it would see of a dead one.
    """

    def __init__(self, client, run_id: str, period: float):
        self.client, self.run_id, self.period = client, run_id, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{run_id}", daemon=True)

    def start(self) -> ParentHeartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(Exception):  # noqa: BLE001 - any store failure: the next beat retries
                self.client.set_tag(self.run_id, HEARTBEAT_TAG, f"{time.time():.3f}")

    def stop(self) -> None:
        """Stop beating (the invocation ends, or - in a test - dies)."""
        self._stop.set()
        if self._thread.is_alive():  # a beat stuck on a store that hangs does not hold the invocation up
            self._thread.join(timeout=5.0)


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def parent_lock_of(run, out_dir: Path) -> Path:
    """Where ``run``'s invocation holds its lock: in its own output folder (``study.out``), else (a run
    from before the tag) in ``out_dir``."""
    theirs = run.data.tags.get(OUT_TAG)
    return parent_lock_path(Path(theirs) if theirs else out_dir, run.info.run_id)


def is_stale(run, out_dir: Path, host: str, now: float) -> bool:
    """True when the RUNNING parent ``run``'s invocation is dead (the rules of this module's docstring)."""
    tags = run.data.tags
    beat = _float(tags.get(HEARTBEAT_TAG))
    if tags.get("study.host") == host:
        lock = parent_lock_of(run, out_dir)
        # a lock that is not there (not yet taken, another machine of the same name): the heartbeat decides
        if beat is None or lock.exists():
            return not is_locked(lock)
    if beat is None:  # another host's, from before heartbeats: its liveness is unknowable here
        return False
    period = _float(tags.get(HEARTBEAT_S_TAG))
    if period is None or not period > 0:  # a writer's bad period never makes a live parent look dead
        period = DEFAULT_HEARTBEAT_S
    return now - beat > GRACE_BEATS * period


def stale_parents(client, out_dir: Path, exclude: str | None = None, now: float | None = None) -> list:
    """RUNNING parent runs in the store whose invocation is dead (:func:`is_stale`); ``exclude`` is the
    caller's own parent run."""
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
    host, now = socket.gethostname(), time.time() if now is None else now
    return [r for r in running if r.info.run_id != exclude and is_stale(r, Path(out_dir), host, now)]


def close_stale(client, out_dir: Path, exclude: str | None = None) -> list[str]:
    """Mark every stale RUNNING parent (:func:`stale_parents`) and its RUNNING children KILLED.

    Returns:
        the run ids marked.
    """
    marked = []
    host = socket.gethostname()
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
        if parent.data.tags.get("study.host") == host:  # another host's lock is not on this machine
            parent_lock_of(parent, Path(out_dir)).unlink(missing_ok=True)
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
