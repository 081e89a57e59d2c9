"""A claim's slices of the table: its rows (:func:`select`, :func:`knob_rows`), the per-seed value of a
condition (:func:`condition_values`), the seeds complete in every slice and the token counts behind them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.kinds._parts.claim import Condition
from analysis.kinds._parts.table import OneLevel, TableView
from vitstudy_core.errors import StudyError

if TYPE_CHECKING:
    import pandas as pd


def knob_levels_of(df: pd.DataFrame, knob: str, where: str) -> list[float]:
    """The knob's distinct values in a sweep's rows, ascending; fewer than 2 raise :class:`OneLevel`."""
    levels = sorted(float(v) for v in df[knob].dropna().unique())
    if len(levels) < 2:
        got = f"one level of {knob} ({levels[0]:g})" if levels else f"no level of {knob}"
        raise OneLevel(f"{got}: a slope needs at least 2", where, "over")
    return levels


def knob_rows(view: TableView, claim: Any, knob: str, where: str) -> tuple[pd.DataFrame, int]:
    """The rows of a claim over a knob: its metric and token set at its epoch, across every trial dataset.

    The table must carry the knob as a column (a sweep's table: one value per trial dataset).
    """
    view.check_one_condition(where, "subset.condition")
    table = view.table
    if knob not in table.columns:
        raise StudyError(
            f"a claim over {knob!r} needs a sweep's table, whose rows carry the knob's value "
            "(python -m study sweep FILE); this table has no such column",
            where,
            "over",
        )
    for col, value, name in (
        ("metric", claim.metric, "metric"),
        ("token_set", claim.subset.token_set, "subset.token_set"),
    ):
        if value not in view._present[col]:
            raise StudyError(f"{value!r} is not in the table (it has {view._present[col]})", where, name)
    df = table[(table.metric == claim.metric) & (table.token_set == claim.subset.token_set)]
    return view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")


def claim_view(table: pd.DataFrame | TableView, claim: Any, where: str) -> TableView:
    """The view a claim reads: the table's, or its condition's (``subset.condition``) in a design with
    conditions. Every kind's ``evaluate`` starts here."""
    return TableView.of(table).in_condition(claim.subset.condition, where, "subset.condition")


def select(table: pd.DataFrame | TableView, claim: Any, where: str) -> tuple[pd.DataFrame, int]:
    """The claim's slice of the table (subset dataset, token set, metric, epoch) and the epoch used."""
    view = TableView.of(table)
    df = view.slice(claim.metric, claim.subset.dataset, claim.subset.token_set, where)
    return view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")


def condition_values(
    view: TableView, claim: Any, cond: Condition, where: str, fld: str
) -> tuple[pd.Series, dict[str, Any]]:
    """Per-seed value of a Condition: the metric averaged over ``cond.layers`` at its epoch.

    Unset fields of ``cond`` come from ``claim.subset``. Returns (seed -> value, resolved condition).
    """
    dataset = cond.dataset or claim.subset.dataset
    token_set = cond.token_set or claim.subset.token_set
    epoch = cond.epoch if cond.epoch is not None else claim.subset.epoch
    if cond.condition is not None:  # an operand in another condition than the claim's
        view = view.in_condition(cond.condition, where, f"{fld}.condition")
    view.check_one_condition(where, f"{fld}.condition or subset.condition")
    df = view.slice(claim.metric, dataset, token_set, where, f"{fld}.")
    df, ep = view.at_epoch(df, epoch, where, f"{fld}.epoch")
    wide = view.wide(df, list(cond.layers), where, f"{fld}.layers")
    values = wide.mean(axis=1, skipna=False)
    resolved: dict[str, Any] = {
        "dataset": dataset,
        "token_set": token_set,
        "epoch": ep,
        "layers": list(cond.layers),
    }
    if view.condition is not None:
        resolved["condition"] = view.condition
    resolved["n_tokens"] = token_counts(df[df.layer.isin(cond.layers)])
    return values, resolved


def token_counts(rows: pd.DataFrame) -> list[int]:
    """The distinct token counts behind a slice's covariances (``n_tokens`` column; -1 = unknown)."""
    import pandas as pd

    if "n_tokens" not in rows:
        return []
    return sorted({int(n) for n in rows.n_tokens.unique() if pd.notna(n) and n >= 0})


def complete_seeds(frames: Sequence[pd.Series | pd.DataFrame], excluded: dict[int, str]) -> list[int]:
    """Seeds with finite values in every frame; the others are added to ``excluded`` with a reason."""
    seeds = sorted(set().union(*(set(int(s) for s in f.index) for f in frames)))
    keep = []
    for s in seeds:
        ok = all(s in f.index and np.isfinite(np.asarray(f.loc[s], dtype=np.float64)).all() for f in frames)
        if ok:
            keep.append(s)
        elif s not in excluded:
            excluded[s] = "missing or non-finite values in the claimed cells"
    return keep


def paired(
    view: TableView, claim: Any, conds: list[tuple[str, Condition]], where: str, excluded: dict[int, str]
) -> tuple[list[np.ndarray], list[int], dict[str, dict[str, Any]]]:
    """Per condition the (S,) values of the seeds complete in every condition, those seeds, and each
    resolved condition (:func:`condition_values`); incomplete seeds are added to ``excluded``."""
    series, resolved = [], {}
    for fld, cond in conds:
        s, r = condition_values(view, claim, cond, where, fld)
        series.append(s)
        resolved[fld] = r
    seeds = complete_seeds(series, excluded)
    return [s.loc[seeds].to_numpy(dtype=np.float64) for s in series], seeds, resolved
