"""The REJECTED rule's tests: how a claim's contrasts combine into evidence against it (:func:`contradiction`)
and the TOST of a declared margin (:func:`margin_p`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from analysis.inference import TTest, tost_estimate

# One-sided level of the REJECTED rule's test of the opposite of the claim: a lone contrast's 95% CI lying
# entirely on the wrong side of 0 is that test at 2.5%. With several contrasts the rule keeps this level
# for the claim as a whole (:func:`contradiction`), and a margin's TOST runs at the claim's alpha.
REJECT_LEVEL = 0.025

# How a claim combines its contrasts: ``every`` one must hold (intersection-union: u_shape, extremum, a
# trend over ``all`` layers), or ``one`` suffices (a trend over ``any`` layer).
Needs = Literal["every", "one"]


def holm_min(p: Sequence[float]) -> float:
    """The smallest Holm-adjusted p of ``p`` (= k * min p, capped at 1; NaN entries count in k, never
    as the minimum; NaN when all are NaN)."""
    finite = [v for v in p if not math.isnan(v)]
    return min(1.0, len(p) * min(finite)) if finite else float("nan")


def combined_against(p_against: Sequence[float], needs: Needs) -> float:
    """The p of the opposite of a claim from each contrast's one-sided p in the wrong direction.

    ``every``: the claim fails when any one contrast is shown to point the wrong way, a union of tests:
    Holm across the k contrasts (k * min p). ``one``: it fails only when every contrast is (an
    intersection-union test: max p, NaN if any is NaN). A single contrast: its own p.
    """
    if len(p_against) == 1:
        return float(p_against[0])
    if needs == "every":
        return holm_min(p_against)
    return float("nan") if any(math.isnan(v) for v in p_against) else max(p_against)


def contradiction(p_against: Sequence[float], needs: Needs) -> bool:
    """The REJECTED rule's evidence test: :func:`combined_against` below :data:`REJECT_LEVEL` (so its
    rate at the boundary of the claim is at most 2.5%, whatever the number of contrasts)."""
    p = combined_against(p_against, needs)
    return bool(not math.isnan(p) and p < REJECT_LEVEL)


@dataclass(frozen=True)
class Estimate:
    """One contrast's estimate for a margin's TOST: ``mean`` and its ``se`` (the units of the effect) and
    the t degrees of freedom ``df`` (S - 1)."""

    mean: float
    se: float
    df: float

    @classmethod
    def of(cls, test: TTest) -> Estimate:
        """The estimate of a one-sample t test's mean."""
        return cls(test.mean, test.se, test.n - 1)


def margin_p(estimates: Sequence[Estimate], margin: float, needs: Needs) -> float:
    """p of "the claimed effect is smaller than ``margin``" (which REJECTS a claim that declares one).

    Per contrast the TOST p of ``|effect| < margin``; ``every``: the claim fails when some contrast is
    within the margin (Holm across contrasts); ``one``: only when every contrast is (max p).
    """
    ps = [tost_estimate(e.mean, e.se, e.df, margin) for e in estimates]
    if not ps:
        return float("nan")
    if len(ps) == 1:
        return ps[0]
    if needs == "every":
        return holm_min(ps)
    return float("nan") if any(math.isnan(v) for v in ps) else max(ps)
