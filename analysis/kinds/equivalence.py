"""``equivalence``: condition ``a`` minus condition ``b`` lies within +-margin ("stays flat"), by TOST.

A non-significant difference is not evidence of no difference: two one-sided t(S-1) tests against the
margin declared in the file, p = the larger of the two.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from analysis.inference import t_p, tost
from analysis.kinds._parts.claim import ClaimBase, Condition
from analysis.kinds._parts.display import Result, condition_figures, describe_condition, per_seed_text
from analysis.kinds._parts.outcome import Outcome, Statistic, few_seeds_warning, paired_outcome
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.selection import claim_view, paired
from analysis.kinds._parts.table import TableView
from vitstudy_core.fmt import fmt_num, unit_of

if TYPE_CHECKING:
    import pandas as pd


class EquivalenceClaim(ClaimBase):
    """Condition ``a`` minus condition ``b`` lies within +-``margin`` (TOST, t(S-1)): "stays flat"."""

    kind: Literal["equivalence"]
    a: Condition
    b: Condition
    margin: float = Field(gt=0)  # in the metric's units; declared before looking at the data


def equivalence_statistics(a: np.ndarray, b: np.ndarray, margin: float) -> Statistic:
    """TOST on the paired per-seed difference ``d = a - b``: equivalent when |mean d| < margin.

    Args:
        a, b: (S,) per-seed values of the two conditions (paired by seed); margin: > 0, metric units.

    Returns:
        A :class:`Statistic`: ``p`` = max of the two one-sided t(S-1) p-values, ``effect`` = mean(d) in
        metric units, ``ci`` (95% t), ``contradicted`` (the 95% CI lies entirely outside [-margin,
        margin]), ``std_effect`` = (margin - |mean d|) / sd (the binding one-sided test's shift),
        ``values`` = d.
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    r = tost(d, margin)
    sd = r.sd
    std = (margin - abs(r.mean)) / sd if sd and math.isfinite(sd) and sd > 0 else float("nan")
    warnings = few_seeds_warning(d.size, r.p)
    if d.size >= 2 and math.isnan(r.p):
        where = "inside" if abs(r.mean) < margin else "outside"
        warnings.append(f"identical per-seed differences {where} the margin: equivalence cannot be tested")
    # outside the margin is shown only with between-seed variation (a point CI is no evidence either way)
    contradicted = r.outside and not math.isnan(r.p)
    # the p of "outside the margin" (one side at a time: its CI lying outside is this below 2.5%), for
    # claims that combine this one's REJECTED rule with others (holds_in_all)
    se = sd / math.sqrt(d.size) if d.size >= 2 and math.isfinite(sd) else float("nan")
    against = (
        min(
            t_p((r.mean - margin) / se, d.size - 1, "greater"),
            t_p((r.mean + margin) / se, d.size - 1, "less"),
        )
        if not math.isnan(r.p) and se > 0
        else float("nan")
    )
    return Statistic(
        p=r.p,
        effect=r.mean,
        ci=r.ci,
        contradicted=contradicted,
        std_effect=std,
        values=d,
        warnings=warnings,
        p_against=[against],
    )


def evaluate(
    table: pd.DataFrame | TableView,
    claim: EquivalenceClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """TOST of ``a - b`` within +-margin (see :func:`equivalence_statistics`). Effect: mean a - b."""
    view = claim_view(table, claim, where)
    excluded = dict(excluded or {})
    (a, b), seeds, resolved = paired(view, claim, [("a", claim.a), ("b", claim.b)], where, excluded)
    stat = equivalence_statistics(a, b, claim.margin)
    details = {
        "conditions": resolved,
        "margin": claim.margin,
        "per_seed_diff": dict(zip(seeds, map(float, stat.values), strict=True)),
    }
    return paired_outcome(stat, seeds, excluded, details, resolved)


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    truth = 1.0 - min(effect, 1.0)  # margin 1: effect = how far inside the margin (capped at the centre)
    return (rng.normal(0, 1, n_seeds) + truth, np.zeros(n_seeds)), truth


def _test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
    st = equivalence_statistics(arrays[0], arrays[1], 1.0)
    covered = bool(st.ci[0] <= truth <= st.ci[1])
    return {"p": st.p, "covered": covered, "warned": False, "contradicted": bool(st.contradicted)}


def explain(claim: EquivalenceClaim, result: Result) -> list[str]:
    """The two conditions, the margin and the per-seed differences."""
    d = result.details
    unit = unit_of(claim.metric)
    lines = []
    if d.get("conditions"):
        lines.append(
            f"a: {describe_condition(d['conditions']['a'])}; b: {describe_condition(d['conditions']['b'])}"
        )
    lines.append(
        f"TOST: a - b = {fmt_num(result.effect)}{unit} (95% CI {fmt_num(result.ci_low)}, {fmt_num(result.ci_high)}) "
        f"against the declared margin +-{fmt_num(d.get('margin'))}{unit}; p = the larger one-sided p"
    )
    if d.get("per_seed_diff"):
        lines.append(f"per-seed a - b: {per_seed_text(d['per_seed_diff'])}")
    return lines


def _margin(claim: Any) -> float | None:
    """The claim holds when the effect lies within +-margin."""
    return claim.margin


def _no_margin(claim: Any) -> None:
    return None  # the margin is what the claim tests, not a way to reject it


def _planning_effect(claim: EquivalenceClaim) -> float:
    """How far inside the margin the true difference is assumed to lie: ``sesoi``, or (default) the whole
    margin, i.e. a true difference of 0."""
    return claim.sesoi if claim.sesoi is not None else claim.margin


register_kind(
    ClaimKind(
        name="equivalence",
        model=EquivalenceClaim,
        evaluate=evaluate,
        calibration={
            "equivalence": Scenario("true difference exactly at the margin (1 SD)", draw=_draw, test=_test)
        },
        figures=condition_figures,
        explain=explain,
        example={
            "kind": "equivalence",
            "metric": "eed_pct",
            "subset": {"dataset": "textures"},
            "a": {"layers": ["block_04"]},
            "b": {"layers": ["block_01"]},
            "margin": 3.0,
        },
        rejection_margin=_no_margin,
        holds_within=_margin,
        planning_effect=_planning_effect,
    )
)
