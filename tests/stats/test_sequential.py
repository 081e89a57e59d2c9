"""Group-sequential boundaries (``analysis.sequential``) against published values and against simulation,
the group-sequential Holm procedure, and the sequential verdict rule (``analysis.sequential_verdicts.decide_sequential``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis.sequential import (
    alpha_spent,
    first_crossing,
    nominal_levels,
    sequential_holm,
    sequential_holm_levels,
    t_boundaries,
    t_critical,
    z_boundaries,
)


@pytest.mark.parametrize(
    "spending, published",
    [("obf", [3.7103, 2.5114, 1.9931]), ("pocock", [2.2794, 2.2949, 2.2960])],
)
def test_boundaries_match_published_values(spending, published):
    """One-sided alpha 0.025, three equally spaced looks (Lan-DeMets spending; e.g. rpact, gsDesign)."""
    got = z_boundaries([1 / 3, 2 / 3, 1.0], 0.025, spending)
    np.testing.assert_allclose(got, published, atol=1e-3)


def test_spending_functions_spend_alpha_by_the_end():
    for spending in ("obf", "pocock"):
        assert alpha_spent(1.0, 0.05, spending) == pytest.approx(0.05)
        t = np.linspace(0.05, 1, 20)
        assert np.all(np.diff(alpha_spent(t, 0.05, spending)) > 0)
    assert z_boundaries([1.0], 0.05)[0] == pytest.approx(stats.norm.isf(0.05))
    with pytest.raises(ValueError):
        z_boundaries([0.5, 0.4], 0.05)


@pytest.mark.parametrize("spending", ["obf", "pocock"])
def test_boundaries_hold_alpha_under_the_canonical_distribution(spending):
    """Z statistics of a Brownian motion at unequal looks: the share crossing any boundary is alpha."""
    fractions = np.array([0.3, 0.55, 0.8, 1.0])
    rng = np.random.default_rng(0)
    steps = rng.normal(0, np.sqrt(np.diff(fractions, prepend=0.0)), (400_000, 4))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = (z >= z_boundaries(fractions, 0.05, spending)).any(axis=1).mean()
    assert abs(crossed - 0.05) < 4 * np.sqrt(0.05 * 0.95 / 400_000)
    # the spending itself: the share that crossed by each look is alpha(t)
    by_look = np.maximum.accumulate(z >= z_boundaries(fractions, 0.05, spending), axis=1).mean(axis=0)
    np.testing.assert_allclose(by_look, alpha_spent(fractions, 0.05, spending), atol=2e-3)


def test_t_critical_is_the_nominal_level_of_t():
    nom = nominal_levels([0.5, 1.0], 0.05, "obf")
    for level in nom:
        assert stats.t.sf(t_critical(level, 4), 4) == pytest.approx(level)


def test_first_crossing_ignores_untestable_looks():
    fr = [0.5, 1.0]
    assert first_crossing([np.nan, 0.001], fr, 0.05) == 1
    assert first_crossing([0.5, 0.5], fr, 0.05) is None
    assert first_crossing([1e-6, 0.5], fr, 0.05) == 0


def test_sequential_holm_passes_alpha_on():
    """Claim 0 crosses at look 1 at alpha/2; its share passes to claim 1, whose look-2 p crosses only at
    the full alpha."""
    fr = [0.5, 1.0]
    full = nominal_levels(fr, 0.05, "obf")[1]
    half = nominal_levels(fr, 0.025, "obf")[1]
    p1 = (full + half) / 2
    got = sequential_holm(np.array([[1e-6, 1e-6], [0.5, p1]]), [0.05, 0.05], fr)
    assert got[0] == (0, 0.025) and got[1] == (1, 0.05)
    # without the first claim crossing, the second stays at alpha/2 and does not cross
    assert sequential_holm(np.array([[0.5, 0.5], [0.5, p1]]), [0.05, 0.05], fr) == [None, None]
    # unweighted (exploratory, adjust: none): each at its own alpha
    assert sequential_holm(np.array([[0.5, 0.5], [0.5, p1]]), [0.05, 0.05], fr, weighted=False)[1] == (
        1,
        0.05,
    )


def _t_paths(looks: list[int], reps: int, seed: int) -> np.ndarray:
    """(reps, K) one-sample t statistics of null N(0, 1) seeds at each look (the same seeds extended),
    drawn seed by seed: independent of the batch-sufficient-statistics rule that sets the boundaries."""
    x = np.random.default_rng(seed).standard_normal((reps, looks[-1]))
    n = np.asarray(looks)
    cs, cq = np.cumsum(x, 1)[:, n - 1], np.cumsum(x**2, 1)[:, n - 1]
    mean = cs / n
    sd = np.sqrt((cq - n * mean**2) / (n - 1))
    return mean / (sd / np.sqrt(n))


@pytest.mark.parametrize("looks", [[3, 5, 7, 9], [3, 6, 9], [4, 6, 8, 10], [3, 10]])
@pytest.mark.parametrize("spending", ["obf", "pocock"])
def test_t_calibrated_levels_hold_alpha_for_t_statistics(looks, spending):
    """The z reference levels compared with t(S-1) p-values exceed alpha (the issue's 0.053-0.055);
    the t-calibrated levels hold it, look by look as the spending function says."""
    reps, alpha = 200_000, 0.05
    t = _t_paths(looks, reps, seed=sum(looks) + len(spending))
    p = stats.t.sf(t, np.asarray(looks) - 1)
    fractions = [n / looks[-1] for n in looks]
    mcse = np.sqrt(alpha * (1 - alpha) / reps)
    by_look = np.maximum.accumulate(p < nominal_levels(fractions, alpha, spending, looks), axis=1).mean(0)
    assert by_look[-1] <= alpha + 2 * mcse, by_look
    assert by_look[-1] >= alpha - 3 * mcse, by_look  # calibrated, not merely conservative
    np.testing.assert_allclose(by_look, alpha_spent(fractions, alpha, spending), atol=3 * mcse)
    # the same comparison with a t-scale boundary, and the old rule's excess where the looks are few seeds
    crossed_t = (t >= t_boundaries(fractions, looks, alpha, spending)).any(1).mean()
    assert crossed_t == pytest.approx(by_look[-1], abs=1e-12)
    if spending == "obf" and looks[0] == 3 and len(looks) > 2:
        old = (p < nominal_levels(fractions, alpha, spending)).any(1).mean()
        assert old > alpha + 2 * mcse, old


def test_t_boundaries_depend_only_on_the_looks_so_far():
    full = t_boundaries([0.3, 0.6, 1.0], [3, 6, 10], 0.05)
    np.testing.assert_array_equal(t_boundaries([0.3, 0.6], [3, 6], 0.05), full[:2])
    # one look: the plain t(S - 1) critical value of alpha (to the rule's Monte Carlo error)
    assert t_boundaries([1.0], [5], 0.05)[0] == pytest.approx(stats.t.isf(0.05, 4), rel=0.02)
    # a single seed allows no t test: nothing is spent there, the next look may spend it
    noms = nominal_levels([0.2, 1.0], 0.05, "pocock", [1, 5])
    assert noms[0] == 0.0 and noms[1] == pytest.approx(0.05, abs=2e-3)
    with pytest.raises(ValueError):
        t_boundaries([0.5, 1.0], [4, 4], 0.05)


def test_holm_levels_record_the_share_of_claims_that_never_cross():
    fr, seeds = [0.5, 1.0], [5, 10]
    got = sequential_holm_levels(np.array([[0.5, 0.5], [0.5, 0.4], [0.6, 0.3]]), [0.05] * 3, fr, seeds=seeds)
    assert got == [(None, pytest.approx(0.05 / 3))] * 3
    # one crosses: the others are left at half each
    got = sequential_holm_levels(
        np.array([[1e-9, 1e-9], [0.5, 0.4], [0.6, 0.3]]), [0.05] * 3, fr, seeds=seeds
    )
    assert got[0] == (0, pytest.approx(0.05 / 3)) and got[1:] == [(None, pytest.approx(0.025))] * 2
    assert sequential_holm_levels(np.array([[0.5, 0.5]]), [0.05], fr, weighted=False) == [(None, 0.05)]
