"""Spectral metrics of a covariance spectrum, registered by name so hypothesis files can name them.

Every metric here is a plain function of the eigenvalues ``lam: (D,)`` of one (centred) token
covariance matrix, in any order; values at or below ``1e-11 * max(lam)`` (round-off from ``eigh``,
negatives included) are set to 0 first.
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
spectral_flatness      geometric mean / arithmetic mean, eigenvalues    (0, 1]
                       floored at 1e-11 * max lam
spectral_anisotropy    max lam / sum lam                                [1/D, 1]
numerical_rank         #{lam_i > 1e-6 * max lam}                        [0, D]
effective_rank_sv      exp(-sum q_i log q_i), q_i = s_i / sum s,        [1, D]
                       s_i = sqrt(lam_i) (singular-value form)
powerlaw_alpha         -slope of log lam_i vs log i, i = 2..max(4, D//2)  (any real)
powerlaw_r2            R^2 of that least-squares fit                    [0, 1]
=====================  ===============================================  ==============

All metrics use the eigenvalues of the *centred* covariance (the extraction centres every token set on
its own mean); none re-centres here.

The effective rank here is the *eigenvalue* form (entropy of normalised covariance eigenvalues). The
Roy & Vetterli / RankMe form normalises *singular values* of the centred data matrix and gives different
numbers; it lives under its own name, ``effective_rank_sv``, and is never mixed in under
``effective_rank``. This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from vitstudy_core.errors import StudyError
from vitstudy_core.registry import Namespace, Registry

MetricFn = Callable[[np.ndarray], float]
# every name a claim's ``metric:`` can give: the eigenvalue metrics, the token-count metrics and the
# observables (analysis.observables) share it, so a name is one column of the tidy table, never two
MEASURES = Namespace()
METRICS: Registry[MetricFn] = Registry(
    "metric", group="vitstudy.metrics", namespace=MEASURES, noun="eigenvalue metric"
)
# (low, high) a metric's values can take (None: unbounded there, or bounded by D, which a table does not
# carry): what the report's figures clip their bands to, so an interval never leaves the possible values
Bounds = tuple[float | None, float | None]
_BOUNDS: dict[str, Bounds] = {}  # as registered; RANGES shows those of the metrics registered now


class _Ranges(Mapping[str, Bounds]):
    """Metric name -> its (low, high), for the metrics in :data:`METRICS` now: read through the registry,
    so a metric taken out (a broken plug-in's, a test's) takes its range with it."""

    def __getitem__(self, name: str) -> Bounds:
        if name not in METRICS:
            raise KeyError(name)
        return _BOUNDS[name]

    def __iter__(self) -> Iterator[str]:
        return iter(METRICS.names())

    def __len__(self) -> int:
        return len(METRICS.names())


RANGES: Mapping[str, Bounds] = _Ranges()


def register_metric(name: str, bounds: Bounds = (None, None)) -> Callable[[MetricFn], MetricFn]:
    """Decorator: add ``fn(eigenvalues) -> float`` to :data:`METRICS` under ``name``, with the range of its
    values ``bounds = (low, high)`` (:data:`RANGES`; None: no bound known without D)."""

    def wrap(fn: MetricFn) -> MetricFn:
        METRICS.register(name, fn)
        _BOUNDS[name] = bounds
        return fn

    return wrap


NUMERICAL_ZERO = (
    1e-11  # relative to max(lam): float64 eigh noise is ~D * eps64 * max(lam) < 1e-12 (D <= 4096)
)


FLATNESS_FLOOR = NUMERICAL_ZERO  # relative to max(lam): spectral_flatness's floor, at the zeroing level

SAFE_EXPONENT = 500  # |log2 max(lam)| beyond this: sums of squares over any D could overflow or underflow


def _clean(lam: np.ndarray) -> np.ndarray:
    """float64 copy with round-off removed: values <= 1e-11 * max(lam) (negatives included) become 0.

    Without this, metrics that weigh small eigenvalues up (``effective_rank_sv`` through sqrt,
    ``powerlaw_alpha`` through log) would depend on the eigensolver's noise on rank-deficient spectra.
    Every metric here is scale-invariant, so a spectrum whose largest value lies beyond 2^±500 (where
    ``sum lam`` or ``sum lam^2`` would overflow to inf or underflow to 0: ``[1e308] * 3`` would read as
    entropy 0) is scaled by a power of two first; a power of two scales exactly, and spectra in range
    are left as they are, bit for bit.
    """
    lam = np.asarray(lam, dtype=np.float64).ravel().copy()
    top = lam.max() if lam.size else 0.0
    if np.isfinite(top) and top > 0:
        exponent = int(np.frexp(top)[1])
        if abs(exponent) > SAFE_EXPONENT:
            lam = np.ldexp(lam, -exponent)  # exact: the largest value becomes [0.5, 1)
            top = lam.max()
    lam[lam <= NUMERICAL_ZERO * max(top, 0.0)] = 0.0
    return lam


def _probs(lam: np.ndarray) -> np.ndarray:
    lam = _clean(lam)
    total = lam.sum()
    if total <= 0:
        return np.full(lam.shape, np.nan)
    return lam / total


@register_metric("spectral_entropy", bounds=(0.0, None))
def spectral_entropy(lam: np.ndarray) -> float:
    """H = -sum p_i log p_i in nats, p_i = lam_i / sum(lam); 0 log 0 = 0. Range [0, log D]."""
    p = _probs(lam)
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum()) if np.isfinite(p).all() else float("nan")


@register_metric("spectral_entropy_norm", bounds=(0.0, 1.0))
def spectral_entropy_norm(lam: np.ndarray) -> float:
    """H / log D. Range [0, 1] (1 = flat spectrum)."""
    d = np.asarray(lam).size
    return spectral_entropy(lam) / np.log(d) if d > 1 else float("nan")


@register_metric("effective_rank", bounds=(1.0, None))
def effective_rank(lam: np.ndarray) -> float:
    """exp(H), eigenvalue form. Range [1, D]; a flat rank-k spectrum gives exactly k."""
    return float(np.exp(spectral_entropy(lam)))


@register_metric("eed_pct", bounds=(0.0, 100.0))
def eed_pct(lam: np.ndarray) -> float:
    """Effective Encoding Dimension in percent of D: 100 * exp(H) / D. Range (0, 100]."""
    return 100.0 * effective_rank(lam) / np.asarray(lam).size


@register_metric("stable_rank", bounds=(1.0, None))
def stable_rank(lam: np.ndarray) -> float:
    """sum(lam) / max(lam) (= ||X||_F^2 / ||X||_2^2 of the centred data). Range [1, D]."""
    lam = _clean(lam)
    return float(lam.sum() / lam.max()) if lam.max() > 0 else float("nan")


@register_metric("participation_ratio", bounds=(1.0, None))
def participation_ratio(lam: np.ndarray) -> float:
    """(sum lam)^2 / sum(lam^2). Range [1, D]."""
    lam = _clean(lam)
    sq = (lam**2).sum()
    return float(lam.sum() ** 2 / sq) if sq > 0 else float("nan")


@register_metric("spectral_flatness", bounds=(0.0, 1.0))
def spectral_flatness(lam: np.ndarray) -> float:
    """exp(mean log max(lam_i, F)) / mean(lam), floor ``F = FLATNESS_FLOOR * max(lam)``. Range (0, 1].

    ``FLATNESS_FLOOR`` is 1e-11, the level at or below which :func:`_clean` already sets eigenvalues to 0
    as eigensolver round-off, so the floor only ever replaces those zeros: a spectrum with every
    eigenvalue above it (full rank at this resolution) gives exactly ``exp(mean log lam) / mean(lam)``,
    bit for bit as before 2026-12-01. On a rank-deficient spectrum (``r`` of ``D`` eigenvalues nonzero)
    the value is about ``FLATNESS_FLOOR ** ((D - r) / D)`` times the flatness of the nonzero part: set
    by the floor, and tiny. Because the floor equals the zeroing level, the value is continuous in the
    eigenvalues: an eigenvalue moving across the round-off level moves ``log(flatness)`` by
    ``log(lam_i / F) / D``, close to 0, where a floor below the zeroing level (until 2026-12-01:
    ``1e-12 * mean(lam)``) made it jump by up to ``log(10 D) / D`` per eigenvalue (a factor ~2,000 for
    336 eigenvalues at D = 384). Perturbing every eigenvalue by at most ``d * max(lam)`` moves
    ``log(flatness)`` by at most about ``d / FLATNESS_FLOOR + D d``. Values this close to 0 are still
    only as reproducible as the smallest eigenvalues, so comparisons of two computations of one
    spectrum use an absolute tolerance for this metric (``bench/extract.py``: ``metric_errors``).
    """
    lam = _clean(lam)
    mean = lam.mean()
    if mean <= 0:
        return float("nan")
    floored = np.maximum(lam, FLATNESS_FLOOR * lam.max())
    return float(np.exp(np.log(floored).mean()) / mean)


@register_metric("spectral_anisotropy", bounds=(0.0, 1.0))
def spectral_anisotropy(lam: np.ndarray) -> float:
    """max(lam) / sum(lam): share of variance on the top direction. Range [1/D, 1]."""
    lam = _clean(lam)
    return float(lam.max() / lam.sum()) if lam.sum() > 0 else float("nan")


@register_metric("numerical_rank", bounds=(0.0, None))
def numerical_rank(lam: np.ndarray, tol: float = 1e-6) -> float:
    """#{lam_i > tol * max(lam)}, tol = 1e-6 by default. Range [0, D]."""
    lam = _clean(lam)
    return float((lam > tol * lam.max()).sum()) if lam.max() > 0 else 0.0


