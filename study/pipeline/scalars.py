"""Per-run scalars in the tidy table, for claims with ``adjust_for`` (issue 23).

A claim adjusted for a per-run scalar (``adjust_for: test_accuracy``) reads it from a column of the tidy
table named after it, on every row of the run: the value the run's training history (``result.json``)
records at the row's epoch (``analysis.kinds.base.RUN_SCALARS`` maps the name to the history key; NaN
where the history has no entry for that epoch, e.g. epoch 0 before any training, or an objective that
records none). ``run`` and ``sweep`` add the columns only when some claim asks for them, so every other
table is today's; a table given to ``analyze --table`` carries the column itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.kinds.base import RUN_SCALARS
from vitstudy_core.runfolder import RunFolder


def scalars_named(claims: Iterable) -> list[str]:
    """The per-run scalars the claims adjust for (an inner claim's too), sorted."""
    out = set()
    for c in claims:
        for one in (c, getattr(c, "claim", None)):
            if one is not None and getattr(one, "adjust_for", None):
                out.add(one.adjust_for)
    return sorted(out)


def history_by_epoch(runs_dir: Path, key: str) -> dict[int, dict]:
    """A run's training history keyed by epoch ({} when the run folder records none)."""
    history = (RunFolder(Path(runs_dir) / key).read_result() or {}).get("history") or []
    return {int(h["epoch"]): h for h in history if isinstance(h, dict) and "epoch" in h}


def with_run_scalars(table: pd.DataFrame, claims: Iterable, runs_dir: Path) -> pd.DataFrame:
    """``table`` with one column per scalar the claims adjust for (:func:`scalars_named`): per row the
    value its run's history records at the row's epoch (NaN where none). No such claim: ``table``
    itself, unchanged."""
    names = scalars_named(claims)
    if not names or table.empty or "run_key" not in table.columns:
        return table
    keys = table[["run_key", "epoch"]].drop_duplicates()
    histories = {k: history_by_epoch(runs_dir, k) for k in keys.run_key.unique() if isinstance(k, str)}
    values = {
        name: {
            (k, int(e)): _value(histories.get(k, {}).get(int(e), {}), name)
            for k, e in keys.itertuples(index=False)
        }
        for name in names
    }
    index = list(zip(table.run_key, table.epoch.astype(int), strict=True))
    return table.assign(**{name: [v.get(i, np.nan) for i in index] for name, v in values.items()})


def _value(entry: dict, name: str) -> float:
    v = entry.get(RUN_SCALARS[name])
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")
