"""``extremum``: a target condition is the highest (or lowest) of itself and every listed competitor.

Per seed, the paired differences target - competitor; each one-sided t(S-1); intersection-union over the
competitors (p = the largest), so no correction is needed inside the claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from analysis.inference import TTest, t_test
from analysis.kinds._parts.claim import ClaimBase, Condition
from analysis.kinds._parts.display import Result, condition_figures, describe_condition
from analysis.kinds._parts.outcome import Outcome, Statistic, few_seeds_warning, paired_outcome, std_effect
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.rejection import Estimate, contradiction
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.selection import claim_view, paired
from analysis.kinds._parts.table import TableView
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of

if TYPE_CHECKING:
    import pandas as pd


class ExtremumClaim(ClaimBase):
    """``target`` is the highest (or lowest) of itself and every listed competitor.

    Per seed, differences target - competitor; each one-sided t(S-1); intersection-union over them.
    """

    kind: Literal["extremum"]
    direction: Literal["highest", "lowest"] = "highest"
    target: Condition
    competitors: list[Condition] = Field(min_length=1)
    margin: float | None = Field(None, gt=0)

    def cross_problem(self) -> str | None:
        return None

    def seed_effect_text(self) -> str:
        return (
            f"per seed the target minus the competitors' mean (signed so that {self.direction} is positive)"
        )


@dataclass(frozen=True, kw_only=True)
class ExtremumStatistic(Statistic):
    """:class:`Statistic` of an extremum claim, plus ``binding`` (the column of the competitor with the
    largest p) and ``tests`` (C,) the one-sided t tests of target - competitor, metric units."""

    binding: int
    tests: list[TTest]


def extremum_statistics(
    target: np.ndarray, competitors: np.ndarray, direction: str = "highest"
) -> ExtremumStatistic:
    """Intersection-union test that ``target`` beats every competitor, on paired per-seed differences.

    Args:
        target: (S,) per-seed value of the target.
        competitors: (S, C) per-seed values of the C competitors.
        direction: ``highest`` (d = target - competitor > 0) or ``lowest`` (d = competitor - target > 0).

    Returns:
        An :class:`ExtremumStatistic`: ``p`` = max over competitors of the one-sided t(S-1) p of mean(d_c)
        > 0 (NaN if any test is impossible), ``effect`` / ``ci`` (mean d and 95% t CI of the binding
        competitor, the one with the largest p), ``contradicted`` (some competitor beats the target:
        Holm across the C competitors, one-sided 2.5%, so the REJECTED rule's rate when every
        competitor ties the target stays at most 2.5%).
    """
    sign = 1.0 if direction == "highest" else -1.0
    d = sign * (np.asarray(target, float)[:, None] - np.asarray(competitors, float))
    tests = [t_test(d[:, c], "greater") for c in range(d.shape[1])]
    against = [t_test(d[:, c], "less").p for c in range(d.shape[1])]
    n = d.shape[0]
    p = float("nan") if n < 2 or any(math.isnan(t.p) for t in tests) else max(t.p for t in tests)
    binding = int(np.argmax([t.p if not math.isnan(t.p) else math.inf for t in tests]))
    bt = tests[binding]
    return ExtremumStatistic(
        p=p,
        effect=bt.mean,
        ci=bt.ci,
        binding=binding,
        tests=tests,
        values=d[:, binding],
        p_against=against,
        contradicted=n >= 2 and contradiction(against, "every"),
        std_effect=std_effect(bt),
        warnings=few_seeds_warning(n, p),
    )


def evaluate(
    table: pd.DataFrame | TableView,
    claim: ExtremumClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """``target`` is the highest (lowest) of itself and every competitor: IUT over paired per-seed
    differences (see :func:`extremum_statistics`). Effect: mean target - binding competitor (sign
    flipped for ``lowest``), metric units."""
    view = claim_view(table, claim, where)
    excluded = dict(excluded or {})
    conds: list[tuple[str, Condition]] = [("target", claim.target)] + [
        (f"competitors[{i}]", c) for i, c in enumerate(claim.competitors)
    ]
    arrays, seeds, resolved = paired(view, claim, conds, where, excluded)
    stat = extremum_statistics(
        arrays[0], np.column_stack(arrays[1:]) if seeds else np.empty((0, len(arrays) - 1)), claim.direction
    )
    details = {
        "conditions": resolved,
        "per_competitor": [
            {
                "competitor": resolved[f"competitors[{i}]"],
                "mean_diff": t.mean,
                "ci": list(t.ci),
                "p": t.p,
            }
            for i, t in enumerate(stat.tests)
        ],
        "binding_competitor": resolved[f"competitors[{stat.binding}]"],
    }
    # a declared margin REJECTS when the target is within it of some competitor (Holm across them)
    return paired_outcome(
        stat,
        seeds,
        excluded,
        details,
        resolved,
        estimates=[Estimate.of(t) for t in stat.tests],
        needs="every",
        seed_effects=_closest_margin(arrays, seeds, claim.direction),
    )


def _closest_margin(arrays: list[np.ndarray], seeds: list[int], direction: str) -> dict[int, float]:
    """Per seed the target minus the competitors' mean (sign flipped for ``lowest``). A mean, not the
    closest competitor: a minimum over noisy differences is lower the noisier a condition's seeds, so
    equal true margins would differ across conditions of unequal noise."""
    if not seeds:
        return {}
    sign = 1.0 if direction == "highest" else -1.0
    d = sign * (arrays[0][:, None] - np.column_stack(arrays[1:]))
    return dict(zip(seeds, map(float, d.mean(axis=1)), strict=True))


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    base = rng.normal(0, 1, (n_seeds, 1))
    target = base[:, 0] + effect + rng.normal(0, 1, n_seeds)
    comps = base + np.array([0.0, -10.0, -10.0, -10.0]) + rng.normal(0, 1, (n_seeds, 4))
    return (target, comps), effect


def _tied(n_seeds: int, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    """The REJECTED rule's boundary: the target ties each of 5 competitors (uncorrected: 0.080)."""
    base = rng.normal(0, 1, (n_seeds, 1))
    return (base[:, 0] + rng.normal(0, 1, n_seeds), base + rng.normal(0, 1, (n_seeds, 5))), 0.0


