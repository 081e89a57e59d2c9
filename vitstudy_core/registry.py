"""One registry shape for every plug-in: metrics, observables, claim kinds, objectives, datasets, run
sources and executors.

    METRICS = Registry("metric")

    @METRICS.register("effective_rank")
    def effective_rank(lam): ...

    METRICS.get("effective_rank")   # the entry
    METRICS.get("nope")             # StudyError: unknown metric 'nope'; expected one of [...]
    METRICS.names()                 # registered names, in registration order

A registry is a read-only mapping from name to entry (``name in R``, ``R[name]``, ``list(R)``,
``R.items()``), so code that only reads it needs nothing else. Registering a name twice is a programming
error (``ValueError``); asking for an unknown one is a user's error (:class:`StudyError`, one line that
lists what is registered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from vitstudy_core.errors import StudyError

T = TypeVar("T")
_MISSING: Any = object()


class Registry(Mapping[str, T], Generic[T]):
    """Named plug-ins of one kind (``what``: the word used in error messages, e.g. ``"metric"``)."""

    def __init__(self, what: str, check: Callable[[str, T], None] | None = None):
        """``check(name, entry)`` runs before an entry is added; it raises ``ValueError`` to refuse it."""
        self.what = what
        self._check = check
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T = _MISSING) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it decorates."""
        if entry is _MISSING:

            def wrap(obj: T) -> T:
                return self.register(name, obj)

            return wrap
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        if self._check is not None:
            self._check(name, entry)
        self._entries[name] = entry
        return entry

    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry named ``name``; unknown: ``default`` if given, else a one-line :class:`StudyError`."""
        if name in self._entries:
            return self._entries[name]
        if default is not _MISSING:
            return default
        raise StudyError(f"unknown {self.what} {name!r}; expected one of {self.names()}")

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {self.names()})"
