"""Plug-ins from installed distributions: the entry points of every registry, loaded once.

    # a plug-in distribution's pyproject.toml
    [project.entry-points."vitstudy.metrics"]
    my_metric = "my_package.metrics"        # a module: importing it registers its parts

    from vitstudy_core.plugins import load_plugins, origin
    load_plugins()                          # the built-ins, then every installed plug-in, once
    origin(METRICS, "my_metric")            # 'my-distribution 0.1.0' ('built-in' for ours)

As pytest's ``pytest11`` group: each registry has one entry-point group (:data:`GROUPS`), an entry point
names a module, and importing that module registers its parts with the same calls the built-ins use
(``@register_metric``, ``register_kind``, ``@OBJECTIVES.register``, ...). :func:`load_plugins` first
imports the module of every registry (so the built-ins register first and keep their order), then loads
every entry point of every group, sorted by distribution and name; the hypothesis schema calls it before
it builds a union, so the order in which anything is imported never matters. A plug-in that fails to
import, or whose registration is refused, is one line on stderr naming it and its distribution
(:data:`BROKEN` keeps them); what it registered before failing is removed, and everything else works.
Each entry point's registrations stand or fall alone: the packages above its module are imported first as
their own units, so a package's parts stand when a module below it fails.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# the packages of this distribution: a registration made by their module-level code is a built-in one
# (vitstudy_core.registry reads it too; this module imports no registry module, so the two never cycle)
OWN_PACKAGES = frozenset({"vitstudy_core", "analysis", "runners", "study", "vitstudy"})
# a registry (vitstudy_core.registry.Registry): typed Any here, as this module must not import that one
Registry = Any

# entry-point group -> "module:attribute" of the registry its plug-ins register in, in study order
GROUPS: dict[str, str] = {
    "vitstudy.datasets": "runners.datasets:DATASETS",
    "vitstudy.objectives": "runners.objectives:OBJECTIVES",
    "vitstudy.sources": "runners.sources:SOURCES",
    "vitstudy.executors": "runners.executors.local:EXECUTORS",
    "vitstudy.metrics": "analysis.spectral:METRICS",
    "vitstudy.token_metrics": "analysis.spectral:TOKEN_METRICS",
    "vitstudy.observables": "analysis.observables:OBSERVABLES",
    "vitstudy.kinds": "analysis.kinds:KINDS",
}


@dataclass(frozen=True)
class Broken:
    """An entry point that could not be loaded: its group, name, distribution and the one-line reason."""

    group: str
    name: str
    distribution: str
    error: str

    def line(self) -> str:
        return (
            f"vitstudy: plug-in {self.name!r} ({self.group}) of distribution {self.distribution} "
            f"not loaded: {self.error}"
        )


BROKEN: list[Broken] = []
# module of a loaded entry point -> "distribution version" (what origin() reports for what it registered)
_LOADED: dict[str, str] = {}
_state = "unloaded"  # "loading" while load_plugins runs (a nested call returns at once), then "loaded"


def registry_modules_ready() -> bool:
    """Whether loading may start now: plug-ins are not loaded yet and no registry's module is half
    imported (a read made by a built-in module's own import, e.g. a kind's check of the kinds registered
    so far, must not load plug-ins before every built-in has registered)."""
    if _state != "unloaded":
        return False
    for target in GROUPS.values():
        module = sys.modules.get(target.partition(":")[0])
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
    return True


def registry_of(group: str) -> Registry:
    """The registry of an entry-point group (imports its module, and so its built-ins)."""
    module, _, attr = GROUPS[group].partition(":")
    reg = getattr(importlib.import_module(module), attr)
    if reg.group != group:  # pragma: no cover - a programming error in GROUPS
        raise ValueError(f"{GROUPS[group]} has group {reg.group!r}, not {group!r}")
    return reg


def registries() -> dict[str, Registry]:
    """``{group: registry}`` for every group, built-ins registered."""
    return {group: registry_of(group) for group in GROUPS}


def _distribution(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "(unknown distribution)"


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


# what a plug-in module may not import while it loads: the application layer, whose hypothesis schema is
# built from the registries the plug-in is filling (in a process whose first import is the schema, e.g.
# `validate`, such an import meets a half-imported module; in `study plugins` it would look healthy)
APPLICATION = "study"
LAYER_RULE = f"a plug-in module imports from vitstudy_core, analysis and runners, never {APPLICATION}"


def _runs_at_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run when the module is imported: blocks of ``if``, ``try``,
    ``with`` and class bodies, not function bodies nor ``if TYPE_CHECKING:`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield stmt
        if isinstance(stmt, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(stmt.test):
                yield from _runs_at_import(stmt.body)
            yield from _runs_at_import(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _runs_at_import(block)
        elif isinstance(stmt, ast.With | ast.ClassDef):
            yield from _runs_at_import(stmt.body)


def _imports_application(module: str) -> str | None:
    """Where ``module`` (or a package above it) imports ``study`` when imported, as
    ``'"from study.schema import X" (kind.py, line 3)'``; None when none of them does or its source cannot
    be read (a compiled module: :func:`load_plugins` then sees the import happen)."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:depth]))
        except Exception:  # noqa: BLE001 - not findable: importing it reports why
            return None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        try:
            with open(spec.origin, encoding="utf-8") as f:
                tree = ast.parse(f.read(), spec.origin)
        except (OSError, SyntaxError, ValueError):
            return None  # importing it reports a syntax error itself
        for stmt in _runs_at_import(tree.body):
            if isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                names = [stmt.module]
            else:
                continue
            if any(n.partition(".")[0] == APPLICATION for n in names):
                return f'"{ast.unparse(stmt)}" ({spec.origin.rpartition("/")[2]}, line {stmt.lineno})'
    return None


