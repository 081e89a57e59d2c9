"""Claims on runs: a run key is filled by one live worker at a time, anywhere, and taken over when it dies.

    store = open_lease_store("postgresql://study@db-host/study")   # or a folder: file leases
    result = fill_once(store, run, run_dir, fill)                   # what a worker calls per run

A *lease* is a row ``(run_key, owner, lease_expires, state, attempts, study)``. A worker that acquires it
renews ``lease_expires`` from a heartbeat thread (every ``ttl / 3`` seconds) while it fills the run, and
releases it as ``finished`` or ``failed``. Another worker asking for the same key waits while the lease is
live; once it expires (its worker died: the process, the node, or its network) the waiting worker takes
the run over, and training resumes from the last complete epoch (``resume.pt`` in the shared run folder).
A worker that loses its lease while it is still alive (its heartbeats could not reach the store for longer
than the lease time, and another worker took the run over) stops at its next epoch (:func:`check_lease`
raises :class:`LeaseLost` in the training loop) and waits for the new owner's result instead.

Two implementations of one four-method interface (:class:`LeaseStore`):

* :class:`SqlLeaseStore`: a table ``study_run_leases`` in any SQLAlchemy database (PostgreSQL for a
  cluster; the same database as MLflow and the optuna storage). Acquiring is one conditional ``UPDATE``
  (or an ``INSERT ... ON CONFLICT DO NOTHING`` racing on the primary key), so two workers never both win.
* :class:`FileLeaseStore`: one JSON file per key in a folder, read-modify-written under an exclusive
  ``fcntl`` lock on ``<folder>/.lock`` (one machine, or a shared filesystem with working POSIX locks).

Times are unix seconds. A database's expiry times are on the database server's clock (``now()`` in SQL,
:meth:`SqlLeaseStore.now_sql`), so a worker whose clock is off neither takes a live lease nor keeps an
expired one; file leases are on the workers' own clocks (one host, or hosts kept in sync by NTP to well
under the lease time, ``STUDY_LEASE_TTL``, default 60 s).

The lease model and interface are in ``runners.leases.model``, the two stores in ``runners.leases.sql`` and
``runners.leases._file``; this module opens a store and fills a run under its lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runners.leases._file import FileLeaseStore
from runners.leases.model import STATES, LeaseLost, LeaseStore, _holding, lease_ttl, new_owner
from runners.leases.sql import _ENGINES_LOCK, _STORES, SqlLeaseStore
from vitstudy_core.redact import redact
from vitstudy_core.runfolder import RunFolder


def open_lease_store(where: str | Path) -> LeaseStore:
    """A database URL (``postgresql://...``, ``sqlite:///...``) -> :class:`SqlLeaseStore` (one per URL and
    process: a reused worker runs many jobs on one pooled engine); a folder path (or ``file://`` URL) ->
    :class:`FileLeaseStore`."""
    where = str(where)
    if "://" in where and not where.startswith("file://"):
        with _ENGINES_LOCK:
            store = _STORES.get(where)
        if store is None:
            store = SqlLeaseStore(where)
            with _ENGINES_LOCK:
                store = _STORES.setdefault(where, store)
        return store
    return FileLeaseStore(where.removeprefix("file://"))


# ---- holding a lease while a run is filled -------------------------------------------------------------
@contextmanager
def heartbeat(
    store: LeaseStore, run_key: str, owner: str, ttl: float, log: Callable[[str], None] | None = None
) -> Iterator[threading.Event]:
    """Renew the lease every ``ttl / 3`` s from a daemon thread while the block runs.

    Yields:
        An event set when the lease was lost (another worker took it over after a missed renewal); while
        the block runs, :func:`check_lease` in this thread raises once it is set.
    """
    stop, lost = threading.Event(), threading.Event()
    outer = getattr(_holding, "lost", None)

    def beat() -> None:
        wait, fails = ttl / 3, 0
        while not stop.wait(wait):
            try:
                ok = store.renew(run_key, owner, ttl)
            except Exception as exc:  # noqa: BLE001 - a database outage: retry sooner, with backoff
                fails += 1
                wait = min(ttl / 3, backoff_s(fails))
                if log:
                    log(
                        f"[{run_key}] lease renewal failed ({type(exc).__name__}: {exc}); retrying in {wait:.1f}s"
                    )
                continue
            wait, fails = ttl / 3, 0
            if not ok:
                lost.set()
                if log:
                    log(f"[{run_key}] lease lost to another worker")
                return

    thread = threading.Thread(target=beat, name=f"lease-{run_key}", daemon=True)
    thread.start()
    _holding.lost = lost
    try:
        yield lost
    finally:
        _holding.lost = outer
        stop.set()
        thread.join()


def fill_once(
    store: LeaseStore,
    run: dict,
    run_dir: str | Path,
    fill: Callable[[], dict],
    ttl: float | None = None,
    poll_s: float | None = None,
    log: Callable[[str], None] | None = None,
    study: str = "",
    wait: bool = True,
) -> dict:
    """Fill a run unless it is finished or being filled elsewhere; idempotent, so safe to retry.

    A finished run folder is returned as it is. Otherwise this waits while another owner holds the run's
    lease live, then acquires it and calls ``fill()`` (which resumes an interrupted run), renewing the
    lease meanwhile. A run that ended (``result.json``) while its lease was held elsewhere is returned
    as it is: a failure elsewhere is not retried here. A fill that loses its lease (:class:`LeaseLost`)
    goes back to waiting, and returns the result of the worker that took the run over.

    ``wait=False`` (an executor's task: waiting there would hold its CPUs and GPUs) returns at once with
    :func:`waiting_result` instead of waiting; its caller sends the job again later (:func:`requeue_waiting`).

    Returns:
        The run's ``result.json`` content plus ``"claim": {"owner", "filled": bool}``: ``filled``
        is False when another worker did the work.
    """
    ttl = lease_ttl() if ttl is None else ttl
    poll_s = min(ttl / 3, 5.0) if poll_s is None else poll_s
    while True:
        try:
            return _fill_when_free(store, run, run_dir, fill, ttl, poll_s if wait else None, log, study)
        except LeaseLost:
            if log:
                log(f"[{run['key']}] stopped: another worker took the run over; waiting for its result")
            if not wait:
                return waiting_result()


def _fill_when_free(store, run, run_dir, fill, ttl, poll_s, log, study) -> dict:
    """One attempt of :func:`fill_once`: wait for the lease (``poll_s`` None: do not wait), then fill
    under it."""
    folder, key = RunFolder(run_dir), run["key"]
    while True:
        ended = folder.read_result()
        if ended is not None and (ended.get("status") != "finished" or folder.is_finished()):
            return {**ended, "claim": {"owner": None, "filled": False}}
        owner = new_owner()
        if store.acquire(key, owner, ttl, study):
            break
        if poll_s is None:
            return waiting_result()
        time.sleep(poll_s)
    state = "failed"
    try:
        ended = folder.read_result()  # ended between our look and our claim: nothing to do
        if ended is not None:
            state = ended.get("status", "failed")
            return {**ended, "claim": {"owner": None, "filled": False}}
        with heartbeat(store, key, owner, ttl, log):
            result = fill()
        state = result.get("status", "failed")
        return {**result, "claim": {"owner": owner, "filled": True}}
    finally:
        release(store, key, owner, state if state in STATES else "failed", ttl, log)


WAITING = "waiting"  # the status of a job that found its run leased live elsewhere (fill_once(wait=False))


def waiting_result() -> dict:
    """What :func:`fill_once` with ``wait=False`` returns while another worker holds the run live."""
    return {"status": WAITING, "claim": {"owner": None, "filled": False}}


def requeue_waiting(result: object, waits: int, ttl: float | None = None) -> float | None:
    """Seconds after which a job whose ``result`` is :func:`waiting_result` is sent again (the ``waits``-th
    time before: 0, 1, ...): 0.5, 1, 2, 4 s, then every ``min(ttl / 3, 5)`` s, as a waiting task polled
    before; None for any other result (the job has ended)."""
    if not (isinstance(result, dict) and result.get("status") == WAITING):
        return None
    ttl = lease_ttl() if ttl is None else ttl
    return min(backoff_s(waits + 1), ttl / 3, 5.0)


def backoff_s(fails: int) -> float:
    """Seconds to wait before retry ``fails`` (1, 2, ...) of a store call: 0.5, 1, 2, 4, at most 8."""
    return min(8.0, 0.5 * 2 ** (fails - 1))


def release(
    store: LeaseStore, key: str, owner: str, state: str, ttl: float, log: Callable[[str], None] | None = None
) -> bool:
    """End a lease, retrying with backoff for up to ``ttl`` seconds while the store is away.

    A store that stays away longer is logged and the lease left to expire: the run's outcome is in its
    folder (``result.json``), which is what decides it, and the next study over it records the lease's end
    (:meth:`LeaseStore.reconcile`). So a finished run is never reported failed for a lost release.

    Returns:
        True when the store recorded the release.
    """
    deadline, fails = time.monotonic() + ttl, 0
    while True:
        try:
            store.release(key, owner, state)
            return True
        except Exception as exc:  # noqa: BLE001 - any store failure: retried, then logged, never raised
            fails += 1
            wait = backoff_s(fails)
            if time.monotonic() + wait > deadline:
                if log:
                    log(
                        f"[{key}] lease release failed for {ttl:.0f}s ({type(exc).__name__}: "
                        f"{redact(str(exc)).splitlines()[0] if str(exc) else ''}); it expires on its own"
                    )
                return False
            time.sleep(wait)
