"""``trend``: the metric increases (or decreases) over epochs, or over layers in depth order.

Per seed the OLS slope (or Kendall tau) of the metric over the ordered factor, tested across seeds with
t(S-1) (taus with an exact sign-flip p); or a MixedLM with random intercept and slope by seed, also with
t(S-1). Several layers are pooled, or all / any of them required.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

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
from analysis.kinds._adjust import (
    KNOB,
    adjusted_outcome,
    adjusted_trial,
    draw_confounded,
    group_covariate,
)
from analysis.kinds.base import (
    ClaimBase,
    ClaimKind,
    Estimate,
    FigureContext,
    Needs,
    Outcome,
    Result,
    Scenario,
    Statistic,
    TableView,
    Trial,
    claim_view,
    combined_against,
    complete_seeds,
    contradiction,
    crossing,
    crossing_lines,
    few_seeds_warning,
    knob_levels_of,
    knob_rows,
    register_kind,
    std_effect,
)
from analysis.mixed import SlopeTest, fit_random_slopes, mixed_slope_test
from analysis.simulate import KNOB_LEVELS, PAPER_EPOCHS, simulate_trends
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.knobs import Knob

if TYPE_CHECKING:
    from analysis.figures import Figure


class TrendClaim(ClaimBase):
    """The metric increases (or decreases) over epochs, over layers in depth order, or over a swept knob.

    ``layers`` lists the observation points; ``aggregate`` says how several are combined: ``pooled``
    (per seed, the mean over the layers, one test), ``all`` (every layer must show the trend:
    intersection-union) or ``any`` (at least one: Holm across layers). ``method``: per-seed OLS
    ``slope`` or Kendall ``kendall`` tau tested across seeds with t(S-1), or ``mixed`` (MixedLM,
    random intercept and slope by seed, t(S-1)). ``over: <knob>`` (a sweep's claim, ``python -m study
    sweep``): per seed the curve of the metric at ``subset.epoch`` against the knob's values across the
    trials; ``level`` asks where the curve reaches that value (the knob value, with a CI over seeds).
    """

    kind: Literal["trend"]
    needs_subset_dataset: ClassVar[bool] = True
    direction: Literal["increasing", "decreasing"]
    over: Literal["epoch", "layer"] | Knob = "epoch"
    layers: list[str] = Field(min_length=1)  # over: layer, the layers in depth order the trend runs over
    aggregate: Literal["pooled", "all", "any"] = "pooled"
    method: Literal["slope", "kendall", "mixed"] = "slope"
    epochs: list[int] | None = None  # over: epoch, the epochs used (default: all in the table)
    margin: float | None = Field(None, gt=0)  # slope per unit; equivalence within it REJECTS the trend
    level: float | None = None  # over a knob: report where the curve reaches this value

    def requires_dataset(self) -> bool:
        return self.knob() is None  # over a knob the rows come from every trial of the sweep

    def knob(self) -> str | None:
        return None if self.over in ("epoch", "layer") else self.over

    def reads_subset_epoch(self) -> bool:
        return self.over != "epoch"  # over epochs: its epochs are ``epochs`` (default all), not subset.epoch

    def cross_problem(self) -> str | None:
        if self.method != "slope":
            return "claims across conditions compare per-seed OLS slopes: use method: slope"
        if len(self.layers) > 1 and self.aggregate != "pooled":
            return "claims across conditions compare one series per seed: aggregate: pooled, or one layer"
        return None

    def seed_effect_text(self) -> str:
        over = {"epoch": "epoch", "layer": "layer index"}.get(self.over, self.over)
        return f"the per-seed slope per {over}, signed so that {self.direction} is positive"

    def adjustable(self) -> bool:
        return self.knob() is not None and self.cross_problem() is None

    @model_validator(mode="after")
    def _level_needs_knob(self) -> TrendClaim:
        if self.level is not None and self.knob() is None:
            raise ValueError("level is for a trend over a swept knob (over: <knob>)")
        return self


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


def _epochs(df: pd.DataFrame, claim: TrendClaim, where: str) -> list[int]:
    have = sorted(int(e) for e in df.epoch.unique())
    if claim.epochs is None:
        return have
    missing = [e for e in claim.epochs if e not in have]
    if missing:
        raise StudyError(f"epochs {missing} are not in the table (it has {have})", where, "epochs")
    return sorted(claim.epochs)


def _trend_arrays(
    view: TableView, claim: TrendClaim, where: str
) -> tuple[np.ndarray, dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """x (T,); per series (a layer, or ``pooled``) a (seed x T) frame; per claimed layer a (seed x T)
    frame (over epochs or a knob; empty over layers)."""
    knob = claim.knob()
    if knob is not None:
        df, _ = knob_rows(view, claim, knob, where)
        view.wide(df, list(claim.layers), where, "layers")  # one-line error for a missing layer
        levels = knob_levels_of(df, knob, where)  # one level: not testable (no slope), never a test
        return _series(df[df.layer.isin(claim.layers)], claim, knob, levels, _seeds(df))
    assert claim.subset.dataset is not None  # required without a knob (the model checks it)
    df = view.slice(claim.metric, claim.subset.dataset, claim.subset.token_set, where)
    if claim.over == "layer":
        df, _ = view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")
        wide = view.wide(df, list(claim.layers), where, "layers")
        order = df.drop_duplicates("layer").set_index("layer").layer_index
        return order.loc[list(claim.layers)].to_numpy(dtype=np.float64), {"over layers": wide}, {}
    epochs = _epochs(df, claim, where)
    df = df[df.epoch.isin(epochs)]
    view.wide(df, list(claim.layers), where, "layers")  # one-line error for a missing layer
    return _series(df[df.layer.isin(claim.layers)], claim, "epoch", epochs, _seeds(df))


def _seeds(df: pd.DataFrame) -> list[int]:
    """Every seed in a slice of the table, so a seed with no rows for the claimed layers is listed as
    excluded instead of vanishing."""
    return sorted(int(s) for s in df.seed.unique())


def _series(
    df: pd.DataFrame, claim: TrendClaim, col: str, points: list[Any], seeds: list[int]
) -> tuple[np.ndarray, dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """x, the (seed x point) frame per series and per layer, the points being the values of ``col``
    (epoch or a knob); one row per seed of ``seeds`` (NaN where it has no rows)."""
    cube = df.pivot_table(index="seed", columns=["layer", col], values="value", aggfunc="mean")
    cube = cube.reindex(index=seeds)
    x = np.asarray(points, dtype=np.float64)
    per_layer = {
        layer: (
            cube[layer] if layer in cube.columns.get_level_values(0) else pd.DataFrame(index=cube.index)
        ).reindex(columns=points)
        for layer in claim.layers
    }
    if claim.aggregate == "pooled":
        pooled = cube.T.groupby(level=col).mean().T.reindex(columns=points)
        # a seed missing any layer at a point must not be averaged over fewer layers
        counts = cube.notna().T.groupby(level=col).sum().T.reindex(columns=points)
        pooled = pooled.where(counts == len(claim.layers))
        return x, {"pooled": pooled}, per_layer
    return x, per_layer, per_layer


def describe_within_seed(
    x: np.ndarray, series: pd.DataFrame, per_layer: dict[str, pd.DataFrame], seeds: list[int], direction: str
) -> dict[int, dict[str, Any]]:
    """Descriptive statistics of each seed's own trajectory, for when no test across seeds is possible.

    Args:
        x: (T,) epochs (or layer indices).
        series: (seed x T) the tested series (the pooled mean over layers, or one layer).
        per_layer: layer -> (seed x T) frame (over epochs; empty over layers).
        seeds: the seeds to describe.
        direction: ``increasing`` or ``decreasing`` (which way a layer must move to count).

    Returns:
        seed -> ``{"kendall_tau": tau of the series with x, "first", "last": its end values,
        "layers_in_direction": layers whose own tau has the claimed sign, "n_layers", "share",
        "per_layer_tau": {layer: tau}}``. Nothing here is a test: one seed has no between-seed variance.
    """
    sign = 1.0 if direction == "increasing" else -1.0
    out = {}
    for seed in seeds:
        y = series.loc[seed].to_numpy(dtype=np.float64)
        taus = {
            layer: float(per_seed_kendall(x, f.loc[[seed]].to_numpy(dtype=np.float64))[0])
            for layer, f in per_layer.items()
        }
        moving = sum(1 for t in taus.values() if sign * t > 0)
        out[seed] = {
            "kendall_tau": float(per_seed_kendall(x, y[None, :])[0]),
            "first": float(y[0]),
            "last": float(y[-1]),
            "layers_in_direction": moving,
            "n_layers": len(taus),
            "share": moving / len(taus) if taus else float("nan"),
            "per_layer_tau": taus,
        }
    return out


def evaluate(
    table: pd.DataFrame | TableView,
    claim: TrendClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """Monotone trend over epochs (or layers) with the seed as the unit (see :func:`trend_statistics`).

    Several layers: ``pooled`` tests the per-seed mean over the layers; ``all`` requires every layer
    (intersection-union: p = max over layers, effect and CI of the binding layer); ``any`` requires one
    (Holm across layers: p = the smallest Holm-adjusted p). Effect: mean per-seed slope, in metric units
    per epoch (per layer index for ``over: layer``), or mean Kendall tau.
    """
    view = claim_view(table, claim, where)
    excluded = dict(excluded or {})
    x, series, per_layer = _trend_arrays(view, claim, where)
    seeds = complete_seeds(list(series.values()), excluded)
    agg = layers_statistics(
        x,
        {name: frame.loc[seeds].to_numpy(dtype=np.float64) for name, frame in series.items()},
        claim.direction,
        claim.method,
        claim.aggregate,
    )
    stats_by, p, binding, holm_p, needs = agg.stats, agg.p, agg.binding, agg.holm_p, agg.needs
    names = list(stats_by)
    warnings: list[str] = []
    for n in names:
        warnings += [w if len(names) == 1 else f"{n}: {w}" for w in stats_by[n].warnings]
    warnings = list(dict.fromkeys(warnings))
    b = stats_by[binding]
    details = _details(x, claim, stats_by, holm_p, binding, seeds)
    if len(names) > 1:
        details["p_against"] = agg.p_against
    if claim.knob() is not None:
        curves = series[binding].loc[seeds].to_numpy(dtype=np.float64)
        details["curve"] = {
            "knob": claim.knob(),
            "x": x.tolist(),
            "per_seed": dict(zip(seeds, curves.tolist(), strict=True)),
        }
        if claim.level is not None and len(seeds):
            details["crossing"] = crossing(x, curves, claim.level)
    if len(seeds) == 1:  # no test across seeds: the seed's own trajectory, described (never a verdict)
        details["descriptive"] = describe_within_seed(x, series[binding], per_layer, seeds, claim.direction)
    if claim.method != "mixed" and len(names) == 1 and len(seeds) >= 2:
        warnings += _display_mixed(x, series[names[0]].loc[seeds].to_numpy(dtype=np.float64), details)
    sign = 1.0 if claim.direction == "increasing" else -1.0
    one_slope = len(names) == 1 and claim.method == "slope"
    out = Outcome(
        seed_effects=dict(zip(seeds, map(float, sign * b.values), strict=True)) if one_slope else {},
        p_against=agg.p_against,
        p_value=p,
        effect=b.effect,
        ci=(b.ci[0], b.ci[1]),
        contradicted=agg.contradicted,
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=warnings,
        details=details,
        effect_values=np.asarray(b.values, float).tolist() if claim.method != "mixed" else [],
        std_effect=b.std_effect,
        labellings_per_seed=_labellings(claim),
        estimates=[s.estimate for s in stats_by.values()],
        needs=needs,
        holm_contrasts=_holm_contrasts(claim),
    )
    if claim.adjust_for is not None:  # the knob's slope at equal covariate decides; raw beside it
        z = _knob_covariate(view, claim, where, x)
        out = adjusted_outcome(out, claim.adjust_for, x, series[binding].loc[seeds], z, claim.direction)
    return out


def _knob_covariate(view: TableView, claim: TrendClaim, where: str, x: np.ndarray) -> pd.DataFrame:
    """(seed x knob value) the claim's covariate (``adjust_for``) at the claim's epoch."""
    knob, name = claim.knob(), claim.adjust_for
    assert knob is not None and name is not None  # adjust_for needs a knob (the model checks it)
    df, _ = knob_rows(view, claim, knob, where)
    df = df[df.layer.isin(claim.layers)]
    rows = {float(v): g for v, g in df.groupby(knob)}
    return group_covariate({v: rows[v] for v in x.tolist() if v in rows}, name, where).reindex(
        columns=x.tolist()
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
        p_against: the p of the claim's opposite (:func:`~analysis.kinds.base.combined_against`).
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


def _details(
    x: np.ndarray,
    claim: TrendClaim,
    stats_by: dict[str, TrendStatistic],
    holm_p: list[float],
    binding: str,
    seeds: list[int],
) -> dict[str, Any]:
    """The report's numbers: per series its effect, CI, p (raw and Holm across layers) and per-seed values."""
    return {
        "x": x.tolist(),
        "method": claim.method,
        "method_used": stats_by[binding].method_used,
        "binding": binding,
        "per_series": {
            n: {
                "effect": s.effect,
                "ci": list(s.ci),
                "p": s.p,
                "p_holm_across_layers": hp,
                "method_used": s.method_used,
                "per_seed": dict(zip(seeds, map(float, s.values), strict=True)),
                **({"mixed": s.mixed.to_dict()} if s.mixed else {}),
            }
            for (n, s), hp in zip(stats_by.items(), holm_p, strict=True)
        },
    }


