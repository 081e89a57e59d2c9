"""Spectral metrics against closed-form spectra, and the registry contract."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.spectral import compute_metrics
from vitstudy.testing import parametrize_with_checks

D = 64


def test_flat_spectrum():
    lam = np.ones(D)
    m = compute_metrics(lam)
    assert m["eed_pct"] == pytest.approx(100.0)
    assert m["effective_rank"] == pytest.approx(D)
    assert m["spectral_entropy"] == pytest.approx(np.log(D))
    assert m["spectral_entropy_norm"] == pytest.approx(1.0)
    assert m["stable_rank"] == pytest.approx(D)
    assert m["participation_ratio"] == pytest.approx(D)
    assert m["spectral_flatness"] == pytest.approx(1.0)
    assert m["spectral_anisotropy"] == pytest.approx(1 / D)
    assert m["numerical_rank"] == D


@pytest.mark.parametrize("k", [1, 3, 10, 64])
def test_flat_rank_k(k):
    lam = np.zeros(D)
    lam[:k] = 2.5
    m = compute_metrics(lam)
    assert m["effective_rank"] == pytest.approx(k)
    assert m["eed_pct"] == pytest.approx(100 * k / D)
    assert m["participation_ratio"] == pytest.approx(k)
    assert m["stable_rank"] == pytest.approx(k)
    assert m["numerical_rank"] == k


def test_geometric_decay_closed_form():
    r = 0.8
    lam = r ** np.arange(D)
    p = lam / lam.sum()
    h = -(p * np.log(p)).sum()
    m = compute_metrics(lam)
    assert m["effective_rank"] == pytest.approx(np.exp(h))
    assert m["participation_ratio"] == pytest.approx(lam.sum() ** 2 / (lam**2).sum())
    assert m["stable_rank"] == pytest.approx(lam.sum())  # max is 1
    assert m["spectral_flatness"] == pytest.approx(np.exp(np.log(lam).mean()) / lam.mean())


def test_one_spike():
    lam = np.full(D, 1.0)
    lam[0] = 1000.0
    m = compute_metrics(lam)
    assert m["spectral_anisotropy"] == pytest.approx(1000 / (1000 + D - 1))
    assert m["stable_rank"] == pytest.approx((1000 + D - 1) / 1000)


def test_negative_roundoff_is_clipped():
    lam = np.ones(D)
    lam[-5:] = -1e-15
    assert compute_metrics(lam)["effective_rank"] == pytest.approx(D - 5)


@parametrize_with_checks("metrics")
def test_contract_every_metric(name, check):
    """The shipped contract (vitstudy.testing.metrics): finite on a generic spectrum, invariant to the
    eigenvalues' order and scale, deterministic, within its bounds."""
    check(name)


@parametrize_with_checks("token_metrics")
def test_contract_every_token_metric(name, check):
    check(name)


# ---- new metrics: closed forms ---------------------------------------------------------------------
def _fit_alpha(lam, lo=2, hi=None):
    """Independent least squares (scipy) of log lam_i on log i over ranks lo..hi: (alpha, R^2)."""
    from scipy.stats import linregress

    hi = hi or D // 2
    i = np.arange(lo, hi + 1)
    fit = linregress(np.log(i), np.log(np.sort(lam)[::-1][i - 1]))
    return -fit.slope, fit.rvalue**2


def test_new_metrics_flat():
    m = compute_metrics(np.full(D, 3.0))
    assert m["effective_rank_sv"] == pytest.approx(D)
    assert m["powerlaw_alpha"] == pytest.approx(0.0, abs=1e-12)
    assert m["powerlaw_r2"] == 1.0


@pytest.mark.parametrize("k", [1, 3, 10, 64])
def test_new_metrics_rank_k(k):
    lam = np.zeros(D)
    lam[:k] = 0.7
    m = compute_metrics(lam)
    assert m["effective_rank_sv"] == pytest.approx(k)
    if k - 1 >= 3:  # positive eigenvalues at ranks 2..k inside the fit range: a flat line
        assert m["powerlaw_alpha"] == pytest.approx(0.0, abs=1e-12)
    else:
        assert np.isnan(m["powerlaw_alpha"]) and np.isnan(m["powerlaw_r2"])


