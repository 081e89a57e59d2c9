"""Linear mixed model with a random intercept and slope by seed (statsmodels MixedLM), tested with t(S-1).

statsmodels prints z tests; with few seeds the calibrated choice is t with S - 1 degrees of freedom
(simulated type-I error 0.04-0.05 at S = 3 and 5). Every warning of the fit (ConvergenceWarning, boundary fits, singular Hessian)
is caught and returned, and the fixed slope is cross-checked against OLS: with ``lbfgs`` a fixed effect
can come back as exactly 0 while ``converged`` is True (statsmodels issue 10239). Verified against
R's lme4/lmerTest on stored fixtures (``tests/fixtures/lme4``). This module never imports torch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from scipy import stats

OLS_TOLERANCE = 0.01  # gap between MixedLM and OLS slopes, in slope SEs, that triggers a warning


def fit_random_slopes(x: np.ndarray, y: np.ndarray, alternative: str = "greater") -> dict:
    """Fit ``y ~ 1 + x + (1 + x | seed)`` by REML and test the fixed slope with t(S-1).

    Args:
        x: (T,) the ordered factor shared by all seeds (epoch, layer index, knob level); centred
            internally (x - mean(x)) so intercept and slope are nearly uncorrelated.
        y: (S, T) values per seed (NaN entries are dropped).
        alternative: ``greater`` (slope > 0), ``less`` or ``two-sided``.

    Returns:
        dict with ``slope``, ``se`` (model-based), ``t`` = slope / se, ``p`` (t(S-1)), ``ci`` (95%,
        t(S-1) quantile), ``intercept`` (at the mean of x) and ``se_intercept``, ``cov_re`` (2x2 random-effects covariance:
        intercept, slope), ``scale`` (residual variance), ``ols_slope``, ``converged``, ``warnings``
        (list of strings: every warning raised by the fit, plus boundary / OLS-mismatch notes).
        Never raises on degenerate data: a failed fit returns NaN numbers and says why in ``warnings``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n_seeds = y.shape[0]
    long = pd.DataFrame(
        {
            "seed": np.repeat(np.arange(n_seeds), y.shape[1]),
            "x": np.tile(x - x.mean(), n_seeds),
            "y": y.ravel(),
        }
    ).dropna()
    out = {
        "slope": float("nan"),
        "se": float("nan"),
        "t": float("nan"),
        "p": float("nan"),
        "ci": (float("nan"), float("nan")),
        "intercept": float("nan"),
        "se_intercept": float("nan"),
        "cov_re": [[float("nan")] * 2] * 2,
        "scale": float("nan"),
        "ols_slope": float("nan"),
        "converged": False,
        "warnings": [],
    }
    if n_seeds < 2 or long.y.std() == 0 or long.x.std() == 0:
        out["warnings"].append("mixed model not fitted: needs >= 2 seeds and varying values")
        return out
    ols = smf.ols("y ~ x", long).fit()
    out["ols_slope"] = float(ols.params["x"])
    model = smf.mixedlm("y ~ x", long, groups=long.seed, re_formula="~x")
    fit = None
    # bfgs at gtol 1e-7 agrees with lme4 to ~2e-7 relative (tests/test_mixed.py); lbfgs (the statsmodels
    # default) stops ~1e-5 early but is more robust near a boundary, so it is the fallback. Only the
    # warnings of the fit that is kept are reported, plus a note that the first optimiser failed.
    for method, kw in (("bfgs", {"gtol": 1e-7}), ("lbfgs", {})):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit = model.fit(reml=True, method=method, **kw)
            except (np.linalg.LinAlgError, ValueError) as exc:
                out["warnings"].append(f"mixed model ({method}) failed: {type(exc).__name__}: {exc}")
                fit = None
        if fit is not None and fit.converged:
            break
        if method == "bfgs":
            out["warnings"].append("bfgs did not converge; refitted with lbfgs")
    out["warnings"] += sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})
    if fit is None:
        return out
    slope, se = float(fit.fe_params["x"]), float(fit.bse_fe["x"])
    df = n_seeds - 1
    tval = slope / se if se > 0 else float("nan")
    if alternative == "greater":
        p = stats.t.sf(tval, df)
    elif alternative == "less":
        p = stats.t.cdf(tval, df)
    else:
        p = 2 * stats.t.sf(abs(tval), df)
    q = stats.t.ppf(0.975, df)
    cov_re = np.asarray(fit.cov_re, dtype=np.float64)
    out.update(
        slope=slope,
        se=se,
        t=float(tval),
        p=float(p),
        ci=(slope - q * se, slope + q * se),
        intercept=float(fit.fe_params["Intercept"]),
        se_intercept=float(fit.bse_fe["Intercept"]),
        cov_re=cov_re.tolist(),
        scale=float(fit.scale),
        converged=bool(fit.converged),
    )
    if not fit.converged:
        out["warnings"].append("mixed model did not converge")
    if np.min(np.diag(cov_re)) < 1e-8 * max(fit.scale, 1e-300):
        out["warnings"].append("boundary fit: a random-effect variance is ~0")
    # Balanced data with a shared x: GLS and OLS fixed slopes coincide, so a gap flags a bad fit
    # (statsmodels issue 10239: slope returned as 0 with converged=True).
    if math.isfinite(se) and abs(slope - out["ols_slope"]) > OLS_TOLERANCE * max(se, 1e-12):
        out["warnings"].append(
            f"fixed slope {slope:.6g} disagrees with OLS {out['ols_slope']:.6g} (statsmodels issue 10239)"
        )
    return out
