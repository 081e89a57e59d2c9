"""The report's figures: matplotlib, headless, each returned as PNG bytes with a record of what it drew.

Figures are made through matplotlib's object API (``matplotlib.figure.Figure``, :func:`new_figure`), which
needs no backend and leaves pyplot's state alone: importing this module never switches the backend, so a
notebook that loads a study keeps its own (inline figures in Jupyter).

Every figure function takes the tidy table and plain arguments (metric, token set, datasets, epochs,
layers) that a claim kind chooses (``analysis.kinds``: each kind's ``figures``), and returns a
:class:`Figure` whose ``plotted`` says which datasets, epochs and layers were actually drawn, so tests can
check a figure against its claim. This module holds the :class:`Figure` record, the bands and the
layer-profile, epoch, effect, covariance and condition-grid figures; the figures over a sweep's knobs and
trials are in :mod:`analysis.report.knob_figures`. This module never imports torch.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure as MplFigure
from scipy import stats

from analysis.observables import metric_range
from analysis.spectral import Bounds
from vitstudy_core.fmt import unit_of
from vitstudy_core.runfolder import RunFolder

_DPI = 90  # enough to read axis labels; keeps a 15-layer study's report well under 1 MB
_CI = 0.95
_REGION_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")
# a verdict is written, in black, never told by a colour: its old green and red were a region's green and a
# condition's red (analysis.report.palette) in the same report
VERDICT_INK = "black"


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


class ReportFigure(MplFigure):
    """A matplotlib Figure holding one rendered report figure (``png``), as the Python API returns it:
    IPython shows it as the cell's value through ``_repr_png_`` (the report's exact image), with no
    backend or pyplot figure involved."""

    def __init__(self, png: bytes, **kw: Any) -> None:
        super().__init__(**kw)
        self.png = png

    def _repr_png_(self) -> bytes:
        return self.png


def new_figure(nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[MplFigure, Any]:
    """A figure and its axes, as ``pyplot.subplots`` returns them, made without pyplot: a
    ``matplotlib.figure.Figure`` needs no backend and is never registered with pyplot, so drawing a
    report figure neither switches a notebook's backend nor leaves a figure for it to show.

    Args:
        kw: ``figsize`` (and ``dpi``) go to the figure, the rest (``sharey``, ``squeeze``, ...) to
            ``Figure.subplots``.
    """
    fig_kw = {k: kw.pop(k) for k in ("figsize", "dpi") if k in kw}
    fig = MplFigure(**fig_kw)
    return fig, fig.subplots(nrows, ncols, **kw)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    if fig.canvas.manager is not None:  # a pyplot figure (optuna's draws through pyplot): released
        import matplotlib.pyplot as plt

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


def clip_band(low: np.ndarray, high: np.ndarray, bounds: Bounds) -> tuple[np.ndarray, np.ndarray]:
    """A band's (low, high), each (L,), clipped to the range its values can take (``bounds``, None: open):
    a t interval of a bounded metric over few seeds can reach past its bounds (EED% below 0)."""
    lo, hi = (-np.inf if bounds[0] is None else bounds[0]), (np.inf if bounds[1] is None else bounds[1])
    return np.clip(low, lo, hi), np.clip(high, lo, hi)


def summary_bounds(metric: str, summary: str) -> Bounds:
    """The range of a per-seed summary of ``metric`` over layers: the metric's own for ``mean``/``min``,
    ``[0, high - low]`` for ``range`` (max - min), ``[0, None]`` for ``argmin`` (a layer index)."""
    lo, hi = metric_range(metric)
    if summary == "range":
        return 0.0, (hi - lo if lo is not None and hi is not None else None)
    if summary == "argmin":
        return 0.0, None
    return lo, hi


def _band(ax, x, values: np.ndarray, bounds: Bounds, colour: Any, alpha: float = 0.25):
    """The across-seed mean of ``values`` (S, T) and its 95% t band clipped to ``bounds``; returns the mean."""
    mean, low, high = t_band(values)
    low, high = clip_band(low, high, bounds)
    ax.fill_between(x, low, high, color=colour, alpha=alpha, lw=0)
    return mean


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
    colours: dict[str, str] | None = None,
    ylim: tuple[float, float] | None = None,
) -> Figure:
    """The metric by layer at one epoch: per-seed lines, and the mean with a 95% t band per dataset.

    ``regions``: name -> layers, shaded (declared regions of a U, the layers a summary runs over, ...).
    ``colours``: the study's condition palette (``analysis.report.palette``): rows of one condition are drawn in
    its colour and named by it. ``ylim``: the y range shared by every figure of the claim.
    """
    ep = _epoch_of(table, epoch)
    name = f"profile_{metric}"
    caption = f"{metric} by layer ({token_set} tokens, epoch {ep})"
    sel = table[(table.metric == metric) & (table.token_set == token_set) & (table.epoch == ep)]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows at epoch {ep} in the table")
    layer_order = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    x = np.arange(len(layer_order))
    fig, ax = new_figure(figsize=(max(6.0, 0.45 * len(layer_order)), 3.6))
    for j, (r_name, r_layers) in enumerate((regions or {}).items()):
        idx = [layer_order.index(layer) for layer in r_layers if layer in layer_order]
        if idx:
            colour = _REGION_COLOURS[j % len(_REGION_COLOURS)]
            ax.axvspan(min(idx) - 0.4, max(idx) + 0.4, color=colour, alpha=0.12, lw=0)
            ax.text((min(idx) + max(idx)) / 2, 1.0, r_name, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color=colour)  # fmt: skip
    drawn, drawn_colours = [], {}
    conds = list(dict.fromkeys(map(str, sel["condition"]))) if "condition" in sel.columns else []
    colours = colours or {}
    cond = conds[0] if len(conds) == 1 and conds[0] in colours else None
    for i, ds in enumerate(datasets):
        wide = sel[sel.dataset == ds].pivot_table(index="seed", columns="layer", values="value")
        wide = wide.reindex(columns=layer_order)
        if wide.empty:
            continue
        drawn.append(ds)
        colour = colours[cond] if cond is not None and len(datasets) == 1 else f"C{i}"
        drawn_colours[ds] = colour
        for _, row in wide.iterrows():
            ax.plot(x, row.to_numpy(), color=colour, alpha=0.35, lw=0.8)
        mean = _band(ax, x, wide.to_numpy(), metric_range(metric), colour)
        who = f"{cond}: {ds}" if cond is not None else ds
        ax.plot(
            x,
            mean,
            color=colour,
            lw=2,
            marker="o",
            ms=3,
            label=f"{who} (mean of {len(wide)} seeds, 95% t CI)",
        )
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xticks(x, layer_order, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    if drawn:
        ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    plotted = {"datasets": drawn, "epochs": [ep], "layers": layer_order, "colours": drawn_colours}
    plotted["regions"] = {r: [x for x in layers if x in layer_order] for r, layers in (regions or {}).items()}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def epoch_figure(
    table: pd.DataFrame,
    metric: str,
    token_set: str,
    datasets: list[str],
    epochs: list[int],
    layers: list[str],
    ylim: tuple[float, float] | None = None,
) -> Figure:
    """The metric against epoch, one panel per dataset, per layer: one thin line per seed and the
    across-seed mean with its 95% t band (clipped to the metric's range), the seed being the unit the
    trend is tested over. The panels share their y axis (``ylim``: the range every figure of the claim
    shares)."""
    name = f"epochs_{metric}"
    caption = (
        f"{metric} against epoch, per layer: seeds (thin), mean and 95% t band ({token_set} tokens, "
        f"epochs {', '.join(map(str, epochs))})"
    )
    sel = table[
        (table.metric == metric)
        & (table.token_set == token_set)
        & table.epoch.isin(epochs)
        & table.layer.isin(layers)
        & table.dataset.isin(datasets)
    ]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows over epochs in the table")
    fig, axes = new_figure(1, len(datasets), figsize=(5.2 * len(datasets), 3.6), squeeze=False, sharey=True)
    cmap = matplotlib.colormaps["viridis"]
    drawn_epochs: set[int] = set()
    drawn_layers: list[str] = []
    for ax, ds in zip(axes[0], datasets, strict=True):
        rows = sel[sel.dataset == ds]
        order = rows.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
        for j, layer in enumerate(order):
            wide = rows[rows.layer == layer].pivot_table(
                index="seed", columns="epoch", values="value", aggfunc="mean"
            )
            wide = wide.sort_index(axis=1)
            x = wide.columns.to_numpy(dtype=float)
            colour = cmap(j / max(1, len(order) - 1))
            for _, seed_row in wide.iterrows():
                ax.plot(x, seed_row.to_numpy(), color=colour, alpha=0.3, lw=0.6)
            mean = _band(ax, x, wide.to_numpy(dtype=float), metric_range(metric), colour, alpha=0.15)
            ax.plot(x, mean, marker="o", ms=3, lw=1.6, color=colour, label=layer)
            drawn_epochs.update(int(e) for e in wide.columns)
            if layer not in drawn_layers:
                drawn_layers.append(layer)
        ax.set_title(f"{ds} ({rows.seed.nunique()} seeds)", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    if ylim is not None:
        axes[0][0].set_ylim(*ylim)
    axes[0][-1].legend(
        fontsize=7,
        ncol=2,
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        title="mean (95% t)",
        title_fontsize=7,
    )
    plotted = {"datasets": list(datasets), "epochs": sorted(drawn_epochs), "layers": drawn_layers}
    return Figure(name, caption, png=_png(fig), plotted=plotted)


def effect_figure(result, unit: str | None = None) -> Figure:
    """Forest plot of one claim's result (``analysis.verdicts.ClaimResult``): the effect and its 95% CI.

    ``unit``: the effect's unit as its kind states it (`` pp per unit of clutter``); default the metric's."""
    name = "effect"
    unit = unit_of(result.metric) if unit is None else unit
    unit = f" ({unit.strip()})" if unit.strip() else ""
    caption = f"effect with 95% CI{unit}"
    effect, lo, hi = (float(v) for v in (result.effect, result.ci_low, result.ci_high))
    if math.isnan(effect):
        return Figure(name, caption, missing="no effect estimate (no test was possible)")
    # the whole name, wrapped between words (never inside one), never clipped
    label = textwrap.fill(result.name, 36, break_long_words=False, break_on_hyphens=False)
    fig, ax = new_figure(figsize=(6.0, 1.0 + 0.15 * (label.count("\n") + 1)))
    colour = VERDICT_INK
    if not (math.isnan(lo) or math.isnan(hi)):
        ax.errorbar([effect], [0], xerr=[[effect - lo], [hi - effect]], fmt="o", color=colour, capsize=5)
    else:
        ax.plot([effect], [0], "o", color=colour)
    ax.axvline(0, color="black", lw=0.8, ls="--")
    ax.set_yticks([0], [label], fontsize=8)
    verdict = str(getattr(result, "label", result.verdict))
    ax.set_title(verdict, fontsize=8, loc="right", fontweight="bold")
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
        fig, axes = new_figure(
            len(rows), len(pick), figsize=(3.0 * len(pick), 2.5 * len(rows)), squeeze=False
        )
        fig.set_layout_engine("constrained")  # each colour bar's ticks kept clear of the next panel
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
                bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
                bar.ax.tick_params(labelsize=6)
                bar.ax.yaxis.get_offset_text().set_fontsize(6)
        return [Figure("covariances", f"{caption}: run {labels.get(key, key)} (key {key})", png=_png(fig))]
    return [Figure("covariances", caption, missing="every covariances.npz was unreadable (see Missing)")]


def _grid_panels(conditions: list[str], datasets: list[str]) -> list[tuple[int, int, str, str]]:
    """(row, column, condition, dataset) of each panel: a row per condition and a column per dataset, or,
    with one dataset, the conditions side by side, up to 3 a row."""
    if len(datasets) > 1:
        return [(r, c, cond, ds) for r, cond in enumerate(conditions) for c, ds in enumerate(datasets)]
    per_row = min(3, len(conditions))
    return [(i // per_row, i % per_row, cond, datasets[0]) for i, cond in enumerate(conditions)]


def conditions_grid(
    table: pd.DataFrame,
    metric: str,
    token_set: str = "all",
    colours: dict[str, str] | None = None,
    order: list[str] | None = None,
) -> Figure:
    """A design with conditions at a glance: one panel per condition (rows) x dataset (columns), the metric
    by layer at the condition's last epoch (an untrained cell's is 0): a thin line per seed, the mean with
    its 95% t band (clipped to the metric's range). Shared axes, so panels compare by eye.

    Args:
        table: a tidy table with a ``condition`` column.
        colours: the study's condition palette (default: ``analysis.report.palette.condition_colours`` of the
            table's conditions), each condition's panels in its colour.
        order: the conditions in the order the file declares them (default: the table's order); with one
            dataset the panels run side by side, up to 3 a row, not one narrow column.
    """
    from analysis.report.palette import condition_colours

    name = f"conditions_{metric}_{token_set}"
    caption = f"{metric} by layer ({token_set} tokens) per condition (rows) and dataset (columns), last epoch"
    sel = table[(table.metric == metric) & (table.token_set == token_set)]
    if sel.empty or "condition" not in sel.columns:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows with conditions in the table")
    present = list(dict.fromkeys(map(str, sel["condition"])))
    conditions = [c for c in order or [] if c in present] + [c for c in present if c not in (order or [])]
    colours = colours or condition_colours(conditions)
    datasets = list(dict.fromkeys(map(str, sel["dataset"])))
    layer_order = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    x = np.arange(len(layer_order))
    panels = _grid_panels(conditions, datasets)
    rows, cols = max(r for r, _, _, _ in panels) + 1, max(c for _, c, _, _ in panels) + 1
    fig, axes = new_figure(
        rows, cols, sharex=True, sharey=True, squeeze=False,
        figsize=(max(4.0, 0.3 * len(layer_order)) * cols, 2.4 * rows + 0.6),
    )  # fmt: skip
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    epochs = {}
    for r, c, cond, ds in panels:
        ax, part = axes[r][c], sel[(sel.condition.astype(str) == cond) & (sel.dataset.astype(str) == ds)]
        if part.empty:
            ax.set_axis_off()
            continue
        ep = int(part.epoch.max())
        epochs[cond] = ep
        wide = part[part.epoch == ep].pivot_table(index="seed", columns="layer", values="value")
        wide = wide.reindex(columns=layer_order)
        colour = colours.get(cond, "C0")
        for _, row in wide.iterrows():
            ax.plot(x, row.to_numpy(), color=colour, alpha=0.35, lw=0.7)
        mean = _band(ax, x, wide.to_numpy(dtype=float), metric_range(metric), colour)
        ax.plot(x, mean, color=colour, lw=1.8, marker="o", ms=2.5)
        ax.set_title(f"{cond} | {ds} (epoch {ep}, {len(wide)} seeds)", fontsize=8)
        if c == 0:
            ax.set_ylabel(metric, fontsize=8)
    for ax in axes.flat:
        ax.set_xticks(x, layer_order, rotation=60, ha="right", fontsize=7)
        ax.tick_params(labelbottom=True)  # shared x: every panel keeps its layer names (a wrapped row too)
    fig.tight_layout()
    plotted = {"conditions": conditions, "datasets": datasets, "layers": layer_order, "epochs": epochs}
    plotted["colours"] = {c: colours.get(c, "C0") for c in conditions}
    return Figure(name, caption, png=_png(fig), plotted=plotted)