def _display_mixed(x: np.ndarray, y: np.ndarray, details: dict[str, Any]) -> list[str]:
    """The mixed model as a second opinion (random intercept and slope by seed, t(S-1)), stored in
    ``details.mixed_model``; returns the one-line warning about its fit, if it warned."""
    fit = fit_random_slopes(x, y)
    details["mixed_model"] = fit.to_dict()
    if not fit.warnings:
        return []
    # one line: the verdict does not rest on this fit; the full list stays in details
    n = len(fit.warnings)
    return [
        f"mixed model (display only, not the verdict's test): {n} fitting warning{'s' * (n > 1)}, "
        f"last: {fit.warnings[-1]} (all in details.mixed_model.warnings)"
    ]


Draw = Callable[[int, float, np.random.Generator], tuple[tuple[np.ndarray, ...], float]]
Test = Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial]


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    _, y = simulate_trends(n_seeds, 6, effect * 0.5, rng, slope_sd=0.5)  # 0.5 SD per epoch of slope spread
    return (y,), effect * 0.5


def _draw_at(x: np.ndarray, slope_sd: float) -> Draw:
    """Paper scale: checkpoints 0, 1, 10, ..., 100 with a slope SD of 0.03 per epoch (a slope variance of
    ~1e-3 per epoch^2) beside an intercept SD of 3; a knob 0..1 keeps the same spread of y over its range
    (3 per unit). ``effect`` is in units of the per-seed slope SD."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
        truth = effect * slope_sd
        _, y = simulate_trends(n_seeds, len(x), truth, rng, slope_sd=slope_sd, seed_sd=3.0, x=x)
        return (y,), truth

    return draw


def _test(method: str, x: np.ndarray | None = None) -> Test:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        y = arrays[0]
        xs = np.arange(y.shape[1], dtype=float) if x is None else x
        st = trend_statistics(xs, y, "increasing", method)
        covered = None if method == "kendall" else bool(st.ci[0] <= truth <= st.ci[1])
        return {
            "p": st.p,
            "covered": covered,
            "warned": bool(st.mixed and st.mixed.fit.warnings),
            "fallback": bool(st.mixed and st.mixed.fallback_reason),
            "contradicted": bool(st.contradicted),
        }

    return test


N_LAYERS = 12  # the aggregate scenarios: a claim over every block of a 12-block ViT


def _draw_layers(aggregate: str, boundary: bool) -> Draw:
    """(y (S, L, 6),) (the seed first, so a sequential look takes the first seeds) for a trend over 12 layers, each with random slopes (SD 0.5 per epoch) and AR(1)
    noise. ``all``: layer 0 at ``effect`` and the rest far up (the IUT's least favourable null); its
    REJECTED boundary: every layer at 0. ``any``: every layer at ``effect`` (Holm's least favourable
    null); its REJECTED boundary: layer 0 at 0 and the rest far down."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
        if aggregate == "all":
            means = np.zeros(N_LAYERS) if boundary else np.r_[effect, np.full(N_LAYERS - 1, 10.0)]
        else:
            means = np.r_[0.0, np.full(N_LAYERS - 1, -10.0)] if boundary else np.full(N_LAYERS, effect)
        ys = [simulate_trends(n_seeds, 6, 0.5 * m, rng, slope_sd=0.5)[1] for m in means]
        return (np.stack(ys, axis=1),), 0.5 * effect

    return draw


def _boundary_layers(
    aggregate: str,
) -> Callable[[int, np.random.Generator], tuple[tuple[np.ndarray, ...], float]]:
    draw = _draw_layers(aggregate, True)
    return lambda n_seeds, rng: draw(n_seeds, 0.0, rng)


def _test_layers(method: str, aggregate: str) -> Test:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        ys = arrays[0]
        x = np.arange(ys.shape[2], dtype=float)
        layers = {f"layer{i}": ys[:, i] for i in range(ys.shape[1])}
        agg = layers_statistics(x, layers, "increasing", method, aggregate)
        return {"p": agg.p, "covered": None, "warned": False, "contradicted": agg.contradicted}

    return test


def _layer_scenarios() -> dict[str, Scenario]:
    out = {}
    for aggregate in ("all", "any"):
        for method in ("slope", "kendall"):
            rest = "far up" if aggregate == "all" else "at the same effect"
            out[f"trend_{method}_{aggregate}12"] = Scenario(
                f"aggregate {aggregate} over 12 layers: layer 1 at the effect, the rest {rest}; REJECTED at "
                + ("all 12 at 0" if aggregate == "all" else "layer 1 at 0, the rest far down"),
                draw=_draw_layers(aggregate, False),
                test=_test_layers(method, aggregate),
                boundary=_boundary_layers(aggregate),
            )
    return out


def _raw_trial(arrays: tuple[np.ndarray, ...], truth: Any, rng: np.random.Generator) -> Trial:
    """The unadjusted per-seed slope test on an adjusted claim's confounded null (a reference row)."""
    st = trend_statistics(KNOB, arrays[0], "decreasing", "slope")
    return {"p": st.p, "covered": None, "warned": False, "contradicted": bool(st.contradicted)}


_SPACINGS = {
    "paper": (
        PAPER_EPOCHS,
        0.03,
        "random slopes (mean 0, SD 0.03/epoch), intercept SD 3, AR(1); epochs 0,1,10..100",
    ),
    "knob": (KNOB_LEVELS, 3.0, "random slopes (mean 0, SD 3/unit), intercept SD 3, AR(1); knob 0,.25,..,1"),
}


def effect_unit(claim: TrendClaim) -> str:
    """The unit of the trend's effect: a slope in the metric's units per epoch, per layer index or per unit
    of the knob (`` pp per unit of clutter``); none for Kendall's tau."""
    if claim.method == "kendall":
        return ""
    per = {"epoch": "per epoch", "layer": "per layer index"}.get(claim.over, f"per unit of {claim.over}")
    return f"{unit_of(claim.metric)} {per}"


def _labellings(claim: TrendClaim) -> int:
    return 2 if claim.method == "kendall" else 0


def _holm_contrasts(claim: TrendClaim) -> int:
    """``any`` of k layers: the binding p is Holm-adjusted across the k."""
    return len(claim.layers) if claim.aggregate == "any" else 1


def figures(ctx: FigureContext) -> list[Figure]:
    """Over epochs: the metric against every tested epoch, one line per claimed layer. Over layers: the
    metric by layer at the tested epoch, the claimed layers shaded."""
    from analysis.figures import epoch_figure, profile_figure

    claim, table = ctx.claim, ctx.table
    if claim.knob() is not None:
        from analysis.figures import knob_figure
        from analysis.observables import metric_range

        return [knob_figure(ctx.result, claim.metric, metric_range(claim.metric), table, effect_unit(claim))]
    if claim.over == "epoch":
        x = ctx.result.details.get("x") or []
        return [
            epoch_figure(
                table,
                claim.metric,
                claim.subset.token_set,
                [claim.subset.dataset],
                [int(e) for e in x],
                list(claim.layers),
                ylim=ctx.ylim,
            )
        ]
    return [
        profile_figure(
            table,
            claim.metric,
            claim.subset.token_set,
            [claim.subset.dataset],
            claim.subset.epoch,
            regions={"trend": list(claim.layers)},
            colours=ctx.colours,
            ylim=ctx.ylim,
        )
    ]


def explain(claim: TrendClaim, result: Result) -> list[str]:
    """The method, and per series (a layer, or the pooled mean) its effect, CI, p and per-seed values."""
    d = result.details
    per = {"epoch": "per epoch", "layer": "per layer index"}.get(claim.over, f"per unit of {claim.over}")
    what = {"slope": f"OLS slope {per}", "kendall": "Kendall tau", "mixed": f"MixedLM fixed slope {per}"}[
        claim.method
    ]
    lines = [f"test: per-seed {what}, {claim.aggregate} over {len(claim.layers)} layer(s), t(S-1)"]
    unit, slope_unit = unit_of(claim.metric), effect_unit(claim)
    lines += crossing_lines(d.get("crossing"), claim.knob())
    over = {"epoch": "epochs", "layer": "layers"}.get(claim.over, claim.over)
    move = "rise" if claim.direction == "increasing" else "fall"
    for seed, desc in (d.get("descriptive") or {}).items():
        lines.append(
            f"descriptive, within seed {seed} (not a verdict: a test across seeds needs >= 2): Kendall tau "
            f"over {over} {fmt_num(desc['kendall_tau'], 2)} ({fmt_num(desc['first'], 3)} -> "
            f"{fmt_num(desc['last'], 3)}{unit})"
            + (
                f"; {desc['layers_in_direction']} of {desc['n_layers']} layers {move} "
                f"({fmt_num(100 * desc['share'], 0)}%)"
                if desc["n_layers"]
                else ""
            )
        )
    for name, s in (d.get("per_series") or {}).items():
        per_seed = ", ".join(f"seed {k}: {fmt_num(v, 3)}" for k, v in (s.get("per_seed") or {}).items())
        lines.append(
            f"{name}: {fmt_num(s['effect'], 3)}{slope_unit} (95% CI {fmt_num(s['ci'][0], 3)}, {fmt_num(s['ci'][1], 3)}), "
            f"p {fmt_p(s['p'])}"
            + (" (binding)" if name == d.get("binding") and len(d["per_series"]) > 1 else "")
            + (f"; per seed {per_seed}" if per_seed else "")
        )
    return lines


register_kind(
    ClaimKind(
        name="trend",
        model=TrendClaim,
        evaluate=evaluate,
        calibration={
            **{
                f"trend_{m}": Scenario(
                    "per-seed random slopes (mean 0) + AR(1) noise, 6 epochs", draw=_draw, test=_test(m)
                )
                for m in ("slope", "kendall", "mixed")
            },
            **{
                f"trend_{m}_{name}": Scenario(desc, draw=_draw_at(x, sd), test=_test(m, x))
                for name, (x, sd, desc) in _SPACINGS.items()
                for m in ("slope", "mixed")
            },
            **_layer_scenarios(),
            "trend_adjusted": Scenario(
                "metric follows accuracy only (accuracy falls with the knob); slope at equal accuracy",
                draw=draw_confounded,
                test=adjusted_trial(),
            ),
            "trend_adjusted_raw": Scenario(
                "the same null, unadjusted per-seed slope (reference: confounded by accuracy)",
                draw=draw_confounded,
                test=_raw_trial,
                reference=True,
            ),
        },
        labellings_per_seed=_labellings,
        holm_contrasts=_holm_contrasts,
        figures=figures,
        explain=explain,
        effect_unit=effect_unit,
        example={
            "kind": "trend",
            "metric": "effective_rank",
            "subset": {"dataset": "objects"},
            "direction": "increasing",
            "layers": ["block_01", "block_06", "block_12"],
        },
    )
)
