"""Does every worker see the study's output folder? A token the driver writes, checked by every task.

    token = write_token(out_dir)                 # the driver, before it starts any job
    check_token(out_dir, token)                  # each job, before it trains (runners.executors.jobs)
    for i, result, exc in seen_by_driver(executor.map_jobs(fn, jobs), run_dirs): ...   # the driver

On a cluster ``--out`` must be one folder every node mounts at the same path. A node where that path is a
private folder would train its runs there, report them finished, and the driver would find nothing: seeds
silently dropped. So the driver writes a random token to ``<out>/.study-token`` and passes it to every
job; a job that reads another token (or none) there fails at once, naming its host, before it trains. And
a run a worker reports finished whose folder the driver cannot read is an error naming that worker's
host, never a seed quietly missing from the verdicts.

The token is also the folder's identity in a lease store that several output folders share (one database
for a cluster): a run's lease is ``<run key>@<token>`` (:func:`lease_key`), so a run of folder B is
never taken for folder A's run, which B cannot see: each folder trains its own copy once.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

from vitstudy_core.runfolder import RunFolder

TOKEN = ".study-token"


class OutNotShared(RuntimeError):
    """A worker does not see the driver's output folder (``--out`` is not on a shared filesystem)."""


def write_token(out_dir: str | Path) -> str:
    """The token of ``out_dir``: created once (atomically, so concurrent drivers agree), then read."""
    path = Path(out_dir) / TOKEN
    path.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        existing = path.read_text().strip()
        if existing:
            return existing
        path.write_text(token)  # an empty file (a writer killed mid-write): ours replaces it
        return token
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


def read_token(out_dir: str | Path) -> str | None:
    """The token of ``out_dir`` when it has one (no job ever ran there: None); writes nothing."""
    try:
        return (Path(out_dir) / TOKEN).read_text().strip() or None
    except OSError:
        return None


LEASE_SCOPE = (
    12  # hex digits of the token in a lease key: 48 bits, two folders of one store never meet in practice
)


def lease_key(run_key: str, token: str | None) -> str:
    """A run's key in the lease store: ``<run key>@<first 12 hex digits of its output folder's token>``,
    so output folders sharing a store hold separate leases; without a token, the run key alone."""
    return f"{run_key}@{token[:LEASE_SCOPE]}" if token else run_key


def check_token(out_dir: str | Path, token: str) -> None:
    """Raise :class:`OutNotShared` (one line naming this host) unless ``out_dir`` holds ``token``."""
    path = Path(out_dir) / TOKEN
    try:
        seen = path.read_text().strip()
    except OSError as exc:
        seen, why = None, f"cannot read {path} ({exc.strerror or type(exc).__name__})"
    else:
        why = f"{path} holds another study's token"
    if seen != token:
        raise OutNotShared(
            f"host {socket.gethostname()} does not see the study's output folder {out_dir} ({why}): "
            "--out must be a folder every node mounts at the same path"
        )


def seen_by_driver(
    ended: Iterator[tuple[int, object, BaseException | None]], run_dirs: Sequence[str | Path]
) -> Generator[tuple[int, object, BaseException | None], None, None]:
    """An executor's ``(index, result, error)`` stream, checked against the run folders as the driver sees
    them: a run reported finished whose folder is not finished here becomes an :class:`OutNotShared` error
    naming the worker's host; a job that raised although its folder is finished here (a worker that lost
    the store after writing it) is the folder's result, so a run finished on disk is never failed.
    Closing this closes ``ended`` (its workers stop)."""
    try:
        for i, result, exc in ended:
            folder = RunFolder(run_dirs[i])
            if exc is None and isinstance(result, dict) and result.get("status") == "finished":
                if not folder.is_finished():
                    host = result.get("host") or "?"
                    exc, result = (
                        OutNotShared(
                            f"host {host} reported this run finished, but its folder {folder.path} is not "
                            f"finished as host {socket.gethostname()} sees it: --out must be a folder "
                            "every node mounts at the same path"
                        ),
                        None,
                    )
            elif exc is not None and not isinstance(exc, OutNotShared) and folder.is_finished():
                result, exc = {**(folder.read_result() or {}), "recovered_from": repr(exc)}, None
            yield i, result, exc
    finally:
        close = getattr(ended, "close", None)
        if close is not None:
            close()
