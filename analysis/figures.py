"""The report's figures: matplotlib, headless, each returned as PNG bytes with a record of what it drew.

Every figure function takes the tidy table and plain arguments (metric, token set, datasets, epochs,
layers) that a claim kind chooses (``analysis.kinds``: each kind's ``figures``), and returns a
:class:`Figure` whose ``plotted`` says which datasets, epochs and layers were actually drawn, so tests can
check a figure against its claim. This module never imports torch.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported anywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from vitstudy_core.fmt import unit_of  # noqa: E402
from vitstudy_core.runfolder import RunFolder  # noqa: E402

_DPI = 90  # enough to read axis labels; keeps a 15-layer study's report well under 1 MB
_CI = 0.95
_REGION_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")
_VERDICT_COLOURS = {"ACCEPTED": "#2e7d32", "REJECTED": "#c62828", "INCONCLUSIVE": "#6d6d6d"}


@dataclass
class Figure:
    """One rendered figure: ``png`` bytes, or ``None`` with ``missing`` saying why.

    ``plotted``: what was drawn, ``{"datasets": [...], "epochs": [...], "layers": [...]}`` (each in the
    order drawn), read from the data that went into the lines.
    """

    name: str
    caption: str
    png: bytes | None = None
    missing: str | None = None
    plotted: dict = field(default_factory=dict)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def t_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Across-seed mean and two-sided 95% t interval per column.

    Args:
        values: (S, L) one row per seed, one column per layer (or epoch); NaN entries are ignored.

    Returns:
        (mean, low, high), each (L,): ``mean +- t_{0.975, n-1} * sd / sqrt(n)`` with ``n`` the non-NaN
        seeds of the column; low = high = mean where n < 2.
    """
    values = np.asarray(values, dtype=np.float64)
    n = np.sum(~np.isnan(values), axis=0)
    mean = np.nanmean(values, axis=0) if values.size else np.full(values.shape[1], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.nanstd(values, axis=0, ddof=1) if values.shape[0] > 1 else np.zeros_like(mean)
        q = np.where(n > 1, stats.t.ppf(0.5 + _CI / 2, np.maximum(n - 1, 1)), 0.0)
        half = np.where(n > 1, q * sd / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, mean - half, mean + half


def _epoch_of(table: pd.DataFrame, epoch) -> int | None:
    """``last`` -> the table's largest epoch; an int stays itself (None when the table has no epochs)."""
    epochs = sorted(int(e) for e in table["epoch"].unique())
    if not epochs:
        return None
    return epochs[-1] if epoch in (None, "last") else int(epoch)


def profile_figure(
    table: pd.DataFrame,
    metric: str,
    token_set: str,
    datasets: list[str],
    epoch: int | str,
    regions: dict[str, list[str]] | None = None,
) -> Figure:
    """The metric by layer at one epoch: per-seed lines, and the mean with a 95% t band per dataset.

    ``regions``: name -> layers, shaded (declared regions of a U, the layers a summary runs over, ...).
    """
    ep = _epoch_of(table, epoch)
    name = f"profile_{metric}"
    caption = f"{metric} by layer ({token_set} tokens, epoch {ep})"
    sel = table[(table.metric == metric) & (table.token_set == token_set) & (table.epoch == ep)]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows at epoch {ep} in the table")
    layer_order = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    x = np.arange(len(layer_order))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(layer_order)), 3.6))
    for j, (r_name, r_layers) in enumerate((regions or {}).items()):
        idx = [layer_order.index(layer) for layer in r_layers if layer in layer_order]
        if idx:
            colour = _REGION_COLOURS[j % len(_REGION_COLOURS)]
            ax.axvspan(min(idx) - 0.4, max(idx) + 0.4, color=colour, alpha=0.12, lw=0)
            ax.text((min(idx) + max(idx)) / 2, 1.0, r_name, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color=colour)  # fmt: skip
    drawn = []
    for i, ds in enumerate(datasets):
        wide = sel[sel.dataset == ds].pivot_table(index="seed", columns="layer", values="value")
        wide = wide.reindex(columns=layer_order)
        if wide.empty:
            continue
        drawn.append(ds)
        colour = f"C{i}"
        for _, row in wide.iterrows():
            ax.plot(x, row.to_numpy(), color=colour, alpha=0.35, lw=0.8)
        mean, low, high = t_band(wide.to_numpy())
        ax.fill_between(x, low, high, color=colour, alpha=0.25, lw=0)
        ax.plot(
            x, mean, color=colour, lw=2, marker="o", ms=3, label=f"{ds} (mean of {len(wide)} seeds, 95% t CI)"
        )
    ax.set_xticks(x, layer_order, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    if drawn:
        ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    plotted = {"datasets": drawn, "epochs": [ep], "layers": layer_order}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def epoch_figure(
    table: pd.DataFrame,
    metric: str,
    token_set: str,
    datasets: list[str],
    epochs: list[int],
    layers: list[str],
) -> Figure:
    """The metric against epoch, one line per layer (the across-seed mean), one panel per dataset."""
    name = f"epochs_{metric}"
    caption = f"{metric} against epoch, one line per layer ({token_set} tokens; mean over seeds)"
    sel = table[
        (table.metric == metric)
        & (table.token_set == token_set)
        & table.epoch.isin(epochs)
        & table.layer.isin(layers)
        & table.dataset.isin(datasets)
    ]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows over epochs in the table")
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.6), squeeze=False)
    cmap = plt.get_cmap("viridis")
    drawn_epochs: set[int] = set()
    drawn_layers: list[str] = []
    for ax, ds in zip(axes[0], datasets, strict=True):
        mean = sel[sel.dataset == ds].groupby(["layer_index", "layer", "epoch"])["value"].mean().reset_index()
        order = mean.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
        for j, layer in enumerate(order):
            m = mean[mean.layer == layer].sort_values("epoch")
            ax.plot(m.epoch, m.value, marker="o", ms=3, lw=1.2, color=cmap(j / max(1, len(order) - 1)),
                    label=layer)  # fmt: skip
            drawn_epochs.update(int(e) for e in m.epoch)
            if layer not in drawn_layers:
                drawn_layers.append(layer)
        ax.set_title(ds, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    plotted = {"datasets": list(datasets), "epochs": sorted(drawn_epochs), "layers": drawn_layers}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def effect_figure(result) -> Figure:
    """Forest plot of one claim's result (``analysis.verdicts.ClaimResult``): the effect and its 95% CI."""
    name = "effect"
    unit = unit_of(result.metric).replace(" pp", " (pp)")
    caption = f"effect with 95% CI{unit}"
    effect, lo, hi = (float(v) for v in (result.effect, result.ci_low, result.ci_high))
    if math.isnan(effect):
        return Figure(name, caption, missing="no effect estimate (no test was possible)")
    label = textwrap.fill(result.name, 36)  # the whole name, wrapped, never clipped
    fig, ax = plt.subplots(figsize=(6.0, 1.0 + 0.15 * (label.count("\n") + 1)))
    colour = _VERDICT_COLOURS.get(result.verdict, "black")
    if not (math.isnan(lo) or math.isnan(hi)):
        ax.errorbar([effect], [0], xerr=[[effect - lo], [hi - effect]], fmt="o", color=colour, capsize=5)
    else:
        ax.plot([effect], [0], "o", color=colour)
    ax.axvline(0, color="black", lw=0.8, ls="--")
    ax.set_yticks([0], [label], fontsize=8)
    ax.set_xlabel(f"{result.metric} effect{unit}")
    ax.grid(axis="x", alpha=0.3)
    return Figure(name, caption, png=_png(fig))


def covariance_figures(runs_dir: Path, run_keys: list[str], labels: dict, missing: list[str]) -> list[Figure]:
    """Heatmaps of the ``all``-token covariance at the first and last checkpoint of the first run that has
    ``covariances.npz`` (keys ``"{epoch}/{layer}"``, float32 (D, D)); up to 4 layers spread over depth."""
    caption = "covariance of the probe tokens (all), first vs last checkpoint"
    present = [k for k in run_keys if (runs_dir / k / "covariances.npz").is_file()]
    if not present:
        return [Figure("covariances", caption, missing="covariance snapshots not recorded")]
    for key in present:
        try:
            parsed = RunFolder(runs_dir / key).read_covariances()
            if not parsed:
                raise ValueError("no '{epoch}/{layer}' keys")
        except Exception as exc:  # noqa: BLE001 - a truncated npz raises many types; mark it, go on
            missing.append(
                f"run {labels.get(key, key)} (key {key}): artifact covariances.npz unreadable ({exc})"
            )
            continue
        epochs = sorted({e for e, _ in parsed})
        layers = list(dict.fromkeys(layer for _, layer in parsed))
        pick = [layers[i] for i in sorted({round(j * (len(layers) - 1) / 3) for j in range(4)})]
        rows = [epochs[0], epochs[-1]] if len(epochs) > 1 else epochs
        fig, axes = plt.subplots(
            len(rows), len(pick), figsize=(2.6 * len(pick), 2.5 * len(rows)), squeeze=False
        )
        for r, epoch in enumerate(rows):
            for c, layer in enumerate(pick):
                ax = axes[r][c]
                cov = parsed.get((epoch, layer))
                if cov is None:
                    ax.set_axis_off()
                    ax.set_title(f"{layer} @ {epoch}: absent", fontsize=7)
                    continue
                vmax = float(np.nanmax(np.abs(cov))) or 1.0
                im = ax.imshow(cov, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
                ax.set_title(f"{layer}, epoch {epoch}", fontsize=8)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        return [Figure("covariances", f"{caption}: run {labels.get(key, key)} (key {key})", png=_png(fig))]
    return [Figure("covariances", caption, missing="every covariances.npz was unreadable (see Missing)")]


def knob_figure(result, ylabel: str) -> Figure:
    """A claim over a swept knob: per-seed points and lines, the seed mean with a 95% t band, and the
    fitted trend (per-seed OLS lines, their mean and 95% t band); the trials' test accuracy (mean over
    seeds) on a second axis when the sweep recorded it (``details["accuracy"]``, same layout as the curve).

    Reads ``result.details["curve"] = {"knob", "x": (T,), "per_seed": {seed: (T,)}}``.
    """
    curve = (result.details or {}).get("curve") or {}
    knob = curve.get("knob", "knob")
    name, caption = f"knob_{knob}", f"{ylabel} against {knob}: seeds, mean (95% t band) and fitted trend"
    if not curve.get("per_seed"):
        return Figure(name, caption, missing="no per-seed curve in the claim's result")
    x = np.asarray(curve["x"], float)
    seeds = list(curve["per_seed"])
    y = np.asarray([curve["per_seed"][s] for s in seeds], float)  # (S, T)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for row in y:
        ax.plot(x, row, color="C0", alpha=0.35, lw=0.8, marker="o", ms=3)
    mean, low, high = t_band(y)
    ax.fill_between(x, low, high, color="C0", alpha=0.2, lw=0)
    ax.plot(x, mean, color="C0", lw=2, marker="o", ms=4, label=f"mean of {len(seeds)} seeds (95% t CI)")
    fits = np.array([np.polyval(np.polyfit(x, row, 1), x) for row in y]) if len(x) > 1 else y
    fmean, flow, fhigh = t_band(fits)
    ax.fill_between(x, flow, fhigh, color="C3", alpha=0.12, lw=0)
    ax.plot(
        x,
        fmean,
        color="C3",
        lw=1.5,
        ls="--",
        label=f"fitted trend, slope {result.effect:.3g} ({result.verdict})",
    )
    cross = (result.details or {}).get("crossing") or {}
    if cross.get("mean_curve") is not None and np.isfinite(cross["mean_curve"]):  # null once read back
        ax.axhline(cross["level"], color="grey", lw=0.8, ls=":")
        ax.axvline(cross["mean_curve"], color="grey", lw=0.8, ls=":")
    accuracy = (result.details or {}).get("accuracy") or {}
    if accuracy.get("per_seed"):
        acc = np.asarray(list(accuracy["per_seed"].values()), float)
        ax2 = ax.twinx()
        ax2.plot(
            np.asarray(accuracy["x"], float), np.nanmean(acc, axis=0), color="C2", lw=1.2, marker="s", ms=3
        )
        ax2.set_ylabel("test accuracy (mean over seeds)", color="C2", fontsize=8)
    ax.set_xlabel(knob)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    plotted = {"datasets": [knob], "epochs": [curve.get("epoch", "last")], "layers": [], "x": x.tolist()}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def trials_figure(trials: pd.DataFrame, knob: str, label: str) -> Figure:
    """A sweep's objective against one knob: per-seed points and lines, the seed mean with a 95% t band,
    and each trial's test accuracy (mean over seeds) on a second axis.

    ``trials``: one row per trial x seed with columns ``knob``, ``seed``, ``objective``, ``test_acc``.
    """
    name, caption = (
        f"sweep_{knob}",
        f"sweep objective ({label}) against {knob}; test accuracy on the right axis",
    )
    if trials.empty or knob not in trials:
        return Figure(name, caption, missing="no complete trial")
    obj = trials.pivot_table(index="seed", columns=knob, values="objective", aggfunc="mean").sort_index(
        axis=1
    )
    x = obj.columns.to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for _, row in obj.iterrows():
        ax.plot(x, row.to_numpy(), color="C0", alpha=0.35, lw=0.8, marker="o", ms=3)
    mean, low, high = t_band(obj.to_numpy(dtype=float))
    ax.fill_between(x, low, high, color="C0", alpha=0.2, lw=0)
    ax.plot(
        x, mean, color="C0", lw=2, marker="o", ms=4, label=f"{label}: mean of {len(obj)} seeds (95% t CI)"
    )
    if trials.test_acc.notna().any():
        acc = trials.pivot_table(index="seed", columns=knob, values="test_acc", aggfunc="mean").sort_index(
            axis=1
        )
        ax2 = ax.twinx()
        ax2.plot(
            acc.columns.to_numpy(dtype=float),
            acc.mean(axis=0).to_numpy(),
            color="C2",
            marker="s",
            ms=3,
            lw=1.2,
        )
        ax2.set_ylabel("test accuracy (mean over seeds)", color="C2", fontsize=8)
    ax.set_xlabel(knob)
    ax.set_ylabel(label)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return Figure(
        name, caption, png=_png(fig), plotted={"datasets": [knob], "epochs": ["last"], "x": x.tolist()}
    )


def optuna_figures(optuna_study) -> list[Figure]:
    """optuna's own matplotlib contour and slice plots of a search over two knobs or more.

    optuna sets ``plt.style.use("ggplot")`` globally when it draws: each plot is drawn inside
    ``rc_context``, so every later figure of the report keeps this module's colours."""
    import warnings

    from optuna.visualization import matplotlib as ovm

    out = []
    for name, plot in (("contour", ovm.plot_contour), ("slice", ovm.plot_slice)):
        try:
            with warnings.catch_warnings(), plt.rc_context():
                warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
                axes = plot(optuna_study)
            ax = np.ravel(axes)[0] if isinstance(axes, np.ndarray) else axes
            out.append(Figure(f"sweep_{name}", f"optuna {name} plot of the objective", png=_png(ax.figure)))
        except Exception as exc:  # noqa: BLE001 - a plot optuna cannot draw is listed, not fatal
            out.append(Figure(f"sweep_{name}", f"optuna {name} plot", missing=f"{type(exc).__name__}: {exc}"))
    return out