def test_new_metrics_geometric():
    r = 0.8
    lam = r ** np.arange(D)
    s = np.sqrt(lam)
    q = s / s.sum()
    m = compute_metrics(lam)
    assert m["effective_rank_sv"] == pytest.approx(np.exp(-(q * np.log(q)).sum()))
    assert m["effective_rank_sv"] > m["effective_rank"]  # the two forms differ on any non-flat spectrum
    alpha, r2 = _fit_alpha(lam)
    assert m["powerlaw_alpha"] == pytest.approx(alpha) and m["powerlaw_r2"] == pytest.approx(r2)
    assert 0 < m["powerlaw_r2"] < 1  # exponential decay is not a power law


@pytest.mark.parametrize("a", [0.5, 1.0, 2.0])
def test_powerlaw_exact(a):
    lam = np.arange(1, D + 1, dtype=float) ** -a
    m = compute_metrics(lam[::-1])  # order does not matter
    assert m["powerlaw_alpha"] == pytest.approx(a)
    assert m["powerlaw_r2"] == pytest.approx(1.0)


def test_new_metrics_one_spike():
    lam = np.ones(D)
    lam[0] = 1000.0
    s = np.sqrt(lam)
    q = s / s.sum()
    m = compute_metrics(lam)
    assert m["effective_rank_sv"] == pytest.approx(np.exp(-(q * np.log(q)).sum()))
    assert m["powerlaw_alpha"] == pytest.approx(0.0, abs=1e-12)  # the spike is rank 1: outside the fit
    assert m["powerlaw_r2"] == 1.0


