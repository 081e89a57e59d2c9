"""Across-seed inference on per-seed numbers: t tests, TOST, per-seed slopes, Jonckheere-Terpstra, power.

Every function here takes plain arrays whose first axis (or only axis) is the seed, the unit of
replication. Nothing here knows about tables or claims; the claim kinds (``analysis.kinds``)
reduce a table to these arrays. This module never imports torch.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

CI_LEVEL = 0.95  # every reported CI is a two-sided t interval at this level
BOOTSTRAP_REPS = 400  # secondary display only; small so `analyze` stays fast
NAN = float("nan")

Alternative = Literal["greater", "less", "two-sided"]


@dataclass(frozen=True)
class TTest:
    """A one-sample t test across seeds (:func:`t_test`), in the units of the per-seed values.

    Attributes:
        mean: mean of the S per-seed values (NaN for S = 0).
        sd: their SD (ddof 1; NaN for S < 2).
        n: S, the seeds tested.
        t: (mean - null) / (sd / sqrt(S)) (NaN when no test is possible).
        p: p-value for the alternative, from t(S-1); NaN when S < 2 or the seeds do not vary.
        ci: (low, high) two-sided 95% t interval of the mean; NaN (S < 2) or the point (mean, mean)
            (no between-seed variation).
    """

    mean: float
    sd: float
    n: int
    t: float
    p: float
    ci: tuple[float, float]

    @property
    def se(self) -> float:
        """Standard error of the mean, sd / sqrt(S) (NaN for S < 2)."""
        return self.sd / math.sqrt(self.n) if self.n >= 2 else NAN


def t_p(t: float, df: float, alternative: Alternative) -> float:
    """The p-value of a t statistic with ``df`` degrees of freedom for ``alternative``."""
    from scipy.special import stdtr  # the t CDF that scipy.stats.t calls, without scipy.stats' import

    if alternative == "greater":
        return float(stdtr(df, -t))
    if alternative == "less":
        return float(stdtr(df, t))
    return float(2 * stdtr(df, -abs(t)))


def t_test(x: np.ndarray, alternative: Alternative = "greater", null: float = 0.0) -> TTest:
    """One-sample t-test of mean(x) against ``null`` across seeds, with a two-sided 95% t CI of the mean.

    Args:
        x: (S,) one value per seed.
        alternative: ``greater`` (H1: mean > null), ``less`` or ``two-sided``.
        null: the null value of the mean.

    Returns:
        A :class:`TTest`; its ``p`` is NaN when S < 2 or the seeds do not vary (no test possible).
    """
    from scipy.special import stdtrit  # the t quantile that scipy.stats.t.ppf calls

    x = np.asarray(x, dtype=np.float64)
    n = x.size
    mean = float(x.mean()) if n else NAN
    if n < 2:
        return TTest(mean, NAN, n, NAN, NAN, (NAN, NAN))
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    # relative tolerance: identical values give sd ~ 1e-15 * |mean| from rounding, not real variation
    if not se > 1e-12 * max(1.0, abs(mean)):
        return TTest(mean, sd, n, NAN, NAN, (mean, mean))
    t = (mean - null) / se
    q = stdtrit(n - 1, 0.5 + CI_LEVEL / 2)
    return TTest(mean, sd, n, float(t), t_p(t, n - 1, alternative), (mean - q * se, mean + q * se))


def sign_flip_p(
    x: np.ndarray, alternative: Alternative = "greater", n_flips: int = 4999, seed: int = 0
) -> float:
    """Exact sign-flip randomisation p-value for mean(x) against 0 (x symmetric about 0 under the null).

    Used where per-seed values are discrete and bounded (Kendall tau), so a t test with few seeds is not
    calibrated (measured: 0.084 at S = 3 for a nominal 0.05). The flips preserve sum(x^2), so the mean
    is an equivalent statistic to t.

    Args:
        x: (S,) one value per seed.
        alternative: ``greater``, ``less`` or ``two-sided`` (|mean|).
        n_flips: Monte Carlo flips when 2^S exceeds it; otherwise all 2^S sign vectors (exact).

    Returns:
        Share of sign vectors whose mean is at least as extreme as the observed one (counting the
        identity); NaN for S < 2. Its smallest value is 2^-S (0.125 at S = 3, 0.031 at S = 5).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if n < 2:
        return float("nan")
    if 2**n <= n_flips:
        flips = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)
    else:
        rng = np.random.default_rng(seed)
        flips = np.vstack([np.ones(n, int), rng.choice([-1, 1], size=(n_flips, n))])
    means = flips @ x / n
    obs = x.mean()
    tol = 1e-12 * max(1.0, float(np.abs(x).max()))
    if alternative == "greater":
        return float(np.mean(means >= obs - tol))
    if alternative == "less":
        return float(np.mean(means <= obs + tol))
    return float(np.mean(np.abs(means) >= abs(obs) - tol))


