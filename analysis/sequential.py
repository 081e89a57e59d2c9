"""Group-sequential testing over looks at a growing number of seeds: alpha spending and its boundaries.

A study that adds seeds until its claims are decided looks at the data several times. Testing each look
at the full alpha would inflate the type-I error, so alpha is *spent* over the looks (Lan and DeMets
1983): at information fraction ``t`` (seeds so far / maximum seeds) at most ``alpha(t)`` may have been
spent, with

* ``obf`` (O'Brien-Fleming type): ``alpha(t) = 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t)))``: almost nothing
  early, nearly the whole alpha at the end;
* ``pocock`` (Pocock type): ``alpha(t) = alpha ln(1 + (e - 1) t)``: spread evenly.

The one-sided z boundaries ``c_1..c_K`` solve ``P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) =
alpha(t_k) - alpha(t_{k-1})`` under the canonical joint distribution of the stage statistics
(``corr(Z_i, Z_j) = sqrt(t_i / t_j)``, i.e. independent score increments). They are computed here by
recursive numerical integration of the score statistic's sub-density on the continuation region
(Jennison and Turnbull 2000, ch. 19), with Simpson's rule on a fixed grid: deterministic and fast.

A look's test is then done with the kind's own statistic, through a nominal one-sided significance level
per look: a stage p-value below it crosses. Two sets of levels exist:

* the z reference ``1 - Phi(c_k)`` (:func:`nominal_levels` without ``seeds``): right for a statistic
  that is normal with known variance, and what the published boundaries (rpact, gsDesign) tabulate.
  Used with a t(S_k - 1) p-value (the "significance level approach") it is anti-conservative at few
  seeds: 200,000 simulated studies gave a type-I error of 0.053-0.055 for a one-sided 0.05;
* the t-calibrated levels (:func:`nominal_levels` with ``seeds``, what the verdicts use): boundaries
  ``b_k`` on the t scale chosen so that, for the one-sample t statistics of the looks (S_k seeds, df
  S_k - 1, the same normal seeds extended between looks), ``P(T_1 < b_1, ..., T_{k-1} < b_{k-1}, T_k
  >= b_k)`` is the spending function's increment at look k; the level is ``P(t(S_k - 1) >= b_k)``. The
  joint law of the t statistics has no low-dimensional recursion like the z one (each look's state is
  the pair sum / sum of squares), so it is integrated by a fixed Monte Carlo rule: ``2**20`` null paths
  drawn from a fixed seed through the exact sufficient statistics of each batch of seeds (the batch's
  sum ~ N(0, b), its within-batch sum of squares ~ chi2(b - 1)); each boundary is the empirical quantile
  that spends the increment exactly on those paths. Deterministic, a look's boundary depends only on
  the looks so far, and the alpha it spends is exact to the rule's Monte Carlo SD (<= 2.2e-4 at alpha
  0.05). For randomisation tests (sign flips, Jonckheere-Terpstra permutations) the same levels are
  used with their exact p: lower than the z ones, so they stay conservative.

Several claims in one family are tested with Holm's procedure made group-sequential (Maurer and Bretz
2013): each remaining claim gets ``alpha / m_remaining`` and its own boundaries; when one crosses at some
look, its share passes to the others, whose boundaries at every look so far are recomputed at the
larger level. Boundaries only fall as the level rises, so this keeps the family-wise error at alpha.
Nothing here knows about tables or claims; this module never imports torch.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np

Spending = Literal["obf", "pocock"]
SPENDING_FUNCTIONS = ("obf", "pocock")
_Z_MAX = 8.0  # the grid covers +-8 SD of the score statistic: the mass outside is < 1e-15
_GRID = 801  # Simpson points per look: boundaries agree with published values to < 1e-4


def alpha_spent(t: np.ndarray | float, alpha: float, spending: Spending = "obf") -> np.ndarray:
    """Cumulative one-sided alpha spent by information fraction ``t`` (0..1) under ``spending``.

    Args:
        t: () or (K,) information fractions in (0, 1]; values above 1 count as 1.
        alpha: the one-sided level spent in total (at t = 1).
        spending: ``obf`` (Lan-DeMets O'Brien-Fleming type) or ``pocock`` (Lan-DeMets Pocock type).

    Returns:
        alpha(t), same shape as ``t``.
    """
    from scipy import stats

    t = np.minimum(np.asarray(t, dtype=np.float64), 1.0)
    if spending == "obf":
        with np.errstate(divide="ignore"):
            return 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / np.sqrt(t))
    if spending == "pocock":
        return alpha * np.log1p((math.e - 1) * t)
    raise ValueError(f"unknown spending function {spending!r}; expected one of {SPENDING_FUNCTIONS}")


def _crossing(c: float, sqrt_t: float, sd: float, grid: np.ndarray, dens: np.ndarray) -> float:
    """P(no crossing before this look, Z >= c here): the sub-density ``dens`` of the previous score
    statistic on ``grid`` moved by an independent N(0, sd^2) increment."""
    from scipy import integrate, stats

    return float(integrate.simpson(dens * stats.norm.sf((c * sqrt_t - grid) / sd), x=grid))


@lru_cache(maxsize=4096)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: Spending) -> tuple[float, ...]:
    from scipy import integrate, optimize, stats

    t = np.minimum(np.asarray(fractions, dtype=np.float64), 1.0)
    if t.size == 0 or np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError(f"information fractions must increase within (0, 1], got {list(fractions)}")
    increments = np.diff(alpha_spent(t, alpha, spending), prepend=0.0)
    bounds: list[float] = []
    grid = dens = np.empty(0)  # the previous look's grid and sub-density (none before the first look)
    for k, (tk, inc) in enumerate(zip(t, increments, strict=True)):
        if k == 0:
            c = float(stats.norm.isf(inc)) if inc > 0 else math.inf
        else:
            sd = math.sqrt(tk - t[k - 1])

            args = (math.sqrt(tk), sd, grid, dens)
            if inc <= 0 or _crossing(_Z_MAX + 4, *args) >= inc:
                c = math.inf
            else:
                c = float(
                    optimize.brentq(lambda c: _crossing(c, *args) - inc, -_Z_MAX, _Z_MAX + 4, xtol=1e-10)  # noqa: B023
                )
        bounds.append(c)
        # the sub-density of the score statistic S_k = Z_k sqrt(t_k) on the continuation region
        new_grid = np.linspace(-_Z_MAX * math.sqrt(tk), min(c, _Z_MAX) * math.sqrt(tk), _GRID)
        if k == 0:
            dens = stats.norm.pdf(new_grid, scale=math.sqrt(tk))
        else:
            kernel = stats.norm.pdf(new_grid[:, None] - grid[None, :], scale=math.sqrt(tk - t[k - 1]))
            dens = integrate.simpson(kernel * dens[None, :], x=grid, axis=1)
        grid = new_grid
    return tuple(bounds)


def z_boundaries(fractions, alpha: float, spending: Spending = "obf") -> np.ndarray:
    """One-sided z boundaries of a group-sequential test with Lan-DeMets alpha spending.

    Args:
        fractions: (K,) increasing information fractions of the looks so far, in (0, 1] (seeds at each
            look / the planned maximum). Boundaries at look k depend only on looks 1..k.
        alpha: one-sided level spent in total.
        spending: ``obf`` or ``pocock``.

    Returns:
        (K,) z boundaries (``inf`` where a look spends nothing). One-sided alpha 0.025 at three equal
        looks: 3.7103, 2.5114, 1.9931 (obf) and 2.2794, 2.2949, 2.2960 (pocock).
    """
    key = tuple(round(float(f), 12) for f in np.atleast_1d(fractions))
    return np.asarray(_boundaries(key, float(alpha), spending))


def nominal_levels(fractions, alpha: float, spending: Spending = "obf", seeds=None) -> np.ndarray:
    """(K,) nominal one-sided significance levels of the looks: a stage p below crosses.

    Args:
        fractions: (K,) information fractions of the looks (seeds so far / planned maximum).
        alpha: one-sided level spent in total; ``spending``: ``obf`` or ``pocock``.
        seeds: (K,) seeds at each look. Without it: the z reference ``1 - Phi(c_k)``; with it: the
            t-calibrated levels ``P(t(S_k - 1) >= b_k)`` of :func:`t_boundaries` (0 where S_k < 2).
    """
    from scipy import stats

    if seeds is None:
        return stats.norm.sf(z_boundaries(fractions, alpha, spending))
    seeds = np.atleast_1d(np.asarray(seeds, dtype=np.int64))
    b = t_boundaries(fractions, seeds, alpha, spending)
    df = np.maximum(seeds - 1, 1)
    return np.where(seeds >= 2, stats.t.sf(b, df), 0.0)


_T_PATHS = 1 << 20  # Monte Carlo paths of the t-scale rule: SD of the spent alpha <= 2.2e-4 at 0.05
_T_SEED = 29  # the rule's fixed seed: boundaries are a deterministic function of the design


def _batch_t(rng: np.random.Generator, state: list, n_new: int) -> np.ndarray:
    """Extend every null path by ``n_new`` N(0, 1) seeds; the (paths,) one-sample t statistics.

    ``state``: [seeds so far, (paths,) sums, (paths,) sums of squares about the mean], updated in place
    with the batch's exact sufficient statistics (sum ~ N(0, n_new), within SS ~ chi2(n_new - 1)).
    """
    n, total, ss = state
    add = rng.normal(0.0, math.sqrt(n_new), total.shape)
    within = rng.chisquare(n_new - 1, total.shape) if n_new > 1 else 0.0
    between = n * n_new / (n + n_new) * (total / n - add / n_new) ** 2 if n else 0.0
    state[:] = [n + n_new, total + add, ss + within + between]
    n, total, ss = state
    with np.errstate(divide="ignore", invalid="ignore"):
        return (total / n) / np.sqrt(ss / (n - 1) / n) if n >= 2 else np.full(total.shape, -np.inf)


@lru_cache(maxsize=512)
def _t_bounds(
    fractions: tuple[float, ...], seeds: tuple[int, ...], alpha: float, spending: Spending
) -> tuple:
    if len(seeds) != len(fractions) or seeds[0] < 1 or np.any(np.diff(seeds) <= 0):
        raise ValueError(f"seeds at the looks must increase from >= 1, one per look, got {list(seeds)}")
    target = alpha_spent(np.asarray(fractions), alpha, spending) * _T_PATHS  # paths crossed by each look
    rng = np.random.default_rng(_T_SEED)
    state: list = [0, np.zeros(_T_PATHS), np.zeros(_T_PATHS)]
    alive = np.ones(_T_PATHS, dtype=bool)
    bounds, prev = [], 0
    for s, goal in zip(seeds, target, strict=True):
        t = _batch_t(rng, state, s - prev)
        prev = s
        m = int(round(goal - (_T_PATHS - alive.sum())))  # paths this look may still reject
        vals = t[alive]
        if s < 2 or m < 1:
            bounds.append(math.inf)
            continue
        k = vals.size - m  # the m largest cross: the boundary lies between the (m+1)-th and m-th largest
        part = np.partition(vals, [k - 1, k])
        b = float((part[k - 1] + part[k]) / 2)
        bounds.append(b)
        alive &= ~(t >= b)
    return tuple(bounds)


def t_boundaries(fractions, seeds, alpha: float, spending: Spending = "obf") -> np.ndarray:
    """One-sided t-scale boundaries of the looks of a one-sample t test (see the module docstring).

    Args:
        fractions: (K,) increasing information fractions of the looks, in (0, 1].
        seeds: (K,) increasing seeds at each look (the t statistic of look k has S_k - 1 df).
        alpha: one-sided level spent in total; ``spending``: ``obf`` or ``pocock``.

    Returns:
        (K,) boundaries b_k (``inf`` where a look spends nothing or S_k < 2): the t statistic of look k
        crosses when it is >= b_k. One-sided alpha 0.05 at 3, 6, 9 seeds (obf): about 26.9, 2.96, 1.97
        (the z reference, as t(S_k - 1) critical values: 26.95, 2.94, 1.93).
    """
    fr = tuple(round(float(f), 12) for f in np.atleast_1d(fractions))
    if len(fr) == 0 or fr[0] <= 0 or any(b <= a for a, b in zip(fr, fr[1:], strict=False)):
        raise ValueError(f"information fractions must increase within (0, 1], got {list(fr)}")
    key = tuple(int(s) for s in np.atleast_1d(seeds))
    return np.asarray(_t_bounds(fr, key, float(alpha), spending))


def t_critical(nominal: float, df: int) -> float:
    """The t(df) critical value of a one-sided nominal level (the stage boundary for a t statistic)."""
    from scipy import stats

    return float(stats.t.isf(nominal, df)) if df >= 1 else math.inf


def first_crossing(
    p: np.ndarray, fractions, alpha: float, spending: Spending = "obf", seeds=None
) -> int | None:
    """The first look whose stage p-value lies below its nominal level, or None.

    Args:
        p: (K,) one-sided stage p-values of one claim (NaN: no test at that look, never crosses).
        fractions: (K,) information fractions of the looks.
        seeds: (K,) seeds at each look: t-calibrated levels (:func:`nominal_levels`); None: the z ones.
    """
    noms = nominal_levels(fractions, alpha, spending, seeds)
    hits = np.flatnonzero(np.nan_to_num(np.asarray(p, dtype=np.float64), nan=2.0) < noms)
    return int(hits[0]) if hits.size else None


def sequential_holm_levels(
    p: np.ndarray, alphas, fractions, spending: Spending = "obf", weighted: bool = True, seeds=None
) -> list[tuple[int | None, float]]:
    """Group-sequential Holm over a family of claims (Maurer and Bretz 2013, equal weights).

    Args:
        p: (m, K) one-sided stage p-values, one row per claim, one column per look (NaN: no test).
        alphas: (m,) each claim's one-sided alpha.
        fractions: (K,) information fractions of the looks.
        weighted: split alpha among the remaining claims (Holm); False tests each claim at its own alpha
            (no multiplicity adjustment).
        seeds: (K,) seeds at each look: t-calibrated nominal levels; None: the z reference levels.

    Returns:
        (m,) for each claim, (the look at which its boundary was crossed or None, the level it was last
        tested at: for a claim that never crossed, its share of alpha among the claims left at the end).
    """
    p = np.atleast_2d(np.asarray(p, dtype=np.float64))
    crossed: dict[int, tuple[int, float]] = {}
    remaining = list(range(p.shape[0]))
    changed = True
    while changed and remaining:
        changed = False
        for i in remaining:
            level = float(alphas[i]) / (len(remaining) if weighted else 1)
            look = first_crossing(p[i], fractions, level, spending, seeds)
            if look is not None:
                crossed[i] = (look, level)
                remaining.remove(i)
                changed = True
                break
    share = len(remaining) if weighted else 1
    return [crossed.get(i, (None, float(alphas[i]) / max(share, 1))) for i in range(p.shape[0])]


def sequential_holm(
    p: np.ndarray, alphas, fractions, spending: Spending = "obf", weighted: bool = True, seeds=None
) -> list[tuple[int, float] | None]:
    """:func:`sequential_holm_levels`, with None for a claim that never crossed.

    Returns:
        (m,) for each claim, (the look at which its boundary was crossed, the level it was tested at):
        its null rejected, the claim ACCEPTED; or None.
    """
    got = sequential_holm_levels(p, alphas, fractions, spending, weighted, seeds)
    return [None if look is None else (look, level) for look, level in got]
