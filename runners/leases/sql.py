"""Leases in a SQL database (:class:`SqlLeaseStore`, a table ``study_run_leases`` in any SQLAlchemy
database), and the one pooled engine per database URL and process (:func:`engine_for`).
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import TYPE_CHECKING

from runners.leases.model import TABLE, Lease, owner_gone

if TYPE_CHECKING:  # sqlalchemy is imported where a store is made (an optional dependency)
    from sqlalchemy.engine import Engine


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

        with self.engine.connect() as conn:  # a SELECT without FROM: exactly one row
            return float(conn.execute(sa.select(self.now_sql())).scalar_one())

    def _insert_new(self, **values) -> bool:
        """Insert a row unless its key is there; True when inserted. Never a failing statement: PostgreSQL
        logs an ERROR for each one (a duplicate key), which every poll of a waiting worker would cost."""
        import sqlalchemy as sa

        t, dialect = self.table, self.engine.dialect.name
        if dialect in ("postgresql", "sqlite"):
            from sqlalchemy.dialects import postgresql, sqlite

            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
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


# ---- one pooled engine per database URL and process ------------------------------------------------------
CONNECT_TIMEOUT_S = 5  # an unreachable database is an error within seconds, not after the OS's minutes
POOL_SIZE = 2  # a worker uses at most two at once: the thread filling the run and its heartbeat
_ENGINES: dict[str, Engine] = {}
_STORES: dict[str, SqlLeaseStore] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(url: str) -> Engine:
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
