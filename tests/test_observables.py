"""Activation observables (analysis/observables.py): closed forms and the registry contract."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.observables import ALL_METRICS, OBSERVABLES, cosine_anisotropy, diagonality, twonn_id
from analysis.spectral import METRICS


def test_all_metrics_is_the_union():
    assert set(ALL_METRICS) == set(METRICS) | set(OBSERVABLES)
    assert not set(METRICS) & set(OBSERVABLES)


def test_cosine_anisotropy_closed_forms():
    rng = np.random.default_rng(0)
    v = rng.normal(size=16)
    assert cosine_anisotropy(np.tile(v, (50, 1)) * rng.uniform(0.5, 2, size=(50, 1))) == pytest.approx(1.0)
    assert cosine_anisotropy(np.eye(16)) == pytest.approx(0.0, abs=1e-15)  # orthogonal tokens
    pair = np.stack([v, -v])
    assert cosine_anisotropy(pair) == pytest.approx(-1.0)
    x = rng.normal(size=(40, 8))
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.mean([u[i] @ u[j] for i in range(40) for j in range(40) if i != j])
    assert cosine_anisotropy(x) == pytest.approx(brute, rel=1e-12)
    assert np.isnan(cosine_anisotropy(np.zeros((5, 3))))  # zero tokens are dropped


def test_diagonality_closed_forms():
    assert diagonality(np.diag([1.0, 5.0, 0.1])) == 0.0
    d = 6
    assert diagonality(np.ones((d, d)) * 4.0) == pytest.approx(1 - 1 / d)
    rho = 0.3  # equicorrelation: off-diagonal share = (d^2 - d) rho / (d + (d^2 - d) rho)
    c = np.full((d, d), rho) + (1 - rho) * np.eye(d)
    assert diagonality(c) == pytest.approx((d * d - d) * rho / (d + (d * d - d) * rho))
    c0 = np.zeros((3, 3))
    c0[:2, :2] = [[1.0, 0.5], [0.5, 1.0]]  # a dead dimension is left out
    assert diagonality(c0) == pytest.approx(1.0 / 3.0)


@pytest.mark.parametrize("d", [2, 5])
def test_twonn_recovers_planted_dimension(d):
    rng = np.random.default_rng(d)
    x = rng.normal(size=(1000, d)) @ rng.normal(size=(d, 40))  # a d-dim linear subspace of R^40
    assert twonn_id(x) == pytest.approx(d, rel=0.15)


def test_twonn_drops_duplicates():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    assert twonn_id(np.concatenate([x, x[:100]])) == twonn_id(x)
    assert np.isnan(twonn_id(np.ones((10, 3))))


def _tokens():
    rng = np.random.default_rng(7)
    return rng.normal(size=(400, 12)) @ rng.normal(size=(12, 12)) + 2.0


@pytest.mark.parametrize("name", OBSERVABLES)
def test_contract_every_observable(name):
    """Finite, deterministic, invariant to token order and to scale (diagonality: on the covariance)."""
    x = _tokens()
    rng = np.random.default_rng(0)
    if name == "diagonality":
        fn, arg, perm, scaled = diagonality, np.cov(x, rowvar=False), None, None
        p = rng.permutation(12)
        perm, scaled = arg[np.ix_(p, p)], arg * 37.0
    else:
        fn = cosine_anisotropy if name == "cosine_anisotropy" else twonn_id
        arg, perm, scaled = x, x[rng.permutation(len(x))], x * 37.0
    v = fn(arg)
    assert np.isfinite(v)
    assert fn(perm) == pytest.approx(v, rel=1e-9)
    assert fn(scaled) == pytest.approx(v, rel=1e-9)
    assert fn(arg.copy()) == v
