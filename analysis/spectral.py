"""Spectral metrics of a covariance spectrum, registered by name so hypothesis files can name them.

Every metric here is a plain function of the eigenvalues ``lam: (D,)`` of one (centred) token
covariance matrix, in any order; negative values (round-off from ``eigh``) are clipped to 0 first.
With ``p_i = lam_i / sum(lam)``:

=====================  ===============================================  ==============
name                   formula                                          range
=====================  ===============================================  ==============
spectral_entropy       H = -sum p_i log p_i  (nats)                     [0, log D]
spectral_entropy_norm  H / log D                                        [0, 1]
effective_rank         exp(H)  (eigenvalue form, as TGO-I / EED)         [1, D]
eed_pct                100 * exp(H) / D                                 (0, 100]
stable_rank            sum lam / max lam                                [1, D]
participation_ratio    (sum lam)^2 / sum lam^2                          [1, D]
spectral_flatness      geometric mean / arithmetic mean (floored)       (0, 1]
spectral_anisotropy    max lam / sum lam                                [1/D, 1]
numerical_rank         #{lam_i > 1e-6 * max lam}                        [0, D]
=====================  ===============================================  ==============

The effective rank here is the *eigenvalue* form (entropy of normalised covariance eigenvalues). The
Roy & Vetterli / RankMe form normalises *singular values* of the data matrix and gives different
numbers; it is not mixed in under this name. This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MetricFn = Callable[[np.ndarray], float]
METRICS: dict[str, MetricFn] = {}

_FLATNESS_FLOOR = 1e-12  # relative to the mean eigenvalue: keeps log() finite on rank-deficient spectra


def register_metric(name: str) -> Callable[[MetricFn], MetricFn]:
    """Decorator: add ``fn(eigenvalues) -> float`` to the registry under ``name``."""

    def wrap(fn: MetricFn) -> MetricFn:
        if name in METRICS:
            raise ValueError(f"metric {name!r} registered twice")
        METRICS[name] = fn
        return fn

    return wrap


def _clean(lam: np.ndarray) -> np.ndarray:
    lam = np.asarray(lam, dtype=np.float64).ravel()
    return np.clip(lam, 0.0, None)


def _probs(lam: np.ndarray) -> np.ndarray:
    lam = _clean(lam)
    total = lam.sum()
    if total <= 0:
        return np.full(lam.shape, np.nan)
    return lam / total


@register_metric("spectral_entropy")
def spectral_entropy(lam: np.ndarray) -> float:
    """H = -sum p_i log p_i in nats, p_i = lam_i / sum(lam); 0 log 0 = 0. Range [0, log D]."""
    p = _probs(lam)
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum()) if np.isfinite(p).all() else float("nan")


@register_metric("spectral_entropy_norm")
def spectral_entropy_norm(lam: np.ndarray) -> float:
    """H / log D. Range [0, 1] (1 = flat spectrum)."""
    d = np.asarray(lam).size
    return spectral_entropy(lam) / np.log(d) if d > 1 else float("nan")


@register_metric("effective_rank")
def effective_rank(lam: np.ndarray) -> float:
    """exp(H), eigenvalue form. Range [1, D]; a flat rank-k spectrum gives exactly k."""
    return float(np.exp(spectral_entropy(lam)))


@register_metric("eed_pct")
def eed_pct(lam: np.ndarray) -> float:
    """Effective Encoding Dimension in percent of D: 100 * exp(H) / D. Range (0, 100]."""
    return 100.0 * effective_rank(lam) / np.asarray(lam).size


@register_metric("stable_rank")
def stable_rank(lam: np.ndarray) -> float:
    """sum(lam) / max(lam) (= ||X||_F^2 / ||X||_2^2 of the centred data). Range [1, D]."""
    lam = _clean(lam)
    return float(lam.sum() / lam.max()) if lam.max() > 0 else float("nan")


@register_metric("participation_ratio")
def participation_ratio(lam: np.ndarray) -> float:
    """(sum lam)^2 / sum(lam^2). Range [1, D]."""
    lam = _clean(lam)
    sq = (lam**2).sum()
    return float(lam.sum() ** 2 / sq) if sq > 0 else float("nan")


@register_metric("spectral_flatness")
def spectral_flatness(lam: np.ndarray) -> float:
    """exp(mean log lam) / mean(lam), eigenvalues floored at 1e-12 * mean. Range (0, 1]."""
    lam = _clean(lam)
    mean = lam.mean()
    if mean <= 0:
        return float("nan")
    floored = np.maximum(lam, _FLATNESS_FLOOR * mean)
    return float(np.exp(np.log(floored).mean()) / mean)


@register_metric("spectral_anisotropy")
def spectral_anisotropy(lam: np.ndarray) -> float:
    """max(lam) / sum(lam): share of variance on the top direction. Range [1/D, 1]."""
    lam = _clean(lam)
    return float(lam.max() / lam.sum()) if lam.sum() > 0 else float("nan")


@register_metric("numerical_rank")
def numerical_rank(lam: np.ndarray, tol: float = 1e-6) -> float:
    """#{lam_i > tol * max(lam)}, tol = 1e-6 by default. Range [0, D]."""
    lam = _clean(lam)
    return float((lam > tol * lam.max()).sum()) if lam.max() > 0 else 0.0


def compute_metrics(lam: np.ndarray, names: list[str] | None = None) -> dict[str, float]:
    """All (or the named) registered metrics of one spectrum ``lam: (D,)``."""
    return {name: METRICS[name](lam) for name in (names or METRICS)}
