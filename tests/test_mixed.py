"""MixedLM (random intercept and slope by seed) against R's lme4 on stored fixtures; no R needed here.

Fixtures: ``tests/fixtures/lme4/make_data.py`` wrote ``data_*.csv`` (fixed seed); ``fit_lme4.R``
fitted ``y ~ x + (1 + x | seed)`` by REML with lme4 1.1.31 and stored ``lme4_*.csv``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.mixed import fit_random_slopes

FIX = Path(__file__).parent / "fixtures" / "lme4"


@pytest.mark.parametrize("name", ["a", "b"])
def test_mixedlm_matches_lme4(name):
    data = pd.read_csv(FIX / f"data_{name}.csv")
    ref = pd.read_csv(FIX / f"lme4_{name}.csv").set_index("quantity")["value"]
    n_seeds = data.seed.nunique()
    y = data.y.to_numpy().reshape(n_seeds, -1)
    x = data.x.to_numpy()[: y.shape[1]]
    fit = fit_random_slopes(x, y)
    ours = {
        "fe_intercept": fit["intercept"],
        "fe_x": fit["slope"],
        "se_x": fit["se"],
        "se_intercept": fit["se_intercept"],
        "var_intercept": fit["cov_re"][0][0],
        "var_x": fit["cov_re"][1][1],
        "cov_intercept_x": fit["cov_re"][0][1],
        "residual_var": fit["scale"],
    }
    for key, value in ours.items():
        assert value == pytest.approx(ref[key], rel=1e-4), key
    assert fit["warnings"] == []
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
    assert fit["warnings"], "a boundary fit must be recorded"
    assert np.isfinite(fit["slope"]) and fit["slope"] == pytest.approx(fit["ols_slope"], rel=1e-6)


def test_degenerate_inputs_return_nan_with_reason():
    fit = fit_random_slopes(np.arange(4.0), np.full((3, 4), 2.0))
    assert np.isnan(fit["p"]) and fit["warnings"]
    fit = fit_random_slopes(np.arange(4.0), np.ones((1, 4)) * np.arange(4.0))
    assert np.isnan(fit["p"]) and fit["warnings"]


def test_zero_slope_with_converged_true_is_flagged(monkeypatch):
    # statsmodels issue 10239: lbfgs can return a fixed effect of exactly 0 with converged=True
    import analysis.mixed as mixed

    class _Fit:
        fe_params = pd.Series({"Intercept": 1.0, "x": 0.0})
        bse_fe = pd.Series({"Intercept": 0.1, "x": 0.05})
        cov_re = np.eye(2)
        scale = 1.0
        converged = True

    class _Model:
        def fit(self, **kw):
            return _Fit()

    monkeypatch.setattr(mixed.smf, "mixedlm", lambda *a, **k: _Model())
    x = np.arange(6.0)
    y = 2.0 * x + np.random.default_rng(0).normal(0, 0.1, (4, 6))
    fit = mixed.fit_random_slopes(x, y)
    assert any("disagrees with OLS" in w for w in fit["warnings"])
