"""Fault injection for tests and ``bench/faults.py``: kill or raise at a named point of a study.

    STUDY_FAULT=train.epoch:kill python -m study run h.yaml      # SIGKILL after the first epoch
    STUDY_FAULT=table.write@2:raise python -m study run h.yaml   # raise at the second table write

    STUDY_FAULT=checkpoint.write@2:enospc python -m study run h.yaml   # the disk fills at a checkpoint

``STUDY_FAULT`` is ``<point>[@<hit>]:<action>``; ``hit`` (default 1) counts the calls of that point
in this process. ``kill`` sends SIGKILL to the whole process group (the invocation and its workers: what
``kill -9`` of a study started from a shell does); ``raise`` raises :class:`InjectedFault`; ``enospc``
raises the ``OSError`` a full disk gives (naming the file being written, where the point knows it);
``dbfull`` raises the ``sqlite3.OperationalError`` a full disk gives the tracking store; ``sigint``
sends SIGINT to the process group (what Ctrl-C in a terminal does) and ``sigterm`` sends SIGTERM to the
group's leader (the invocation, when it was started from a shell or in a session of its own), then both
go on. Unset (the
normal case), :func:`fault_point` returns at once. The points placed in the code are :data:`POINTS`.
"""

from __future__ import annotations

import errno
import os
import signal

from vitstudy_core.errors import StudyError

ENV = "STUDY_FAULT"
POINTS = (
    "train.epoch",  # after each training epoch (runners.train)
    "checkpoint.write",  # a weight/resume file written to its temporary name, not yet renamed
    "extract",  # spectra measured at a checkpoint epoch, not yet saved
    "mlflow.log",  # a child run created in the tracking store, its artifacts not yet logged
    "table.write",  # the tidy table written to its temporary name, not yet renamed
    "report.write",  # report.html written, report.md not yet
    "store.create",  # a fresh sqlite tracking store made under its temporary name, not yet renamed
)
ACTIONS = ("kill", "raise", "enospc", "dbfull", "sigint", "sigterm")
_hits: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised by :func:`fault_point` for ``STUDY_FAULT=<point>:raise``."""


def _parse(value: str) -> tuple[str, int, str]:
    where, _, action = value.rpartition(":")
    point, _, hit = where.partition("@")
    if point not in POINTS or action not in ACTIONS or (hit and not hit.isdigit()):
        raise StudyError(
            f"expected '<point>[@<hit>]:<{'|'.join(ACTIONS)}>' with a point in {POINTS}, got {value!r}", ENV
        )
    return point, int(hit or 1), action


def check_env() -> None:
    """Raise a one-line StudyError when ``STUDY_FAULT`` is set but malformed (the CLI checks it first)."""
    if os.environ.get(ENV):
        _parse(os.environ[ENV])


def fault_point(name: str, path: str | os.PathLike | None = None) -> None:
    """Kill the process group or raise here when ``STUDY_FAULT`` names this point (and this hit);
    ``path``: the file being written here (named by an ``enospc`` fault)."""
    value = os.environ.get(ENV)
    if not value:
        return
    point, hit, action = _parse(value)
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != hit:
        return
    if action == "raise":
        raise InjectedFault(f"injected fault at {name}")
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), None if path is None else str(path))
    if action == "dbfull":
        import sqlite3

        raise sqlite3.OperationalError("database or disk is full")
    if action == "sigint":
        os.killpg(os.getpgid(0), signal.SIGINT)
        return
    if action == "sigterm":
        os.kill(os.getpgid(0), signal.SIGTERM)
        return
    os.killpg(os.getpgid(0), signal.SIGKILL)
