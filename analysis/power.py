"""Seeds a claim needs, before training: power of its test at the smallest effect of interest.

Every number is the power of statsmodels' :class:`~statsmodels.stats.power.TTestPower` (the one-sample
t test on per-seed values that every kind's binding test is, or approximates): the power of ``S`` seeds at
a standardised effect ``d = effect / sd``, and the smallest ``S`` reaching a target power. It is computed
as statsmodels' ``ttest_power`` computes it, from the scipy.special functions that one calls (the t
quantile ``stdtrit`` and the noncentral t CDF ``nctdtr``), because importing ``statsmodels.stats.power``
imports ``scipy.stats``: about 0.8 s of every ``plan`` on 2 cores. tests/stats/test_planning.py holds the
two equal over the seeds, effects, levels and sides a plan uses. The per-seed SD
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
    from scipy.special import chdtri  # chdtri(df, q) = scipy.stats.chi2.isf(q, df) = chi2.ppf(1 - q, df)

    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return float(sd * math.sqrt((n - 1) / chdtri(n - 1, level)))


def seed_floor(labellings: int, alpha: float, contrasts: int = 1) -> int:
    """Fewest seeds at which a randomisation test with ``labellings`` per seed can reach p < alpha (0: none).

    ``contrasts``: the p is Holm-adjusted across this many tests (a trend over ``any`` of k layers), so its
    smallest value is ``contrasts * labellings^-S``: ``S_min = floor(log(contrasts / alpha) / log(L)) + 1``.
    """
    if labellings < 2:
        return 0
    return int(math.floor(math.log(max(1, contrasts) / alpha) / math.log(labellings))) + 1


def nct_cdf(df: np.ndarray, nc: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(T <= x) for the noncentral t with ``df`` degrees of freedom and noncentrality ``nc``.

    scipy.special's ``nctdtr`` (what statsmodels and ``scipy.stats.nct`` call), except where it returns NaN:
    scipy 1.17 does so where the probability is within rounding of 0 or 1 (scipy issue 25470; seen at
    seed counts and effects a plan counts, e.g. the lower tail of a two-sided test at d = 1.7 with 11 seeds,
    which made statsmodels' power NaN and the plan skip that seed count). There the mirrored distribution
    gives it, ``1 - P(T(-nc) <= -x)``; where that is NaN too, the probability is 0 or 1 by the side of the
    distribution's centre ``nc`` that ``x`` lies on. tests/stats/test_planning.py checks the mended values
    against the CDF integrated at 30 digits.
    """
    from scipy.special import nctdtr

    df, nc, x = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (df, nc, x)))
    p = np.array(nctdtr(df, nc, x), dtype=np.float64)
    bad = np.isnan(p) & np.isfinite(df) & np.isfinite(nc) & ~np.isnan(x)
    if bad.any():
        mirrored = 1 - nctdtr(df[bad], -nc[bad], -x[bad])
        side = (x[bad] > nc[bad]).astype(np.float64)
        p[bad] = np.where(np.isnan(mirrored), side, mirrored)
    return p


def t_power(d: float, n: np.ndarray, alpha: float, two_sided: bool = False) -> np.ndarray:
    """statsmodels' ``ttest_power(d, n, alpha, alternative="larger" | "two-sided")`` for ``n >= 2`` seeds:
    the chance that the noncentral t (df ``n - 1``, noncentrality ``d * sqrt(n)``) passes the critical t
    (its NaN mended: :func:`nct_cdf`)."""
    from scipy.special import stdtrit

    n = np.asarray(n, dtype=np.float64)
    df, nc = n - 1, d * np.sqrt(n)
    level = alpha / 2 if two_sided else alpha
    upper = -stdtrit(df, level)  # scipy.stats.t.isf(level, df)
    pw = 1 - nct_cdf(df, nc, upper)
    if two_sided:
        pw = pw + nct_cdf(df, nc, stdtrit(df, level))  # below scipy.stats.t.ppf(level, df)
    return pw


def power(d: float, n: int, alpha: float, two_sided: bool = False, floor: int = 0) -> float:
    """Power of the one-sample t test with ``n`` seeds at standardised effect ``d`` (0 below ``floor``)."""
    if not math.isfinite(d) or n < 2:
        return float("nan")
    if n < floor:
        return 0.0
    return float(t_power(d, np.asarray(n), alpha, two_sided))


def seeds_needed(
    d: float, alpha: float, target: float, two_sided: bool = False, floor: int = 0
) -> int | None:
    """Smallest number of seeds (>= 2, >= ``floor``) whose power at ``d`` reaches ``target``; None when
    ``d <= 0`` or more than :data:`MAX_SEEDS` would be needed."""
    if not math.isfinite(d) or d <= 0:
        return None
    n = np.arange(max(2, floor), MAX_SEEDS + 1)
    pw = t_power(d, n, alpha, two_sided)
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
