"""``ordering``: a per-seed summary of each dataset follows the order in which the datasets are listed.

Per seed and dataset the metric is summarised over layers (mean, min, argmin, range). Without levels:
Jonckheere-Terpstra with a within-seed permutation p; with levels (a continuous knob per dataset):
per-seed slopes of the summary on the level, t(S-1), or MixedLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from analysis.inference import JTTest, identical_rows, jonckheere_terpstra
from analysis.kinds._parts.adjust import adjusted_outcome, group_covariate
from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.curves import crossing, crossing_lines, summarise_layers
from analysis.kinds._parts.display import FigureContext, Result
from analysis.kinds._parts.outcome import Outcome, outcome_from_stats, token_count_warnings
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.selection import (
    claim_view,
    complete_seeds,
    knob_levels_of,
    knob_rows,
    token_counts,
)
from analysis.kinds._parts.table import TableView
from analysis.kinds._parts.trend_statistics import TrendStatistic, trend_statistics
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.knobs import Knob

if TYPE_CHECKING:
    import pandas as pd

    from analysis.report.figures import Figure


class OrderingClaim(ClaimBase):
    """A per-seed summary of each dataset is ordered as the datasets are listed.

    Per seed and dataset the metric is summarised over ``layers`` (``mean``, ``min``, ``argmin``: the
    depth index of the minimum, or ``range``: max - min). Without ``levels``: Jonckheere-Terpstra with
    a permutation p-value. With ``levels`` (a continuous knob value per dataset): per-seed slopes of
    the summary on the level, t(S-1) (``method: mixed`` fits MixedLM instead). ``over: <knob>`` (a
    sweep's claim) replaces ``datasets``: the groups are the knob's values across the sweep's trials, in
    ascending order, and the test is the per-seed slope of the summary on the knob (``level``: where the
    per-seed curve reaches that value).
    """

    kind: Literal["ordering"]
    datasets: list[str] | None = Field(None, min_length=2)
    over: Knob | None = None
    level: float | None = None
    direction: Literal["increasing", "decreasing"]
    layers: list[str] = Field(min_length=1)
    summary: Literal["mean", "min", "argmin", "range"] = "mean"
    levels: list[float] | None = None
    method: Literal["slope", "mixed"] = "slope"
    n_permutations: int = Field(4999, ge=99)  # exact enumeration is used when it is smaller
    margin: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _levels_match(self) -> OrderingClaim:
        if (self.datasets is None) == (self.over is None):
            raise ValueError("give either datasets (in their claimed order) or over: <a swept knob>")
        if self.over is not None:
            if self.levels is not None:
                raise ValueError("over a knob the levels are the knob's values; drop levels")
            return self
        if self.level is not None:
            raise ValueError("level is for an ordering over a swept knob (over: <knob>)")
        assert self.datasets is not None
        if self.levels is not None and len(self.levels) != len(self.datasets):
            raise ValueError(
                f"levels needs one value per dataset ({len(self.datasets)}), got {len(self.levels)}"
            )
        if len(set(self.datasets)) != len(self.datasets):
            raise ValueError("datasets must be distinct")
        return self

    def knob(self) -> str | None:
        return self.over

    def cross_problem(self) -> str | None:
        return None

    def seed_effect_text(self) -> str:
        on = f"the {self.over}" if self.over else ("the levels" if self.levels else "the dataset's rank")
        return (
            f"the per-seed slope of the {self.summary} on {on}, signed so that {self.direction} is positive"
        )

    def adjustable(self) -> bool:
        return self.method == "slope"


@dataclass(frozen=True, kw_only=True)
class OrderingStatistic(TrendStatistic):
    """:class:`~analysis.kinds._parts.trend_statistics.TrendStatistic` of the per-seed slopes on the rank (or levels), plus
    ``jt``: the Jonckheere-Terpstra test that decides without levels (else None)."""

    jt: JTTest | None = None


_TREND_FIELDS = [f.name for f in fields(TrendStatistic)]


def ordering_statistics(
    y: np.ndarray,
    direction: str = "increasing",
    levels: np.ndarray | None = None,
    method: str = "slope",
    n_permutations: int = 4999,
    seed: int = 0,
) -> OrderingStatistic:
    """Ordered conditions: per-seed summaries ``y`` (S, K), columns in the claimed order.

    Without ``levels``: Jonckheere-Terpstra over the K groups with a permutation p-value (exact when the
    distinct labellings are few). With ``levels`` (K,) a continuous knob: per-seed slopes of y on the
    level, t(S-1) (or MixedLM for ``method: mixed``). Either way the effect is the mean per-seed slope
    (on the rank 0..K-1 without levels) with a 95% t CI over seeds.

    Returns:
        An :class:`OrderingStatistic` (a :class:`~analysis.kinds._parts.trend_statistics.TrendStatistic` plus ``jt``).
    """
    y = np.asarray(y, dtype=np.float64)
    k = y.shape[1]
    x = np.arange(k, dtype=np.float64) if levels is None else np.asarray(levels, dtype=np.float64)
    trend = trend_statistics(
        x, y, direction, "mixed" if (levels is not None and method == "mixed") else "slope"
    )
    out = OrderingStatistic(**{f: getattr(trend, f) for f in _TREND_FIELDS}, jt=None)
    if levels is None:
        jt = jonckheere_terpstra(y, direction, n_permutations, seed)
        n = y.shape[0]
        p = jt.p if n >= 2 else float("nan")
        warnings = [w for w in out.warnings if "between-seed variance" not in w]
        if n >= 2 and np.ptp(y) == 0:
            warnings.append("all summaries identical: no ordering can be tested")
            p = float("nan")
        elif identical_rows(y):
            # JT permutes within seeds: seeds that repeat one pattern (a run copied) give a tiny p from
            # one seed's information
            warnings.append(
                "zero between-seed variance: every seed's summaries are the same up to a constant, so no "
                "test across seeds is possible"
            )
            p = float("nan")
        out = replace(out, jt=jt, method_used="Jonckheere-Terpstra (permutation)", p=p, warnings=warnings)
    return out


def evaluate(
    table: pd.DataFrame | TableView,
    claim: OrderingClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """Per-seed summaries of the listed datasets follow their listed order (see :func:`ordering_statistics`).

    Effect: mean per-seed slope of the summary on the dataset's rank (0..K-1), or on ``levels``; in
    metric units (layer-index units for ``argmin``) per step. Seeds are matched by seed id across datasets;
    a seed missing in any dataset is excluded.
    """
    import pandas as pd

    view = claim_view(table, claim, where)
    excluded = dict(excluded or {})
    groups: list[str]
    levels: list[float] | None
    cols: dict[str, pd.Series] = {}
    counts: dict[str, list[int]] = {}
    rows: dict[str, pd.DataFrame] = {}  # per group its rows at the epoch (the covariate of adjust_for)
    if claim.knob() is not None:
        groups, levels, cols, counts = _knob_groups(view, claim, where)
    else:
        assert claim.datasets is not None
        groups, levels = list(claim.datasets), claim.levels
        for i, ds in enumerate(claim.datasets):
            df = view.slice(claim.metric, ds, claim.subset.token_set, where, f"datasets[{i}].")
            df, _ = view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")
            wide = view.wide(df, list(claim.layers), where, "layers")
            cols[ds] = summarise_layers(wide, claim.summary, _depth(df))
            counts[ds] = token_counts(df[df.layer.isin(claim.layers)])
            rows[ds] = df[df.layer.isin(claim.layers)]
    frame = pd.DataFrame(cols)
    seeds = complete_seeds([frame], excluded)
    y = frame.loc[seeds, groups].to_numpy(dtype=np.float64)
    stat = ordering_statistics(
        y, claim.direction, None if levels is None else np.asarray(levels), claim.method, claim.n_permutations
    )
    details = {
        "summary": claim.summary,
        "test": "jonckheere_terpstra_permutation" if levels is None else f"slope_on_levels ({claim.method})",
        "method_used": stat.method_used,
        "jt": asdict(stat.jt) if stat.jt else None,
        "per_seed_summary": {
            ds: dict(zip(seeds, map(float, y[:, j]), strict=True)) for j, ds in enumerate(groups)
        },
        "mean_summary": dict(zip(groups, map(float, y.mean(axis=0)) if len(seeds) else [], strict=False)),
        **({"mixed": stat.mixed.to_dict()} if stat.mixed else {}),
    }
    if levels is not None and claim.knob() is not None:
        details["curve"] = {
            "knob": claim.knob(),
            "x": list(levels),
            "per_seed": dict(zip(seeds, y.tolist(), strict=True)),
        }
        if claim.level is not None and len(seeds):
            details["crossing"] = crossing(np.asarray(levels), y, claim.level)
    sign = 1.0 if claim.direction == "increasing" else -1.0
    out = outcome_from_stats(
        stat,
        seeds,
        excluded,
        details,
        labellings_per_seed=math.factorial(len(groups)) if levels is None else 0,
        seed_effects=dict(zip(seeds, map(float, sign * np.asarray(stat.values)), strict=True)),
    )
    out.warnings += token_count_warnings(counts)
    if claim.adjust_for is not None:  # the slope at equal covariate decides; the raw one stays beside it
        x = np.arange(len(groups), dtype=float) if levels is None else np.asarray(levels, float)
        rows = rows or _knob_rows_by_group(view, claim, where, groups, levels)
        z = group_covariate({g: rows[g] for g in groups}, claim.adjust_for, where)
        out = adjusted_outcome(out, claim.adjust_for, x, frame.loc[seeds, groups], z, claim.direction)
    return out


def _knob_rows_by_group(
    view: TableView, claim: OrderingClaim, where: str, groups: list[str], levels: list[float] | None
) -> dict[str, pd.DataFrame]:
    """Over a knob: per group label its rows at the claim's epoch in the claimed layers (every trial with
    that knob value)."""
    knob = claim.over
    assert knob is not None and levels is not None
    df, _ = knob_rows(view, claim, knob, where)
    df = df[df.layer.isin(claim.layers)]
    return {g: df[df[knob] == lv] for g, lv in zip(groups, levels, strict=True)}


def _depth(df: pd.DataFrame) -> dict[str, int]:
    """Layer name -> depth index (``layer_index``) in a slice of the table."""
    return {str(k): int(v) for k, v in df.drop_duplicates("layer").set_index("layer").layer_index.items()}


def _knob_groups(
    view: TableView, claim: OrderingClaim, where: str
) -> tuple[list[str], list[float], dict[str, pd.Series], dict[str, list[int]]]:
    """Over a knob: group labels ``knob=value`` (ascending), the values, and per group the per-seed summary
    (the mean over trials sharing the value, when a sweep varies other knobs too) and token counts."""
    import pandas as pd

    knob = claim.over
    assert knob is not None
    df, _ = knob_rows(view, claim, knob, where)
    view.wide(df, list(claim.layers), where, "layers")  # one-line error for a missing layer
    levels = knob_levels_of(df, knob, where)  # one level: not testable (no slope), never a test
    order = _depth(df)
    per_trial = {}
    for ds, rows in df.groupby("dataset", sort=True):
        wide = view.wide(rows, list(claim.layers), where, "layers")
        per_trial[ds] = (float(rows[knob].iloc[0]), summarise_layers(wide, claim.summary, order))
    cols: dict[str, pd.Series] = {}
    counts: dict[str, list[int]] = {}
    groups: list[str] = []
    for level in levels:
        label = f"{knob}={level:g}"
        groups.append(label)
        cols[label] = pd.concat([v for lv, v in per_trial.values() if lv == level], axis=1).mean(
            axis=1, skipna=False
        )
        counts[label] = token_counts(df[(df[knob] == level) & df.layer.isin(claim.layers)])
    return groups, levels, cols, counts


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    y = rng.normal(0, 1, (n_seeds, 1)) + effect * np.arange(3)[None, :] + rng.normal(0, 1, (n_seeds, 3))
    return (y,), effect


def _test(with_levels: bool) -> Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial]:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        levels = np.array([0.0, 1.0, 2.0]) if with_levels else None
        st = ordering_statistics(
            arrays[0], "increasing", levels, n_permutations=999, seed=int(rng.integers(1 << 30))
        )
        covered = bool(st.ci[0] <= truth <= st.ci[1])
        return {"p": st.p, "covered": covered, "warned": False, "contradicted": bool(st.contradicted)}

    return test


def _labellings(claim: OrderingClaim) -> int:
    """Distinct within-seed labellings of the JT permutation test (0: a t test, over levels or a knob)."""
    if claim.datasets is None or claim.levels is not None:
        return 0
    return math.factorial(len(claim.datasets))


def effect_unit(claim: OrderingClaim) -> str:
    """The unit of the ordering's effect, a per-seed slope of the summary (the metric's units, or a layer
    index for ``argmin``): per unit of the knob, per unit of ``levels``, or per rank step of the datasets."""
    base = " layer index" if claim.summary == "argmin" else unit_of(claim.metric)
    if claim.over is not None:
        return f"{base} per unit of {claim.over}"
    return f"{base} {'per unit of level' if claim.levels is not None else 'per rank step'}"


def figures(ctx: FigureContext) -> list[Figure]:
    """The metric by layer at the tested epoch for every listed dataset, in order, summarised layers shaded."""
    from analysis.report.figures import profile_figure

    claim = ctx.claim
    if claim.knob() is not None:
        from analysis.report.figures import summary_bounds
        from analysis.report.knob_figures import knob_figure

        bounds = summary_bounds(claim.metric, claim.summary)
        return [
            knob_figure(
                ctx.result, f"{claim.summary} of {claim.metric}", bounds, ctx.table, effect_unit(claim)
            )
        ]
    return [
        profile_figure(
            ctx.table,
            claim.metric,
            claim.subset.token_set,
            list(claim.datasets),
            claim.subset.epoch,
            regions={f"{claim.summary} over": list(claim.layers)},
            colours=ctx.colours,
            ylim=ctx.ylim,
        )
    ]


def explain(claim: OrderingClaim, result: Result) -> list[str]:
    """The test, each dataset's mean summary and its per-seed summaries."""
    d = result.details
    lines = [f"test: {d.get('test')}, per-seed {d.get('summary')} over {len(claim.layers)} layer(s)"]
    lines += crossing_lines(d.get("crossing"), claim.knob())
    if d.get("jt"):
        jt = d["jt"]
        how = "exact over" if jt.get("exact") else "Monte Carlo,"
        lines.append(
            f"Jonckheere-Terpstra statistic {fmt_num(jt.get('stat'), 1)} in the claimed direction; "
            f"permutation p {fmt_p(jt.get('p'))} ({how} {jt.get('n_labellings')} labellings within seeds)"
        )
    for ds, mean in (d.get("mean_summary") or {}).items():
        per_seed = ", ".join(
            f"seed {s}: {fmt_num(v)}" for s, v in (d.get("per_seed_summary", {}).get(ds) or {}).items()
        )
        lines.append(f"{ds}: mean {fmt_num(mean)}; per seed {per_seed}")
    return lines


register_kind(
    ClaimKind(
        name="ordering",
        model=OrderingClaim,
        evaluate=evaluate,
        calibration={
            "ordering_jt": Scenario(
                "3 datasets with equal means, seed offsets", draw=_draw, test=_test(False)
            ),
            "ordering_levels": Scenario(
                "3 knob levels with equal means, seed offsets", draw=_draw, test=_test(True)
            ),
        },
        labellings_per_seed=_labellings,
        figures=figures,
        explain=explain,
        effect_unit=effect_unit,
        example={
            "kind": "ordering",
            "metric": "eed_pct",
            "subset": {},
            "datasets": ["objects", "mixed", "textures"],
            "direction": "increasing",
            "layers": ["block_02", "block_03", "block_04", "block_05"],
            "summary": "min",
        },
    )
)
