"""Advisory file locks (``fcntl.flock``) that serialise concurrent invocations on one output folder.

A lock belongs to an open file description: it is released when the holder closes it or dies (even by
SIGKILL), so a lock left by a dead process is simply free. Used per run key (``runs/<key>.lock``: one
process trains and logs a run at a time), around creating the tracking store and its experiments, and by
a live invocation on its own parent run (so the next one can tell a dead invocation's RUNNING run).

:func:`database_lock` is the same idea for a database several hosts share: a PostgreSQL advisory lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def file_lock(path: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` (created when missing) for the block; waits for other holders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)  # closing releases the lock


def hold_lock(path: str | Path) -> int:
    """Take an exclusive lock on ``path`` without waiting and return its descriptor (close it to release).

    Raises:
        BlockingIOError: another process holds it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def is_locked(path: str | Path) -> bool:
    """True when a live process holds the lock on ``path``; False when it is free or the file is absent."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def run_lock_path(runs_dir: str | Path, key: str) -> Path:
    """The lock file of one run key: ``runs/<key>.lock`` beside its folder."""
    return Path(runs_dir) / f"{key}.lock"


@contextmanager
def database_lock(engine: Any, name: str) -> Iterator[None]:
    """Hold the PostgreSQL advisory lock ``name`` for the block, on a connection of ``engine`` (SQLAlchemy).

    Serialises what must happen once per database among processes on any host: creating a library's
    tables (MLflow's migrations, run on a fresh database by two invocations at once, otherwise both create
    ``alembic_version`` and one fails with an ``IntegrityError``). A session-level lock: released by the
    block's end, or by the database when the holder's connection dies (a killed process holds nothing).
    Another database (SQLite: one file, serialised by the caller's :func:`file_lock`) is not locked.
    """
    if engine.dialect.name != "postgresql":
        yield
        return
    import sqlalchemy as sa

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)  # a bigint
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": key})
        conn.commit()  # the lock is the session's, not the transaction's: no transaction held meanwhile
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()
