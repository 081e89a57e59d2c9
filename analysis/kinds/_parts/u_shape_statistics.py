"""The u_shape's array-level tests: the intersection-union test of the two per-seed contrasts (early -
bottleneck) and (late - bottleneck), each one-sided t(S-1), with the bottleneck region declared
(:func:`u_shape_statistics`) or chosen per seed leave-one-seed-out with a sign-flip randomisation p
that repeats the choice (:func:`loso_bottleneck`, :func:`u_shape_loso_statistics`), and the dip depth
(:func:`dip_depth`). This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from analysis.inference import TTest, t_test
from analysis.kinds._parts.outcome import Statistic, few_seeds_warning, std_effect
from analysis.kinds._parts.rejection import contradiction


@dataclass(frozen=True, kw_only=True)
class UShapeStatistic(Statistic):
    """:class:`Statistic` of a U-shape, plus per contrast (``early``, ``late``: shoulder - bottleneck,
    metric units) its one-sided test (``tests``) and (S,) per-seed values (``contrasts``), the
    ``binding`` contrast (the larger p), and for a leave-one-seed-out bottleneck the (S,) chosen column
    of the candidates (``pick``) and the (S,) bottleneck values (``bottleneck``)."""

    binding: str
    tests: dict[str, TTest]
    contrasts: dict[str, np.ndarray]
    pick: np.ndarray | None = None
    bottleneck: np.ndarray | None = None


def u_shape_statistics(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> UShapeStatistic:
    """The u_shape intersection-union test on per-seed region means (each ``(S,)``, one value per seed).

    Per seed ``c_early = early - bottleneck`` and ``c_late = late - bottleneck``; each tested one-sided
    (mean > 0) with t(S-1); the IUT p-value is ``max(p_early, p_late)``. Contradicted (REJECTED) when one
    contrast is significantly below 0, Holm across the two at 2.5% (``2 min p_against < 0.025``): the
    U needs both, so either one pointing the wrong way refutes it, and the rule's rate at the boundary
    (both contrasts 0) stays at most 2.5%.

    Returns:
        A :class:`UShapeStatistic`: ``p`` (NaN if no test is possible), ``effect`` and ``ci`` (bottleneck
        minus the binding shoulder, mean and 95% t CI, metric units), ``values`` = -(binding contrast).
    """
    bottleneck = np.asarray(bottleneck, dtype=np.float64)
    contrasts = {"early": np.asarray(early) - bottleneck, "late": np.asarray(late) - bottleneck}
    tests = {k: t_test(v, "greater") for k, v in contrasts.items()}
    against = [t_test(v, "less").p for v in contrasts.values()]
    n = len(bottleneck)
    p = (
        float("nan")
        if any(math.isnan(t.p) for t in tests.values()) or n < 2
        else max(t.p for t in tests.values())
    )
    warnings = few_seeds_warning(n, p)
    binding = max(tests, key=lambda k: tests[k].p if not math.isnan(tests[k].p) else math.inf)
    bt = tests[binding]
    return UShapeStatistic(
        p=p,
        effect=-bt.mean,
        ci=(-bt.ci[1], -bt.ci[0]),
        binding=binding,
        p_against=against,
        contradicted=n >= 2 and contradiction(against, "every"),
        tests=tests,
        contrasts=contrasts,
        values=-contrasts[binding],
        std_effect=std_effect(bt),
        warnings=warnings,
    )


def dip_depth(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> np.ndarray:
    """Per seed the bottleneck depth: the shoulders' mean minus the bottleneck, (S,) from (S,) region
    means (metric units; > 0 where the bottleneck sits below the shoulders). What claims across
    conditions compare: a linear contrast, so its mean is the true depth whatever the seed noise."""
    return (np.asarray(early, float) + np.asarray(late, float)) / 2 - np.asarray(bottleneck, float)


def loso_bottleneck(profiles: np.ndarray) -> np.ndarray:
    """Leave-one-seed-out bottleneck choice: for each seed, the argmin of the *other* seeds' mean profile.

    Args:
        profiles: (S, L) per-seed values over the candidate layers (depth order).

    Returns:
        (S,) integer column index chosen for each seed (seed s never influences its own choice; with
        S = 1 the seed's own argmin, which cannot be tested anyway).
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    n = profiles.shape[0]
    if n < 2:
        return np.argmin(profiles, axis=1)
    others = (profiles.sum(axis=0, keepdims=True) - profiles) / (n - 1)
    return np.argmin(others, axis=1)


def sign_flip_loso_p(
    shoulder: np.ndarray,
    candidates: np.ndarray,
    n_flips: int = 4999,
    seed: int = 0,
    alternative: Literal["greater", "less"] = "greater",
) -> float:
    """One-sided p that ``shoulder - bottleneck > 0`` when the bottleneck is chosen leave-one-seed-out.

    The per-seed contrasts ``c_s = shoulder_s - cand_s[j(-s)]`` are dependent across seeds through the
    choice ``j(-s)`` (it is where the *other* seeds are low), so a t(S-1) test on them is anti-conservative
    (measured: 0.09 at S = 5 and 0.15 at S = 10 for a nominal 0.05 on flat profiles). This randomisation
    test flips the sign of each seed's whole relative profile ``cand_s - shoulder_s`` (exchangeable under
    the flat null when seed deviations are symmetric), repeats the leave-one-seed-out choice on each
    flipped data set and compares the t statistic of the contrasts: exact at the boundary of the null.

    Args:
        shoulder: (S,) the shoulder region mean per seed.
        candidates: (S, L) per-seed values of the candidate bottleneck layers.
        n_flips: Monte Carlo flips when 2^S exceeds it (otherwise all 2^S are enumerated).
        alternative: ``greater`` (shoulder above the bottleneck: the claim) or ``less`` (below it: the
            REJECTED rule's test, the same randomisation the other way).

    Returns:
        p = share of flips with t >= observed t (``less``: t <= observed t); NaN when S < 2 or the
        contrasts do not vary.
    """
    rel = np.asarray(candidates, float) - np.asarray(shoulder, float)[:, None]  # (S, L)
    n = rel.shape[0]
    if n < 2:
        return float("nan")
    if 2**n <= n_flips:
        flips = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)  # (F, S), row 0 = identity
    else:
        rng = np.random.default_rng(seed)
        flips = np.vstack([np.ones(n, int), rng.choice([-1, 1], size=(n_flips, n))])
    data = flips[:, :, None] * rel[None]  # (F, S, L)
    others = (data.sum(axis=1, keepdims=True) - data) / (n - 1)
    pick = np.argmin(others, axis=2)  # (F, S)
    c = -np.take_along_axis(data, pick[:, :, None], axis=2)[:, :, 0]  # shoulder - bottleneck, (F, S)
    sd = c.std(axis=1, ddof=1)
    if not sd[0] > 1e-12 * max(1.0, abs(c[0].mean())):
        return float("nan")
    t = c.mean(axis=1) / np.where(sd > 0, sd, np.inf) * math.sqrt(n)
    if alternative == "less":
        return float(np.mean(t <= t[0] + 1e-12))
    return float(np.mean(t >= t[0] - 1e-12))


