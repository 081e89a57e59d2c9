"""Linear mixed model with a random intercept and slope by seed, REML, slope tested with t(S-1).

statsmodels prints z tests; with few seeds the calibrated choice is t with S - 1 degrees of freedom.
The model is fitted on standardised x and y (each centred and divided by its SD) and the estimates are
transformed back, so nothing depends on units: in raw units at the papers' checkpoint spacing (epochs
0-100) the slope variance (~1e-3 per epoch^2) sits beside an intercept variance of ~10, and the
optimiser stopped far from the optimum. statsmodels MixedLM gives the starting point; where it stops
short (typically a boundary fit, which its criterion cannot reach because it inverts the random-effect
covariance) the REML criterion is minimised again in lme4's form, which is defined on the boundary.
Every warning of the fit is caught and returned, and the fixed slope is cross-checked against OLS (they
coincide on balanced data; statsmodels issue 10239 returned a slope of exactly 0 with converged=True).
:func:`mixed_slope_test` decides which test a claim uses: the mixed model only when its fit is sound,
the per-seed slopes otherwise. Verified against R's lme4/lmerTest on stored fixtures
(``tests/fixtures/lme4``). This module never imports torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from analysis.inference import Alternative, TTest, per_seed_slopes, t_p, t_test

if TYPE_CHECKING:
    import pandas as pd

OLS_TOLERANCE = 0.01  # gap between MixedLM and OLS slopes, in slope SEs, that triggers a warning
# A sound REML slope SE on balanced data equals the per-seed slopes' SE (interior fit) or departs from it
# only through a boundary estimate; a factor beyond this is a failed fit, not a different answer
SE_RATIO_LIMIT = 10.0
SINGULAR_TOL = 1e-4  # R's isSingular: a diagonal entry of the relative Cholesky factor below this
NAN = float("nan")


@dataclass(frozen=True)
class _Reml:
    """The REML criterion and estimates at one ``theta`` (see :func:`_reml_parts`), unitless."""

    deviance: float  # -2 REML log-likelihood up to a constant
    fe: np.ndarray  # (2,) fixed effects: intercept, slope
    scale: float  # residual variance
    cov_fe: np.ndarray  # (2, 2) = scale * (X'V^-1X)^-1 (lme4's vcov)
    cov_re: np.ndarray  # (2, 2) random-effect covariance


def _reml_parts(theta: np.ndarray, zz: np.ndarray, zy: np.ndarray, yy: np.ndarray, n_obs: int) -> _Reml:
    """The profiled REML criterion of ``y ~ 1 + x + (1 + x | seed)`` in lme4's form, defined on the boundary.

    With the relative Cholesky factor ``L`` (random-effect covariance = scale * L L') and per seed
    ``M = I + L' Z'Z L`` (Z = [1, x], also the fixed-effect design): ``log|V| = sum log|M|``, ``X'V^-1X =
    sum Z'Z - Z'Z L M^-1 L' Z'Z`` (likewise ``X'V^-1y``, ``y'V^-1y``). Nothing inverts ``L L'``, so a
    singular factor (a variance 0, a correlation +-1) is an ordinary point, unlike statsmodels' criterion.

    Args:
        theta: (3,) ``(l11, l21, l22)``, statsmodels' packed square-root parameters.
        zz: (S, 2, 2) per-seed ``Z'Z``; zy: (S, 2) ``Z'y``; yy: (S,) ``y'y``; n_obs: rows in all.

    Returns:
        A :class:`_Reml`.
    """
    lam = np.array([[theta[0], 0.0], [theta[1], theta[2]]])
    zl = zz @ lam  # (S, 2, 2): Z'Z L
    m = np.eye(2) + lam.T @ zl  # (S, 2, 2)
    sol = np.linalg.solve(m, np.swapaxes(zl, 1, 2))  # M^-1 L' Z'Z, (S, 2, 2)
    xvx = (zz - zl @ sol).sum(0)
    xvy = (zy - np.einsum("sij,sj->si", zl @ np.linalg.solve(m, lam.T[None]), zy)).sum(0)
    yvy = (yy - np.einsum("si,sij,sj->s", zy, lam @ np.linalg.solve(m, lam.T[None]), zy)).sum()
    fe = np.linalg.solve(xvx, xvy)
    rss = float(yvy - fe @ xvy)
    scale = rss / (n_obs - 2)
    deviance = (
        float(np.linalg.slogdet(m)[1].sum()) + float(np.linalg.slogdet(xvx)[1]) + (n_obs - 2) * math.log(rss)
    )
    return _Reml(
        deviance=deviance,
        fe=fe,
        scale=scale,
        cov_fe=scale * np.linalg.inv(xvx),
        cov_re=scale * lam @ lam.T,
    )


Parts = Callable[[np.ndarray], _Reml]


def _refine(theta: np.ndarray, parts: Parts) -> tuple[np.ndarray, bool, float]:
    """Minimise the REML deviance ``parts(theta).deviance`` over ``(l11, l21, l22)`` with both diagonal
    entries >= 0, as lme4 does: L-BFGS-B, then Powell (derivative-free, for flat valleys next to a
    boundary), then L-BFGS-B again with any diagonal entry that ended near 0 held at 0. Returns the best
    point (3,), whether it meets the first-order conditions (numerical gradient), and the deviance/2
    (log-likelihood) gained over ``theta``."""

    from scipy import optimize

    def dev(th: np.ndarray) -> float:
        try:
            value = parts(th).deviance
        except (np.linalg.LinAlgError, ValueError):
            return math.inf
        return value if math.isfinite(value) else math.inf

    # the criterion is even in the sign of each column of the factor: fold onto the bounded half
    start = np.array([abs(theta[0]), theta[1] * np.sign(theta[0] or 1.0), abs(theta[2])])
    bounds: list[tuple[float | None, float | None]] = [(0.0, None), (None, None), (0.0, None)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f0 = dev(start)
        best, near = _minimise(dev, start, bounds)
        f_best = dev(best)
        g = optimize.approx_fprime(best + np.where(near, 1e-7, 0.0), dev, 1e-7)
    # converged: first-order conditions at the best point (a diagonal entry at its bound may only push
    # outwards), the tolerance relative to the size of the criterion
    tol = 1e-3 * max(1.0, abs(f_best))
    at_bound = np.array([best[0] < SINGULAR_TOL, False, best[2] < SINGULAR_TOL])
    kkt = np.where(at_bound, g >= -tol, np.abs(g) <= tol)
    return np.asarray(best, dtype=np.float64), bool(math.isfinite(f_best) and kkt.all()), (f0 - f_best) / 2


def _minimise(
    dev: Callable[[np.ndarray], float], start: np.ndarray, bounds: list[tuple[float | None, float | None]]
) -> tuple[np.ndarray, np.ndarray]:
    """The optimiser chain of :func:`_refine`: the best point (3,) and which diagonal entries ended near 0."""
    from scipy import optimize

    lbfgs = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000}
    minimize: Callable[..., optimize.OptimizeResult] = (
        optimize.minimize
    )  # the stubs' overloads are too narrow
    first = minimize(dev, start, method="L-BFGS-B", bounds=bounds, options=lbfgs)
    second = minimize(
        dev, first.x, method="Powell", bounds=bounds, options={"xtol": 1e-12, "ftol": 1e-15, "maxiter": 20000}
    )
    best = min((start, first.x, second.x), key=dev)
    near = np.array([best[0] < SINGULAR_TOL, False, best[2] < SINGULAR_TOL])
    fixed = [(0.0, 0.0) if n else b for n, b in zip(near, bounds, strict=True)]
    third = minimize(dev, np.where(near, 0.0, best), method="L-BFGS-B", bounds=fixed, options=lbfgs)
    best = min((best, third.x), key=dev)
    # Nelder-Mead on the free entries pins a flat valley down far enough that units cannot matter
    free = np.flatnonzero(~near)

    def dev_free(v: np.ndarray) -> float:
        th = best.copy()
        th[free] = v
        return dev(th)

    fourth = minimize(
        dev_free,
        best[free],
        method="Nelder-Mead",
        bounds=[bounds[i] for i in free],
        options={"xatol": 1e-9, "fatol": 1e-13, "maxiter": 1000},
    )
    if fourth.fun < dev(best):
        best = best.copy()
        best[free] = fourth.x
    return best, near


@dataclass(frozen=True)
class MixedFit:
    """A MixedLM fit of ``y ~ 1 + x + (1 + x | seed)`` by REML, slope tested with t(S-1) (:func:`fit_random_slopes`).

    Attributes:
        slope: fixed slope, units of y per unit of x; se: its model-based SE; t = slope / se.
        p: p of the slope for the alternative, t(S-1); ci: its 95% t(S-1) interval.
        intercept: fixed intercept at mean(x), units of y; se_intercept: its SE.
        cov_re: 2x2 random-effect covariance (intercept, slope), in the units of y and x.
        scale: residual variance (units of y squared).
        ols_slope: the pooled OLS slope (the cross-check of statsmodels issue 10239).
        converged: the REML optimum meets its first-order conditions.
        singular: a random-effect variance ~0 or correlation ~+-1 (R's ``isSingular``).
        warnings: every warning raised by the fit, plus boundary / OLS-mismatch notes.
    """

    slope: float = NAN
    se: float = NAN
    t: float = NAN
    p: float = NAN
    ci: tuple[float, float] = (NAN, NAN)
    intercept: float = NAN
    se_intercept: float = NAN
    cov_re: list[list[float]] = field(default_factory=lambda: [[NAN] * 2 for _ in range(2)])
    scale: float = NAN
    ols_slope: float = NAN
    converged: bool = False
    singular: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The fit as a JSON-ready dict (``details.mixed_model``): one key per attribute."""
        return asdict(self)


def _long(x: np.ndarray, y: np.ndarray) -> pd.DataFrame:
    """(seed, x - mean(x), y) rows of a (S, T) array, NaN rows dropped."""
    import pandas as pd

    n_seeds = y.shape[0]
    return pd.DataFrame(
        {
            "seed": np.repeat(np.arange(n_seeds), y.shape[1]),
            "x": np.tile(x - x.mean(), n_seeds),
            "y": y.ravel(),
        }
    ).dropna()


def _exactly_linear(long: pd.DataFrame) -> bool:
    """Whether every seed's rows lie on a straight line in x: the within-seed residuals are at rounding
    level (RMS below 1e-12 of the largest |y|)."""
    rss = 0.0
    for _, g in long.groupby("seed"):
        if len(g) > 2:
            design = np.column_stack([np.ones(len(g)), g.x.to_numpy()])
            coef, *_ = np.linalg.lstsq(design, g.y.to_numpy(), rcond=None)
            rss += float(np.sum((g.y.to_numpy() - design @ coef) ** 2))
    return rss <= len(long) * (1e-12 * float(np.abs(long.y).max())) ** 2


def _statsmodels_start(unit: pd.DataFrame) -> tuple[np.ndarray, bool, list[str]] | str:
    """statsmodels' REML fit on the standardised rows: (theta (3,), converged, the warnings it raised), or
    the reason it failed."""
    import statsmodels.formula.api as smf  # its formula machinery (patsy): only when a model is fitted

    model = smf.mixedlm("y ~ x", unit, groups=unit.seed, re_formula="~x")
    # statsmodels' bfgs at gtol 1e-7 reaches lme4's optimum to ~1e-7 relative on interior fits; where it
    # stops short (a boundary, or a failure) the same REML criterion is refined by a bounded optimiser
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit = model.fit(reml=True, method="bfgs", gtol=1e-7)
        except (np.linalg.LinAlgError, ValueError) as exc:
            return f"mixed model failed: {type(exc).__name__}: {exc}"
    theta = np.asarray(fit.params_object.get_packed(use_sqrt=True, has_fe=False), dtype=np.float64)
    notes = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})
    return theta, bool(fit.converged), notes


