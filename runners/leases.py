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
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from vitstudy_core.errors import env_seconds
from vitstudy_core.redact import redact
from vitstudy_core.runfolder import RunFolder

LEASE_TTL_ENV = "STUDY_LEASE_TTL"  # seconds a lease lives without a heartbeat
DEFAULT_TTL = 60.0  # long enough to ride out a GC pause or a slow epoch save, short enough to take over soon
TABLE = "study_run_leases"
STATES = ("todo", "running", "finished", "failed")


@dataclass(frozen=True)
class Lease:
    """One run's claim.

    Attributes:
        run_key: the run's key (primary key).
        owner: ``host:pid:nonce`` of the attempt holding or last holding it ("" for a run not started).
        lease_expires: unix seconds; a ``running`` lease past it belongs to a dead worker.
        state: ``todo`` (announced by a study), ``running``, ``finished`` or ``failed``.
        attempts: how many times a worker acquired it (1 for a run trained once; +1 per take-over).
        study: the study that announced or first claimed it.
    """

    run_key: str
    owner: str
    lease_expires: float
    state: str
    attempts: int
    study: str = ""

    def live(self, now: float | None = None) -> bool:
        """True while a worker holds it (``running``, not expired, and its owner not known to be dead)."""
        return (
            self.state == "running"
            and self.lease_expires > (time.time() if now is None else now)
            and not owner_gone(self.owner)
        )


class LeaseStore(Protocol):
    """Where leases live. Every method is atomic with respect to every other worker of the store."""

    def acquire(self, run_key: str, owner: str, ttl: float, study: str = "") -> bool:
        """Take the lease unless another owner holds it live; True when ``owner`` now holds it."""
        ...

    def renew(self, run_key: str, owner: str, ttl: float) -> bool:
        """Push ``lease_expires`` to now + ttl; False when ``owner`` no longer holds it (taken over)."""
        ...

    def release(self, run_key: str, owner: str, state: str) -> None:
        """End ``owner``'s lease with ``state`` (finished or failed); nothing if another owner holds it."""
        ...

    def leases(self) -> list[Lease]:
        """Every lease, for ``python -m study status``."""
        ...

    def now(self) -> float:
        """The clock its expiry times are on (unix seconds): compare :meth:`Lease.live` with it."""
        ...

    def announce(self, study: str, run_keys: list[str]) -> None:
        """Record a study's planned runs as ``todo`` (keys already present are left as they are)."""
        ...

    def reconcile(self, run_keys: list[str], state: str = "finished") -> None:
        """Record ``state`` for runs whose folders ended while their leases still say ``todo`` or
        ``running`` past their time (a release that never reached the store); live leases are left."""
        ...


class LeaseLost(Exception):
    """Raised by :func:`check_lease` in the thread filling a run whose lease another worker took over."""


_holding = threading.local()  # .lost: the Event of the lease the current thread holds (see heartbeat)


def check_lease() -> None:
    """Raise :class:`LeaseLost` when the current thread fills a run under a lease it has lost.

    A long fill calls this at safe points (the training loop: before each epoch and before the final
    write), so a worker that was taken over stops writing the shared run folder. Outside a lease, nothing.
    """
    lost = getattr(_holding, "lost", None)
    if lost is not None and lost.is_set():
        raise LeaseLost("the run's lease was taken over by another worker")