@register_metric("effective_rank_sv", bounds=(1.0, None))
def effective_rank_sv(lam: np.ndarray) -> float:
    """Roy & Vetterli (2007) / RankMe (Garrido et al. 2023) effective rank, singular-value form.

    The singular values of the centred data matrix ``X: (n, D)`` are ``s_i = sqrt((n - 1) lam_i)``; the
    factor ``sqrt(n - 1)`` cancels in the normalisation, so ``q_i = sqrt(lam_i) / sum_j sqrt(lam_j)`` and
    the metric is ``exp(-sum q_i log q_i)`` (0 log 0 = 0). Range [1, D]; a flat rank-k spectrum gives k,
    as the eigenvalue form does, but any non-flat spectrum gives a *larger* value than ``effective_rank``.
    """
    return float(np.exp(spectral_entropy(np.sqrt(_clean(lam)))))


POWERLAW_FIRST_INDEX = 2  # skip lam_1: the top direction is often a separate spike (e.g. a mean-like mode)


def _powerlaw_fit(lam: np.ndarray) -> tuple[float, float]:
    """(alpha, R^2) of ``log lam_i = c - alpha log i`` by least squares over the default index range.

    Range: 1-based ranks ``i = POWERLAW_FIRST_INDEX .. max(4, D // 2)`` of the descending spectrum; the
    upper half is left out because its tail is dominated by the finite-sample noise floor and, on
    rank-deficient spectra, by zeros. Within the range only ``lam_i > 0`` enter the fit; with fewer than
    3 such points both values are NaN.
    """
    lam = np.sort(_clean(lam))[::-1]
    hi = min(lam.size, max(4, lam.size // 2))
    idx = np.arange(POWERLAW_FIRST_INDEX, hi + 1)
    vals = lam[idx - 1]
    keep = vals > 0
    if keep.sum() < 3:
        return float("nan"), float("nan")
    x, y = np.log(idx[keep].astype(np.float64)), np.log(vals[keep])
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    ss_tot = ((y - y.mean()) ** 2).sum()
    ss_res = (resid**2).sum()
    # a constant log-spectrum is fitted exactly: R^2 = 1 rather than 0/0
    r2 = 1.0 if ss_tot <= 1e-24 * max(1.0, (y**2).sum()) else 1.0 - ss_res / ss_tot
    return float(-slope), float(max(0.0, min(1.0, r2)))


@register_metric("powerlaw_alpha", bounds=(None, None))
def powerlaw_alpha(lam: np.ndarray) -> float:
    """Power-law decay exponent: ``-slope`` of ``log lam_i`` against ``log i`` (least squares).

    Fit range: ranks ``i = 2 .. max(4, D // 2)`` of the descending spectrum, positive eigenvalues only
    (see ``_powerlaw_fit``). Positive for a decaying spectrum (``lam_i = i^-a`` gives exactly ``a``), 0 for
    a flat one. Scale invariant (a scale only moves the intercept). NaN with < 3 positive points in range.
    """
    return _powerlaw_fit(lam)[0]


@register_metric("powerlaw_r2", bounds=(0.0, 1.0))
def powerlaw_r2(lam: np.ndarray) -> float:
    """Coefficient of determination R^2 = 1 - SS_res / SS_tot of the ``powerlaw_alpha`` fit, in [0, 1].

    1 for an exact power law (and for a flat spectrum, fitted exactly with alpha = 0).
    """
    return _powerlaw_fit(lam)[1]


def compute_metrics(lam: np.ndarray, names: list[str] | None = None) -> dict[str, float]:
    """All (or the named) registered metrics of one spectrum ``lam: (D,)``."""
    return {name: METRICS[name](lam) for name in (names or METRICS)}


def metrics_json(lam: np.ndarray) -> dict[str, float | None]:
    """:func:`compute_metrics` of ``lam: (D,)`` for JSON: a metric undefined for this spectrum (NaN or
    inf, e.g. ``powerlaw_alpha`` with fewer than 3 positive eigenvalues in its range) is None (``null``),
    never the ``NaN`` / ``Infinity`` tokens that JSON does not have."""
    return {k: float(v) if np.isfinite(v) else None for k, v in compute_metrics(lam).items()}


ROUNDOFF = 1e-12  # negatives down to -ROUNDOFF * max|lam| are eigh round-off (clipped), not bad input


def load_spectrum(path: str | Path) -> np.ndarray:
    """Read a spectrum from a ``.npy`` file: a 1-D, non-empty, finite, non-negative numeric vector.

    Values down to ``-1e-12 * max|lam|`` are accepted as ``eigh`` round-off (the metrics clip them).

    Raises:
        StudyError: one line naming the file and what was expected (missing, unreadable, wrong shape,
            wrong dtype, NaN/Inf, negative values).
    """
    path = Path(path)
    lam = _read(path, SPECTRUM_FILE)
    if not isinstance(lam, np.ndarray):
        raise StudyError(f"holds several arrays, not one vector ({SPECTRUM_FILE})", str(path))
    return _checked(lam, path, "", SPECTRUM_FILE)


SPECTRUM_FILE = "expected a .npy file holding a 1-D non-negative finite numeric vector of eigenvalues"
SPECTRA_FILE = (
    "expected a .npy file holding a 1-D non-negative finite numeric vector of eigenvalues, or a .npz of "
    "such vectors (a run's spectra.npz)"
)


def load_spectra(path: str | Path) -> dict[str, np.ndarray]:
    """Every spectrum in ``path``: a ``.npy`` vector (key ``""``), or each named vector of a ``.npz`` (a
    run's ``spectra.npz``: keys ``<epoch>/<layer>/<token set>``), in the file's order; each checked as
    :func:`load_spectrum` checks one.

    Raises:
        StudyError: one line naming the file, the array (for a ``.npz``) and what was expected.
    """
    path = Path(path)
    data = _read(path, SPECTRA_FILE)
    if isinstance(data, np.ndarray):
        return {"": _checked(data, path, "", SPECTRA_FILE)}
    with data:
        names = list(data.files)
        if not names:
            raise StudyError(f"holds no arrays ({SPECTRA_FILE})", str(path))
        try:
            arrays = {name: data[name] for name in names}
        except Exception as exc:  # noqa: BLE001 - a damaged member is a user-facing input error
            raise StudyError(f"cannot read: {type(exc).__name__} ({SPECTRA_FILE})", str(path)) from None
    return {name: _checked(lam, path, name, SPECTRA_FILE) for name, lam in arrays.items()}


def spectra_metrics_json(path: str | Path) -> dict:
    """``python -m study metrics``: :func:`metrics_json` of a ``.npy`` spectrum, or ``{name: metrics}``
    for every spectrum of a ``.npz``."""
    spectra = load_spectra(path)
    if list(spectra) == [""]:
        return metrics_json(spectra[""])
    return {name: metrics_json(lam) for name, lam in spectra.items()}


def _read(path: Path, expect: str) -> np.ndarray | np.lib.npyio.NpzFile:
    if not path.is_file():
        raise StudyError(f"file not found ({expect})", str(path))
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a user-facing input error
        raise StudyError(f"cannot read: {type(exc).__name__} ({expect})", str(path)) from None


def _checked(lam: np.ndarray, path: Path, name: str, expect: str) -> np.ndarray:
    """``lam`` as float64 if it is a spectrum, else one line naming ``path`` (and the array ``name``)."""
    where = f"{name}: " if name else ""
    if lam.dtype.kind not in "iuf":
        raise StudyError(f"{where}dtype {lam.dtype} is not real numeric ({expect})", str(path))
    if lam.ndim != 1 or lam.size == 0:
        raise StudyError(f"{where}shape {lam.shape} ({expect})", str(path))
    lam = lam.astype(np.float64)
    if not np.isfinite(lam).all():
        raise StudyError(f"{where}{int((~np.isfinite(lam)).sum())} NaN/Inf value(s) ({expect})", str(path))
    if lam.min() < -ROUNDOFF * np.abs(lam).max():
        raise StudyError(f"{where}negative value {lam.min():.6g} ({expect})", str(path))
    return lam


# --------------------------------------------------------------------------------------------------
# Token-count metrics: bias-corrected estimators that need more than the eigenvalues
# --------------------------------------------------------------------------------------------------
TokenMetricFn = Callable[[Mapping[str, np.ndarray]], float]
TOKEN_METRICS: Registry[TokenMetricFn] = Registry(
    "token-count metric", group="vitstudy.token_metrics", namespace=MEASURES
)


def register_token_metric(name: str, version: str | None = None) -> Callable[[TokenMetricFn], TokenMetricFn]:
    """Decorator: add ``fn(sums) -> float`` to :data:`TOKEN_METRICS` under ``name``.

    ``sums`` are one covariance's streamed token sums of shifted activations ``y = x - k`` (any constant
    shift ``k``): ``n`` (tokens), ``s = sum y`` (D,), ``q = sum y y^T`` (D, D), ``u = sum y |y|^2`` (D,)
    and ``w = sum |y|^4`` (); ``runners.extract`` accumulates them beside the Gram and stores each
    metric's value in ``scalars.json`` like an observable. ``version``: what the metric declares about
    its values (a plug-in's enters the run key: bump it when they change; ``study.measured_by``).
    """
    return TOKEN_METRICS.register(name, version=version)


def quartic_sums(sums: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The seven quartic index sums of Chun et al. (2026) from streamed token sums (see
    :func:`register_token_metric`), in their pattern names over rows ``i, j, l, m`` of ``Y: (n, D)``.

    ``ijji = |Y^T Y|_F^2``, ``iiii = sum_i |y_i|^4``, ``ijjj = s . u``, ``ijjl = s^T Y^T Y s``,
    ``iijj = tr(Y^T Y)^2``, ``iijl = tr(Y^T Y) |s|^2``, ``ijlm = |s|^4``: each a sum over all (not distinct)
    row indices and all column pairs, as the package's ``_gett_all(...)[0]`` before its 1/(PQ)^2 scale.
    """
    q = np.asarray(sums["q"], dtype=np.float64)
    s = np.asarray(sums["s"], dtype=np.float64)
    tr, ss = float(np.trace(q)), float(s @ s)
    return {
        "ijji": float((q * q).sum()),
        "iiii": float(sums["w"]),
        "ijjj": float(s @ np.asarray(sums["u"], dtype=np.float64)),
        "ijjl": float(s @ q @ s),
        "iijj": tr * tr,
        "iijl": tr * ss,
        "ijlm": ss * ss,
    }


@register_token_metric("participation_ratio_bc")
def participation_ratio_bc(sums: Mapping[str, np.ndarray]) -> float:
    """Bias-corrected participation ratio: Chun, Canatar, Chung & Lee (ICLR 2026), row-corrected form.

    ``(tr C)^2 / tr(C^2)`` of the population covariance, numerator and denominator each estimated without
    bias from ``n`` tokens by U-statistics over distinct token indices (their ``gamma_row``: every
    dimension observed, tokens a finite sample; the package's ``participation_ratio(..., return_all=True)
    ["row"]``, computed here from streamed sums instead of the ``(n, D)`` matrix, so it is shift invariant
    and needs no second pass). The naive ``participation_ratio`` reads low by about ``1/PR + 1/n`` in its
    inverse. Range: any real (an unbiased ratio can leave [1, D] at small n); NaN with n < 4 or a zero
    denominator.
    """
    p = float(sums["n"])
    if p < 4:
        return float("nan")
    t = quartic_sums(sums)
    f1, f2, f3 = p / (p - 2), 2.0 / (p - 2), 1.0 / ((p - 1) * (p - 2))
    a = (
        t["iijj"]
        - (2.0 / (p - 1)) * t["iijl"]
        + (1.0 / (p - 2)) * (4.0 * t["ijjj"] - p * t["iiii"])
        + f3 * (t["ijlm"] - 4.0 * t["ijjl"] + 2.0 * t["ijji"] - t["iijj"])
    )
    b = (
        t["ijji"]
        - f1 * t["iiii"]
        + f2 * (2.0 * t["ijjj"] - t["ijjl"])
        + f3 * (t["iijj"] - 2.0 * t["iijl"] + t["ijlm"])
    )
    return float(a / b) if b != 0 else float("nan")


def sums_of(x: np.ndarray, shift: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The streamed token sums of :func:`register_token_metric` of ``x: (n, D)`` in one go (for tests and
    simulations): shift ``k`` defaults to the first row."""
    x = np.asarray(x, dtype=np.float64)
    y = x - (x[0] if shift is None else shift)
    sq = (y * y).sum(1)
    return {
        "n": np.asarray(float(len(y))),
        "s": y.sum(0),
        "q": y.T @ y,
        "u": y.T @ sq,
        "w": np.asarray(float((sq * sq).sum())),
    }
