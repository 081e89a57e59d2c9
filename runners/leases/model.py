"""What a lease is: the :class:`Lease` row, the four-method :class:`LeaseStore` interface every store
implements, the lease time (``STUDY_LEASE_TTL``), owner names, and :func:`check_lease` (raises
:class:`LeaseLost` in the training loop of a worker whose lease was taken over).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from vitstudy_core.errors import env_seconds

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