def u_shape_loso_statistics(early: np.ndarray, candidates: np.ndarray, late: np.ndarray) -> UShapeStatistic:
    """:func:`u_shape_statistics` with the bottleneck chosen leave-one-seed-out among ``candidates``
    (S, L); each contrast's p, both ways, comes from :func:`sign_flip_loso_p` (the t CIs are kept for
    display): the t tests of these dependent contrasts are anti-conservative, in both directions (the
    REJECTED rule on their CIs: 0.097 at S = 10 for a nominal 0.025 at the step-down null)."""
    candidates = np.asarray(candidates, float)
    pick = loso_bottleneck(candidates)
    bottleneck = candidates[np.arange(len(candidates)), pick]
    stat = u_shape_statistics(early, bottleneck, late)
    ps = {k: sign_flip_loso_p(v, candidates) for k, v in (("early", early), ("late", late))}
    against = [sign_flip_loso_p(v, candidates, alternative="less") for v in (early, late)]
    n = len(candidates)
    warnings = list(stat.warnings)
    if n >= 2 and 2**n < 40:
        warnings.append(
            f"sign-flip p of a leave-one-seed-out bottleneck cannot go below 1/2^{n} = {1 / 2**n:.3f}"
        )
    return replace(
        stat,
        tests={k: replace(t, p=ps[k]) for k, t in stat.tests.items()},
        p=float("nan") if n < 2 or any(math.isnan(v) for v in ps.values()) else max(ps.values()),
        pick=pick,
        bottleneck=bottleneck,
        warnings=warnings,
        p_against=against,
        contradicted=n >= 2 and contradiction(against, "every"),
    )
