"""``python -m study plugins [--json]``: every plug-in registry and what is registered in it.

Each part a hypothesis file or the command line names by a string is registered in one
:class:`~vitstudy_core.registry.Registry` (docs/plugins.md says how to add one). This lists them in the
order a study uses them, with the module that holds each registry, so a newcomer can see what exists and
where to look. Nothing trains and torch is not imported.
"""

from __future__ import annotations

import json

from vitstudy_core.registry import Registry


def registries() -> dict[str, tuple[str, Registry]]:
    """``{title: (module of the registry, registry)}`` for every plug-in registry, in study order."""
    from analysis.kinds import KINDS
    from analysis.observables import OBSERVABLES
    from analysis.spectral import METRICS
    from runners.datasets import DATASETS
    from runners.executors import EXECUTORS
    from runners.objectives import OBJECTIVES
    from runners.sources import SOURCES

    return {
        "datasets": ("runners.datasets.base.DATASETS", DATASETS),
        "objectives": ("runners.objectives.base.OBJECTIVES", OBJECTIVES),
        "run sources": ("runners.sources.base.SOURCES", SOURCES),
        "executors": ("runners.executors.EXECUTORS", EXECUTORS),
        "eigenvalue metrics": ("analysis.spectral.METRICS", METRICS),
        "observables": ("analysis.observables.OBSERVABLES", OBSERVABLES),
        "claim kinds": ("analysis.kinds.base.KINDS", KINDS),
    }


def plugins_verb(as_json: bool = False) -> int:
    """Print every registry: its title, where it lives and its registered names (``--json``: a mapping
    ``{title: {"registry": module, "names": [...]}}``)."""
    regs = registries()
    if as_json:
        print(json.dumps({t: {"registry": m, "names": r.names()} for t, (m, r) in regs.items()}, indent=1))
        return 0
    for title, (module, reg) in regs.items():
        print(f"{title} ({module}):")
        print("  " + ", ".join(reg.names()))
    return 0
