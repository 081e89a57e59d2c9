"""Activation-level observables that are not functions of the covariance eigenvalues.

Plain numpy functions (this module never imports torch), registered in :data:`OBSERVABLES` with what
they are computed on: ``"covariance"`` (the centred ``(D, D)`` covariance of a point and token set) or
``"sample"`` (the fixed, seeded ``(m, D)`` token subsample of it). ``runners.extract`` computes every
registered observable at extraction time and stores the values with the run (``scalars.json``, key
``"{epoch}/{layer}/{token_set}/{name}"``) so the tidy table carries them next to the eigenvalue metrics
and claims can name them. Adding one is one ``@register_observable(NAME, on=...)`` function here (plus
its test; ``tests/spectra/test_observables.py`` checks every entry).

================  ===================================================================  ===============
name              formula (computed on)                                                range
================  ===================================================================  ===============
cosine_anisotropy mean cos(x_i, x_j) over all distinct pairs of a fixed seeded          [-1, 1]
                  token subsample, *uncentred* (raw activations)
diagonality       sum_{i!=j} |R_ij| / sum_{i,j} |R_ij|, R the correlation matrix of    [0, 1 - 1/D']
                  the *centred* covariance (D' = dimensions with non-zero variance);
                  the off-diagonal share: 0 = perfectly diagonal
twonn_id          TwoNN intrinsic dimension (Facco et al. 2017) of the fixed seeded     (0, inf)
                  token subsample, duplicates dropped
================  ===================================================================  ===============

``ALL_METRICS`` lists every name a hypothesis file may use: the eigenvalue metrics of
``analysis.spectral.METRICS``, ``OBSERVABLES`` and the token-count metrics of
``analysis.spectral.TOKEN_METRICS`` (measured at extraction, stored like observables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from analysis.spectral import MEASURES, METRICS, RANGES, TOKEN_METRICS, Bounds
from vitstudy_core.registry import Names, Registry

Input = Literal["covariance", "sample"]
INPUTS: tuple[Input, ...] = ("covariance", "sample")


@dataclass(frozen=True)
class Observable:
    """A registered observable: ``fn`` of the input named by ``on`` -> one float (NaN where undefined).

    Attributes:
        on: ``"covariance"``: ``fn(cov)`` with ``cov`` the centred ``(D, D)`` float64 covariance;
            ``"sample"``: ``fn(x)`` with ``x`` the ``(m, D)`` seeded token subsample (raw activations).
        fn: the function.
        bounds: (low, high) of its values (None: unbounded on that side), as :data:`analysis.spectral.RANGES`.
    """

    on: Input
    fn: Callable[[np.ndarray], float]
    bounds: Bounds = (None, None)


def _check(name: str, entry: Observable) -> None:
    if entry.on not in INPUTS:
        raise ValueError(f"observable {name!r}: 'on' must be one of {INPUTS}, got {entry.on!r}")


OBSERVABLES: Registry[Observable] = Registry(
    "observable", check=_check, group="vitstudy.observables", namespace=MEASURES
)


def register_observable(
    name: str, on: Input, bounds: Bounds = (None, None), version: str | None = None
) -> Callable[[Callable], Callable]:
    """Decorator: add ``fn`` to :data:`OBSERVABLES` under ``name``, computed on ``on``, its values in
    ``bounds``; returns ``fn``. ``version``: what the observable declares about its values (a plug-in's
    enters the run key: bump it when they change; ``study.measured_by``)."""

    def wrap(fn: Callable[[np.ndarray], float]) -> Callable[[np.ndarray], float]:
        OBSERVABLES.register(name, Observable(on, fn, bounds), version=version)
        return fn

    return wrap


def compute_observables(cov: np.ndarray, sample: np.ndarray) -> dict[str, float]:
    """Every registered observable of one point and token set, by name (registration order).

    Args:
        cov: the centred ``(D, D)`` covariance.
        sample: the ``(m, D)`` seeded token subsample.
    """
    inputs = {"covariance": cov, "sample": sample}
    return {name: entry.fn(inputs[entry.on]) for name, entry in OBSERVABLES.items()}


TWONN_DISCARD = 0.1  # Facco et al. 2017: drop the largest 10% of ratios, where the Pareto fit is poorest


@register_observable("cosine_anisotropy", on="sample", bounds=(-1.0, 1.0))
def cosine_anisotropy(x: np.ndarray) -> float:
    """Mean cosine similarity over all distinct pairs of rows of ``x``, uncentred.

    Args:
        x: ``(m, D)`` tokens (a random subsample of one point and token set). Zero-norm rows are dropped.

    Returns:
        ``(|sum_i u_i|^2 - m) / (m (m - 1))`` with ``u_i = x_i / |x_i|``: exactly the mean of
        ``cos(x_i, x_j)`` over the ``m (m - 1)`` ordered pairs ``i != j``, computed in float64 in O(m D).
        Range [-1/(m-1), 1] (within [-1, 1]); 1 when all tokens point the same way. NaN if m < 2.
    """
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    u = x[norms > 0] / norms[norms > 0, None]
    m = u.shape[0]
    if m < 2:
        return float("nan")
    total = u.sum(0)
    return float((total @ total - m) / (m * (m - 1)))


@register_observable("diagonality", on="covariance", bounds=(0.0, 1.0))
def diagonality(cov: np.ndarray) -> float:
    """Off-diagonal share of the absolute mass of the correlation matrix.

    Args:
        cov: ``(D, D)`` centred covariance. Dimensions with zero variance have no correlation and are
            left out.

    Returns:
        ``sum_{i != j} |R_ij| / sum_{i, j} |R_ij|`` with ``R_ij = C_ij / sqrt(C_ii C_jj)``. 0 for a diagonal
        covariance, ``1 - 1/D'`` when all D' live dimensions are perfectly correlated. Invariant to
        scaling the covariance and to permuting dimensions. NaN if no dimension has variance.
    """
    cov = np.asarray(cov, dtype=np.float64)
    d = np.diag(cov).copy()
    live = d > 0
    if not live.any():
        return float("nan")
    # a copy, divided and made absolute in place (fancy indexing only where a dimension is dead: it is
    # slower than a plain copy)
    r = cov.copy() if live.all() else cov[np.ix_(live, live)]
    s = np.sqrt(d[live])
    r /= np.outer(s, s)
    np.abs(r, out=r)
    total = r.sum()
    return float((total - np.trace(r)) / total)


@register_observable("twonn_id", on="sample", bounds=(0.0, None))
def twonn_id(x: np.ndarray, discard_fraction: float = TWONN_DISCARD) -> float:
    """TwoNN intrinsic dimension (Facco, d'Errico, Rodriguez & Laio, Sci. Rep. 2017).

    For each point, ``mu_i = r2_i / r1_i`` (Euclidean distances to its 2nd and 1st nearest neighbour).
    Under local uniformity ``mu`` is Pareto with ``P(mu > t) = t^-d``; with ``mu`` sorted ascending and
    ``F_i = i / N``, ``d`` is the least-squares slope through the origin of ``-log(1 - F_i)`` against
    ``log mu_i`` over the smallest ``(1 - discard_fraction) N`` ratios.

    Args:
        x: ``(m, D)`` points (a random token subsample). Duplicate rows are dropped first: a zero
            nearest-neighbour distance makes ``mu`` infinite.
        discard_fraction: share of the largest ratios left out of the fit.

    Returns:
        The estimate ``d`` (> 0). NaN with fewer than 3 distinct points.
    """
    x = np.unique(np.asarray(x, dtype=np.float64), axis=0)
    n = x.shape[0]
    if n < 3:
        return float("nan")
    # squared distances by one GEMM (|a|^2 + |b|^2 - 2 a.b) after centring: cdist's per-pair loop is ~50x
    # slower at D = 384, and centring keeps the cancellation error far below the nearest-neighbour distances
    x = x - x.mean(0)
    sq = (x * x).sum(1)
    dist2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.fill_diagonal(dist2, np.inf)
    r12 = np.sqrt(np.maximum(np.partition(dist2, 1, axis=1)[:, :2], 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = r12[:, 1] / r12[:, 0]
    mu = np.sort(mu[np.isfinite(mu)])  # r1 rounded to 0 (near-duplicates): the point carries no ratio
    n = mu.size
    if n < 3:
        return float("nan")
    keep = min(n - 1, max(2, int(np.floor(n * (1.0 - discard_fraction)))))  # F_N = 1: log(0)
    f = np.arange(1, n + 1) / n
    xs, ys = np.log(mu[:keep]), -np.log(1.0 - f[:keep])
    denom = (xs * xs).sum()
    return float((xs * ys).sum() / denom) if denom > 0 else float("nan")


# every name a hypothesis file may use as a metric: eigenvalue metrics, observables and token-count metrics,
# read from the registries at each use (a plug-in's metric is in it whenever it registered)
ALL_METRICS: Sequence[str] = Names(lambda: sorted(set(METRICS) | set(OBSERVABLES) | set(TOKEN_METRICS)))


def metric_range(name: str) -> Bounds:
    """(low, high) of a metric's values: an eigenvalue metric's or an observable's declared bounds
    (None on a side without one; both None for a name registered nowhere)."""
    if name in RANGES:
        return RANGES[name]
    entry = OBSERVABLES.get(name, None)
    return entry.bounds if entry is not None else (None, None)
