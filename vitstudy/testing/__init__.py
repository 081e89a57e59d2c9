"""Contract checks for every plug-in registry, shipped with the package (as scikit-learn ships
``check_estimator`` / ``parametrize_with_checks``): our tests run them on the built-ins, a plug-in package
runs the same checks on its own parts.

    # tests/test_my_parts.py of a plug-in package
    from vitstudy.testing import parametrize_with_checks

    @parametrize_with_checks("metrics", names=["my_metric"])     # names=None: every registered entry
    def test_my_metric(name, check):
        check(name)

    from vitstudy.testing import check_part
    check_part("kinds", "my_kind")                                # every check of one part, in order

A check is a plain function ``check(name)`` that raises ``AssertionError`` (or the error the part raised)
when the registered entry ``name`` breaks its registry's contract. :func:`checks` lists them by part,
keyed by the entry-point group's last word (``metrics``, ``kinds``, ``objectives``, ...). The installed
plug-ins are loaded before names are read, so "every registered entry" includes them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable

from vitstudy_core.plugins import GROUPS, load_plugins, registry_of

Check = Callable[[str], None]

# part -> module of vitstudy.testing holding its checks (its CHECKS list)
_MODULES = {
    "metrics": "vitstudy.testing.metrics",
    "token_metrics": "vitstudy.testing.metrics",
    "observables": "vitstudy.testing.metrics",
    "kinds": "vitstudy.testing.kinds",
    "objectives": "vitstudy.testing.objectives",
    "datasets": "vitstudy.testing.runs",
    "sources": "vitstudy.testing.runs",
    "executors": "vitstudy.testing.runs",
}
PARTS = tuple(g.partition(".")[2] for g in GROUPS)


def _require(part: str, name: str) -> None:
    """An ``AssertionError`` saying why ``name`` is not registered for ``part``: the one line of every
    plug-in of that group that failed to load ("... not loaded: <the error>"), else the names registered."""
    from vitstudy_core.plugins import BROKEN

    reg = registry_of(f"vitstudy.{part}")
    if name in reg:
        return
    lines = [b.line() for b in BROKEN if b.group == reg.group]
    raise AssertionError(
        f"{part} {name!r} is not registered"
        + (f": {'; '.join(lines)}" if lines else f"; registered: {reg.names()}")
    )


def _guarded(part: str, check: Check) -> Check:
    """``check`` that first says why its entry is not registered (:func:`_require`), not a ``KeyError``."""

    @functools.wraps(check)
    def guarded(name: str) -> None:
        _require(part, name)
        check(name)

    return guarded


def checks(part: str) -> list[Check]:
    """The contract checks of one part (``"metrics"``, ``"kinds"``, ...), in the order they run; each
    first fails with the plug-in's "not loaded" line when its entry is not registered."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; expected one of {list(PARTS)}")
    return [_guarded(part, c) for c in importlib.import_module(_MODULES[part]).CHECKS[part]]


def registered(part: str) -> list[str]:
    """Every name registered for ``part``, built-ins and installed plug-ins alike."""
    load_plugins()
    return registry_of(f"vitstudy.{part}").names()


def built_in(part: str) -> list[str]:
    """The names of ``part`` that this distribution registers itself (``origin`` ``'built-in'``): the
    entries whose data-on-disk checks (a dataset's fixture folder, a source's files to import) live in
    this repository's tests. An installed plug-in's entries are not among them: its package gives them
    fixtures and tests them, so installing one never fails our tests."""
    from vitstudy_core.plugins import origin

    reg = registry_of(f"vitstudy.{part}")
    return [n for n in registered(part) if origin(reg, n) == "built-in"]


def check_part(part: str, name: str) -> None:
    """Run every contract check of ``part`` on its entry ``name`` (the first failure raises)."""
    load_plugins()
    for check in checks(part):
        check(name)


def parametrize_with_checks(part: str, names: Iterable[str] | None = None):  # -> pytest.MarkDecorator
    """``pytest.mark.parametrize(("name", "check"), ...)`` over every (entry, check) pair of ``part``:
    ``names`` (default: every registered entry) times :func:`checks`; test ids are ``name-check``."""
    import pytest

    load_plugins()
    pairs = [(n, c) for n in (registered(part) if names is None else list(names)) for c in checks(part)]
    return pytest.mark.parametrize(("name", "check"), pairs, ids=[f"{n}-{c.__name__}" for n, c in pairs])


__all__ = ["PARTS", "built_in", "check_part", "checks", "parametrize_with_checks", "registered"]
