"""MixedLM (random intercept and slope by seed) against R's lme4 on stored fixtures; no R needed here.

Fixtures: ``tests/fixtures/lme4/make_data.py`` wrote ``data_*.csv`` (fixed seed); ``fit_lme4.R``
fitted ``y ~ x + (1 + x | seed)`` by REML with lme4 1.1.31 / lmerTest 3.1.3 and stored ``lme4_*.csv``
(``lme4_designs.csv``: 27 designs over three x ranges, 3/5/10 seeds, large/small/zero slope spread).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.inference import per_seed_slopes, t_test
from analysis.mixed import fit_random_slopes, mixed_slope_test

FIX = Path(__file__).parents[1] / "fixtures" / "lme4"
DESIGNS = pd.read_csv(FIX / "data_designs.csv")
LME4 = pd.read_csv(FIX / "lme4_designs.csv").set_index("design")


def _design(name: str) -> tuple[np.ndarray, np.ndarray]:
    data = DESIGNS[DESIGNS.design == name]
    y = data.y.to_numpy().reshape(data.seed.nunique(), -1)
    return data.x.to_numpy()[: y.shape[1]], y


@pytest.mark.parametrize("name", ["a", "b"])
def test_mixedlm_matches_lme4(name):
    data = pd.read_csv(FIX / f"data_{name}.csv")
    ref = pd.read_csv(FIX / f"lme4_{name}.csv").set_index("quantity")["value"]
    n_seeds = data.seed.nunique()
    y = data.y.to_numpy().reshape(n_seeds, -1)
    x = data.x.to_numpy()[: y.shape[1]]
    fit = fit_random_slopes(x, y)
    ours = {
        "fe_intercept": fit.intercept,
        "fe_x": fit.slope,
        "se_x": fit.se,
        "se_intercept": fit.se_intercept,
        "var_intercept": fit.cov_re[0][0],
        "var_x": fit.cov_re[1][1],
        "cov_intercept_x": fit.cov_re[0][1],
        "residual_var": fit.scale,
    }
    for key, value in ours.items():
        assert value == pytest.approx(ref[key], rel=1e-4), key
    assert fit.warnings == [] and fit.converged and not fit.singular
    # lmerTest's Satterthwaite df for the slope is S - 1 on this balanced design: our t(S-1) is that test
    assert ref["df_x_satterthwaite"] == pytest.approx(n_seeds - 1, rel=1e-4)


def test_boundary_fit_is_warned_not_silent():
    # no between-seed variation at all: the random-effect variances sit at 0 (a boundary fit)
    rng = np.random.default_rng(0)
    x = np.arange(6.0)
    y = 1.0 + 0.3 * x + rng.normal(0, 1, (5, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may leak out of the fit
        fit = fit_random_slopes(x, y)
    assert fit.warnings, "a boundary fit must be recorded"
    assert np.isfinite(fit.slope) and fit.slope == pytest.approx(fit.ols_slope, rel=1e-6)


def test_degenerate_inputs_return_nan_with_reason():
    fit = fit_random_slopes(np.arange(4.0), np.full((3, 4), 2.0))
    assert np.isnan(fit.p) and fit.warnings
    fit = fit_random_slopes(np.arange(4.0), np.ones((1, 4)) * np.arange(4.0))
    assert np.isnan(fit.p) and fit.warnings


def test_zero_slope_with_converged_true_is_flagged(monkeypatch):
    # statsmodels issue 10239: a fixed effect can come back as exactly 0 with converged=True; the OLS
    # cross-check catches any such slope, here planted in the final GLS step
    import analysis.mixed as mixed

    real = mixed._reml_parts

    def zero_slope(*a, **k):
        out = real(*a, **k)
        return dataclasses.replace(out, fe=np.array([out.fe[0], 0.0]))

    monkeypatch.setattr(mixed, "_reml_parts", zero_slope)
    x = np.arange(6.0)
    y = (
        2.0 * x
        + np.random.default_rng(0).normal(0, 0.1, (4, 6))
        + np.random.default_rng(1).normal(0, 1, (4, 1))
    )
    fit = mixed.fit_random_slopes(x, y)
    assert fit.slope == 0.0
    assert any("disagrees with OLS" in w for w in fit.warnings)
    test = mixed.mixed_slope_test(x, y)
    assert test.fallback_reason == "mixed-model slope disagrees with OLS"
    assert test.effect == pytest.approx(2.0, abs=0.1) and test.p < 1e-4


@pytest.mark.parametrize("name", list(LME4.index))
def test_mixedlm_matches_lme4_at_every_scale(name):
    """x on 0-5, on the paper's checkpoints 0, 1, 10, ..., 100 and on knob levels 0-1; 3, 5, 10 seeds;
    singular fits included (R's isSingular). Slope and SE always; the variances where R's fit is not
    singular (on a singular fit the boundary is approached to SINGULAR_TOL, not reached)."""
    ref = LME4.loc[name]
    x, y = _design(name)
    n_seeds = y.shape[0]
    fit = fit_random_slopes(x, y, "two-sided")
    assert fit.converged and fit.singular == bool(ref.is_singular)
    assert fit.slope == pytest.approx(ref.fe_x, rel=1e-4)
    assert fit.se == pytest.approx(ref.se_x, rel=1e-4)
    assert fit.t == pytest.approx(ref.t_x, rel=1e-4)
    # our p is t with S - 1 df; lmerTest's differs only through its Satterthwaite df (S - 1 on an
    # interior fit of a balanced design, more on a singular one): R's t with S - 1 df gives our p
    assert fit.p == pytest.approx(ref.p_x_t_s_minus_1, rel=1e-3)
    if not ref.is_singular:
        assert ref.df_x_satterthwaite == pytest.approx(n_seeds - 1, rel=1e-4)
        assert fit.p == pytest.approx(ref.p_x_satterthwaite, rel=1e-3)
        assert fit.cov_re[0][0] == pytest.approx(ref.var_intercept, rel=1e-4)
        assert fit.cov_re[1][1] == pytest.approx(ref.var_x, rel=1e-4)
        assert fit.cov_re[0][1] == pytest.approx(ref.cov_intercept_x, rel=1e-4)
        assert fit.scale == pytest.approx(ref.residual_var, rel=1e-4)
        assert fit.intercept == pytest.approx(ref.fe_intercept, rel=1e-4)
    else:
        assert ref.df_x_satterthwaite >= n_seeds - 1 - 1e-3  # so our t(S-1) p is the larger (conservative)
        assert any("boundary fit" in w for w in fit.warnings)
    test = mixed_slope_test(x, y, "two-sided")
    assert test.method_used == "mixed" and test.p == fit.p


@pytest.mark.parametrize("name", ["paper_s5_small", "knob_s10_large", "x6_s3_large"])
@pytest.mark.parametrize("x_unit", [0.01, 1.0, 100.0])
@pytest.mark.parametrize("y_unit", [1e-3, 1.0, 1e3])
def test_mixed_model_does_not_depend_on_units(name, x_unit, y_unit):
    x, y = _design(name)
    base = fit_random_slopes(x, y)
    fit = fit_random_slopes(x * x_unit, y * y_unit)
    assert fit.t == pytest.approx(base.t, rel=1e-6)
    assert fit.p == pytest.approx(base.p, rel=1e-6, abs=1e-12)
    assert fit.slope == pytest.approx(base.slope * y_unit / x_unit, rel=1e-6)
    assert fit.cov_re[1][1] == pytest.approx(base.cov_re[1][1] * (y_unit / x_unit) ** 2, rel=1e-5)
    assert fit.scale == pytest.approx(base.scale * y_unit**2, rel=1e-5)


def test_unsound_fit_falls_back_to_per_seed_slopes(monkeypatch):
    import analysis.mixed as mixed

    x, y = _design("paper_s5_large")
    per_seed = t_test(per_seed_slopes(x, y), "greater")
    real = mixed.fit_random_slopes
    monkeypatch.setattr(mixed, "fit_random_slopes", lambda *a: dataclasses.replace(real(*a), converged=False))
    test = mixed.mixed_slope_test(x, y)
    assert test.method_used == "per-seed slopes (fallback: mixed model did not converge)"
    assert (test.p, test.effect, test.ci) == (per_seed.p, per_seed.mean, per_seed.ci)
    assert test.warnings[-1].startswith("verdict from the per-seed slopes' t(S-1) test")


def test_implausible_slope_se_falls_back():
    """Real data on which REML's slope SE is implausible: every seed's slope is 0.2 up to 1e-6 and the
    within-seed noise is orthogonal to x, so the seeds agree on the slope while REML, treating the noise
    as independent, gives it an SE 1e5 times larger. The per-seed slopes decide."""
    rng = np.random.default_rng(0)
    x = np.arange(6.0)
    xc = x - x.mean()
    noise = rng.normal(0, 1, (5, 6))
    noise -= np.outer(noise @ xc / (xc @ xc), xc)
    y = rng.normal(0, 3, (5, 1)) + (0.2 + rng.normal(0, 1e-6, (5, 1))) * x + noise
    test = mixed_slope_test(x, y)
    assert test.fit.converged and test.fit.se > 1e4 * test.per_seed_se
    assert test.method_used.startswith("per-seed slopes (fallback: mixed-model slope SE")
    assert test.effect == pytest.approx(0.2, abs=1e-5) and test.p < 1e-10


def test_statsmodels_failure_is_refined_to_lme4s_optimum():
    """On this singular design statsmodels' own bfgs stops short (SE 20% off); the bounded refinement of
    the same REML criterion reaches lme4's optimum, and the refinement is recorded."""
    x, y = _design("x6_s3_large")
    fit = fit_random_slopes(x, y)
    assert any("REML refined by a bounded optimiser" in w for w in fit.warnings)
    assert fit.se == pytest.approx(LME4.loc["x6_s3_large"].se_x, rel=1e-4)
    assert stats.t.sf(fit.t, 2) == pytest.approx(fit.p)