def _reml_of(unit: pd.DataFrame) -> Parts:
    """The REML criterion of the standardised rows as a function of theta (per-seed sufficient statistics)."""
    z = np.column_stack([np.ones(len(unit)), unit.x.to_numpy()])
    yv = unit.y.to_numpy()
    groups = [np.flatnonzero(unit.seed.to_numpy() == g) for g in np.unique(unit.seed)]
    zz = np.stack([z[i].T @ z[i] for i in groups])
    zy = np.stack([z[i].T @ yv[i] for i in groups])
    yy = np.array([yv[i] @ yv[i] for i in groups])
    n_obs = len(unit)
    return lambda th: _reml_parts(th, zz, zy, yy, n_obs)


def fit_random_slopes(x: np.ndarray, y: np.ndarray, alternative: Alternative = "greater") -> MixedFit:
    """Fit ``y ~ 1 + x + (1 + x | seed)`` by REML and test the fixed slope with t(S-1).

    The fit runs on ``x* = (x - mean(x)) / sd(x)`` and ``y* = (y - mean(y)) / sd(y)`` (SDs over the
    long data); with ``A = diag(sd(y), sd(y) / sd(x))`` the fixed effects and their SEs scale by ``A``,
    the random-effect covariance by ``A cov* A`` and the residual variance by ``sd(y)^2``. t and p are
    therefore unit-free.

    Args:
        x: (T,) the ordered factor shared by all seeds (epoch, layer index, knob level); the intercept is
            at mean(x), so intercept and slope are nearly uncorrelated.
        y: (S, T) values per seed (NaN entries are dropped).
        alternative: ``greater`` (slope > 0), ``less`` or ``two-sided``.

    Returns:
        A :class:`MixedFit`. Never raises on degenerate data: a failed fit has NaN numbers and says why in
        ``warnings``.
    """
    import pandas as pd

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n_seeds = y.shape[0]
    long = _long(x, y)
    if n_seeds < 2 or not long.y.std() > 0 or not long.x.std() > 0:
        return MixedFit(warnings=["mixed model not fitted: needs >= 2 seeds and varying values"])
    import statsmodels.formula.api as smf  # its formula machinery (patsy): only when a model is fitted

    ols_slope = float(smf.ols("y ~ x", long).fit().params["x"])
    if _exactly_linear(long):
        # REML's deviance has (n - 2) log(rss): unbounded below as rss -> 0, so an optimiser never stops
        return MixedFit(
            ols_slope=ols_slope,
            warnings=[
                "mixed model not fitted: zero residual variance (every seed lies exactly on a line in x), "
                "so REML has no optimum"
            ],
        )
    sx, my, sy = float(long.x.std()), float(long.y.mean()), float(long.y.std())
    unit = pd.DataFrame({"seed": long.seed, "x": long.x / sx, "y": (long.y - my) / sy})
    start = _statsmodels_start(unit)
    if isinstance(start, str):
        return MixedFit(ols_slope=ols_slope, warnings=[start])
    theta, converged, notes = start
    parts = _reml_of(unit)
    notes_out = []
    if notes or not converged:
        theta, converged, gain = _refine(theta, parts)
        notes_out.append(
            f"statsmodels bfgs stopped short ({notes[-1] if notes else 'not converged'}); REML refined "
            f"by a bounded optimiser (+{gain:.3g} log-likelihood)"
        )
    try:
        est = parts(theta)
    except (np.linalg.LinAlgError, ValueError) as exc:
        notes_out.append(f"mixed model failed at its optimum: {type(exc).__name__}: {exc}")
        return MixedFit(ols_slope=ols_slope, warnings=notes_out)
    fit = _in_units(est, theta, sy / sx, sy, my, n_seeds, alternative)
    return replace(
        fit,
        ols_slope=ols_slope,
        converged=converged,
        warnings=notes_out + _fit_notes(fit, converged, ols_slope),
    )


