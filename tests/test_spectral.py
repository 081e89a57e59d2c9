"""Spectral metrics against closed-form spectra, and the registry contract."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.spectral import METRICS, compute_metrics

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


@pytest.mark.parametrize("name", sorted(METRICS))
def test_contract_every_metric(name):
    """Finite on a generic spectrum, invariant to eigenvalue order and to scale, deterministic."""
    rng = np.random.default_rng(0)
    lam = rng.gamma(0.5, size=D)
    fn = METRICS[name]
    v = fn(lam)
    assert np.isfinite(v)
    assert fn(rng.permutation(lam)) == pytest.approx(v)
    assert fn(lam * 37.0) == pytest.approx(v)
    assert fn(lam.copy()) == v