def _application_modules() -> set[str]:
    return {m for m in sys.modules if m.partition(".")[0] == APPLICATION}


@contextmanager
def _application_imports() -> Iterator[list[str]]:
    """The application modules named by ``import`` statements that run inside the block, in order.

    Seen at the statement, not in ``sys.modules``: in a process that was importing the schema when the
    plug-ins loaded (``study.api.validate``), the module a plug-in imports is there already, half made.
    """
    seen: list[str] = []
    original = builtins.__import__
    loading = threading.get_ident()  # another thread's imports meanwhile are not the plug-in's

    def watching(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level == 0 and name.partition(".")[0] == APPLICATION and threading.get_ident() == loading:
            seen.append(name)
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = watching
    try:
        yield seen
    finally:
        builtins.__import__ = original


def _load(ep: metadata.EntryPoint, regs: dict[str, Registry]) -> str | None:
    """Import ``ep``'s module; the one-line reason it is not loaded, or None when it is.

    The packages above the module are imported first, each on its own (:func:`_unit`): what a package
    registers is its own entry point's (``norm_cv = "pkg"``) and stands whatever a module below it does
    (``clash = "pkg.clash"`` failing to register)."""
    found_at = _imports_application(ep.module)
    if found_at is not None:  # refused before it runs, so that every process refuses it alike
        return f"ImportError: imports {APPLICATION} ({found_at}); {LAYER_RULE}"
    parts = ep.module.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package not in sys.modules:
            error = _unit(lambda package=package: importlib.import_module(package), regs)
            if error is not None:
                return f"{error} (importing its package {package})"
    return _unit(ep.load, regs)


def _unit(load: Any, regs: dict[str, Registry]) -> str | None:
    """Run ``load`` (an import) as one unit of registrations: they stand when it succeeds; when it fails
    they are removed, and so are the modules it imported whose registrations were removed with it (from
    ``sys.modules``: their own entry point, or the next import, runs them again, so their parts register
    on their own instead of never, behind a no-op import). Returns the one-line reason, or None."""
    names = {g: set(r.names()) for g, r in regs.items()}
    modules = set(sys.modules)
    before = _application_modules()
    with _application_imports() as seen:
        try:
            load()
        except Exception as err:  # any failure of a third party's import: name it, keep going
            error: str | None = _one_line(err)
        else:
            error = None
    new = [*seen, *sorted(_application_modules() - before)]  # importlib.import_module: the second
    if new:  # through another module of its own (the direct import is caught above)
        error = f"ImportError: imports {APPLICATION} (through another module: {new[0]}); {LAYER_RULE}"
    if error is not None:
        dropped: set[str] = set()
        for g, reg in regs.items():
            gone = [n for n in reg.names() if n not in names[g]]
            dropped |= {reg.module_of(n) for n in gone}
            reg.discard(gone)
        for module in set(sys.modules) - modules:
            if module in dropped and module.partition(".")[0] not in OWN_PACKAGES:
                del sys.modules[module]
    return error


def installed_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Each registry group's installed entry points (:data:`GROUPS` order), read in one pass over the
    installed distributions (``entry_points(group=...)`` reads every distribution's metadata again for
    each group)."""
    every = metadata.entry_points()
    return {group: list(every.select(group=group)) for group in GROUPS}


def load_plugins() -> bool:
    """Register the built-ins, then every installed plug-in (once per process).

    Returns:
        True when this call loaded them; False when they were loaded already (or are being loaded: a
        plug-in module that imports a module calling this gets the registries as they are).
    """
    global _state
    if _state != "unloaded":
        return False
    _state = "loading"
    try:
        found = installed_entry_points()
        if not any(found.values()):
            # no plug-in installed: nothing to register, and no reason to import every registry's module
            # here (a verb that reads one registry, e.g. the CLI's --executor choices, would otherwise
            # import every claim kind, metric and dataset: about 1 s on 2 cores, measured by bench/cli.py)
            return True
        regs = registries()
        for group in GROUPS:
            points = sorted(found[group], key=lambda e: (_distribution(e), e.name))
            for ep in points:
                error = _load(ep, regs)
                if error is not None:
                    broken = Broken(group, ep.name, _distribution(ep), error)
                    BROKEN.append(broken)
                    print(broken.line(), file=sys.stderr)
                    continue
                _LOADED[ep.module] = _distribution(ep)
    finally:
        _state = "loaded"
    return True


def distribution_of(reg: Registry, name: str) -> tuple[str, str] | None:
    """``(distribution, version)`` that registered ``reg``'s entry ``name``: None for a built-in, and
    ``("module M", "")`` for one registered by code outside any installed distribution (a test, a script)."""
    module = reg.module_of(name)
    top = module.partition(".")[0]
    if top in OWN_PACKAGES:
        return None
    for loaded, dist in _LOADED.items():
        if loaded.partition(".")[0] == top:
            dist_name, _, version = dist.rpartition(" ")
            return dist_name, version
    for dist_name in metadata.packages_distributions().get(top, []):
        return dist_name, metadata.version(dist_name)
    return f"module {module}", ""


# a role in a run's plug-in parts (study.measured_by.plugin_parts, the run key's "plugins") -> its group
ROLE_GROUPS: dict[str, str] = {
    "dataset": "vitstudy.datasets",
    "objective": "vitstudy.objectives",
    "source": "vitstudy.sources",
    "observables": "vitstudy.observables",
    "token_metrics": "vitstudy.token_metrics",
}


def missing_parts(parts: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """What of a run's plug-in parts (``{role: {name: {"distribution": ..., "version": ...}}}``, as its key
    holds them) this process lacks or has in another distribution or version, one phrase each
    (``"observable 'norm_spread' of measure-plugins (version 1) is not installed"``); [] when it has all."""
    out = []
    for role, named in sorted(parts.items()):
        reg = registry_of(ROLE_GROUPS[role])
        for name, want in sorted(named.items()):
            wanted = f"{reg.what} {name!r} of {want['distribution']} (version {want['version']})"
            if name not in reg:
                out.append(f"{wanted} is not installed")
                continue
            dist, version = distribution_of(reg, name), reg.version_of(name)
            have = "built-in" if dist is None else dist[0]
            if have != want["distribution"] or version != want["version"]:
                out.append(f"{wanted} is {have} (version {version}) here")
    return out


def origin(reg: Registry, name: str) -> str:
    """Where ``reg``'s entry ``name`` comes from: ``'built-in'``, a distribution's ``'name version'``, or
    ``'module M'`` for one registered by code outside any installed distribution (a test, a script)."""
    dist = distribution_of(reg, name)
    return "built-in" if dist is None else " ".join(p for p in dist if p)