def _in_units(
    est: _Reml,
    theta: np.ndarray,
    slope_unit: float,
    sy: float,
    my: float,
    n_seeds: int,
    alternative: Alternative,
) -> MixedFit:
    """The standardised REML estimates back in the units of the data, the slope tested with t(S-1)."""
    from scipy import stats

    fe, cov_fe = est.fe, est.cov_fe
    scale_fe = np.array([sy, slope_unit])  # back to units: intercept in y, slope in y per x
    slope = float(fe[1]) * slope_unit
    se = math.sqrt(cov_fe[1, 1]) * slope_unit if cov_fe[1, 1] > 0 else NAN
    df = n_seeds - 1
    tval = slope / se if se > 0 else NAN
    q = stats.t.ppf(0.975, df)
    cov_re = est.cov_re * np.outer(scale_fe, scale_fe)
    return MixedFit(
        slope=slope,
        se=se,
        t=float(tval),
        p=t_p(tval, df, alternative),
        ci=(slope - q * se, slope + q * se),
        intercept=my + float(fe[0]) * sy,
        se_intercept=math.sqrt(cov_fe[0, 0]) * sy if cov_fe[0, 0] > 0 else float("nan"),
        cov_re=cov_re.tolist(),
        scale=est.scale * sy**2,
        # singular as R's isSingular (there in the units of the data, here in standardised units)
        singular=bool(np.abs(theta[[0, 2]]).min() < SINGULAR_TOL),
    )


