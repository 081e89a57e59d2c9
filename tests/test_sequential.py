"""Group-sequential boundaries (``analysis.sequential``) against published values and against simulation,
the group-sequential Holm procedure, and the sequential verdict rule (``analysis.verdicts.decide_sequential``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis.sequential import (
    alpha_spent,
    first_crossing,
    nominal_levels,
    sequential_holm,
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
