"""Which running trials still have a driver: trial owners (``"<host>:<pid>"``), the thread that records
optuna's heartbeat for this process's trials, and failing and queuing again the trials of a driver that is
gone (a dead process on this host, or, on a database storage, a heartbeat that stopped on any host).
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable

import optuna

from study.schema import Hypothesis
from study.sweep.storage import GRACE_BEATS, _rdb, heartbeat_s

Log = Callable[[str], None]
OWNER = "study.owner"  # trial user attribute: "<host>:<pid>" of the process running it


def _hostname() -> str:
    """This host's name, as trial owners record it (a function, so tests can pose as another host)."""
    return socket.gethostname()


def _owner() -> str:
    """This process as a trial's owner: ``"<host>:<pid>"``."""
    return f"{_hostname()}:{os.getpid()}"


def _alive(owner: str | None) -> bool:
    host, _, pid = (owner or "").rpartition(":")
    if host != _hostname() or not pid.isdigit():
        # another host's trial: alive unless its heartbeat says otherwise (:func:`fail_stale`, database
        # storages only); a journal file has no heartbeat, so it is assumed alive
        return host != "" and host != _hostname()
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _just_asked(trial, grace_s: float = 120.0) -> bool:
    """A trial asked by another sweep process that has not yet recorded its owner (ask, then set_user_attr)."""
    import datetime as dt

    start = trial.datetime_start
    return (
        OWNER not in trial.user_attrs
        and start is not None
        and (dt.datetime.now() - start).total_seconds() < grace_s
    )


def fail_stale(optuna_study, log: Log) -> int:
    """On a database storage: fail every running trial whose driver stopped beating, whatever host
    started it, and queue its parameters again. optuna's ``fail_stale_trials`` fails those whose last
    heartbeat is older than the grace period (measured by the database's clock) and its
    ``RetryHeartbeatStaleTrialCallback`` queues a WAITING copy; a trial with an owner but no heartbeat at
    all was asked by a driver from before heartbeats were recorded (``_ask`` beats before it records
    the owner) and is failed the same way. Returns how many trials were failed."""
    from optuna.trial import TrialState

    storage = _rdb(optuna_study)
    if storage is None:
        return 0
    before = {t.number: t for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(optuna_study)
        beating = _beating(storage, [t._trial_id for t in before.values()])
        for t in before.values():
            mine = (t.user_attrs.get(OWNER) or "").rpartition(":")[0] == _hostname()
            if OWNER in t.user_attrs and not mine and t._trial_id not in beating:
                try:
                    failed = optuna_study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # another driver failed it first (or it ended): as optuna's fail_stale_trials
                if failed:
                    retry = storage.get_heartbeat_stale_trial_callback()
                    retry(optuna_study, optuna_study._storage.get_trial(t._trial_id))
    state = {t.number: t.state for t in optuna_study.get_trials(deepcopy=False)}
    gone = [n for n in sorted(before) if state.get(n) == TrialState.FAIL]
    for n in gone:
        log(
            f"trial {n} ({before[n].user_attrs.get(OWNER, 'no owner')}) has no heartbeat for "
            f"{GRACE_BEATS * heartbeat_s()}s: its driver is gone; run again with {dict(before[n].params)}"
        )
    return len(gone)


def _beating(storage, trial_ids: list[int]) -> set[int]:
    """Those of ``trial_ids`` that have a heartbeat recorded (optuna's table ``trial_heartbeats``)."""
    import sqlalchemy as sa

    if not trial_ids:
        return set()
    query = sa.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    with storage.engine.connect() as conn:
        return {int(r[0]) for r in conn.execute(query, {"ids": trial_ids})}


class Heartbeat:
    """While a sweep runs on a database storage: a thread that records optuna's heartbeat for every
    running trial this process owns, every :func:`heartbeat_s` seconds (a database outage is ridden out:
    the next beat tries again). Use as a context manager; without heartbeats it does nothing."""

    def __init__(self, optuna_study):
        import threading

        self.study, self.storage = optuna_study, _rdb(optuna_study)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trial-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.storage is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _run(self) -> None:
        from optuna.trial import TrialState

        while not self.stop.wait(heartbeat_s()):
            try:
                me = _owner()
                for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    if t.user_attrs.get(OWNER) == me:
                        self.storage.record_heartbeat(t._trial_id)
            except Exception:  # noqa: BLE001 - the database is away: the next beat tries again
                continue


def recover_stale(optuna_study, hyp: Hypothesis, log: Log) -> int:
    """Fail trials left RUNNING by a driver that is gone and queue their parameters again: on a database
    storage those whose heartbeat stopped, on any host (:func:`fail_stale`); on any storage this host's
    trials whose process is dead (enqueued, so the grid sampler too runs that point again: it counts a
    failed point as visited). Returns how many."""
    from optuna.trial import TrialState

    n = fail_stale(optuna_study, log)
    for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _alive(t.user_attrs.get(OWNER)) or _just_asked(t):
            continue
        optuna_study.tell(t.number, state=TrialState.FAIL)
        optuna_study.enqueue_trial(dict(t.params), skip_if_exists=False)
        log(f"trial {t.number} was left running by a process that is gone: run again with {dict(t.params)}")
        n += 1
    return n
