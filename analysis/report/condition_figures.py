"""The across-seed profile of every condition of a study in one chart over layer names, each condition in
its colour of the study's palette (``analysis.report.palette.condition_colours``).

:func:`seed_aggregate_figure` is the study-level profile the MLflow parent run holds
(``seed_aggregates/*.png``): per condition its mean over seeds with the 95% t band, the layers named on
the axis. Made through matplotlib's object API (``analysis.report.figures.new_figure``); never imports torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.observables import metric_range
from analysis.report.figures import Figure, _band, _epoch_of, _png, new_figure
from analysis.report.palette import condition_colours
from analysis.table import conditions_of


def seed_aggregate_figure(
    table: pd.DataFrame, metric: str, token_set: str, dataset: str, epoch: int | str = "last"
) -> Figure:
    """The metric by layer, one line per condition (one line in a design without conditions): the mean
    over seeds with its two-sided 95% t band (clipped to the metric's range) and each seed thin, at
    ``epoch`` (``last``: each condition's own last checkpoint, 0 in an untrained cell). The x axis names
    the layers, which MLflow's step charts of the same numbers (step = layer index) cannot.

    Args:
        table: the study's tidy table (all its conditions: the colours are :func:`condition_colours` of
            them).
    """
    name = f"seed_aggregates_{metric}_{token_set}"
    conditions = conditions_of(table)
    colours = condition_colours(conditions)
    caption = (
        f"{metric} by layer ({token_set} tokens, {dataset})"
        + (" per condition" if conditions else "")
        + ": mean over seeds and 95% t band"
    )
    sel = table[(table.metric == metric) & (table.token_set == token_set) & (table.dataset == dataset)]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{token_set} rows of {dataset} in the table")
    layer_order = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    x = np.arange(len(layer_order))
    fig, ax = new_figure(figsize=(max(6.0, 0.45 * len(layer_order)), 3.8))
    drawn: list[str] = []
    epochs: dict[str, int | None] = {}
    cells: list[str | None] = list(conditions) or [None]
    for cond in cells:
        rows = sel[sel["condition"].astype(str) == cond] if cond is not None else sel
        ep = _epoch_of(rows, epoch)
        wide = rows[rows.epoch == ep].pivot_table(index="seed", columns="layer", values="value")
        wide = wide.reindex(columns=layer_order)
        if wide.empty:
            continue
        colour = colours.get(cond, "C0") if cond is not None else "C0"
        for _, row in wide.iterrows():
            ax.plot(x, row.to_numpy(), color=colour, alpha=0.3, lw=0.7)
        mean = _band(ax, x, wide.to_numpy(dtype=float), metric_range(metric), colour, alpha=0.2)
        who = f"{cond}: " if cond is not None else ""
        label = f"{who}mean of {len(wide)} seeds, 95% t CI (epoch {ep})"
        ax.plot(x, mean, color=colour, lw=2, marker="o", ms=3, label=label)
        drawn.append(str(cond) if cond is not None else "")
        epochs[str(cond)] = ep
    ax.set_xticks(x, layer_order, rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel(metric)
    ax.set_title(f"{dataset}, {token_set} tokens", fontsize=9)
    if drawn:
        ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    plotted = {"conditions": drawn, "layers": layer_order, "epochs": epochs, "colours": colours}
    return Figure(name, caption, png=_png(fig), plotted=plotted)