def _test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
    st = extremum_statistics(arrays[0], arrays[1], "highest")
    ci = st.tests[0].ci
    covered = bool(ci[0] <= truth <= ci[1])
    return {"p": st.p, "covered": covered, "warned": False, "contradicted": bool(st.contradicted)}


def explain(claim: ExtremumClaim, result: Result) -> list[str]:
    """The target, then each competitor's paired difference with its CI and p."""
    d = result.details
    unit = unit_of(claim.metric)
    lines = [f"target: {describe_condition(d['conditions']['target'])}"] if d.get("conditions") else []
    for c in d.get("per_competitor") or []:
        binding = " (binding)" if c["competitor"] == d.get("binding_competitor") else ""
        lines.append(
            f"vs {describe_condition(c['competitor'])}: {claim.direction} by {fmt_num(c['mean_diff'])}{unit} "
            f"(95% CI {fmt_num(c['ci'][0])}, {fmt_num(c['ci'][1])}), one-sided p {fmt_p(c['p'])}{binding}"
        )
    return lines


register_kind(
    ClaimKind(
        name="extremum",
        model=ExtremumClaim,
        evaluate=evaluate,
        calibration={
            "extremum": Scenario(
                "target ties one competitor, 3 others far below (REJECTED: ties all 5)",
                draw=_draw,
                test=_test,
                boundary=_tied,
            )
        },
        figures=condition_figures,
        explain=explain,
        example={
            "kind": "extremum",
            "metric": "effective_rank",
            "subset": {"dataset": "objects", "token_set": "cls"},
            "target": {"layers": ["norm"]},
            "competitors": [{"layers": ["block_06"]}, {"layers": ["block_12"]}],
        },
    )
)
