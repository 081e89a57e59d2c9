"""What measured a run: the plug-in parts that shape what a run computes, as they enter its key.

    plugin_parts(payload)   # {} for a run of built-ins only; else e.g.
    # {"observables": {"norm_spread": {"distribution": "my-plugins", "version": "2"}},
    #  "objective": {"mirrored": {"distribution": "my-plugins", "version": None}}}

A run's dataset kind, objective and source decide what is trained; the observables and token-count
metrics the study's claims name are what it needs measured into ``scalars.json``. Each of these that an
installed distribution (not this one) registered enters the run key (``study.runspecs.run_key``) with its
distribution's name and the version the part declared when it registered (``Registry.register(...,
version=...)``, ``register_observable(..., version=...)``, ``register_token_metric(..., version=...)``).
So a study that uses a plug-in's part, after installing it or bumping its declared version, gets new keys:
its runs are trained and measured again, never reused without the part's values; removing the plug-in
makes such a study invalid. A study that uses none keeps its keys whatever is installed (its runs also
hold the values of every observable registered when they were measured, which it does not need). The
distribution's own version stays out (a release that changes nothing a part computes keeps the keys), and
eigenvalue metrics stay out (computed from the stored spectra when the table is read: no new runs).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from runners.sources import DEFAULT_SOURCE
from vitstudy_core.plugins import ROLE_GROUPS, distribution_of, registry_of

# payload field -> entry-point group of the registry naming what that field selects
_SELECTED = {field: ROLE_GROUPS[field] for field in ("dataset", "objective", "source")}
# what a claim's metric may name besides an eigenvalue metric (measured at extraction, in scalars.json)
_MEASURED = {role: ROLE_GROUPS[role] for role in ("observables", "token_metrics")}


def _part(group: str, name: str) -> dict[str, Any] | None:
    reg = registry_of(group)
    dist = distribution_of(reg, name) if name in reg else None
    return None if dist is None else {"distribution": dist[0], "version": reg.version_of(name)}


def _selected(payload: dict, field: str) -> str | None:
    """The registered name a run payload's ``field`` selects (None: none, e.g. an imported run's
    ``objective: none``)."""
    value = payload.get(field, DEFAULT_SOURCE if field == "source" else None)
    if field == "dataset":
        from runners.datasets import kind_of

        return kind_of(value)
    if isinstance(value, dict):
        return value.get("kind")
    return value if isinstance(value, str) else None


def claimed_metrics(claims: Iterable[Any]) -> set[str]:
    """Every ``metric`` a study's claims name, an inner claim's included (``claims``: validated claims)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("metric"), str):
                found.add(value["metric"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk([c.model_dump() for c in claims])
    return found


def plugin_parts(payload: dict, metrics: Collection[str] = ()) -> dict[str, dict[str, dict[str, Any]]]:
    """The plug-in parts (not built-in) that shape the run of ``payload`` (a run spec's fields) for a
    study whose claims name ``metrics``, by role then name: ``{"observables": {name: {"distribution": ...,
    "version": ...}}, ...}``; ``{}`` when every such part is built-in."""
    parts: dict[str, dict[str, dict[str, Any]]] = {}
    for field, group in _SELECTED.items():
        name = _selected(payload, field)
        info = _part(group, name) if name is not None else None
        if name is not None and info is not None:
            parts[field] = {name: info}
    for role, group in _MEASURED.items():
        reg = registry_of(group)
        found = {n: info for n in sorted(set(metrics)) if n in reg and (info := _part(group, n)) is not None}
        if found:
            parts[role] = found
    return parts