@dataclass(frozen=True)
class Tost:
    """Two one-sided t tests of equivalence (:func:`tost`), in the units of the per-seed values.

    Attributes:
        mean, sd, n, ci: as in :class:`TTest` (ci: two-sided 95% t interval of the mean).
        p: max(p of mean > -margin, p of mean < +margin); NaN if no test is possible.
        lower, upper: the two one-sided tests (against -margin and +margin).
        outside: the 95% CI lies entirely outside [-margin, margin] (non-equivalence shown).
    """

    mean: float
    sd: float
    n: int
    ci: tuple[float, float]
    p: float
    lower: TTest
    upper: TTest
    outside: bool


def tost(x: np.ndarray, margin: float) -> Tost:
    """Two one-sided t-tests (TOST) of equivalence: H1 is ``-margin < mean(x) < margin``.

    Args:
        x: (S,) one value per seed (e.g. per-seed differences of two conditions).
        margin: the equivalence margin, > 0, in the units of ``x``.

    Returns:
        A :class:`Tost`.
    """
    lo = t_test(x, "greater", -margin)
    hi = t_test(x, "less", margin)
    p = max(lo.p, hi.p) if not (math.isnan(lo.p) or math.isnan(hi.p)) else NAN
    ci = lo.ci
    outside = bool(lo.n >= 2 and (ci[0] > margin or ci[1] < -margin))
    return Tost(mean=lo.mean, sd=lo.sd, n=lo.n, ci=ci, p=p, lower=lo, upper=hi, outside=outside)


def tost_estimate(estimate: float, se: float, df: float, margin: float) -> float:
    """TOST p of ``-margin < true value < margin`` from an estimate, its SE and t degrees of freedom.

    The same two one-sided t tests as :func:`tost`, for an estimate that is not a mean of per-seed values
    (a mixed model's fixed slope). NaN when ``se`` is not positive and finite.
    """
    # the relative tolerance of t_test: an SE at rounding level is no variation
    if not (math.isfinite(se) and math.isfinite(estimate) and se > 1e-12 * max(1.0, abs(estimate))):
        return NAN
    return max(t_p((estimate + margin) / se, df, "greater"), t_p((estimate - margin) / se, df, "less"))


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values of (m,) finite ``p`` (statsmodels' ``multipletests(method="holm")``
    arithmetic, without its per-call garbage collection, which dominates a calibration study)."""
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p)
    adjusted = np.minimum(np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1)), 1.0)
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return out


def opposite(alternative: Alternative) -> Alternative:
    """The one-sided alternative pointing the other way (``two-sided`` has none: itself)."""
    if alternative == "greater":
        return "less"
    if alternative == "less":
        return "greater"
    return "two-sided"


def identical_rows(y: np.ndarray) -> bool:
    """Whether every seed's row of ``y`` (S, T) is the same up to a constant: no seed adds information.

    True for one run copied S times, or for S seeds that lie on one exactly parallel curve (noise-free):
    then any test across seeds has zero between-seed variance, whatever its statistic (a rank test's
    per-seed statistics are identical too). Rows are centred on their mean; rounding (1e-12 relative) is
    no difference. False for S < 2.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 2 or not np.isfinite(y).all():
        return False
    centred = y - y.mean(axis=1, keepdims=True)
    return bool(np.ptp(centred, axis=0).max(initial=0.0) <= 1e-12 * max(1.0, float(np.abs(y).max())))


