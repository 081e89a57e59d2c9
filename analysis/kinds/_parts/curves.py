"""Per-seed curves summarised: where curves along a knob reach a level (:func:`crossing`), a location
along depth in layer names (:func:`layer_location`), one number per seed from its layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def crossing(x: np.ndarray, y: np.ndarray, level: float) -> dict[str, Any]:
    """Where curves first reach ``level``, by linear interpolation between neighbouring points.

    Args:
        x: (T,) ascending knob values; y: (S, T) per-seed curves.

    Returns:
        dict with ``per_seed`` (S,) crossing x (NaN where a curve never reaches the level), ``mean_curve``
        (the crossing of the seed-mean curve, NaN if none), and ``mean``/``ci`` (95% t over the seeds that
        cross), ``n_crossing`` and ``x_range`` (the swept [min, max] of x).
    """
    from analysis.inference import t_test

    def first(curve: np.ndarray) -> float:
        d = curve - level
        if d[0] == 0:
            return float(x[0])
        for i in range(len(d) - 1):
            if d[i] == 0 or d[i] * d[i + 1] < 0 or d[i + 1] == 0:
                if d[i + 1] == d[i]:
                    return float(x[i])
                return float(x[i] + (x[i + 1] - x[i]) * (-d[i]) / (d[i + 1] - d[i]))
        return float("nan")

    x, y = np.asarray(x, float), np.asarray(y, float)
    per_seed = np.array([first(row) for row in y])
    ok = per_seed[np.isfinite(per_seed)]
    if len(ok) >= 2:
        t = t_test(ok, "two-sided")
        mean, ci = t.mean, t.ci
    else:
        mean, ci = (float(ok.mean()) if len(ok) else float("nan")), (float("nan"), float("nan"))
    return {
        "level": float(level),
        "per_seed": per_seed.tolist(),
        "mean_curve": first(y.mean(axis=0)) if len(y) else float("nan"),
        "mean": float(mean),
        "ci": list(ci),
        "n_crossing": int(len(ok)),
        "x_range": [float(x.min()), float(x.max())] if len(x) else [float("nan")] * 2,
    }


def crossing_lines(cross: dict[str, Any] | None, knob: str | None) -> list[str]:
    """The report's line for a :func:`crossing` result (none without one): where the seed-mean curve and
    the seeds' curves reach the level, or that they never do within the swept range."""
    if not cross:
        return []
    from vitstudy_core.fmt import fmt_num

    level, n = fmt_num(cross["level"]), len(cross["per_seed"])
    lo, hi = cross.get("x_range") or (None, None)
    swept = (
        f"the swept range ({knob} {lo:g} to {hi:g})"
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
        else "the swept range"
    )
    mean_curve = cross.get("mean_curve")
    if mean_curve is None or not math.isfinite(mean_curve):
        head = f"the seed-mean curve never reaches {level} within {swept}"
    else:
        head = f"the seed-mean curve reaches {level} at {knob} = {fmt_num(mean_curve, 3)}"
    k = int(cross.get("n_crossing", 0))
    if k == 0:
        return [f"{head}; no seed's curve reaches it"]
    ci = cross["ci"]
    where = (
        f"at {fmt_num(cross['mean'], 3)} (95% CI {fmt_num(ci[0], 3)}, {fmt_num(ci[1], 3)})"
        if k >= 2
        else f"at {fmt_num(cross['mean'], 3)} (one seed: no CI)"
    )
    return [f"{head}; {k} of {n} seeds' curves reach it, {where}"]


def layer_location(
    mean_index: float, ci: Sequence[float], layers: dict[str, int], within: str = "the observed layers"
) -> str:
    """A location along depth (a mean layer index over seeds and its 95% CI) in layer names.

    Args:
        mean_index: the mean over seeds of a per-seed layer index.
        ci: its (low, high) interval (NaN: none).
        layers: the layers it can be at, name -> layer index.
        within: what ``layers`` are, in words (said when the CI is clipped to them).

    Returns:
        ``block_05 (95% CI block_03 to block_07)``, or ``between block_05 and block_06 (...)`` for a mean
        between two layers: the CI's bounds rounded outwards to layers and clipped to the first and last of
        ``layers`` (said so), never shown as indices no layer has.
    """
    from vitstudy_core.fmt import fmt_num

    if not layers or not math.isfinite(mean_index):
        return f"mean layer index {fmt_num(mean_index, 1)}"
    order = sorted(layers.items(), key=lambda kv: kv[1])
    below = [n for n, i in order if i <= mean_index] or [order[0][0]]
    above = [n for n, i in order if i >= mean_index] or [order[-1][0]]
    text = below[-1] if below[-1] == above[0] else f"between {below[-1]} and {above[0]}"
    low, high = (float(v) for v in ci)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{text} (95% CI n/a)"
    first = ([n for n, i in order if i <= low] or [order[0][0]])[-1]
    last = ([n for n, i in order if i >= high] or [order[-1][0]])[0]
    clipped = low < order[0][1] or high > order[-1][1]
    note = f", clipped to {within}, {order[0][0]}..{order[-1][0]}" if clipped else ""
    return f"{text} (95% CI {first} to {last}{note})"


def no_interior_minimum(location: dict[str, Any]) -> str | None:
    """The words for a bottleneck location no seed has (``details.bottleneck_location`` whose
    ``interior_seeds`` is 0), else None (older results, without the count, are read as before)."""
    if location.get("interior_seeds") != 0 or not location.get("seeds"):
        return None
    edges = " or ".join(location.get("edges") or []) or "an edge"
    return (
        f"no interior minimum between the shoulders (in every seed the lowest layer between them, "
        f"{edges}, lies at their edge, above the shoulder layer beside it: the profile does not dip there)"
    )


def summarise_layers(wide: pd.DataFrame, summary: str, order: dict[str, int]) -> pd.Series:
    """Per seed, one number from a (seed x layer) frame: ``mean``, ``min``, ``range`` (max - min) or
    ``argmin`` (the depth index ``order[layer]`` of the minimum); NaN where a seed misses a layer."""
    import pandas as pd

    if summary == "mean":
        return wide.mean(axis=1, skipna=False)
    if summary == "min":
        return wide.min(axis=1, skipna=False)
    if summary == "range":
        return wide.max(axis=1, skipna=False) - wide.min(axis=1, skipna=False)
    idx = np.array([order[c] for c in wide.columns], dtype=np.float64)
    out = pd.Series(idx[np.argmin(wide.to_numpy(), axis=1)], index=wide.index)
    return out.where(wide.notna().all(axis=1))
