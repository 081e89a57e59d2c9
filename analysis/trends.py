"""Trends over an ordered factor and orderings across conditions, tested with the seed as the unit.

``trend``: per seed, the OLS slope (or Kendall tau) of the metric over epochs (or layers), tested across
seeds with t(S-1); or a MixedLM with random intercept and slope by seed, also with t(S-1). ``ordering``:
per seed and dataset a summary of the metric; Jonckheere-Terpstra with a permutation p-value across the
datasets' claimed order, or per-seed slopes on a continuous knob. This module never imports torch.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from analysis.claims import (
    Outcome,
    TableView,
    _few_seeds_warning,
    _std,
    complete_seeds,
    outcome_from_stats,
    token_count_warnings,
    token_counts,
)
from analysis.inference import jonckheere_terpstra, per_seed_kendall, per_seed_slopes, sign_flip_p, t_test
from analysis.mixed import fit_random_slopes
from core.errors import StudyError


def trend_statistics(
    x: np.ndarray, y: np.ndarray, direction: str = "increasing", method: str = "slope"
) -> dict:
    """Test a monotone trend of y over x with the seed as the unit.

    Args:
        x: (T,) the ordered factor (epochs, layer indices), shared by all seeds.
        y: (S, T) per-seed values.
        direction: ``increasing`` or ``decreasing``.
        method: ``slope`` (per-seed OLS slopes, one-sample t(S-1)), ``kendall`` (per-seed Kendall tau-b, exact
            sign-flip p) or ``mixed`` (MixedLM ``y ~ x + (1 + x | seed)``, REML, slope tested with t(S-1)).

    Returns:
        dict with ``p`` (one-sided in ``direction``), ``effect`` (mean per-seed slope in units of the
        metric per unit of x, or mean tau; the fixed slope for ``mixed``), ``ci`` (95%), ``values``
        (per-seed slopes or taus, (S,)), ``contradicted`` (CI entirely on the other side of 0),
        ``std_effect``, ``mixed`` (the MixedLM result for ``mixed``), ``warnings``.
    """
    y = np.asarray(y, dtype=np.float64)
    alt = "greater" if direction == "increasing" else "less"
    sign = 1.0 if direction == "increasing" else -1.0
    values = per_seed_kendall(x, y) if method == "kendall" else per_seed_slopes(x, y)
    t = t_test(values, alt)
    if method == "kendall" and len(values) >= 2:
        # taus are discrete and bounded: with few seeds a t test on them is not calibrated (0.084 at S = 3),
        # the exact sign-flip test is (the CI stays a t interval, for display)
        t["p"] = sign_flip_p(values, alt) if np.ptp(values) > 0 or t["mean"] != 0 else float("nan")
    out = {
        "p": t["p"],
        "effect": t["mean"],
        "ci": t["ci"],
        "values": values,
        "std_effect": _std(t, sign),
        "mixed": None,
        "warnings": _few_seeds_warning(len(values), t["p"]),
    }
    if method == "kendall" and 2 ** len(values) < 40:
        out["warnings"].append(
            f"sign-flip p of Kendall taus cannot go below 2^-{len(values)} = {0.5 ** len(values):.3f}"
        )
    if method == "mixed":
        fit = fit_random_slopes(x, y, alt)
        out.update(p=fit["p"], effect=fit["slope"], ci=fit["ci"], mixed=fit)
        out["warnings"] = _few_seeds_warning(len(values), fit["p"]) + fit["warnings"]
    lo, hi = out["ci"]
    out["contradicted"] = len(values) >= 2 and (hi < 0 if sign > 0 else lo > 0)
    return out


def ordering_statistics(
    y: np.ndarray,
    direction: str = "increasing",
    levels: np.ndarray | None = None,
    method: str = "slope",
    n_permutations: int = 4999,
    seed: int = 0,
) -> dict:
    """Ordered conditions: per-seed summaries ``y`` (S, K), columns in the claimed order.

    Without ``levels``: Jonckheere-Terpstra over the K groups with a permutation p-value (exact when the
    distinct labellings are few). With ``levels`` (K,) a continuous knob: per-seed slopes of y on the
    level, t(S-1) (or MixedLM for ``method: mixed``). Either way the effect is the mean per-seed slope
    (on the rank 0..K-1 without levels) with a 95% t CI over seeds.

    Returns:
        dict like :func:`trend_statistics` plus ``jt`` (the JT result, or None).
    """
    y = np.asarray(y, dtype=np.float64)
    k = y.shape[1]
    x = np.arange(k, dtype=np.float64) if levels is None else np.asarray(levels, dtype=np.float64)
    out = trend_statistics(
        x, y, direction, "mixed" if (levels is not None and method == "mixed") else "slope"
    )
    out["jt"] = None
    if levels is None:
        jt = jonckheere_terpstra(y, direction, n_permutations, seed)
        out["jt"] = jt
        n = y.shape[0]
        out["p"] = jt["p"] if n >= 2 else float("nan")
        out["warnings"] = [w for w in out["warnings"] if "between-seed variance" not in w]
        if n >= 2 and np.ptp(y) == 0:
            out["warnings"].append("all summaries identical: no ordering can be tested")
            out["p"] = float("nan")
    return out


def _epochs(df: pd.DataFrame, claim, where: str) -> list[int]:
    have = sorted(int(e) for e in df.epoch.unique())
    if claim.epochs is None:
        return have
    missing = [e for e in claim.epochs if e not in have]
    if missing:
        raise StudyError(f"epochs {missing} are not in the table (it has {have})", where, "epochs")
    return sorted(claim.epochs)


def _trend_arrays(view: TableView, claim, where: str) -> tuple[np.ndarray, dict[str, pd.DataFrame]]:
    """x (T,) and, per series (a layer, or ``pooled``), a (seed x T) frame."""
    df = view.slice(claim.metric, claim.subset.dataset, claim.subset.token_set, where)
    if claim.over == "layer":
        df, _ = view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")
        wide = view.wide(df, list(claim.layers), where, "layers")
        order = df.drop_duplicates("layer").set_index("layer").layer_index
        return order.loc[list(claim.layers)].to_numpy(dtype=np.float64), {"over layers": wide}
    epochs = _epochs(df, claim, where)
    df = df[df.epoch.isin(epochs)]
    view.wide(df, list(claim.layers), where, "layers")  # one-line error for a missing layer
    df = df[df.layer.isin(claim.layers)]
    cube = df.pivot_table(index="seed", columns=["layer", "epoch"], values="value", aggfunc="mean")
    x = np.asarray(epochs, dtype=np.float64)
    if claim.aggregate == "pooled":
        pooled = cube.T.groupby(level="epoch").mean().T.reindex(columns=epochs)
        # a seed missing any layer at an epoch must not be averaged over fewer layers
        counts = cube.notna().T.groupby(level="epoch").sum().T.reindex(columns=epochs)
        pooled = pooled.where(counts == len(claim.layers))
        return x, {"pooled": pooled}
    return x, {layer: cube[layer].reindex(columns=epochs) for layer in claim.layers}


def test_trend(table, claim, where: str = "claim", excluded: dict[int, str] | None = None) -> Outcome:
    """Monotone trend over epochs (or layers) with the seed as the unit (see :func:`trend_statistics`).

    Several layers: ``pooled`` tests the per-seed mean over the layers; ``all`` requires every layer
    (intersection-union: p = max over layers, effect and CI of the binding layer); ``any`` requires one
    (Holm across layers: p = the smallest Holm-adjusted p). Effect: mean per-seed slope, in metric units
    per epoch (per layer index for ``over: layer``), or mean Kendall tau.
    """
    view = TableView.of(table)
    excluded = dict(excluded or {})
    x, series = _trend_arrays(view, claim, where)
    seeds = complete_seeds(list(series.values()), excluded)
    stats_by = {
        name: trend_statistics(x, frame.loc[seeds].to_numpy(dtype=np.float64), claim.direction, claim.method)
        for name, frame in series.items()
    }
    names = list(stats_by)
    ps = [stats_by[n]["p"] for n in names]
    warnings: list[str] = []
    if len(names) == 1 or claim.aggregate != "any":
        # IUT over layers: the claim holds only where every layer's does; max p needs no correction
        p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
        binding = max(names, key=lambda n: stats_by[n]["p"] if not math.isnan(stats_by[n]["p"]) else math.inf)
        contradicted = any(s["contradicted"] for s in stats_by.values())
        holm_p = ps
    else:
        finite = [i for i, v in enumerate(ps) if not math.isnan(v)]
        holm_p = [float("nan")] * len(ps)
        if finite:
            for i, a in zip(finite, multipletests([ps[i] for i in finite], method="holm")[1], strict=True):
                holm_p[i] = float(a)
        p = min((v for v in holm_p if not math.isnan(v)), default=float("nan"))
        binding = names[int(np.nanargmin(holm_p))] if finite else names[0]
        contradicted = all(s["contradicted"] for s in stats_by.values())
    for n in names:
        warnings += [w if len(names) == 1 else f"{n}: {w}" for w in stats_by[n]["warnings"]]
    warnings = list(dict.fromkeys(warnings))
    b = stats_by[binding]
    details = {
        "x": x.tolist(),
        "method": claim.method,
        "binding": binding,
        "per_series": {
            n: {
                "effect": s["effect"],
                "ci": list(s["ci"]),
                "p": s["p"],
                "p_holm_across_layers": hp,
                "per_seed": dict(zip(seeds, map(float, s["values"]), strict=True)),
                **({"mixed": s["mixed"]} if s["mixed"] else {}),
            }
            for (n, s), hp in zip(stats_by.items(), holm_p, strict=True)
        },
    }
    if claim.method != "mixed" and len(names) == 1 and len(seeds) >= 2:
        # the mixed model as a second opinion (random intercept and slope by seed, t(S-1))
        fit = fit_random_slopes(x, series[names[0]].loc[seeds].to_numpy(dtype=np.float64))
        details["mixed_model"] = fit
        if fit["warnings"]:  # one line: the verdict does not rest on this fit; the full list stays in details
            n = len(fit["warnings"])
            warnings.append(
                f"mixed model (display only, not the verdict's test): {n} fitting warning{'s' * (n > 1)}, "
                f"last: {fit['warnings'][-1]} (all in details.mixed_model.warnings)"
            )
    return Outcome(
        p_value=p,
        effect=b["effect"],
        ci=tuple(b["ci"]),
        contradicted=bool(contradicted),
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=warnings,
        details=details,
        effect_values=np.asarray(b["values"], float).tolist() if claim.method != "mixed" else [],
        std_effect=b["std_effect"],
        labellings_per_seed=2 if claim.method == "kendall" else 0,
    )


def _summarise(wide: pd.DataFrame, summary: str, order: dict[str, int]) -> pd.Series:
    if summary == "mean":
        return wide.mean(axis=1, skipna=False)
    if summary == "min":
        return wide.min(axis=1, skipna=False)
    if summary == "range":
        return wide.max(axis=1, skipna=False) - wide.min(axis=1, skipna=False)
    idx = np.array([order[c] for c in wide.columns], dtype=np.float64)
    out = pd.Series(idx[np.argmin(wide.to_numpy(), axis=1)], index=wide.index)
    return out.where(wide.notna().all(axis=1))


def test_ordering(table, claim, where: str = "claim", excluded: dict[int, str] | None = None) -> Outcome:
    """Per-seed summaries of the listed datasets follow their listed order (see :func:`ordering_statistics`).

    Effect: mean per-seed slope of the summary on the dataset's rank (0..K-1), or on ``levels``; in
    metric units (layer-index units for ``argmin``) per step. Seeds are matched by seed id across datasets;
    a seed missing in any dataset is excluded.
    """
    view = TableView.of(table)
    excluded = dict(excluded or {})
    cols, counts = {}, {}
    for i, ds in enumerate(claim.datasets):
        df = view.slice(claim.metric, ds, claim.subset.token_set, where, f"datasets[{i}].")
        df, ep = view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")
        wide = view.wide(df, list(claim.layers), where, "layers")
        order = df.drop_duplicates("layer").set_index("layer").layer_index.to_dict()
        cols[ds] = _summarise(wide, claim.summary, order)
        counts[ds] = token_counts(df[df.layer.isin(claim.layers)])
    frame = pd.DataFrame(cols)
    seeds = complete_seeds([frame], excluded)
    y = frame.loc[seeds, list(claim.datasets)].to_numpy(dtype=np.float64)
    stat = ordering_statistics(
        y,
        claim.direction,
        None if claim.levels is None else np.asarray(claim.levels),
        claim.method,
        claim.n_permutations,
    )
    details = {
        "summary": claim.summary,
        "test": "jonckheere_terpstra_permutation"
        if claim.levels is None
        else f"slope_on_levels ({claim.method})",
        "jt": stat["jt"],
        "per_seed_summary": {
            ds: dict(zip(seeds, map(float, y[:, j]), strict=True)) for j, ds in enumerate(claim.datasets)
        },
        "mean_summary": dict(
            zip(claim.datasets, map(float, y.mean(axis=0)) if len(seeds) else [], strict=False)
        ),
        **({"mixed": stat["mixed"]} if stat["mixed"] else {}),
    }
    out = outcome_from_stats(
        stat,
        seeds,
        excluded,
        details,
        labellings_per_seed=math.factorial(len(claim.datasets)) if claim.levels is None else 0,
    )
    out.warnings += token_count_warnings(counts)
    return out
