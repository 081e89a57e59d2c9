"""The trend's array-level tests: per-seed slopes (or Kendall taus, or a MixedLM) over an ordered factor,
tested across seeds (:func:`trend_statistics`), and several layers pooled or all / any of them required
(:func:`layers_statistics`). This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.inference import (
    Alternative,
    holm,
    identical_rows,
    opposite,
    per_seed_kendall,
    per_seed_slopes,
    sign_flip_p,
    t_p,
    t_test,
)
from analysis.kinds._parts.outcome import Statistic, few_seeds_warning, std_effect
from analysis.kinds._parts.rejection import Estimate, Needs, combined_against, contradiction
from analysis.mixed import SlopeTest, mixed_slope_test


@dataclass(frozen=True, kw_only=True)
class TrendStatistic(Statistic):
    """:class:`Statistic` of a trend, plus ``method_used`` (the test that decided, in words), ``mixed``
    (the :class:`~analysis.mixed.SlopeTest` of ``method: mixed``, else None) and ``estimate`` (the slope,
    or mean tau, its SE and df: what a declared margin is tested on)."""

    method_used: str
    estimate: Estimate
    mixed: SlopeTest | None = None


def trend_statistics(
    x: np.ndarray, y: np.ndarray, direction: str = "increasing", method: str = "slope"
) -> TrendStatistic:
    """Test a monotone trend of y over x with the seed as the unit.

    Args:
        x: (T,) the ordered factor (epochs, layer indices), shared by all seeds.
        y: (S, T) per-seed values.
        direction: ``increasing`` or ``decreasing``.
        method: ``slope`` (per-seed OLS slopes, one-sample t(S-1)), ``kendall`` (per-seed Kendall tau-b, exact
            sign-flip p) or ``mixed`` (MixedLM ``y ~ x + (1 + x | seed)``, REML, slope tested with t(S-1)).

    Returns:
        A :class:`TrendStatistic`: ``p`` one-sided in ``direction``, ``effect`` (mean per-seed slope in
        units of the metric per unit of x, or mean tau; the fixed slope for ``mixed``), ``ci`` (95%),
        ``values`` (per-seed slopes or taus, (S,)), ``p_against`` (the same test the other way) and
        ``contradicted`` (it is below 2.5%: for a t test, the CI lies entirely on the other side of 0).
        Seeds whose trajectories coincide up to a constant (one run copied, or noise-free parallel
        curves) have no between-seed variance: no method tests them (p NaN).
    """
    y = np.asarray(y, dtype=np.float64)
    alt: Alternative = "greater" if direction == "increasing" else "less"
    sign = 1.0 if direction == "increasing" else -1.0
    values = per_seed_kendall(x, y) if method == "kendall" else per_seed_slopes(x, y)
    t = t_test(values, alt)
    p, effect, ci, mixed = t.p, t.mean, t.ci, None
    against = t_test(values, opposite(alt)).p
    if method == "kendall" and len(values) >= 2:
        # taus are discrete and bounded: with few seeds a t test on them is not calibrated (0.084 at S = 3),
        # the exact sign-flip test is, both ways (the CI stays a t interval, for display). Identical seeds
        # give identical taus whose sign-flip p looks small (2^-S): they carry one seed's information
        testable = (np.ptp(values) > 0 or t.mean != 0) and not identical_rows(y)
        p = sign_flip_p(values, alt) if testable else float("nan")
        against = sign_flip_p(values, opposite(alt)) if testable else float("nan")
    warnings = few_seeds_warning(len(values), p)
    if method == "kendall" and 2 ** len(values) < 40:
        warnings.append(
            f"sign-flip p of Kendall taus cannot go below 2^-{len(values)} = {0.5 ** len(values):.3f}"
        )
    method_used = "per-seed Kendall tau (sign-flip)" if method == "kendall" else "per-seed slopes"
    estimate = Estimate.of(t)
    if method == "mixed":
        mixed = mixed_slope_test(x, y, alt)  # the fit, or the per-seed slopes where the fit is unsound
        p, effect, ci, method_used = mixed.p, mixed.effect, mixed.ci, mixed.method_used
        warnings = few_seeds_warning(len(values), mixed.p) + mixed.warnings
        estimate = Estimate(mixed.effect, mixed.se, len(values) - 1)
        ok = math.isfinite(mixed.p) and mixed.se > 0
        against = t_p(mixed.effect / mixed.se, len(values) - 1, opposite(alt)) if ok else float("nan")
    return TrendStatistic(
        p=p,
        effect=effect,
        ci=ci,
        values=values,
        std_effect=std_effect(t, sign),
        mixed=mixed,
        warnings=warnings,
        method_used=method_used,
        estimate=estimate,
        p_against=[against],
        contradicted=contradiction([against], "every") and len(values) >= 2,
    )


@dataclass(frozen=True)
class LayersStatistic:
    """A trend's test over several series (layers) combined as the claim says (:func:`layers_statistics`).

    Attributes:
        stats: series name -> its :class:`TrendStatistic`.
        p: the claim's p (``all``/one series: max p; ``any``: smallest Holm-adjusted p).
        binding: the series whose effect and CI are reported.
        holm_p: per series, its p after Holm across the series (``any``; else the raw p).
        needs: ``every`` series must trend (``all``, ``pooled``) or ``one`` (``any``).
        p_against: the p of the claim's opposite (:func:`~analysis.kinds._parts.rejection.combined_against`).
        contradicted: the REJECTED rule: ``p_against`` < 2.5%.
    """

    stats: dict[str, TrendStatistic]
    p: float
    binding: str
    holm_p: list[float]
    needs: Needs
    p_against: float
    contradicted: bool


def layers_statistics(
    x: np.ndarray, ys: dict[str, np.ndarray], direction: str, method: str, aggregate: str
) -> LayersStatistic:
    """:func:`trend_statistics` of each series ``ys[name]`` (S, T), combined: ``all`` (intersection-union:
    max p; REJECTED when some series falls, Holm across them), ``any`` (Holm across series; REJECTED only
    when every series falls) or one series (``pooled``)."""
    stats_by = {name: trend_statistics(x, y, direction, method) for name, y in ys.items()}
    p, binding, holm_p = _combine(stats_by, aggregate)
    needs: Needs = "one" if aggregate == "any" and len(stats_by) > 1 else "every"
    against = [s.p_against[0] for s in stats_by.values()]
    n = min((len(s.values) for s in stats_by.values()), default=0)
    return LayersStatistic(
        stats=stats_by,
        p=p,
        binding=binding,
        holm_p=holm_p,
        needs=needs,
        p_against=combined_against(against, needs),
        contradicted=n >= 2 and contradiction(against, needs),
    )


def _combine(stats_by: dict[str, TrendStatistic], aggregate: str) -> tuple[float, str, list[float]]:
    """Several series' tests as the claim combines them: (p, the binding series, the p of each series
    after Holm across them (``any``; else the raw p))."""
    names = list(stats_by)
    ps = [stats_by[n].p for n in names]
    if len(names) == 1 or aggregate != "any":
        # IUT over layers: the claim holds only where every layer's does; max p needs no correction
        p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
        binding = max(names, key=lambda n: stats_by[n].p if not math.isnan(stats_by[n].p) else math.inf)
        return p, binding, ps
    finite = [i for i, v in enumerate(ps) if not math.isnan(v)]
    holm_p = [float("nan")] * len(ps)
    if finite:
        for i, a in zip(finite, holm(np.array([ps[i] for i in finite])), strict=True):
            holm_p[i] = float(a)
    p = min((v for v in holm_p if not math.isnan(v)), default=float("nan"))
    binding = names[int(np.nanargmin(holm_p))] if finite else names[0]
    return p, binding, holm_p
