"""Where a u_shape's bottleneck sits and how deep it is, in words: the one text the terminal,
``verdicts.txt``, ``verdicts.json`` (``details.bottleneck_location.text``) and the report print, so they
cannot disagree.

A location is given only where every replicate (seed, probe block for ``unit: images``, model for
``unit: models``) has an interior minimum between the shoulders: a replicate whose lowest in-between layer
sits at an edge, above the shoulder beside it, has no bottleneck there, and a mean over it would place one
where the profile does not dip. Its 95% CI is in layer names, rounded outwards and clipped to the layers
between the shoulders (``bottleneck_location.layers``; results from before it: the observed layers).
"""

from __future__ import annotations

from typing import Any

from analysis.kinds._parts.curves import layer_location
from vitstudy_core.fmt import fmt_interval, unit_of

_REPLICATES = {"images": ("probe block", "probe blocks"), "models": ("model", "models")}


def replicates(details: dict[str, Any]) -> tuple[str, str]:
    """What a claim's replicates are, (one, many): seeds, or probe blocks / models by its ``unit``."""
    unit = (details.get("unit") or {}).get("unit")
    return _REPLICATES.get(str(unit), ("seed", "seeds"))


def bottleneck_text(details: dict[str, Any]) -> str | None:
    """``bottleneck at block_05 (95% CI block_04 to block_06)``, ``bottleneck between block_05 and
    block_06 (...)``, or why there is no location; None without ``details.bottleneck_location``."""
    loc = details.get("bottleneck_location")
    if not loc:
        return None
    one, many = replicates(details)
    n, k = loc.get("seeds"), loc.get("interior_seeds")
    if n and k is not None and k < n:
        edges = " or ".join(loc.get("edges") or []) or "an edge"
        if k == 0:
            return (
                f"no bottleneck location: no interior minimum between the shoulders (in every {one} the "
                f"lowest layer between them, {edges}, lies at their edge, above the shoulder layer beside "
                "it: the profile does not dip there)"
            )
        return (
            f"no bottleneck location: {n - k} of {n} {many} have no interior minimum between the shoulders "
            f"(their lowest layer between them, {edges}, lies at their edge, above the shoulder layer beside it)"
        )
    layers = loc.get("layers")
    within = "the layers between the shoulders"
    if not layers:  # a result from before the location recorded its layers
        layers = {str(p["layer"]): int(p["layer_index"]) for p in details.get("profile") or []}
        within = "the observed layers"
    where = layer_location(loc["mean_layer_index"], loc["ci"], layers, within)
    return f"bottleneck {where}" if where.startswith("between ") else f"bottleneck at {where}"


def depth_text(details: dict[str, Any], metric: str) -> str | None:
    """``depth 1.23 pp (95% CI 0.80, 1.66)``: the shoulders' mean minus the bottleneck; None without it."""
    depth = details.get("bottleneck_depth")
    if not depth:
        return None
    return f"depth {fmt_interval(depth['mean'], depth['ci'], unit_of(metric))}"
