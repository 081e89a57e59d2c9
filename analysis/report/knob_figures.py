"""The figures over a sweep's knobs: a claim's metric against one knob (:func:`knob_figure`, each seed's
points or one line per level of a grid, with the fit the claim tests and the accuracy beside it), the
trials' objective against a knob (:func:`trials_figure`) and optuna's own contour and slice plots
(:func:`optuna_figures`). Built on :mod:`analysis.report.figures` (its :class:`~analysis.report.figures.Figure` record
and bands); never imports torch.
"""

from __future__ import annotations

from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from analysis.report.figures import Figure, _band, _png, clip_band, new_figure, t_band
from analysis.spectral import Bounds
from vitstudy_core.knobs import KNOBS

_GROUP_COLOURS = ("C0", "C1", "C3", "C4", "C5", "C6")  # C2 is the accuracy axis's


def _seed_mean(values: np.ndarray) -> np.ndarray:
    """(S, T) -> (T,) mean over the finite entries of each column (NaN where none: no empty-slice warning)."""
    values = np.asarray(values, dtype=np.float64)
    n = np.isfinite(values).sum(axis=0)
    total = np.where(np.isfinite(values), values, 0.0).sum(axis=0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def other_knobs(frame: pd.DataFrame | None, knob: str, names: list[str] | None = None) -> list[str]:
    """The knobs besides ``knob`` that vary in ``frame`` (its columns named as knobs, or ``names``)."""
    if frame is None:
        return []
    names = [k for k in (names if names is not None else KNOBS) if k != knob and k in frame.columns]
    return [k for k in names if frame[k].nunique(dropna=True) > 1]


def balanced(points: pd.DataFrame, knob: str, others: list[str]) -> bool:
    """Every value of ``knob`` among the design ``points`` (one row per trial: the knobs as columns) meets
    the same combinations of the ``others`` (a full grid): only then does each value's mean average the
    same design points, so a line may join the values."""
    if not others:
        return True
    combos = {
        value: frozenset(map(tuple, rows[others].drop_duplicates().to_numpy().tolist()))
        for value, rows in points.groupby(knob)
    }
    return len(set(combos.values())) == 1


def _accuracy_axis(ax, x: np.ndarray, acc: np.ndarray, chance: np.ndarray | None, joined: bool):
    """The trials' test accuracy (mean over seeds) on a right axis fixed to [0, 1] (never zoomed in on a
    few points of noise), with each point's chance level (1 / n_classes: it moves with an n_classes
    knob); points only when the trials may not be joined. Returns the right axis."""
    ax2 = ax.twinx()
    style = {"lw": 1.2} if joined else {"ls": "none"}
    ax2.plot(
        x, acc, color="C2", marker="s", ms=3, label="test accuracy, mean over seeds (right axis)", **style
    )
    if chance is not None and np.isfinite(chance).any():
        ax2.plot(
            x,
            chance,
            color="dimgrey",
            ls=":" if joined else "none",
            marker=None if joined else "_",
            ms=12,
            lw=1.2,
            label="chance, 1 / n_classes (right axis)",
        )
    ax2.set_ylim(0.0, 1.0)
    ax2.set_ylabel("test accuracy", color="C2", fontsize=8)
    return ax2


def _legend(ax, ax2=None) -> None:
    """One legend for both axes, below the plot: inside it (``loc="best"``) a long ``adjust_for`` legend
    sat over the y tick labels and hid lines."""
    handles, labels = ax.get_legend_handles_labels()
    if ax2 is not None:
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


def _seed_points(ax, x: np.ndarray, y: np.ndarray, bounds: Bounds, joined: bool, colour: Any, label: str):
    """Per-seed curves ``y`` (S, T) over ``x`` and their mean with a 95% t band clipped to ``bounds``; as
    points with 95% t error bars, no line, when the points may not be joined."""
    ls = "-" if joined else "none"
    for row in y:
        ax.plot(x, row, color=colour, alpha=0.35, lw=0.8, ls=ls, marker="o", ms=3)
    mean, low, high = t_band(y)
    low, high = clip_band(low, high, bounds)
    if joined:
        ax.fill_between(x, low, high, color=colour, alpha=0.2, lw=0)
        ax.plot(x, mean, color=colour, lw=2, marker="o", ms=4, label=label)
    else:
        err = np.vstack([mean - low, high - mean])
        ax.errorbar(x, mean, yerr=err, fmt="D", ms=4, color=colour, capsize=3, label=label)


def _joined_caption(joined: bool, others: list[str]) -> str:
    if not others:
        return ""
    if joined:
        return f"; each value's point averages the same {', '.join(others)} levels (a full grid)"
    return f"; points only: the trials at different values also differ in {', '.join(others)}"


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """The OLS slope of one drawn line ``y`` (T,) over ``x`` (T,) (NaN with fewer than 2 finite points)."""
    ok = np.isfinite(y)
    return float(np.polyfit(x[ok], y[ok], 1)[0]) if ok.sum() >= 2 else float("nan")


def _adjusted_fits(result, x: np.ndarray, y: np.ndarray, seeds: list) -> tuple[str, np.ndarray] | None:
    """An adjusted claim's (``details.adjusted``: ``adjust_for``) fitted relation at equal covariate: per
    seed the OLS fit ``y = a + b x + c z`` evaluated at the seed's mean covariate, ``a + b x + c mean(z)``
    (slope ``b``, the per-seed coefficient the verdict tests). Returns (the covariate's name, (S', T)
    fits of the seeds whose fit is defined), or None when the claim is not adjusted or records no
    covariate per seed."""
    adjusted = (result.details or {}).get("adjusted") or {}
    covariate = {str(k): v for k, v in (adjusted.get("covariate") or {}).items()}
    if not covariate or len(x) < 3:
        return None
    out = []
    for s, row in zip(seeds, y, strict=True):
        z = np.asarray(covariate.get(str(s), []), float)
        if z.shape != x.shape or not (np.isfinite(z).all() and np.isfinite(row).all()):
            continue
        design = np.column_stack([np.ones_like(x), x, z])
        if np.linalg.matrix_rank(design) < 3:  # the covariate is a linear function of the knob: no slope
            continue
        coef = np.linalg.lstsq(design, row, rcond=None)[0]
        out.append(coef[0] + coef[1] * x + coef[2] * z.mean())
    return (str(adjusted.get("for", "the covariate")), np.asarray(out)) if out else None


def knob_figure(
    result,
    ylabel: str,
    bounds: Bounds = (None, None),
    table: pd.DataFrame | None = None,
    slope_unit: str = "",
) -> Figure:
    """A claim over a swept knob: per-seed points and lines, the seed mean with a 95% t band, and the
    fitted trend (per-seed OLS lines, their mean and 95% t band), bands clipped to ``bounds`` (the range
    of the plotted values); the trials' test accuracy (mean over seeds) on a right axis fixed to [0, 1],
    with the chance level, when the sweep recorded it (``details["accuracy"]``: ``x``, ``per_seed``, and
    ``chance`` per point).

    When another knob varies in ``table`` (the sweep's table) and the values of this one do not all meet
    the same levels of it, the curve's points are not joined (points with error bars), since a line
    would join trials that differ in the other knob. ``slope_unit``: the slope's unit (`` pp per unit
    of clutter``). Reads ``result.details["curve"] = {"knob", "x": (T,), "per_seed": {seed: (T,)}}``.

    An adjusted claim (``adjust_for``, ``details["adjusted"]``) is decided by the slope at equal covariate,
    so that relation is the trend drawn (per seed ``y = a + b x + c z`` at the seed's mean ``z``), the raw
    fit dotted beside it; each line's legend gives the slope of the line drawn.
    """
    curve = (result.details or {}).get("curve") or {}
    knob = curve.get("knob", "knob")
    others = other_knobs(table, knob)
    joined = (
        table is None or knob not in table or balanced(table[[knob, *others]].drop_duplicates(), knob, others)
    )
    name = f"knob_{knob}"
    caption = f"{ylabel} against {knob}: seeds, mean (95% t band) and fitted trend" + _joined_caption(
        joined, others
    )
    if not curve.get("per_seed"):
        return Figure(name, caption, missing="no per-seed curve in the claim's result")
    x = np.asarray(curve["x"], float)
    seeds = list(curve["per_seed"])
    y = np.asarray([curve["per_seed"][s] for s in seeds], float)  # (S, T)
    fig, ax = new_figure(figsize=(6.4, 3.8))
    _seed_points(ax, x, y, bounds, joined, "C0", f"mean of {len(seeds)} seeds (95% t CI)")
    fits = np.array([np.polyval(np.polyfit(x, row, 1), x) for row in y]) if len(x) > 1 else y
    adjusted = _adjusted_fits(result, x, y, seeds)
    if adjusted is None:
        fmean = _band(ax, x, fits, bounds, "C3", alpha=0.12)
        label = f"fitted trend, slope {result.effect:.3g}{slope_unit} ({result.verdict})"
        ax.plot(x, fmean, color="C3", lw=1.5, ls="--", label=label)
    else:  # the verdict's slope is at equal covariate: draw that relation, and the raw fit for what it is
        name, adj = adjusted
        raw = _seed_mean(fits)
        ax.plot(
            x,
            raw,
            color="0.45",
            lw=1.2,
            ls=":",
            label=f"raw fit, slope {_slope(x, raw):.3g}{slope_unit} (not adjusted)",
        )
        fmean = _band(ax, x, adj, bounds, "C3", alpha=0.12)
        label = (
            f"at equal {name} (each seed's mean), slope {_slope(x, fmean):.3g}{slope_unit} ({result.verdict})"
        )
        ax.plot(x, fmean, color="C3", lw=1.5, ls="--", label=label)
        caption += f"; the trend drawn is at equal {name} (the verdict's), the raw fit dotted"
    cross = (result.details or {}).get("crossing") or {}
    if cross.get("mean_curve") is not None and np.isfinite(cross["mean_curve"]):  # null once read back
        ax.axhline(cross["level"], color="grey", lw=0.8, ls=":")
        ax.axvline(cross["mean_curve"], color="grey", lw=0.8, ls=":")
    accuracy = (result.details or {}).get("accuracy") or {}
    ax2 = None
    if accuracy.get("per_seed"):
        acc = np.asarray(list(accuracy["per_seed"].values()), float)
        chance = np.asarray(accuracy["chance"], float) if accuracy.get("chance") else None
        ax2 = _accuracy_axis(ax, np.asarray(accuracy["x"], float), _seed_mean(acc), chance, joined)
    ax.set_xlabel(knob)
    ax.set_ylabel(ylabel)
    _legend(ax, ax2)
    ax.grid(alpha=0.3)
    plotted = {"datasets": [knob], "epochs": [curve.get("epoch", "last")], "layers": [], "x": x.tolist()}
    return Figure(name, caption, png=_png(fig), plotted={**plotted, "joined": joined, "others": others})


def _trial_means(trials: pd.DataFrame, knob: str, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Per trial its ``knob`` value and the mean of ``column`` over its seeds (NaN where none)."""
    per = trials.groupby("trial").agg(x=(knob, "first"), v=(column, "mean")).sort_values("x")
    return per.x.to_numpy(dtype=float), per.v.to_numpy(dtype=float)


def _trials_accuracy(ax, trials: pd.DataFrame, knob: str, joined: bool):
    """The right axis of the sweep figure: per point (per trial when not joined) the seeds' mean test
    accuracy and the chance level; None when no run recorded an accuracy."""
    if not trials.test_acc.notna().any():
        return None
    has_chance = "chance" in trials and trials.chance.notna().any()
    if joined:
        per = trials.groupby(knob).agg(
            acc=("test_acc", "mean"), **({"chance": ("chance", "mean")} if has_chance else {})
        )
        x = per.index.to_numpy(dtype=float)
        return _accuracy_axis(ax, x, per.acc.to_numpy(), per.chance.to_numpy() if has_chance else None, True)
    x, acc = _trial_means(trials, knob, "test_acc")
    chance = _trial_means(trials, knob, "chance")[1] if has_chance else None
    return _accuracy_axis(ax, x, acc, chance, False)


def trials_figure(
    trials: pd.DataFrame,
    knob: str,
    label: str,
    bounds: Bounds = (None, None),
    others: list[str] | None = None,
) -> Figure:
    """A sweep's objective against one knob: per-seed points and lines, the seed mean with a 95% t band
    (clipped to ``bounds``, the range of the objective), and each trial's test accuracy (mean over seeds)
    with its chance level on a right axis fixed to [0, 1].

    ``trials``: one row per trial x seed with columns ``trial``, ``knob``, ``seed``, ``objective``,
    ``test_acc`` (and ``chance``, 1 / n_classes of the trial, when known). ``others``: the sweep's other
    knobs. When one of them varies, a line never joins trials that differ in it: one line per
    combination of their values when each such group has two values of ``knob`` or more (at most 6
    groups), else points only; the caption says which.
    """
    name = f"sweep_{knob}"
    caption = f"sweep objective ({label}) against {knob}; test accuracy and chance on the right axis"
    if trials.empty or knob not in trials:
        return Figure(name, caption, missing="no complete trial")
    others = other_knobs(trials, knob, others or [])
    groups = list(trials.groupby(others)) if others else [((), trials)]
    grouped = bool(others) and len(groups) <= 6 and all(g[knob].nunique() >= 2 for _, g in groups)
    mode = "lines" if not others else ("grouped" if grouped else "points")
    caption += {
        "lines": "",
        "grouped": f"; one line per value of {', '.join(others)} (trials differing in it are not joined)",
        "points": f"; points only: the trials also differ in {', '.join(others)}, so no line joins them",
    }[mode]
    fig, ax = new_figure(figsize=(6.4, 3.8))
    if mode == "points":  # one point per trial x seed, and per trial its seeds' mean: no line
        ax.plot(trials[knob], trials.objective, "o", color="C0", alpha=0.35, ms=3)
        x, mean = _trial_means(trials, knob, "objective")
        ax.plot(x, mean, "D", color="C0", ms=4, ls="none", label=f"{label}: mean over seeds per trial")
    for i, (value, group) in enumerate(groups if mode != "points" else []):
        obj = group.pivot_table(index="seed", columns=knob, values="objective", aggfunc="mean")
        obj = obj.sort_index(axis=1)
        values = value if isinstance(value, tuple) else (value,)
        at = " at " + ", ".join(f"{k}={v:g}" for k, v in zip(others, values, strict=True)) if others else ""
        text = f"{label}{at}: mean of {len(obj)} seeds (95% t CI)"
        x, y = obj.columns.to_numpy(dtype=float), obj.to_numpy(dtype=float)
        _seed_points(ax, x, y, bounds, True, _GROUP_COLOURS[i], text)
    ax2 = _trials_accuracy(ax, trials, knob, mode == "lines")
    ax.set_xlabel(knob)
    ax.set_ylabel(label)
    _legend(ax, ax2)
    ax.grid(alpha=0.3)
    x = np.sort(trials[knob].unique().astype(float))
    plotted = {"datasets": [knob], "epochs": ["last"], "x": x.tolist(), "mode": mode, "others": others}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def optuna_figures(optuna_study) -> list[Figure]:
    """optuna's own matplotlib contour and slice plots of a search over two knobs or more.

    optuna sets ``plt.style.use("ggplot")`` globally when it draws: each plot is drawn inside
    ``rc_context``, so every later figure of the report keeps this module's colours."""
    import warnings

    from optuna.visualization import matplotlib as ovm

    out = []
    for name, plot in (("contour", ovm.plot_contour), ("slice", ovm.plot_slice)):
        try:
            with warnings.catch_warnings(), matplotlib.rc_context():
                warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
                axes = plot(optuna_study)
            ax = np.ravel(axes)[0] if isinstance(axes, np.ndarray) else axes
            out.append(Figure(f"sweep_{name}", f"optuna {name} plot of the objective", png=_png(ax.figure)))
        except Exception as exc:  # noqa: BLE001 - a plot optuna cannot draw is listed, not fatal
            out.append(Figure(f"sweep_{name}", f"optuna {name} plot", missing=f"{type(exc).__name__}: {exc}"))
    return out