def new_owner() -> str:
    """A name for one attempt at one run: host, process and a nonce (a Ray worker process runs many)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_gone(owner: str) -> bool:
    """True when ``owner`` (:func:`new_owner`) was a process on this host that no longer exists: its lease
    is free at once instead of after the lease time (a killed or interrupted study's rerun does not wait).

    Another host's owner, or a process that exists (or whose id was reused), is never called gone: the
    lease then lives out its time, as before.
    """
    host, _, pid = owner.rpartition(":")[0].rpartition(":")  # host:pid:nonce
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def lease_ttl() -> float:
    """Seconds a lease lives without a heartbeat: ``STUDY_LEASE_TTL`` or :data:`DEFAULT_TTL`."""
    return env_seconds(LEASE_TTL_ENV, DEFAULT_TTL)


# ---- PostgreSQL (any SQLAlchemy database) -------------------------------------------------------------
class SqlLeaseStore:
    """Leases in the table ``study_run_leases`` of a SQLAlchemy database URL (created when absent)."""

    def __init__(self, url: str):
        import sqlalchemy as sa

        self.url = url
        self.engine = engine_for(url)
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE,
            meta,
            sa.Column("run_key", sa.String(128), primary_key=True),
            sa.Column("owner", sa.String(256), nullable=False, default=""),
            sa.Column("lease_expires", sa.Float, nullable=False, default=0.0),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False, default=0),
            sa.Column("study", sa.String(256), nullable=False, default=""),
        )
        try:
            meta.create_all(self.engine)
        except sa.exc.IntegrityError:  # two workers created the table at once: it exists now
            pass
        except sa.exc.ProgrammingError as exc:  # PostgreSQL: same race, reported as a duplicate type
            if "already exists" not in str(exc):
                raise

    def now_sql(self):
        """The database server's clock in unix seconds, as an SQL expression: every expiry this store
        writes or compares is on it, so a worker whose clock is off does not take a live lease (its
        clock fast) or keep one past its time (slow). Another dialect: this process's clock."""
        import sqlalchemy as sa

        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            return sa.cast(sa.extract("epoch", sa.func.now()), sa.Float)
        if dialect == "sqlite":
            return (sa.func.julianday("now") - 2440587.5) * 86400.0  # days since the unix epoch, in s
        return sa.literal(time.time(), sa.Float)

    def now(self) -> float:
        """The database server's clock (unix seconds): what :meth:`Lease.live` of this store's leases
        compares with."""
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return float(conn.execute(sa.select(self.now_sql())).scalar())

    def _insert_new(self, **values) -> bool:
        """Insert a row unless its key is there; True when inserted. Never a failing statement: PostgreSQL
        logs an ERROR for each one (a duplicate key), which every poll of a waiting worker would cost."""
        import sqlalchemy as sa

        t, dialect = self.table, self.engine.dialect.name
        if dialect in ("postgresql", "sqlite"):
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert
            else:
                from sqlalchemy.dialects.sqlite import insert
            stmt = insert(t).values(**values).on_conflict_do_nothing(index_elements=["run_key"])
            with self.engine.begin() as conn:  # RETURNING: psycopg's rowcount of this statement is -1
                return conn.execute(stmt.returning(t.c.run_key)).first() is not None
        with self.engine.connect() as conn:
            if conn.execute(sa.select(t.c.run_key).where(t.c.run_key == values["run_key"])).first():
                return False
        try:  # another dialect, and a racing insert since the look: the primary key decides
            with self.engine.begin() as conn:
                conn.execute(sa.insert(t).values(**values))
        except sa.exc.IntegrityError:
            return False
        return True

    def acquire(self, run_key: str, owner: str, ttl: float, study: str = "") -> bool:
        import sqlalchemy as sa

        t, now = self.table, self.now_sql()
        free = sa.or_(t.c.state != "running", t.c.lease_expires < now, t.c.owner == owner)
        values = {"owner": owner, "lease_expires": now + ttl, "state": "running"}
        with self.engine.begin() as conn:
            hit = conn.execute(
                sa.update(t).where(t.c.run_key == run_key, free).values(attempts=t.c.attempts + 1, **values)
            ).rowcount
        if hit or self._insert_new(run_key=run_key, attempts=1, study=study, **values):
            return True
        return self._take_from_dead(run_key, values)  # the row exists and another owner holds it live

    def _take_from_dead(self, run_key: str, values: dict) -> bool:
        """Take a lease whose holder was a process on this host that is gone (:func:`owner_gone`); the
        update names that holder, so of two takers one wins."""
        import sqlalchemy as sa

        t = self.table
        with self.engine.connect() as conn:
            holder = conn.execute(sa.select(t.c.owner).where(t.c.run_key == run_key)).scalar()
        if not holder or not owner_gone(holder):
            return False
        with self.engine.begin() as conn:
            hit = conn.execute(
                sa.update(t)
                .where(t.c.run_key == run_key, t.c.owner == holder, t.c.state == "running")
                .values(attempts=t.c.attempts + 1, **values)
            ).rowcount
        return bool(hit)

    def renew(self, run_key: str, owner: str, ttl: float) -> bool:
        import sqlalchemy as sa

        t = self.table
        with self.engine.begin() as conn:
            hit = conn.execute(
                sa.update(t)
                .where(t.c.run_key == run_key, t.c.owner == owner, t.c.state == "running")
                .values(lease_expires=self.now_sql() + ttl)
            ).rowcount
        return bool(hit)

    def release(self, run_key: str, owner: str, state: str) -> None:
        import sqlalchemy as sa

        t = self.table
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(t)
                .where(t.c.run_key == run_key, t.c.owner == owner)
                .values(state=state, lease_expires=self.now_sql())
            )

    def reconcile(self, run_keys: list[str], state: str = "finished") -> None:
        import sqlalchemy as sa

        t, now = self.table, self.now_sql()
        stale = sa.or_(t.c.state == "todo", sa.and_(t.c.state == "running", t.c.lease_expires < now))
        with self.engine.begin() as conn:
            for key in run_keys:
                conn.execute(sa.update(t).where(t.c.run_key == key, stale).values(state=state))

    def leases(self) -> list[Lease]:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.table)).mappings().all()
        return [Lease(**dict(r)) for r in rows]

    def announce(self, study: str, run_keys: list[str]) -> None:
        for key in run_keys:  # one statement per key; a key already there (or inserted meanwhile) is kept
            self._insert_new(run_key=key, owner="", lease_expires=0.0, state="todo", attempts=0, study=study)


