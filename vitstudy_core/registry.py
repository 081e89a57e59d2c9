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

Each registry has an entry-point ``group`` (``vitstudy.metrics``, ...): :func:`vitstudy_core.plugins.load_plugins`
imports the modules installed distributions declare there, once, and they register with the same calls as
the built-ins. A registry remembers the module that registered each entry (:meth:`Registry.module_of`), which
``python -m study plugins`` turns into "built-in" or a distribution's name and version. Every read of a
registry with a ``group`` (a lookup, ``in``, iterating, ``names()``, ``len``) loads the installed plug-ins
first, once per process, so a worker process that never built the schema sees the same parts as the driver
(a spawned worker iterating the observables measures a plug-in's too). Reads made while a registry's own
module is still being imported, or by a registry's ``check`` while an entry registers, do not load: the
built-ins register first, whatever is imported first.

Registries whose names share one namespace (:class:`Namespace`: the eigenvalue metrics, token-count
metrics and observables, every one of which a claim's ``metric:`` can name) refuse a name registered in
another of them, with the same ``ValueError`` line as a name registered twice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from vitstudy_core.errors import StudyError
from vitstudy_core.plugins import OWN_PACKAGES, load_plugins, registry_modules_ready

T = TypeVar("T")
_MISSING: Any = object()
_registering = 0  # > 0 while a registry's check runs: its reads never load plug-ins mid-registration


class Namespace:
    """Registries whose names are one namespace (``Registry(..., namespace=ns)`` joins one): a name
    registered in any of them is refused in the others."""

    def __init__(self) -> None:
        self.registries: list[Registry] = []

    def holder(self, name: str, besides: Registry) -> Registry | None:
        """The registry of this namespace other than ``besides`` that holds ``name`` (None: none does)."""
        return next((r for r in self.registries if r is not besides and name in r._entries), None)


def _article(what: str) -> str:
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


def _registering_module() -> str:
    """The module whose code registers an entry: the innermost frame outside this module and outside the
    functions of our own packages (``register_metric``'s wrapper and the like), so a plug-in calling our
    decorators is named, and a built-in module's own registrations name that module."""
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", "?"))
        ours = module.partition(".")[0] in OWN_PACKAGES
        if module != __name__ and (not ours or frame.f_code.co_name == "<module>"):
            return module
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


class Registry(Mapping[str, T], Generic[T]):
    """Named plug-ins of one kind (``what``: the word used in error messages, e.g. ``"metric"``)."""

    def __init__(
        self,
        what: str,
        check: Callable[[str, T], None] | None = None,
        group: str | None = None,
        namespace: Namespace | None = None,
        noun: str | None = None,
    ):
        """``check(name, entry)`` runs before an entry is added; it raises ``ValueError`` to refuse it.
        ``group``: the entry-point group plug-in distributions declare their modules in. ``namespace``:
        registries whose names may not meet (a name of another is refused here, naming that registry by
        its ``noun``, default ``what``)."""
        self.what = what
        self.group = group
        self._check = check
        self._entries: dict[str, T] = {}
        self._modules: dict[str, str] = {}
        self._versions: dict[str, str | None] = {}
        self._namespace = namespace
        self.noun = noun or what
        if namespace is not None:
            namespace.registries.append(self)

    def _load(self) -> None:
        """Load the installed plug-ins before a read (once per process; never from a check or while a
        registry module is still being imported, where the built-ins are not all registered yet)."""
        if self.group is not None and not _registering and registry_modules_ready():
            load_plugins()

    @overload
    def register(self, name: str, *, version: str | None = None) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T, *, version: str | None = None) -> T: ...

    def register(self, name: str, entry: T = _MISSING, *, version: str | None = None) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it decorates.

        ``version``: what the part declares about its own results (bump it when what it computes changes;
        a plug-in's part that shapes a run enters the run key with it, see ``study.measured_by``)."""
        global _registering
        if entry is _MISSING:

            def wrap(obj: T) -> T:
                return self.register(name, obj, version=version)

            return wrap
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        other = self._namespace.holder(name, self) if self._namespace is not None else None
        if other is not None:
            raise ValueError(
                f"{self.what} {name!r} is registered twice: the name is {_article(other.noun)}'s"
            )
        if self._check is not None:
            _registering += 1
            try:
                self._check(name, entry)
            finally:
                _registering -= 1
        self._entries[name] = entry
        self._modules[name] = _registering_module()
        self._versions[name] = version
        return entry

    def version_of(self, name: str) -> str | None:
        """The version ``name`` was registered with (None: it declared none; ``KeyError`` if unknown)."""
        self._entries[name]
        return self._versions[name]

    def module_of(self, name: str) -> str:
        """The module that registered ``name`` (``KeyError`` if it is not registered)."""
        self._entries[name]
        return self._modules[name]

    def discard(self, names: list[str]) -> None:
        """Remove ``names`` (what a plug-in registered before it failed: a broken plug-in leaves nothing)."""
        for name in names:
            self._entries.pop(name, None)
            self._modules.pop(name, None)
            self._versions.pop(name, None)

    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry named ``name``; unknown: ``default`` if given, else (after loading the installed
        plug-ins, once, in case one registers it) a one-line :class:`StudyError`."""
        self._load()
        if name in self._entries:
            return self._entries[name]
        if default is not _MISSING:
            return default
        raise StudyError(f"unknown {self.what} {name!r}; expected one of {self.names()}")

    def names(self) -> list[str]:
        """Registered names, in registration order (the installed plug-ins' included)."""
        self._load()
        return list(self._entries)

    def __getitem__(self, name: str) -> T:
        self._load()
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {self.names()})"


class Names(Sequence[str]):
    """A read-only list of names computed afresh from registries on every read (``x in names``,
    ``list(names)``, ``len(names)``), so a list derived from registries never freezes at import.

    ``names()`` is called after the installed plug-ins are loaded (:func:`vitstudy_core.plugins.load_plugins`).
    """

    def __init__(self, names: Callable[[], list[str]]):
        self._names = names

    def _now(self) -> list[str]:
        load_plugins()
        return self._names()

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self._now()[i]

    def __len__(self) -> int:
        return len(self._now())

    def __contains__(self, name: object) -> bool:
        return name in self._now()

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __repr__(self) -> str:
        return repr(self._now())
