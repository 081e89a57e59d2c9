"""Seeds a claim needs, before training: power of its test at the smallest effect of interest.

Every number comes from statsmodels' :class:`~statsmodels.stats.power.TTestPower` (the one-sample t test
on per-seed values that every kind's binding test is, or approximates): the power of ``S`` seeds at a
standardised effect ``d = effect / sd``, and the smallest ``S`` reaching a target power. The per-seed SD
comes from a pilot (the kind's own ``evaluate`` on a pilot table: ``Outcome.effect_values``), so it is an
estimate from few seeds; the seeds are also given at its upper 80% confidence bound,
``sd * sqrt((n - 1) / chi2_{0.2}(n - 1))`` (n pilot seeds), so the plan survives an unlucky pilot.

A randomisation test (sign flips, permutations) cannot give p below ``labellings^-S``
(``ClaimKind.labellings_per_seed``): below the floor ``S_min = floor(log(1/alpha) / log(L)) + 1`` it
accepts nothing at any effect, and the seeds needed are at least ``S_min``. This module never imports
torch.
"""

from __future__ import annotations

import math

import numpy as np

MAX_SEEDS = 1000  # beyond this many seeds a plan says "more than the budget" instead of a number
TARGETS = (0.8, 0.9)


def sd_upper_bound(sd: float, n: int, level: float = 0.8) -> float:
    """One-sided upper ``level`` confidence bound of a normal SD estimated from ``n`` values (chi-square)."""
    from scipy import stats

    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return float(sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - level, n - 1)))


def seed_floor(labellings: int, alpha: float, contrasts: int = 1) -> int:
    """Fewest seeds at which a randomisation test with ``labellings`` per seed can reach p < alpha (0: none).

    ``contrasts``: the p is Holm-adjusted across this many tests (a trend over ``any`` of k layers), so its
    smallest value is ``contrasts * labellings^-S``: ``S_min = floor(log(contrasts / alpha) / log(L)) + 1``.
    """
    if labellings < 2:
        return 0
    return int(math.floor(math.log(max(1, contrasts) / alpha) / math.log(labellings))) + 1


def power(d: float, n: int, alpha: float, two_sided: bool = False, floor: int = 0) -> float:
    """Power of the one-sample t test with ``n`` seeds at standardised effect ``d`` (0 below ``floor``)."""
    from statsmodels.stats.power import TTestPower

    if not math.isfinite(d) or n < 2:
        return float("nan")
    if n < floor:
        return 0.0
    alt = "two-sided" if two_sided else "larger"
    return float(TTestPower().power(effect_size=d, nobs=n, alpha=alpha, alternative=alt))


def seeds_needed(
    d: float, alpha: float, target: float, two_sided: bool = False, floor: int = 0
) -> int | None:
    """Smallest number of seeds (>= 2, >= ``floor``) whose power at ``d`` reaches ``target``; None when
    ``d <= 0`` or more than :data:`MAX_SEEDS` would be needed."""
    from statsmodels.stats.power import TTestPower

    if not math.isfinite(d) or d <= 0:
        return None
    n = np.arange(max(2, floor), MAX_SEEDS + 1)
    alt = "two-sided" if two_sided else "larger"
    pw = TTestPower().power(effect_size=d, nobs=n, alpha=alpha, alternative=alt)
    hit = np.flatnonzero(pw >= target)
    return int(n[hit[0]]) if hit.size else None


def plan_claim(
    effect: float | None,
    values: np.ndarray | None,
    alpha: float,
    n_file: int,
    two_sided: bool = False,
    labellings: int = 0,
    contrasts: int = 1,
) -> dict[str, float | int | None]:
    """The seed plan of one claim.

    Args:
        effect: the smallest effect of interest in the claimed direction, in the units of ``values``
            (None: unknown).
        values: (n,) per-seed values of the claim's contrast in a pilot (None: no pilot).
        alpha: the level the claim is tested at.
        n_file: the seeds the hypothesis file plans.
        labellings: randomisation labellings per seed (0: t-based).
        contrasts: the claim's p is Holm-adjusted across this many contrasts (``ClaimKind.holm_contrasts``):
            the seeds are sized at ``alpha / contrasts`` and the floor rises with it.

    Returns:
        dict with ``sd``, ``sd_upper80``, ``n_pilot``, ``d`` and ``d_upper`` (effect / SD at the estimate
        and at the bound), ``floor``, ``seeds_80`` / ``seeds_90`` (and ``*_upper``: at the bound),
        ``power_file`` (power of ``n_file`` seeds at the estimate).
    """
    values = np.asarray(values if values is not None else [], dtype=np.float64)
    values = values[np.isfinite(values)]
    n = values.size
    sd = float(values.std(ddof=1)) if n >= 2 else float("nan")
    hi = sd_upper_bound(sd, n)
    ok = effect is not None and math.isfinite(sd) and sd > 0
    d = effect / sd if effect is not None and ok else float("nan")
    d_hi = effect / hi if effect is not None and ok else float("nan")
    floor = seed_floor(labellings, alpha, contrasts)
    alpha = alpha / max(1, contrasts)
    out: dict[str, float | int | None] = {
        "sd": sd,
        "sd_upper80": hi,
        "n_pilot": n,
        "d": d,
        "d_upper": d_hi,
        "floor": floor,
    }
    for target in TARGETS:
        key = f"seeds_{round(target * 100)}"
        out[key] = seeds_needed(d, alpha, target, two_sided, floor)
        out[f"{key}_upper"] = seeds_needed(d_hi, alpha, target, two_sided, floor)
    out["power_file"] = power(d, n_file, alpha, two_sided, floor)
    return out
