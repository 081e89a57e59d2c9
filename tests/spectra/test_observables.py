"""Activation observables (analysis/observables.py): closed forms and the registry contract."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.observables import (
    ALL_METRICS,
    OBSERVABLES,
    compute_observables,
    cosine_anisotropy,
    diagonality,
    register_observable,
    twonn_id,
)
from analysis.spectral import METRICS, TOKEN_METRICS
from vitstudy.testing import parametrize_with_checks


def test_all_metrics_is_the_union():
    assert set(ALL_METRICS) == set(METRICS) | set(OBSERVABLES) | set(TOKEN_METRICS)
    assert not set(METRICS) & set(OBSERVABLES)
    assert not (set(METRICS) | set(OBSERVABLES)) & set(TOKEN_METRICS)
    assert list(ALL_METRICS) == sorted(ALL_METRICS)
    assert list(OBSERVABLES)[:3] == ["cosine_anisotropy", "diagonality", "twonn_id"]  # built-ins first


def test_all_metrics_follows_a_late_registration():
    """ALL_METRICS reads the registries at each use: a metric registered after import is in it."""
    from analysis.spectral import register_metric

    assert "late_metric" not in ALL_METRICS
    register_metric("late_metric")(lambda lam: 0.0)
    try:
        assert "late_metric" in ALL_METRICS and len(ALL_METRICS) == len(METRICS) + len(OBSERVABLES) + len(
            TOKEN_METRICS
        )
    finally:
        METRICS.discard(["late_metric"])
    assert "late_metric" not in ALL_METRICS


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


def _input(on: str, x: np.ndarray) -> np.ndarray:
    """What an observable registered ``on`` this input gets from tokens ``x`` (m, D)."""
    return np.cov(x, rowvar=False) if on == "covariance" else x


@parametrize_with_checks("observables")
def test_contract_every_registered_observable(name, check):
    """The shipped contract (vitstudy.testing.metrics): a known input, a name of its own, documented,
    finite and deterministic on a small random input, its input left as it was."""
    check(name)


@pytest.mark.parametrize("name", ["cosine_anisotropy", "diagonality", "twonn_id"])
def test_builtin_observables_are_invariant_to_token_order_and_scale(name):
    """diagonality (on the covariance): to permuting dimensions and scaling; the others (on the sample):
    to the token order and scaling."""
    x = _tokens()
    rng = np.random.default_rng(0)
    entry = OBSERVABLES.get(name)
    arg = _input(entry.on, x)
    if entry.on == "covariance":
        p = rng.permutation(12)
        perm = arg[np.ix_(p, p)]
    else:
        perm = x[rng.permutation(len(x))]
    fn = entry.fn
    v = fn(arg)
    assert np.isfinite(v)
    assert fn(perm) == pytest.approx(v, rel=1e-9)
    assert fn(arg * 37.0) == pytest.approx(v, rel=1e-9)
    assert fn(arg.copy()) == v


def test_compute_observables_feeds_each_its_input():
    x = _tokens()
    cov = np.cov(x, rowvar=False)
    values = compute_observables(cov, x)
    assert list(values) == list(OBSERVABLES)
    assert values == {n: e.fn(cov if e.on == "covariance" else x) for n, e in OBSERVABLES.items()}
    assert (values["cosine_anisotropy"], values["diagonality"], values["twonn_id"]) == (
        cosine_anisotropy(x),
        diagonality(cov),
        twonn_id(x),
    )


def test_registry_refuses_a_bad_entry():
    with pytest.raises(ValueError, match="registered twice"):
        register_observable("twonn_id", on="sample")(lambda x: 0.0)
    with pytest.raises(ValueError, match="eigenvalue metric"):
        register_observable("effective_rank", on="covariance")(lambda c: 0.0)
    with pytest.raises(ValueError, match="'on' must be one of"):
        register_observable("new_one", on="gram")(lambda c: 0.0)
    assert "new_one" not in OBSERVABLES


# what a finished run measures beside the spectra (scalars.json), per study.runspecs.PROTOCOL_VERSION
MEASURED_BY_PROTOCOL = {
    2: {
        "observables": ["cosine_anisotropy", "diagonality", "twonn_id"],
        "token_metrics": ["participation_ratio_bc"],
    }
}


def test_a_new_builtin_observable_bumps_the_protocol_version():
    """A run folder holds the observables and token-count metrics registered when it was measured: a new
    built-in one must bump PROTOCOL_VERSION (so runs are measured again) and be recorded here."""
    from study.runspecs import PROTOCOL_VERSION
    from vitstudy_core.plugins import origin

    now = {
        part: [n for n in reg if origin(reg, n) == "built-in"]
        for part, reg in (("observables", OBSERVABLES), ("token_metrics", TOKEN_METRICS))
    }
    assert MEASURED_BY_PROTOCOL.get(PROTOCOL_VERSION) == now, (
        f"the built-in observables or token-count metrics are {now}: bump study.runspecs.PROTOCOL_VERSION "
        f"(finished runs lack the new one) and record the names under it in MEASURED_BY_PROTOCOL"
    )
