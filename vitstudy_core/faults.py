"""Fault injection for tests and ``bench/faults.py``: kill or raise at a named point of a study.

    STUDY_FAULT=train.epoch:kill python -m study run h.yaml      # SIGKILL after the first epoch
    STUDY_FAULT=table.write@2:raise python -m study run h.yaml   # raise at the second table write

``STUDY_FAULT`` is ``<point>[@<hit>]:<kill|raise>``; ``hit`` (default 1) counts the calls of that point
in this process. ``kill`` sends SIGKILL to the whole process group (the invocation and its workers: what
``kill -9`` of a study started from a shell does); ``raise`` raises :class:`InjectedFault`. Unset (the
normal case), :func:`fault_point` returns at once. The points placed in the code are :data:`POINTS`.
"""

from __future__ import annotations

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
_hits: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised by :func:`fault_point` for ``STUDY_FAULT=<point>:raise``."""


def _parse(value: str) -> tuple[str, int, str]:
    where, _, action = value.rpartition(":")
    point, _, hit = where.partition("@")
    if point not in POINTS or action not in ("kill", "raise") or (hit and not hit.isdigit()):
        raise StudyError(
            f"expected '<point>[@<hit>]:<kill|raise>' with a point in {POINTS}, got {value!r}", ENV
        )
    return point, int(hit or 1), action


def check_env() -> None:
    """Raise a one-line StudyError when ``STUDY_FAULT`` is set but malformed (the CLI checks it first)."""
    if os.environ.get(ENV):
        _parse(os.environ[ENV])


def fault_point(name: str) -> None:
    """Kill the process group or raise here when ``STUDY_FAULT`` names this point (and this hit)."""
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
    os.killpg(os.getpgid(0), signal.SIGKILL)
