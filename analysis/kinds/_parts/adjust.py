"""Adjusted claims (``adjust_for: <per-run scalar>``): per seed, the metric's slope on the knob (or the
datasets' levels) with the covariate in the same OLS, tested across seeds with t(S-1).

A knob that also changes how well the task is learnt (test accuracy moves with it) moves the metric
through accuracy too; holding each seed's accuracy fixed in its own regression separates the two:
per seed ``y_t = a + b x_t + c z_t + e_t`` over the T points, and ``b`` is the effect of the knob at equal
accuracy. The per-seed ``b`` are independent across seeds and symmetric about the true slope under a
normal within-seed error, so their one-sample t(S-1) test holds its level even though their variances
differ between seeds (the t test stays valid for unequal variances at alpha <= 0.08: Bakirov and Szekely,
2006). The covariate is the one recorded, not a latent "learnedness": if the metric follows the latter
and accuracy measures it with error, adjustment removes only part of the confound. Not a kind: the
trend and ordering kinds call it (this module is skipped by the kind registry's import, being private).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.inference import Alternative, opposite, t_test
from analysis.kinds._parts.outcome import Outcome, Statistic, few_seeds_warning, std_effect
from analysis.kinds._parts.rejection import Estimate, contradiction
from analysis.kinds._parts.scenario import Trial
from analysis.kinds._parts.selection import complete_seeds
from vitstudy_core.errors import StudyError

if TYPE_CHECKING:
    import pandas as pd

COLLINEAR_R2 = 0.9  # a seed whose covariate explains this share of the knob's variation warns


def per_seed_adjusted_slopes(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per seed the OLS coefficient of x in ``y ~ 1 + x + z`` (Frisch-Waugh: x and y residualised on 1, z).

    Args:
        x: (T,) the knob's values (shared) or (S, T); y: (S, T) the metric; z: (S, T) the covariate.

    Returns:
        ((S,) coefficients in units of y per unit of x, NaN where x lies in the span of 1 and z, e.g. z
        a linear function of x; (S,) the R^2 of x on (1, z) per seed).
    """
    y, z = np.asarray(y, float), np.asarray(z, float)
    x = np.broadcast_to(np.asarray(x, float), y.shape)
    xc, yc, zc = (v - v.mean(axis=1, keepdims=True) for v in (x, y, z))
    zz = (zc**2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        gx = np.where(zz > 0, (xc * zc).sum(axis=1) / zz, 0.0)  # x on z (z constant: nothing to remove)
        gy = np.where(zz > 0, (yc * zc).sum(axis=1) / zz, 0.0)
        xr, yr = xc - gx[:, None] * zc, yc - gy[:, None] * zc
        sxx = (xr**2).sum(axis=1)
        total = (xc**2).sum(axis=1)
        ok = sxx > 1e-12 * np.maximum(total, 1e-300)
        b = np.where(ok, (xr * yr).sum(axis=1) / np.where(ok, sxx, 1.0), np.nan)
        r2 = np.where(total > 0, 1 - sxx / total, np.nan)
    return b, r2


def adjusted_statistics(x: np.ndarray, y: np.ndarray, z: np.ndarray, direction: str) -> Statistic:
    """The adjusted slope test: :func:`per_seed_adjusted_slopes`, one-sided t(S-1) in ``direction``.

    Args:
        x: (T,); y, z: (S, T) (seeds with NaN anywhere must be dropped before).
        direction: ``increasing`` or ``decreasing``.

    Returns:
        A :class:`Statistic` over the seeds whose coefficient is defined: ``effect`` = mean coefficient
        (metric units per unit of x, at equal covariate), ``ci`` (95% t), ``values`` (S,), ``p_against``
        and ``contradicted`` (the other side below 2.5%), warnings for a near-collinear knob and covariate.
    """
    b, r2 = per_seed_adjusted_slopes(x, y, z)
    alt: Alternative = "greater" if direction == "increasing" else "less"
    vals = b[np.isfinite(b)]
    t = t_test(vals, alt)
    against = t_test(vals, opposite(alt)).p
    warnings = few_seeds_warning(vals.size, t.p)
    if vals.size < b.size:
        warnings.append(
            f"{b.size - vals.size} seed(s) dropped: their covariate is a linear function of the knob"
        )
    if np.nanmax(r2, initial=0.0) > COLLINEAR_R2:
        warnings.append(
            f"the covariate explains up to {np.nanmax(r2):.0%} of the knob's variation within a seed: "
            "the adjusted slope rests on what is left and is imprecise"
        )
    return Statistic(
        p=t.p,
        effect=t.mean,
        ci=t.ci,
        contradicted=vals.size >= 2 and contradiction([against], "every"),
        std_effect=std_effect(t, 1.0 if direction == "increasing" else -1.0),
        values=vals,
        warnings=warnings,
        p_against=[against],
    )


def covariate_column(df: pd.DataFrame, name: str, where: str) -> None:
    """One-line error when the table has no column ``name``, or no value of it in these rows."""
    import pandas as pd

    if name not in df.columns:
        raise StudyError(
            f"the table has no column {name!r}: the runs record no such per-run scalar here (run and sweep "
            "put it in the table when a claim asks for it; a table given to analyze --table must carry it)",
            where,
            "adjust_for",
        )
    if not np.isfinite(pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)).any():
        raise StudyError(
            f"no run records {name!r} at the claim's epoch (the objective records none: supervised records "
            "test_accuracy, dino knn_accuracy)",
            where,
            "adjust_for",
        )


