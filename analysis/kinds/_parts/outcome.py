"""What a kind's test found: the array-level :class:`Statistic`, the table-level :class:`Outcome` built
from it, and the helpers every test shares (standardised effect, the few-seeds and
unequal-token-count warnings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.inference import TTest
from analysis.kinds._parts.rejection import Estimate, Needs, combined_against, margin_p


@dataclass
class Outcome:
    """What a claim's test found, before multiplicity adjustment and the verdict rule.

    Attributes:
        p_value: p-value in the claimed direction (NaN when no test was possible).
        effect: the effect in the metric's units, signed as documented per claim kind.
        ci: (low, high) two-sided 95% t interval of ``effect`` over seeds.
        contradicted: the evidence excludes the claimed effect (its CI lies on the wrong side of 0, or
            outside the equivalence margin for an equivalence claim).
        seeds_used / seeds_excluded: seeds in the test / seeds dropped (with the reason).
        warnings: anything a reader must know (degenerate data, too few seeds, fit warnings, ...).
        details: kind-specific numbers for reports (per-contrast tests, mean profile, ...).
        effect_values: (S,) per-seed values whose mean is ``effect`` (for the bootstrap display and the
            equivalence check against ``margin``); empty when the effect is not a mean over seeds.
        std_effect: standardised effect (mean / sd of the binding test's per-seed values) in the claimed
            direction; the basis of the power and seeds-needed numbers of an inconclusive claim.
        two_sided: the binding test is two-sided (power is computed at alpha / 2 per side).
        not_testable: non-empty when the table holds nothing to test the claim on (:class:`NotTestable`):
            the verdict's whole reason (``not testable on this source: metric ... is not in the table``).
        estimates: per contrast the estimate a declared margin is tested on (:func:`margin_p`); empty:
            the one-sample t test of ``effect_values``.
        needs: how the contrasts combine (``every`` or ``one``; see :func:`contradiction`).
        holm_contrasts: the binding p is Holm-adjusted across this many contrasts (a trend over ``any``
            of k layers: k), so it cannot go below k * labellings^-S and its power is at alpha / k.
        seed_effects: per seed the effect, positive in the claimed direction, that claims across
            conditions compare (:meth:`ClaimBase.seed_effect`); empty where the kind has none.
        p_against: the p of the claim's opposite that ``contradicted`` compares with
            :data:`REJECT_LEVEL` (:func:`combined_against`; NaN where the kind records none), so claims
            built on this one (``holds_in_all``, ``controls``) can combine it with others.
    """

    p_value: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool = False
    seeds_used: list[int] = field(default_factory=list)
    seeds_excluded: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    effect_values: list[float] = field(default_factory=list)
    std_effect: float = float("nan")
    two_sided: bool = False
    labellings_per_seed: int = 0  # randomisation tests: K! (JT) or 2 (sign flips); p >= this^-S. 0 = t-based
    not_testable: str = ""  # why the table cannot test the claim at all (e.g. its metric is absent)
    estimates: list[Estimate] = field(default_factory=list)
    needs: Needs = "every"
    holm_contrasts: int = 1
    p_against: float = float("nan")
    # per seed the effect signed so that positive is the claimed direction (ClaimBase.seed_effect); empty
    # where the kind has none that is independent across seeds
    seed_effects: dict[int, float] = field(default_factory=dict)

    def margin_p(self, margin: float) -> float:
        """p of "the effect lies within +-margin" (:func:`margin_p`; NaN when it cannot be tested)."""
        if self.estimates:
            return margin_p(self.estimates, margin, self.needs)
        if len(self.effect_values) < 2:
            return float("nan")
        from analysis.inference import t_test

        return margin_p([Estimate.of(t_test(np.asarray(self.effect_values)))], margin, self.needs)


@dataclass(frozen=True, kw_only=True)
class Statistic:
    """What a kind's array-level test (its ``*_statistics`` function) found on per-seed arrays.

    Attributes:
        p: p-value in the claimed direction (NaN when no test was possible).
        effect: the effect, in the units the kind documents (metric units, per unit of x for a slope).
        ci: (low, high) 95% interval of ``effect``.
        contradicted: the REJECTED rule's test: the evidence excludes the claimed effect
            (:func:`contradiction` of ``p_against``).
        std_effect: standardised effect of the binding test in the claimed direction (mean / sd).
        values: (S,) per-seed values whose mean is ``effect`` (empty when it is no mean over seeds).
        warnings: what a reader must know (degenerate data, too few seeds, ...).
    """

    p: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool
    std_effect: float
    values: np.ndarray
    warnings: list[str]
    p_against: list[float] = field(default_factory=list)  # per contrast, one-sided p the wrong way


def std_effect(test: TTest, sign: float = 1.0) -> float:
    """mean / sd of a t_test result, signed towards the claim (NaN when sd is 0 or undefined)."""
    sd = test.sd
    return sign * test.mean / sd if sd and math.isfinite(sd) and sd > 0 else float("nan")


def few_seeds_warning(n: int, p: float) -> list[str]:
    """The warning of a test that could not run: too few seeds, or no variation between them."""
    if n < 2:
        return [f"needs >= 2 seeds (has {n}): no test across seeds is possible"]
    if math.isnan(p):
        return ["zero between-seed variance: no test across seeds is possible"]
    return []


def token_count_warnings(counts: dict[str, list[int]]) -> list[str]:
    """A warning when compared conditions rest on different numbers of tokens.

    Effective rank, participation ratio and similar estimates are biased downward at smaller N, so a
    difference between conditions of unequal token counts mixes the effect with that bias.
    """
    known = {name: tuple(c) for name, c in counts.items() if c}
    if len(set(known.values())) <= 1:
        return []
    listed = ", ".join(f"{name}: {'/'.join(map(str, c))}" for name, c in known.items())
    return [
        f"compared conditions rest on different token counts ({listed}); finite-sample bias differs between them"
    ]


def outcome_from_stats(
    stat: Statistic, seeds: list[int], excluded: dict[int, str], details: dict[str, Any], **extra: Any
) -> Outcome:
    """An Outcome from an array core's :class:`Statistic`; ``extra`` sets further Outcome fields."""
    needs = extra.get("needs", "every")
    extra.setdefault("p_against", combined_against(stat.p_against, needs) if stat.p_against else float("nan"))
    return Outcome(
        p_value=stat.p,
        effect=stat.effect,
        ci=(stat.ci[0], stat.ci[1]),
        contradicted=bool(stat.contradicted),
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=list(stat.warnings),
        details=details,
        effect_values=np.asarray(stat.values, float).tolist(),
        std_effect=stat.std_effect,
        **extra,
    )


def paired_outcome(
    stat: Statistic,
    seeds: list[int],
    excluded: dict[int, str],
    details: dict[str, Any],
    resolved: dict[str, dict[str, Any]],
    **extra: Any,
) -> Outcome:
    """``outcome_from_stats`` for claims over paired conditions, plus the unequal-token-count warning."""
    out = outcome_from_stats(stat, seeds, excluded, details, **extra)
    out.warnings += token_count_warnings({k: r["n_tokens"] for k, r in resolved.items()})
    return out
