"""Leases in a folder (:class:`FileLeaseStore`): one JSON file per run key, read-modify-written under an
exclusive ``fcntl`` lock on ``<folder>/.lock``.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from runners.leases.model import Lease


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
