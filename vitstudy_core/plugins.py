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
"""

from __future__ import annotations

import importlib
import sys
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
        found = {group: list(metadata.entry_points(group=group)) for group in GROUPS}
        if not any(found.values()):
            # no plug-in installed: nothing to register, and no reason to import every registry's module
            # here (a verb that reads one registry, e.g. the CLI's --executor choices, would otherwise
            # import every claim kind, metric and dataset: about 1 s on 2 cores, measured by bench/cli.py)
            return True
        regs = registries()
        for group in GROUPS:
            points = sorted(found[group], key=lambda e: (_distribution(e), e.name))
            for ep in points:
                before = {g: set(r.names()) for g, r in regs.items()}
                try:
                    ep.load()
                except Exception as err:  # any failure of a third party's import: name it, keep going
                    for g, reg in regs.items():
                        reg.discard([n for n in reg.names() if n not in before[g]])
                    broken = Broken(group, ep.name, _distribution(ep), _one_line(err))
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


def origin(reg: Registry, name: str) -> str:
    """Where ``reg``'s entry ``name`` comes from: ``'built-in'``, a distribution's ``'name version'``, or
    ``'module M'`` for one registered by code outside any installed distribution (a test, a script)."""
    dist = distribution_of(reg, name)
    return "built-in" if dist is None else " ".join(p for p in dist if p)
