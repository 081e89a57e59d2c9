"""``trend``: the metric increases (or decreases) over epochs, or over layers in depth order.

Per seed the OLS slope (or Kendall tau) of the metric over the ordered factor, tested across seeds with
t(S-1) (taus with an exact sign-flip p); or a MixedLM with random intercept and slope by seed, also with
t(S-1). Several layers are pooled, or all / any of them required.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from analysis.inference import (
    per_seed_kendall,
)
from analysis.kinds._parts.adjust import (
    adjusted_outcome,
    adjusted_trial,
    draw_confounded,
    group_covariate,
)
from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.curves import crossing, crossing_lines
from analysis.kinds._parts.display import FigureContext, Result
from analysis.kinds._parts.outcome import Outcome
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.scenario import Scenario
from analysis.kinds._parts.selection import claim_view, complete_seeds, knob_levels_of, knob_rows
from analysis.kinds._parts.table import OneLevel, TableView
from analysis.kinds._parts.trend_scenarios import (
    _SPACINGS,
    _draw,
    _draw_at,
    _layer_scenarios,
    _raw_trial,
    _test,
)
from analysis.kinds._parts.trend_statistics import (
    TrendStatistic,
    layers_statistics,
)
from analysis.mixed import fit_random_slopes
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.knobs import Knob

if TYPE_CHECKING:
    import pandas as pd

    from analysis.report.figures import Figure


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


def _epochs(df: pd.DataFrame, claim: TrendClaim, where: str) -> list[int]:
    """The epochs the trend runs over; fewer than 2 raise :class:`OneLevel` (one x value: no slope)."""
    have = sorted(int(e) for e in df.epoch.unique())
    if claim.epochs is None:
        if len(have) < 2:
            got = f"one epoch ({have[0]})" if have else "no epoch"
            raise OneLevel(f"the table holds {got}: a trend over epochs needs at least 2", where, "epochs")
        return have
    missing = [e for e in claim.epochs if e not in have]
    if missing:
        raise StudyError(f"epochs {missing} are not in the table (it has {have})", where, "epochs")
    if len(set(claim.epochs)) < 2:
        raise OneLevel(
            f"one epoch ({claim.epochs[0]}): a trend over epochs needs at least 2", where, "epochs"
        )
    return sorted(set(claim.epochs))


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
        if len(set(claim.layers)) < 2:
            raise OneLevel(
                f"one layer ({claim.layers[0]}): a trend over layers needs at least 2", where, "layers"
            )
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
    import pandas as pd

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
    from analysis.report.figures import epoch_figure, profile_figure

    claim, table = ctx.claim, ctx.table
    if claim.knob() is not None:
        from analysis.observables import metric_range
        from analysis.report.knob_figures import knob_figure

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
