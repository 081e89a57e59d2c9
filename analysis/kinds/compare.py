"""``compare``: condition ``a`` differs from ``b`` (greater, less or two-sided), paired by seed, t(S-1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from analysis.inference import Alternative, opposite, t_test
from analysis.kinds._parts.claim import ClaimBase, Condition
from analysis.kinds._parts.display import Result, condition_figures, describe_condition, per_seed_text
from analysis.kinds._parts.outcome import Outcome, Statistic, few_seeds_warning, paired_outcome, std_effect
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.rejection import contradiction
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.selection import claim_view, paired
from analysis.kinds._parts.table import TableView

if TYPE_CHECKING:
    import pandas as pd


class CompareClaim(ClaimBase):
    """Condition ``a`` differs from ``b`` (paired by seed): ``greater``, ``less`` or ``two-sided``."""

    kind: Literal["compare"]
    a: Condition
    b: Condition
    alternative: Literal["greater", "less", "two-sided"] = "greater"
    margin: float | None = Field(None, gt=0)

    def cross_problem(self) -> str | None:
        return None

    def seed_effect_text(self) -> str:
        return "a - b per seed" + (", signed so that less is positive" if self.alternative == "less" else "")


def compare_statistics(a: np.ndarray, b: np.ndarray, alternative: Alternative = "greater") -> Statistic:
    """Paired per-seed difference ``d = a - b`` tested with t(S-1).

    Args:
        a, b: (S,) per-seed values of the two conditions (paired by seed).
        alternative: ``greater`` (a > b), ``less`` or ``two-sided``.

    Returns:
        A :class:`Statistic`: ``effect`` = mean(d) in metric units, ``ci`` (95% t), ``contradicted`` (the
        CI lies entirely on the side opposite to a one-sided claim; never for two-sided), ``values`` = d.
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    t = t_test(d, alternative)
    n = d.size
    # one-sided: contradicted when the other side is significant at 2.5% (the CI lies entirely there);
    # never for two-sided. Zero between-seed variance allows neither side (p NaN)
    against = [t_test(d, opposite(alternative)).p] if alternative != "two-sided" else []
    sign = {"greater": 1.0, "less": -1.0}.get(alternative, float(np.sign(t.mean) or 1.0))
    return Statistic(
        p=t.p,
        effect=t.mean,
        ci=t.ci,
        p_against=against,
        contradicted=bool(against) and n >= 2 and contradiction(against, "every"),
        std_effect=std_effect(t, sign),
        values=d,
        warnings=few_seeds_warning(n, t.p),
    )


def evaluate(
    table: pd.DataFrame | TableView,
    claim: CompareClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """Condition ``a`` vs ``b``, paired by seed, t(S-1) (see :func:`compare_statistics`). Effect: mean a - b."""
    view = claim_view(table, claim, where)
    excluded = dict(excluded or {})
    (a, b), seeds, resolved = paired(view, claim, [("a", claim.a), ("b", claim.b)], where, excluded)
    stat = compare_statistics(a, b, claim.alternative)
    details = {
        "conditions": resolved,
        "per_seed_diff": dict(zip(seeds, map(float, stat.values), strict=True)),
    }
    sign = -1.0 if claim.alternative == "less" else 1.0
    return paired_outcome(
        stat,
        seeds,
        excluded,
        details,
        resolved,
        two_sided=claim.alternative == "two-sided",
        seed_effects=dict(zip(seeds, map(float, sign * stat.values), strict=True)),
    )


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    """(a (S,), b (S,)) sharing a seed offset; a - b has mean ``effect`` and SD sqrt(2)."""
    base = rng.normal(0, 1, n_seeds)
    return (base + effect + rng.normal(0, 1, n_seeds), base + rng.normal(0, 1, n_seeds)), effect


def _test(alternative: Alternative) -> Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial]:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        st = compare_statistics(arrays[0], arrays[1], alternative)
        covered = bool(st.ci[0] <= truth <= st.ci[1])
        return {"p": st.p, "covered": covered, "warned": False, "contradicted": bool(st.contradicted)}

    return test


def explain(claim: CompareClaim, result: Result) -> list[str]:
    """The two conditions, the alternative and the per-seed differences."""
    d = result.details
    lines = []
    if d.get("conditions"):
        lines.append(
            f"a: {describe_condition(d['conditions']['a'])}; b: {describe_condition(d['conditions']['b'])}"
        )
    lines.append(f"paired t(S-1) test of a - b, alternative: {claim.alternative}")
    if d.get("per_seed_diff"):
        lines.append(f"per-seed a - b: {per_seed_text(d['per_seed_diff'])}")
    return lines


register_kind(
    ClaimKind(
        name="compare",
        model=CompareClaim,
        evaluate=evaluate,
        calibration={
            "compare": Scenario("no difference (one-sided greater)", draw=_draw, test=_test("greater")),
            "compare_two_sided": Scenario("no difference (two-sided)", draw=_draw, test=_test("two-sided")),
        },
        figures=condition_figures,
        explain=explain,
        images=lambda claim: None,  # unit: images fits every compare claim ...
        # ... whose rows hold: on eed_pct type-I was 0.069 > 0.064 at 256 images (bench/calibration.py)
        images_calibrated=frozenset({"participation_ratio"}),
        example={
            "kind": "compare",
            "metric": "eed_pct",
            "subset": {},
            "a": {"dataset": "textures", "layers": ["block_04"]},
            "b": {"dataset": "objects", "layers": ["block_04"]},
        },
    )
)