def adjusted_outcome(
    out: Outcome, name: str, x: np.ndarray, y: pd.DataFrame, z: pd.DataFrame, direction: str
) -> Outcome:
    """The claim's Outcome decided by the adjusted slope instead of the raw one; the raw effect, CI and p
    stay in ``details.adjusted.raw`` beside the adjusted ones.

    Args:
        out: the raw Outcome; name: the covariate; x: (T,); y, z: (seed x T) frames (the raw test's seeds).
    """
    excluded = dict(out.seeds_excluded)
    seeds = complete_seeds([y, z], excluded)
    stat = adjusted_statistics(x, y.loc[seeds].to_numpy(float), z.loc[seeds].to_numpy(float), direction)
    b, _ = per_seed_adjusted_slopes(x, y.loc[seeds].to_numpy(float), z.loc[seeds].to_numpy(float))
    used = [s for s, v in zip(seeds, b, strict=True) if math.isfinite(v)]
    for s in sorted(set(seeds) - set(used)):
        excluded[s] = f"its {name} is a linear function of the knob: no slope at equal {name}"
    sign = 1.0 if direction == "increasing" else -1.0
    raw: dict[str, Any] = {"effect": out.effect, "ci": list(out.ci), "p": out.p_value}
    out.details["adjusted"] = {
        "for": name,
        "raw": raw,
        "adjusted": {"effect": stat.effect, "ci": list(stat.ci), "p": stat.p},
        "per_seed": dict(zip(used, map(float, stat.values), strict=True)),
        "covariate": {int(s): [float(v) for v in z.loc[s]] for s in seeds},
    }
    before = out.details.get("method_used") or "per-seed slopes"
    out.details["method_used"] = f"per-seed OLS slope with {name} in the same regression (raw: {before})"
    out.p_value, out.effect, out.ci = stat.p, stat.effect, (stat.ci[0], stat.ci[1])
    out.contradicted, out.std_effect = bool(stat.contradicted), stat.std_effect
    out.seeds_used, out.seeds_excluded = used, excluded
    out.effect_values = np.asarray(stat.values, float).tolist()
    out.estimates = [Estimate.of(t_test(np.asarray(stat.values)))] if len(used) >= 2 else []
    out.p_against = stat.p_against[0]
    out.seed_effects = dict(zip(used, map(float, sign * stat.values), strict=True))
    out.labellings_per_seed, out.needs, out.holm_contrasts = 0, "every", 1
    out.warnings += [f"adjusted for {name}: {w}" for w in stat.warnings]
    return out


def group_covariate(rows: dict[Any, pd.DataFrame], name: str, where: str) -> pd.DataFrame:
    """(seed x group) the covariate's mean over each group's rows (a dataset's, or a knob value's across
    the trials that share it), groups in the given order; one-line error when the table lacks it."""
    import pandas as pd

    for df in rows.values():
        covariate_column(df, name, where)
    cols = {g: pd.to_numeric(df[name], errors="coerce").groupby(df["seed"]).mean() for g, df in rows.items()}
    return pd.DataFrame(cols).reindex(columns=list(rows))


# --------------------------------------------------------------------------------------------------
# Calibration: a knob that moves accuracy, and a metric that follows accuracy only
# --------------------------------------------------------------------------------------------------
KNOB = np.linspace(0.0, 1.0, 5)  # the knob's levels (as a sweep's grid)


def draw_confounded(
    n_seeds: int, effect: float, rng: np.random.Generator
) -> tuple[tuple[np.ndarray, ...], float]:
    """(y (S, T), z (S, T)) over KNOB: per seed accuracy z falls with the knob (slope -0.3 per unit, seed
    SD 0.1, noise SD 0.03) and the metric y = 40 z - ``effect`` * 3 x + seed offset + noise (SD 1): at
    ``effect`` 0 the metric depends on accuracy only (its raw slope on the knob is -12 per unit, a
    "decreasing" trend that is all accuracy). The truth is the knob's slope at equal accuracy,
    -3 * ``effect`` (claimed: decreasing)."""
    s, t = n_seeds, KNOB.size
    z = 0.7 + rng.normal(0, 0.1, (s, 1)) + rng.normal(-0.3, 0.1, (s, 1)) * KNOB + rng.normal(0, 0.03, (s, t))
    y = 40.0 * z - 3.0 * effect * KNOB + rng.normal(0, 3.0, (s, 1)) + rng.normal(0, 1.0, (s, t))
    return (y, z), -3.0 * effect


def adjusted_trial(
    direction: str = "decreasing",
) -> Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial]:
    def test(arrays: tuple[np.ndarray, ...], truth: Any, rng: np.random.Generator) -> Trial:
        st = adjusted_statistics(KNOB, arrays[0], arrays[1], direction)
        return {"p": st.p, "covered": bool(st.ci[0] <= truth <= st.ci[1]), "warned": False,
                "contradicted": bool(st.contradicted)}  # fmt: skip

    return test
