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

A look's test is then done with the kind's own statistic: the boundary becomes a nominal one-sided
significance level ``1 - Phi(c_k)``, and a stage p-value below it crosses. For a t test this is the
same as comparing t to the t(S_k - 1) critical value of that level (what rpact does for means); for
randomisation tests (sign flips, Jonckheere-Terpstra permutations) it compares their exact p.

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
from scipy import integrate, optimize, stats

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
    return float(integrate.simpson(dens * stats.norm.sf((c * sqrt_t - grid) / sd), x=grid))


@lru_cache(maxsize=4096)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    t = np.minimum(np.asarray(fractions, dtype=np.float64), 1.0)
    if t.size == 0 or np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError(f"information fractions must increase within (0, 1], got {list(fractions)}")
    increments = np.diff(alpha_spent(t, alpha, spending), prepend=0.0)
    bounds: list[float] = []
    grid = dens = None
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


def nominal_levels(fractions, alpha: float, spending: Spending = "obf") -> np.ndarray:
    """(K,) nominal one-sided significance levels ``1 - Phi(c_k)`` of the looks: a stage p below crosses."""
    return stats.norm.sf(z_boundaries(fractions, alpha, spending))


def t_critical(nominal: float, df: int) -> float:
    """The t(df) critical value of a one-sided nominal level (the stage boundary for a t statistic)."""
    return float(stats.t.isf(nominal, df)) if df >= 1 else math.inf


def first_crossing(p: np.ndarray, fractions, alpha: float, spending: Spending = "obf") -> int | None:
    """The first look whose stage p-value lies below its nominal level, or None.

    Args:
        p: (K,) one-sided stage p-values of one claim (NaN: no test at that look, never crosses).
        fractions: (K,) information fractions of the looks.
    """
    noms = nominal_levels(fractions, alpha, spending)
    hits = np.flatnonzero(np.nan_to_num(np.asarray(p, dtype=np.float64), nan=2.0) < noms)
    return int(hits[0]) if hits.size else None


def sequential_holm(
    p: np.ndarray, alphas, fractions, spending: Spending = "obf", weighted: bool = True
) -> list[tuple[int, float] | None]:
    """Group-sequential Holm over a family of claims (Maurer and Bretz 2013, equal weights).

    Args:
        p: (m, K) one-sided stage p-values, one row per claim, one column per look (NaN: no test).
        alphas: (m,) each claim's one-sided alpha.
        fractions: (K,) information fractions of the looks.
        weighted: split alpha among the remaining claims (Holm); False tests each claim at its own alpha
            (no multiplicity adjustment).

    Returns:
        (m,) for each claim, (the look at which its boundary was crossed, the level it was tested at):
        its null rejected, the claim ACCEPTED; or None.
    """
    p = np.atleast_2d(np.asarray(p, dtype=np.float64))
    crossed: list[tuple[int, float] | None] = [None] * p.shape[0]
    remaining = list(range(p.shape[0]))
    changed = True
    while changed and remaining:
        changed = False
        for i in remaining:
            level = float(alphas[i]) / (len(remaining) if weighted else 1)
            look = first_crossing(p[i], fractions, level, spending)
            if look is not None:
                crossed[i] = (look, level)
                remaining.remove(i)
                changed = True
                break
    return crossed