def bootstrap_ci(x: np.ndarray, reps: int = BOOTSTRAP_REPS, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of mean(x) over seeds (a secondary display: it under-covers at S < 10).

    ``scipy.stats.bootstrap`` (``method="percentile"``): ``reps`` resamples of the seeds with replacement,
    drawn from ``numpy.random.default_rng(seed)``, so the interval is the same on every call. (scipy's BCa
    is not used: with 3-5 seeds its acceleration estimate is as noisy as the interval itself, and it is NaN
    for constant data.)

    Args:
        x: (S,) one value per seed.

    Returns:
        (low, high); NaN for S < 2; the point (mean, mean) for constant data (never NaN there).
    """
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        return (float("nan"), float("nan"))
    res = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=reps,
        confidence_level=CI_LEVEL,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def power_and_seeds_needed(d: float, n: int, alpha: float, target: float = 0.8) -> tuple[float, int | None]:
    """Achieved power of a one-sided one-sample t-test at the observed standardised effect, and seeds for 80%.

    Args:
        d: the observed standardised effect in the claimed direction, mean / sd (Cohen's d of the
            per-seed values of the binding test); <= 0 means the data point the other way.
        n: seeds used.
        alpha: the claim's alpha (unadjusted: the power a lone claim would have).

    Returns:
        (power, seeds needed for ``target`` power at this d, or None when d <= 0 or d is not finite:
        no number of seeds reaches it).
    """
    from statsmodels.stats.power import TTestPower

    if not math.isfinite(d) or n < 2:
        return (float("nan"), None)
    analysis = TTestPower()
    power = float(analysis.power(effect_size=d, nobs=n, alpha=alpha, alternative="larger"))
    if d <= 0:
        return (power, None)
    if analysis.power(effect_size=d, nobs=2, alpha=alpha, alternative="larger") >= target:
        return (power, 2)  # a huge effect: the root finder would fail, 2 seeds already suffice
    with warnings.catch_warnings():
        # the root finder warns (and may return junk) for tiny d; the check below decides instead
        warnings.simplefilter("ignore")
        try:
            needed = analysis.solve_power(effect_size=d, power=target, alpha=alpha, alternative="larger")
            needed = int(math.ceil(float(np.asarray(needed).ravel()[0])))
        except (ValueError, RuntimeError, OverflowError):
            return (power, None)
        needed = max(needed, 2)
        achieved = analysis.power(effect_size=d, nobs=needed, alpha=alpha, alternative="larger")
    if not (math.isfinite(achieved) and achieved >= target - 1e-6):
        return (power, None)  # far beyond any seed budget
    return (power, needed)


def per_seed_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """OLS slope of y on x, separately for each seed.

    Args:
        x: (T,) the ordered factor (epoch, layer index, knob level), shared by all seeds.
        y: (S, T) one row per seed; rows may contain NaN (those points are dropped for that seed).

    Returns:
        (S,) slopes, sum((x - xbar)(y - ybar)) / sum((x - xbar)^2) per seed (NaN if < 2 points).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if not np.isnan(y).any():
        xc = x - x.mean()
        return (y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    out = np.full(y.shape[0], np.nan)
    for s, row in enumerate(y):
        ok = ~np.isnan(row)
        if ok.sum() >= 2 and np.ptp(x[ok]) > 0:
            out[s] = np.polyfit(x[ok], row[ok], 1)[0]
    return out


def per_seed_kendall(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of y with x, separately for each seed: (S,) from y (S, T), x (T,).

    A seed whose values are all tied gets tau = 0 (no ordering), not NaN.
    """
    from scipy import stats

    out = np.empty(len(y))
    for s, row in enumerate(np.asarray(y, dtype=np.float64)):
        tau = stats.kendalltau(x, row).statistic
        out[s] = 0.0 if not np.isfinite(tau) else tau
    return out


def jt_statistic(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Jonckheere-Terpstra statistic for one or many labellings.

    Args:
        values: (N,) observations.
        groups: (N,) or (P, N) ordinal group labels 0..K-1 (one labelling per row).

    Returns:
        () or (P,): sum over pairs of observations i, j with group_i < group_j of
        [v_i < v_j] + 0.5 [v_i == v_j] (large when values increase with the group order).
    """
    v = np.asarray(values, dtype=np.float64)
    less = (v[:, None] < v[None, :]).astype(np.float64) + 0.5 * (v[:, None] == v[None, :])
    g = np.atleast_2d(groups)
    earlier = (g[:, :, None] < g[:, None, :]).astype(np.float64)  # (P, N, N): pair ordered by group
    stat = np.einsum("pij,ij->p", earlier, less)
    return stat if np.ndim(groups) == 2 else stat[0]


@dataclass(frozen=True)
class JTTest:
    """A Jonckheere-Terpstra permutation test (:func:`jonckheere_terpstra`).

    Attributes:
        stat: the JT statistic in the claimed direction (a count of ordered pairs, ties 1/2).
        p: one-sided permutation p (NaN for S < 2 or K < 2).
        exact: every labelling was enumerated (else Monte Carlo).
        n_labellings: labellings the p is over ((K!)^S when exact, else the permutations drawn).
    """

    stat: float
    p: float
    exact: bool
    n_labellings: int


def jonckheere_terpstra(
    y: np.ndarray, direction: str = "increasing", n_permutations: int = 4999, seed: int = 0
) -> JTTest:
    """Jonckheere-Terpstra test for ordered conditions with a within-seed permutation p-value.

    The labels are permuted within each seed (row), which is exact under the null that a seed's K
    summaries are exchangeable, whether or not seeds differ in level (scipy has no JT test).

    Args:
        y: (S, K) per-seed summaries of K conditions in their claimed order (complete rows).
        direction: ``increasing`` (values rise with the order) or ``decreasing``.
        n_permutations: Monte Carlo permutations when the (K!)^S distinct labellings are more than
            this; otherwise all are enumerated (exact p).

    Returns:
        A :class:`JTTest`: ``p`` is the share of labellings with a statistic >= the observed one, counting
        the observed one ((1 + #>=) / (1 + n) for Monte Carlo).
    """
    y = np.asarray(y, dtype=np.float64)
    if direction == "decreasing":
        y = -y
    n_seeds, k = y.shape
    values = y.ravel()
    obs = float(jt_statistic(values, np.tile(np.arange(k), n_seeds)))
    if n_seeds < 2 or k < 2:
        return JTTest(stat=obs, p=NAN, exact=False, n_labellings=0)
    n_distinct = math.factorial(k) ** n_seeds
    if n_distinct <= n_permutations:
        perms = np.array(list(itertools.permutations(range(k))))
        labellings = np.array([np.concatenate(rows) for rows in itertools.product(perms, repeat=n_seeds)])
        null = jt_statistic(values, labellings)
        return JTTest(stat=obs, p=float(np.mean(null >= obs - 1e-9)), exact=True, n_labellings=n_distinct)
    rng = np.random.default_rng(seed)
    labellings = rng.permuted(np.tile(np.arange(k), (n_permutations, n_seeds, 1)), axis=2).reshape(
        n_permutations, -1
    )
    null = jt_statistic(values, labellings)
    p = float((1 + np.sum(null >= obs - 1e-9)) / (1 + n_permutations))
    return JTTest(stat=obs, p=p, exact=False, n_labellings=n_permutations)