def _fit_notes(fit: MixedFit, converged: bool, ols_slope: float) -> list[str]:
    """Warnings about a finished fit: not converged, a boundary, a slope that disagrees with OLS."""
    notes = []
    if not converged:
        notes.append("mixed model did not converge")
    if fit.singular:
        notes.append("boundary fit: the random-effect covariance is singular (a variance ~0 or |corr| ~1)")
    # Balanced data with a shared x: GLS and OLS fixed slopes coincide, so a gap flags a bad fit
    # (statsmodels issue 10239: slope returned as 0 with converged=True).
    if math.isfinite(fit.se) and abs(fit.slope - ols_slope) > OLS_TOLERANCE * max(fit.se, 1e-12):
        notes.append(
            f"fixed slope {fit.slope:.6g} disagrees with OLS {ols_slope:.6g} (statsmodels issue 10239)"
        )
    return notes


@dataclass(frozen=True)
class SlopeTest:
    """The slope test of ``method: mixed`` (:func:`mixed_slope_test`).

    Attributes:
        method_used: ``mixed``, or ``per-seed slopes (fallback: <reason>)``.
        fallback_reason: why the per-seed slopes decided (None when the fit decides).
        p: p of the test used for the alternative; effect: its slope (units of y per unit of x); ci: its
            95% t(S-1) interval.
        fit: the :class:`MixedFit` (whether or not it decided).
        per_seed_se: SE of the mean per-seed OLS slope (units of y per unit of x).
        warnings: the fit's, plus the fallback's.
    """

    method_used: str
    fallback_reason: str | None
    p: float
    effect: float
    ci: tuple[float, float]
    fit: MixedFit
    per_seed_se: float
    warnings: list[str]

    @property
    def se(self) -> float:
        """SE of ``effect``: the fit's slope SE, or the per-seed slopes' where they decided."""
        return self.fit.se if self.fallback_reason is None else self.per_seed_se

    def to_dict(self) -> dict:
        """JSON-ready dict (``details.per_series.<name>.mixed``), the fit nested as a dict."""
        return asdict(self)


