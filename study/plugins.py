"""``python -m study plugins [--json]``: every plug-in registry, what is registered in it and where from.

Each part a hypothesis file or the command line names by a string is registered in one
:class:`~vitstudy_core.registry.Registry` (docs/plugins.md says how to add one, in this repository or in a
package of your own). This lists them in the order a study uses them, with the module that holds each
registry and its entry-point group, and says of every entry where it comes from: ``built-in``, or the
name and version of the installed distribution whose entry point registered it. Plug-ins that could not
be loaded are listed last, one line each. Nothing trains and torch is not imported.
"""

from __future__ import annotations

import json

import vitstudy_core.plugins as loader
from vitstudy_core.plugins import load_plugins, origin, registry_of
from vitstudy_core.registry import Registry

# title -> (entry-point group, module and name of the registry), in study order
TITLES: dict[str, tuple[str, str]] = {
    "datasets": ("vitstudy.datasets", "runners.datasets.base.DATASETS"),
    "objectives": ("vitstudy.objectives", "runners.objectives.base.OBJECTIVES"),
    "run sources": ("vitstudy.sources", "runners.sources.base.SOURCES"),
    "executors": ("vitstudy.executors", "runners.executors.local.EXECUTORS"),
    "eigenvalue metrics": ("vitstudy.metrics", "analysis.spectral.METRICS"),
    "token-count metrics": ("vitstudy.token_metrics", "analysis.spectral.TOKEN_METRICS"),
    "observables": ("vitstudy.observables", "analysis.observables.OBSERVABLES"),
    "claim kinds": ("vitstudy.kinds", "analysis.kinds.base.KINDS"),
}


def registries() -> dict[str, tuple[str, Registry]]:
    """``{title: (module of the registry, registry)}`` for every plug-in registry, in study order, with
    the installed plug-ins loaded."""
    load_plugins()
    return {title: (module, registry_of(group)) for title, (group, module) in TITLES.items()}


def plugins_verb(as_json: bool = False) -> int:
    """Print every registry: its title, where it lives, its entry-point group and its registered names,
    each with its origin when it is not built-in (``--json``: ``{"registries": {title: {"registry": module,
    "group": group, "names": [...], "origins": {name: origin}}}, "broken": [line, ...]}``)."""
    regs = registries()
    broken = [b.line() for b in loader.BROKEN]
    if as_json:
        out = {
            t: {"registry": m, "group": r.group, "names": r.names(), "origins": {n: origin(r, n) for n in r}}
            for t, (m, r) in regs.items()
        }
        print(json.dumps({"registries": out, "broken": broken}, indent=1))
        return 0
    for title, (module, reg) in regs.items():
        print(f"{title} ({module}, entry points {reg.group}):")
        names = [n if origin(reg, n) == "built-in" else f"{n} [{origin(reg, n)}]" for n in reg]
        print("  " + ", ".join(names))
    for line in broken:
        print(line)
    return 0