def test_planted_covariance_against_independent_float64():
    """Metrics from covariance eigenvalues vs an SVD of the centred data matrix (independent path)."""
    rng = np.random.default_rng(3)
    d, n = 32, 4000
    a = rng.normal(size=(d, d)) * np.geomspace(3.0, 0.01, d)
    x = rng.normal(size=(n, d)) @ a.T + 60.0
    xc = x - x.mean(0)
    sv = np.linalg.svd(xc, compute_uv=False)  # singular values of the centred data, float64
    lam = sv**2 / (n - 1)
    cov_lam = np.linalg.eigvalsh(np.cov(x, rowvar=False))
    m = compute_metrics(cov_lam)
    q = sv / sv.sum()
    p = lam / lam.sum()
    assert m["effective_rank_sv"] == pytest.approx(np.exp(-(q * np.log(q)).sum()), rel=1e-10)
    assert m["effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-10)
    assert m["participation_ratio"] == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-10)
    assert m["stable_rank"] == pytest.approx(lam.sum() / lam.max(), rel=1e-10)
    alpha, r2 = _fit_alpha(lam, hi=d // 2)
    assert m["powerlaw_alpha"] == pytest.approx(alpha, rel=1e-8)
    assert m["powerlaw_r2"] == pytest.approx(r2, rel=1e-8)


# ---- spectrum files ----------------------------------------------------------------------------------
def test_load_spectrum_rejects_bad_files(tmp_path):
    from analysis.spectral import load_spectrum
    from vitstudy_core.errors import StudyError

    good = tmp_path / "good.npy"
    np.save(good, np.array([3.0, 1.0, -1e-17, 0.0]))  # eigh round-off below zero is accepted
    assert load_spectrum(good).shape == (4,)
    bad = {
        "two_d.npy": np.ones((3, 3)),
        "neg.npy": np.array([1.0, -0.5]),
        "nan.npy": np.array([1.0, np.nan]),
        "inf.npy": np.array([np.inf, 1.0]),
        "str.npy": np.array(["a", "b"]),
        "cplx.npy": np.array([1 + 1j]),
        "empty.npy": np.array([]),
    }
    for name, arr in bad.items():
        np.save(tmp_path / name, arr)
    (tmp_path / "junk.npy").write_text("not a numpy file")
    for name in [*bad, "junk.npy", "missing.npy"]:
        with pytest.raises(StudyError) as err:
            load_spectrum(tmp_path / name)
        assert name in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("scale", [1e300, 1e-300, 2.0**600])
def test_metrics_do_not_overflow_at_extreme_scales(scale):
    """Every metric is scale-invariant: a spectrum near the float64 limits gives the metrics of its shape
    (before: sum lam^2 overflowed and [1e308] * 3 read as entropy 0, effective rank 1), warning nothing."""
    import warnings

    lam = np.geomspace(1.0, 1e-3, D)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compute_metrics(lam * scale)
    want = compute_metrics(lam)
    assert got == pytest.approx(want, rel=1e-9)


def test_in_range_spectra_are_not_rescaled():
    """Spectra of ordinary magnitude give the same bits as before (the run tables' snapshots hold)."""
    from analysis.spectral import _clean

    lam = np.random.default_rng(0).gamma(0.5, 1e3, D)
    np.testing.assert_array_equal(_clean(lam), np.where(lam <= 1e-11 * lam.max(), 0.0, lam))


def test_metrics_cli_on_huge_values_is_valid_json(tmp_path, capsys):
    """`metrics` on [1e308] * 3: the flat spectrum's values, strict JSON (null where undefined), no
    warning lines."""
    import json
    import warnings

    from study.cli import main

    path = tmp_path / "big.npy"
    np.save(path, np.array([1e308] * 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["metrics", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""

    def refuse(token):
        raise AssertionError(f"{token} is not JSON")

    values = json.loads(out, parse_constant=refuse)
    assert values["spectral_entropy"] == pytest.approx(np.log(3))
    assert values["effective_rank"] == pytest.approx(3.0) and values["stable_rank"] == pytest.approx(3.0)
    assert values["participation_ratio"] == pytest.approx(3.0)
    assert values["powerlaw_alpha"] is None  # 2 points in its fit range: undefined, so null


def _rank_deficient(rng: np.random.Generator, d: int = 384, r: int = 48) -> np.ndarray:
    lam = np.zeros(d)
    lam[:r] = np.sort(rng.gamma(2.0, 1.0, r))[::-1]
    return lam


def test_flatness_floor_is_the_zeroing_level_so_the_value_is_continuous():
    """Rank-deficient spectrum (48 of 384): eigenvalues just below the round-off level (set to 0, then
    floored) and just above it (kept) give the same flatness to 1e-5 relative; with the former floor
    (1e-12 * mean) the two differed by three orders of magnitude. Full-rank spectra are unchanged."""
    from analysis.spectral import FLATNESS_FLOOR, NUMERICAL_ZERO, spectral_flatness

    assert FLATNESS_FLOOR == NUMERICAL_ZERO
    lam = _rank_deficient(np.random.default_rng(0))
    below, above = lam.copy(), lam.copy()
    below[48:] = (1 - 1e-6) * NUMERICAL_ZERO * lam.max()
    above[48:] = (1 + 1e-6) * NUMERICAL_ZERO * lam.max()
    a, b, z = spectral_flatness(below), spectral_flatness(above), spectral_flatness(lam)
    assert a == z and b == pytest.approx(a, rel=1e-5)
    nz = lam[:48]
    expect = np.exp((48 * np.log(nz).mean() + 336 * np.log(NUMERICAL_ZERO * nz.max())) / 384) / lam.mean()
    assert z == pytest.approx(expect, rel=1e-12)
    full = np.random.default_rng(1).gamma(
        1.0, 1.0, 384
    )  # every eigenvalue above the floor: the plain formula
    assert spectral_flatness(full) == np.exp(np.log(full).mean()) / full.mean()
