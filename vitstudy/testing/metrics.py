"""Contract checks of the eigenvalue metrics, token-count metrics and observables.

Each check is ``check(name)`` on a registered entry of :data:`analysis.spectral.METRICS`,
:data:`analysis.spectral.TOKEN_METRICS` or :data:`analysis.observables.OBSERVABLES`.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from analysis.observables import INPUTS, OBSERVABLES
from analysis.spectral import METRICS, RANGES, TOKEN_METRICS, sums_of

D = 64  # the generic spectrum's dimension


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return bool(np.isclose(a, b, rtol=rel, atol=1e-12))


def _documented(fn: object, name: str) -> None:
    assert (getattr(fn, "__doc__", None) or "").strip(), f"{name}: the function has no docstring"


def _in_module_table(fn: object, name: str) -> None:
    doc = sys.modules[fn.__module__].__doc__ or ""
    assert f"\n{name} " in doc, f"{name}: no row in the docstring table of {fn.__module__}"


def check_metric_is_finite_invariant_and_deterministic(name: str) -> None:
    """A metric of the eigenvalues ``lam: (D,)``: finite on a generic spectrum, the same for any order
    and any scale of the eigenvalues, the same twice, and within its declared bounds."""
    rng = np.random.default_rng(0)
    lam = rng.gamma(0.5, size=D)
    fn = METRICS[name]
    v = fn(lam)
    assert np.isfinite(v), f"{name}: {v} on a generic spectrum"
    assert _close(fn(rng.permutation(lam)), v), f"{name}: depends on the eigenvalues' order"
    assert _close(fn(lam * 37.0), v), f"{name}: depends on the eigenvalues' scale"
    assert fn(lam.copy()) == v, f"{name}: not deterministic"
    low, high = RANGES.get(name, (None, None))
    assert (low is None or v >= low) and (high is None or v <= high), f"{name}: {v} outside {low, high}"


def check_metric_on_extreme_spectra_warns_nothing(name: str) -> None:
    """On the largest float spectrum (``[1e308] * 3``), a rank-one one and a tiny one: a float (NaN where
    undefined, which ``study metrics`` prints as null) and no numpy warning (overflow, division by 0)."""
    for lam in (np.full(3, 1e308), np.array([2.0, 0.0, 0.0, 0.0]), np.full(5, 1e-300)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            v = METRICS[name](lam)
        assert isinstance(v, float | np.floating), f"{name}: {v!r} on {lam} is not a float"


def check_metric_name_is_its_own(name: str) -> None:
    """A metric's name is neither an observable's nor a token-count metric's (one column per name)."""
    assert name not in OBSERVABLES and name not in TOKEN_METRICS, f"{name}: registered twice as a metric"


def check_token_metric_is_finite_and_shift_invariant(name: str) -> None:
    """A token-count metric of streamed sums: finite on random tokens, the same for any shift ``k`` of
    the sums (they are sums of ``x - k``) and for the tokens' order, the same twice."""
    fn = TOKEN_METRICS[name]
    _documented(fn, name)
    assert name not in METRICS and name not in OBSERVABLES, f"{name}: the name is another metric's"
    x = np.random.default_rng(5).normal(size=(60, 8)) + 3.0
    v = fn(sums_of(x))
    assert np.isfinite(v), f"{name}: {v} on random tokens"
    assert _close(fn(sums_of(x, shift=np.zeros(8))), v, 1e-6), f"{name}: depends on the shift"
    assert _close(fn(sums_of(x[::-1].copy())), v, 1e-6), f"{name}: depends on the token order"
    assert fn(sums_of(x)) == v, f"{name}: not deterministic"


def _input(on: str, x: np.ndarray) -> np.ndarray:
    """What an observable registered ``on`` this input gets from tokens ``x`` (m, D)."""
    return np.cov(x, rowvar=False) if on == "covariance" else x


def check_observable_entry(name: str) -> None:
    """An observable: a known input, a name of its own, documented (a docstring and a row in its
    module's docstring table), finite and deterministic on a small random input, its input unchanged."""
    entry = OBSERVABLES[name]
    assert entry.on in INPUTS, f"{name}: on={entry.on!r}"
    assert name not in METRICS and name not in TOKEN_METRICS, f"{name}: the name is another metric's"
    _documented(entry.fn, name)
    _in_module_table(entry.fn, name)
    arg = _input(entry.on, np.random.default_rng(3).normal(size=(40, 6)))
    before = arg.copy()
    v = entry.fn(arg)
    assert isinstance(v, float) and np.isfinite(v), f"{name}: {v!r} is not a finite float"
    assert entry.fn(arg.copy()) == v, f"{name}: not deterministic"
    np.testing.assert_array_equal(arg, before, err_msg=f"{name}: changed its input")
    low, high = entry.bounds
    assert (low is None or v >= low) and (high is None or v <= high), f"{name}: {v} outside {low, high}"


CHECKS = {
    "metrics": [
        check_metric_is_finite_invariant_and_deterministic,
        check_metric_on_extreme_spectra_warns_nothing,
        check_metric_name_is_its_own,
    ],
    "token_metrics": [check_token_metric_is_finite_and_shift_invariant],
    "observables": [check_observable_entry],
}