# ---- files (one machine or a shared filesystem) -------------------------------------------------------
class FileLeaseStore:
    """Leases as ``<folder>/<run key>.json``, changed only under an exclusive lock on ``<folder>/.lock``."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read(self, run_key: str) -> Lease | None:
        try:
            return Lease(**json.loads((self.folder / f"{run_key}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _write(self, lease: Lease) -> None:
        from vitstudy_core.io import atomic_write_json

        atomic_write_json(self.folder / f"{lease.run_key}.json", asdict(lease))

    def now(self) -> float:
        """This host's clock (unix seconds): file leases are written and compared on the workers' clocks."""
        return time.time()

    def acquire(self, run_key: str, owner: str, ttl: float, study: str = "") -> bool:
        with self._locked():
            old, now = self._read(run_key), time.time()
            if old is not None and old.live(now) and old.owner != owner:
                return False
            attempts = (old.attempts if old else 0) + 1
            self._write(Lease(run_key, owner, now + ttl, "running", attempts, old.study if old else study))
            return True

    def renew(self, run_key: str, owner: str, ttl: float) -> bool:
        with self._locked():
            old = self._read(run_key)
            if old is None or old.owner != owner or old.state != "running":
                return False
            self._write(Lease(run_key, owner, time.time() + ttl, "running", old.attempts, old.study))
            return True

    def release(self, run_key: str, owner: str, state: str) -> None:
        with self._locked():
            old = self._read(run_key)
            if old is not None and old.owner == owner:
                self._write(Lease(run_key, owner, time.time(), state, old.attempts, old.study))

    def reconcile(self, run_keys: list[str], state: str = "finished") -> None:
        with self._locked():
            now = time.time()
            for key in run_keys:
                old = self._read(key)
                if old is not None and (
                    old.state == "todo" or (old.state == "running" and not old.live(now))
                ):
                    self._write(Lease(key, old.owner, old.lease_expires, state, old.attempts, old.study))

    def leases(self) -> list[Lease]:
        return [lease for p in sorted(self.folder.glob("*.json")) if (lease := self._read(p.stem))]

    def announce(self, study: str, run_keys: list[str]) -> None:
        with self._locked():
            for key in run_keys:
                if self._read(key) is None:
                    self._write(Lease(key, "", 0.0, "todo", 0, study))


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


# ---- one pooled engine per database URL and process ------------------------------------------------------
CONNECT_TIMEOUT_S = 5  # an unreachable database is an error within seconds, not after the OS's minutes
POOL_SIZE = 2  # a worker uses at most two at once: the thread filling the run and its heartbeat
_ENGINES: dict[str, object] = {}
_STORES: dict[str, SqlLeaseStore] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(url: str):
    """This process's SQLAlchemy engine for ``url``, created once (pooled: at most :data:`POOL_SIZE` + 1
    connections) and disposed at exit, so a worker that runs many jobs holds a bounded number of
    connections however many jobs it ran (PostgreSQL's ``max_connections`` defaults to 100)."""
    import sqlalchemy as sa

    with _ENGINES_LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            kwargs: dict = {"pool_pre_ping": True}
            if url.startswith("postgresql"):
                kwargs.update(
                    pool_size=POOL_SIZE,
                    max_overflow=1,
                    connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
                )
            engine = _ENGINES[url] = sa.create_engine(url, **kwargs)
            if len(_ENGINES) == 1:
                atexit.register(dispose_engines)
    return engine


def dispose_engines() -> None:
    """Close every pooled connection of this process (at exit; a test's clean slate)."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
        _STORES.clear()
    for engine in engines:
        engine.dispose()


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
