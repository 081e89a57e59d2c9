"""Verdicts of a study that added seeds between looks (:func:`decide_sequential`): group-sequential Holm
over the looks' stage p-values, with boundaries from ``analysis.sequential``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysis.verdicts import (
    ACCEPTED,
    INCONCLUSIVE,
    REJECTED,
    ClaimResult,
    Claims,
    Families,
)
from vitstudy_core.fmt import fmt_p

if TYPE_CHECKING:
    from analysis.sequential import Spending


def decide_sequential(
    hyp: Claims,
    looks: list[list[ClaimResult]],
    seeds_at: list[int],
    max_seeds: int,
    fams: Families,
    spending: Spending = "obf",
) -> list[ClaimResult]:
    """Verdicts of a study that added seeds between looks (group-sequential, ``analysis.sequential``).

    Each family (``fams``, :func:`analysis.verdicts.families`, the looks' own) is tested with group-sequential Holm (``none``: each claim at its own
    alpha; ``bh``: Holm, which also bounds the false discovery rate) over the looks' one-sided stage
    p-values, with boundaries from ``spending`` at information fractions ``seeds_at / max_seeds``, as
    t-calibrated nominal levels at each look's planned seeds (``analysis.sequential.nominal_levels``). A claim
    is ACCEPTED at the first look whose stage p crosses its boundary; REJECTED at the first look where the
    fixed-sample rule rejects it (its CI excludes the claimed effect, or equivalence within its margin:
    stopping for this only lowers the chance of accepting, so the type-I error stays bounded); whichever
    comes first decides it. Otherwise it is INCONCLUSIVE at the last look.

    Args:
        looks: per look, the fixed-sample results of every claim (:func:`evaluate_claims`).
        seeds_at: (K,) planned seeds at each look; ``max_seeds``: the planned maximum.

    Returns:
        One result per claim: the result at the look that decided it (else the last), its verdict and
        reason from the sequential rule, and ``sequential`` filled in.
    """
    from analysis.sequential import alpha_spent, nominal_levels, sequential_holm_levels

    fractions = [n / max_seeds for n in seeds_at]
    p = np.array([[look[i].p_value for look in looks] for i in range(len(hyp.claims))], dtype=np.float64)
    crossed: dict[int, tuple[int | None, float]] = {}  # (look crossed or None, the level last tested at)
    for fam, idx in fams.items():
        alphas = [fams.alphas[i] for i in idx]
        weighted = not fam.endswith("/none")
        got = sequential_holm_levels(p[idx], alphas, fractions, spending, weighted, seeds_at)
        crossed.update(zip(idx, got, strict=True))
    out = []
    for i, _claim in enumerate(hyp.claims):
        rejected = next((k for k, look in enumerate(looks) if look[i].verdict == REJECTED), None)
        accepted, level = crossed[i]  # level: the claim's Holm share, the one its looks were tested at
        noms = nominal_levels(fractions, level, spending, seeds_at)  # t-calibrated (analysis.sequential)
        if accepted is not None and (rejected is None or accepted <= rejected):
            k, verdict = accepted, ACCEPTED
            reason = (
                f"stage p {fmt_p(p[i, k])} < {noms[k]:.3g}, the nominal level of look {k + 1} "
                f"({seeds_at[k]} seeds; {spending} spending of alpha {level:.3g})"
            )
        elif rejected is not None:
            k, verdict, reason = rejected, REJECTED, f"{looks[rejected][i].reason} (look {rejected + 1})"
        else:
            k, verdict = len(looks) - 1, INCONCLUSIVE
            reason = (
                f"no look's stage p crossed its group-sequential boundary ({len(looks)} looks; "
                f"{spending} spending of alpha {level:.3g})"
            )
        r = ClaimResult.from_dict(looks[k][i].to_dict())
        r.verdict, r.reason = verdict, reason
        r.adjustment = f"{r.adjustment}, group-sequential ({spending})"
        spent = alpha_spent(np.asarray(fractions), level, spending)
        r.sequential = {
            "spending": spending,
            "max_seeds": max_seeds,
            "level": level,
            "decided_at_look": k + 1 if verdict != INCONCLUSIVE else None,
            "looks": [
                {"look": j + 1, "seeds": n, "fraction": f, "p": p[i, j], "nominal": nm, "alpha_spent": s}
                for j, (n, f, nm, s) in enumerate(zip(seeds_at, fractions, noms, spent, strict=True))
            ],
        }
        out.append(r)
    return out


def looks_spent(
    hyp: Claims,
    results: list[ClaimResult],
    seeds_at: list[int],
    max_seeds: int,
    fams: Families,
    spending: Spending = "obf",
) -> list[dict]:
    """The study's looks as :func:`decide_sequential` decided them (verdicts.json ``sequential.looks``).

    The deciding family is the confirmatory one (every claim, if none is confirmatory: the claims
    ``run --until-decided`` waits for). At each look, ``alpha_spent`` is what that family has spent by
    then: the sum over its claims of ``spending`` at each claim's first-step level (its alpha over its
    family's size, :attr:`analysis.verdicts.Families.first_step_levels`; the sum bounds the family's error), and
    ``by_claim`` is each claim's own spending at the level it was tested at (its ``sequential.looks``).

    Args:
        results: the sequential results, one per claim (``sequential`` filled in).
        seeds_at: (K,) seeds at each look; ``max_seeds``: the planned maximum.

    Returns:
        (K,) ``{look, seeds, fraction, alpha_spent, by_claim}``.
    """
    from analysis.sequential import alpha_spent

    fractions = np.asarray([n / max_seeds for n in seeds_at], dtype=np.float64)
    deciding, first = fams.deciding, fams.first_step_levels
    family = np.sum([alpha_spent(fractions, first[i], spending) for i in deciding], axis=0)
    return [
        {
            "look": j + 1,
            "seeds": n,
            "fraction": float(fractions[j]),
            "alpha_spent": float(family[j]),
            "by_claim": {
                hyp.claims[i].name: float(results[i].sequential["looks"][j]["alpha_spent"])
                for i in deciding
                if results[i].sequential is not None
            },
        }
        for j, n in enumerate(seeds_at)
    ]