def _fallback_reason(fit: MixedFit, se_seed: float, per_seed: TTest) -> str | None:
    """Why the fit must not decide (None: it is sound)."""
    if per_seed.n >= 2 and math.isnan(per_seed.p):
        # every seed has the same slope (one run copied, noise-free parallel lines): the fit's SE comes
        # from within-seed residuals alone, so its p would be a test across seeds with no variance
        return "the per-seed slopes do not vary (zero between-seed variance)"
    if not math.isfinite(fit.p):
        return "mixed model gave no test"
    if not fit.converged:
        return "mixed model did not converge"
    if abs(fit.slope - fit.ols_slope) > OLS_TOLERANCE * fit.se:
        return "mixed-model slope disagrees with OLS"
    if se_seed > 0 and not 1 / SE_RATIO_LIMIT <= fit.se / se_seed <= SE_RATIO_LIMIT:
        return (
            f"mixed-model slope SE {fit.se:.3g} is {fit.se / se_seed:.3g}x the per-seed slopes' SE "
            f"{se_seed:.3g}"
        )
    return None


def mixed_slope_test(x: np.ndarray, y: np.ndarray, alternative: Alternative = "greater") -> SlopeTest:
    """The slope test of ``method: mixed``: the MixedLM fit when it is sound, the per-seed slopes otherwise.

    The fit decides only when it converged, its slope matches OLS (statsmodels issue 10239) and its
    slope SE lies within a factor SE_RATIO_LIMIT of the SE of the per-seed slopes' mean (on balanced data
    the two coincide for an interior fit; a boundary fit moves them apart by a few times at most). Else
    the claim falls back to the one-sample t(S-1) test of the per-seed OLS slopes, which is valid
    whatever the fit did, and says so.

    Args:
        x: (T,) the ordered factor shared by all seeds.
        y: (S, T) values per seed.
        alternative: ``greater``, ``less`` or ``two-sided``.

    Returns:
        A :class:`SlopeTest`.
    """
    fit = fit_random_slopes(x, y, alternative)
    slopes = per_seed_slopes(x, y)
    per_seed = t_test(slopes[np.isfinite(slopes)], alternative)
    se_seed = per_seed.sd / math.sqrt(per_seed.n) if per_seed.n >= 2 else NAN
    reason = _fallback_reason(fit, se_seed, per_seed)
    if reason is None:
        return SlopeTest("mixed", None, fit.p, fit.slope, fit.ci, fit, se_seed, list(fit.warnings))
    return SlopeTest(
        method_used=f"per-seed slopes (fallback: {reason})",
        fallback_reason=reason,
        p=per_seed.p,
        effect=per_seed.mean,
        ci=per_seed.ci,
        fit=fit,
        per_seed_se=se_seed,
        warnings=[
            *fit.warnings,
            f"verdict from the per-seed slopes' t(S-1) test, not the mixed model: {reason}",
        ],
    )
