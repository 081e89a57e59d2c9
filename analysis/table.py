"""The tidy results table: the one contract between measurement and statistics.

One row per (run_key, dataset, seed, epoch, layer, token_set, metric) with its ``value``; also
``layer_index`` (depth order) and ``n_tokens`` (tokens behind the covariance, so conditions can be
compared at equal sample size). A value that is undefined (NaN: e.g. any spectral metric of a token set
with zero variance, such as the class token before the first block) gets no row. Metrics are the eigenvalue metrics of ``analysis.spectral`` (recomputed
here from saved eigenvalues) and the activation observables of ``analysis.observables`` (measured at
extraction time, read from the run's ``scalars.json``). Saved as Parquet (or CSV by extension). This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.observables import OBSERVABLES
from analysis.spectral import METRICS, TOKEN_METRICS
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.io import atomic_path
from vitstudy_core.layers import layer_order

CONDITION = "condition"  # a design with conditions: the cell's name on every row (study.schema._conditions)
# why a run did not learn (runners.objectives.learning_status), on each of its rows; "" for one that did.
# Present only where some run of the table did not learn, so tables of runs that learned keep their columns.
NOT_LEARNED = "not_learned"
COLUMNS = [
    "run_key",
    "dataset",
    "seed",
    "epoch",
    "layer",
    "layer_index",
    "token_set",
    "n_tokens",
    "metric",
    "value",
]


def rows_from_spectra(
    run_key: str,
    dataset: str,
    seed: int,
    spectra: Mapping[str, np.ndarray],
    layers: list[str],
    n_tokens: Mapping[str, int] | None = None,
    metrics: Iterable[str] | None = None,
    scalars: Mapping[str, float] | None = None,
) -> list[dict]:
    """Tidy rows for one run.

    Args:
        spectra: eigenvalues ``(D,)`` keyed ``"{epoch}/{layer}/{token_set}"``.
        layers: observation points in depth order (gives ``layer_index``).
        n_tokens: token count per ``"{layer}/{token_set}"``.
        metrics: metric names, eigenvalue metrics and/or observables (default: all).
        scalars: observables keyed ``"{epoch}/{layer}/{token_set}/{observable}"`` (``vitstudy_core.runfolder.RunFolder.read_scalars``).
    """
    order = {name: i for i, name in enumerate(layers)}
    wanted = list(metrics) if metrics is not None else [*METRICS, *OBSERVABLES, *TOKEN_METRICS]
    names = [m for m in wanted if m in METRICS]
    obs = set(wanted) & (set(OBSERVABLES) | set(TOKEN_METRICS))  # both stored in scalars.json
    rows = []

    def add(key: str, metric: str, value: float) -> None:
        if not np.isfinite(value):  # an undefined metric gets no row, never a NaN row
            return
        epoch, layer, tset = key.split("/")[:3]
        rows.append(
            {
                "run_key": run_key,
                "dataset": dataset,
                "seed": int(seed),
                "epoch": int(epoch),
                "layer": layer,
                "layer_index": order.get(layer, -1),
                "token_set": tset,
                "n_tokens": int((n_tokens or {}).get(f"{layer}/{tset}", -1)),
                "metric": metric,
                "value": float(value),
            }
        )

    for key, value in (scalars or {}).items():
        if key.split("/")[3] in obs:
            add(key, key.split("/")[3], value)
    for key, lam in spectra.items():
        for m in names:
            add(key, m, float(METRICS[m](lam)))
    return rows


def make_table(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """The tidy table from row dicts or from a frame of rows (e.g. concatenated runs), sorted.

    Rows of a design with conditions carry the column ``condition`` (the cell's name): it is kept, after
    :data:`COLUMNS`, and leads the sort; rows of runs that did not learn carry :data:`NOT_LEARNED` (kept
    last, "" on the other runs' rows); without either the table has exactly :data:`COLUMNS`.
    """
    given = rows.columns if isinstance(rows, pd.DataFrame) else {k for r in rows for k in r}
    columns = [*COLUMNS, *(c for c in (CONDITION, NOT_LEARNED) if c in given)]
    df = (
        rows.reindex(columns=columns)
        if isinstance(rows, pd.DataFrame)
        else pd.DataFrame(rows, columns=columns)
    )
    if NOT_LEARNED in columns:
        df[NOT_LEARNED] = df[NOT_LEARNED].fillna("").astype(str)
    order = ["dataset", "seed", "epoch", "token_set", "metric", "layer_index"]
    return df.sort_values([CONDITION, *order] if CONDITION in columns else order, ignore_index=True)


def save_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write atomically (temp file, then rename); ``.csv`` writes CSV, anything else Parquet.

    Raises:
        StudyError: ``path`` is a folder (the rename would fail after the table was written).
    """
    path = Path(path)
    if path.is_dir():
        raise StudyError("is a folder; expected the table's file path (.parquet or .csv)", str(path))
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        fault_point("table.write")
    return path


def load_table(path: str | Path) -> pd.DataFrame:
    """Read a tidy table (Parquet or CSV) and check its columns; one-line StudyError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise StudyError("file not found (expected a tidy results table, .parquet or .csv)", str(path))
    try:
        df = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a user-facing input error
        raise StudyError(f"cannot read table: {type(exc).__name__}: {exc}", str(path)) from None
    return check_table(df, str(path))


REQUIRED = ("dataset", "seed", "epoch", "layer", "token_set", "metric", "value")  # the rest can be derived


def check_table(df: pd.DataFrame, where: str = "table") -> pd.DataFrame:
    """A tidy table from anywhere, checked: the :data:`REQUIRED` columns present (one-line StudyError
    naming those missing), their dtypes and uniqueness (:func:`_check_columns`), and ``layer_index`` /
    ``n_tokens`` filled when absent (:func:`complete_columns`).

    Args:
        df: (N rows) at least the :data:`REQUIRED` columns; others are kept.
        where: what the error names (a file path, or ``table`` for a DataFrame).
    """
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise StudyError(
            f"missing columns {sorted(missing)}; expected at least {list(REQUIRED)} (run_key, layer_index, "
            "n_tokens and condition are optional)",
            where,
        )
    _check_columns(df, where)
    return complete_columns(df, where)


def complete_columns(df: pd.DataFrame, where: str = "table") -> pd.DataFrame:
    """Fill the two derived columns when a table lacks them.

    ``layer_index`` is the depth order of the layer names (``vitstudy_core.layers.layer_order``: patch_embed,
    pos_embed, block_01..block_NN, norm), as :func:`rows_from_spectra` writes it; ``n_tokens`` (only used
    to warn about unequal token counts) becomes -1, "unknown".

    Raises:
        StudyError: ``layer_index`` is missing and some layer name does not follow that naming.
    """
    out = df
    if "layer_index" not in df.columns:
        names = [str(n) for n in pd.unique(df["layer"])]
        order = layer_order(names)
        if order is None:
            odd = sorted(n for n in names if layer_order([n]) is None)
            raise StudyError(
                f"column 'layer_index' is missing and cannot be derived from layer names {odd[:5]} "
                "(expected patch_embed, pos_embed, block_NN, norm); add the column",
                where,
                "layer_index",
            )
        out = out.assign(layer_index=df["layer"].astype(str).map(order).astype(int))
    if "n_tokens" not in df.columns:
        out = out.assign(n_tokens=-1)
    return out


def _check_columns(df: pd.DataFrame, file: str) -> None:
    """Dtypes, finiteness and uniqueness of a loaded tidy table; one-line StudyError naming the column.

    ``seed``/``epoch`` (and ``layer_index`` when given: the claims order layers by it): integers;
    ``value``: real numbers (NaN allowed: a metric undefined for a spectrum; +-inf not);
    ``dataset``/``layer``/``token_set``/``metric`` (and ``condition``, when present): non-empty text; no
    two rows share (condition, dataset, seed, epoch, layer, token_set, metric).
    """
    for col in ("seed", "epoch", *(["layer_index"] if "layer_index" in df.columns else [])):
        v = pd.to_numeric(df[col], errors="coerce")
        if v.isna().any() or not np.isfinite(v).all() or (v != np.round(v)).any():
            raise StudyError("expected integers in every row", file, col)
    if df["value"].dtype == bool or not pd.api.types.is_numeric_dtype(df["value"]):
        raise StudyError(f"expected real numbers, got dtype {df['value'].dtype}", file, "value")
    if np.isinf(df["value"].to_numpy(dtype=float)).any():
        raise StudyError("expected finite numbers or NaN, got +-inf", file, "value")
    text = ("dataset", "layer", "token_set", "metric", *((CONDITION,) if CONDITION in df.columns else ()))
    for col in text:
        if df[col].isna().any() or not df[col].map(lambda x: isinstance(x, str) and x != "").all():
            raise StudyError("expected non-empty text in every row", file, col)
    keys = [
        *((CONDITION,) if CONDITION in df.columns else ()),
        "dataset",
        "seed",
        "epoch",
        "layer",
        "token_set",
        "metric",
    ]
    dup = df.duplicated(keys)
    if dup.any():
        row = df.loc[dup, keys].iloc[0].to_dict()
        raise StudyError(f"{int(dup.sum())} duplicated row(s), first {row}", file, "+".join(keys))


def seed_profile(
    table: pd.DataFrame,
    metric: str,
    dataset: str | None = None,
    epoch: int | str = "last",
    token_set: str = "all",
    where: str = "table",
    condition: str | None = None,
) -> pd.DataFrame:
    """A metric by layer across seeds: one row per seed, then ``mean``, ``ci_low``, ``ci_high`` (the
    two-sided 95% t interval of the mean, ``analysis.inference.t_test``, the claims' interval) and ``n``.

    Args:
        table: a tidy table (:data:`COLUMNS`, and ``condition`` in a design with conditions).
        dataset: default: the table's only dataset (with several, required).
        epoch: a checkpoint epoch, or ``last`` (the largest of this slice: 0 in an untrained cell).
        where: what errors name (a file or folder).
        condition: the design's cell (:func:`of_condition`; required when the table holds several).

    Returns:
        (S + 4, L) frame: index ``seed`` (the S seeds, then the four summary rows), columns the L layers in
        depth order; NaN where a seed has no value, and the CI where fewer than 2 seeds have one.

    Raises:
        StudyError: the table has no such metric, dataset, token set, epoch or condition, or holds several
            conditions and none is named (the error lists what it has).
    """
    from analysis.inference import t_test

    sel = _profile_rows(of_condition(table, condition, where), metric, dataset, epoch, token_set, where)
    layers = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    wide = sel.pivot_table(index="seed", columns="layer", values="value", aggfunc="mean").reindex(
        columns=layers
    )
    summary = {}
    for layer in layers:
        x = wide[layer].dropna().to_numpy(dtype=np.float64)
        t = t_test(x, "two-sided")
        summary[layer] = [t.mean, t.ci[0], t.ci[1], float(x.size)]
    rows = pd.DataFrame(summary, index=["mean", "ci_low", "ci_high", "n"], columns=layers)
    out = pd.concat([wide.astype(float), rows])
    out.index.name, out.columns.name = "seed", "layer"
    return out


def conditions_of(table: pd.DataFrame) -> list[str]:
    """The table's conditions (its ``condition`` column) in the order they first appear; [] without one."""
    if "condition" not in table.columns:
        return []
    return list(dict.fromkeys(map(str, table["condition"].dropna())))


def of_condition(table: pd.DataFrame, condition: str | None, where: str = "table") -> pd.DataFrame:
    """The rows of one condition (a design's cell); the whole table when it has at most one and none is named.

    A table of several conditions holds one row per (seed, layer, ...) in each, and their runs differ (a
    shuffled-label run is not its seed's trained run): averaging over them is never what a by-seed summary
    means, so naming none is an error.

    Raises:
        StudyError: several conditions and ``condition`` None; a name the table lacks; a name given to a
            table without conditions.
    """
    names = conditions_of(table)
    if condition is None:
        if len(names) > 1:
            raise StudyError(
                f"this study has {len(names)} conditions {names}: expected condition= one of them "
                "(rows of different conditions come from different runs and are never averaged)",
                where,
                "condition",
            )
        return table
    if not names:
        raise StudyError(
            f"expected no condition (this study's design has none), got {condition!r}", where, "condition"
        )
    if condition not in names:
        raise StudyError(f"expected condition= one of {names}, got {condition!r}", where, "condition")
    return table[table["condition"].astype(str) == condition]


def _profile_rows(
    table: pd.DataFrame, metric: str, dataset: str | None, epoch: int | str, token_set: str, where: str
) -> pd.DataFrame:
    """The rows of one (metric, dataset, epoch, token_set); one-line errors listing what the table has."""
    datasets = sorted(map(str, table["dataset"].unique()))
    if dataset is None:
        if len(datasets) != 1:
            raise StudyError(f"expected dataset= one of {datasets}", where, "dataset")
        dataset = datasets[0]
    for col, value in (("metric", metric), ("dataset", dataset), ("token_set", token_set)):
        present = sorted(map(str, table[col].unique()))
        if value not in present:
            raise StudyError(f"expected one of {present}, got {value!r}", where, col)
    sel = table[(table.metric == metric) & (table.dataset == dataset) & (table.token_set == token_set)]
    epochs = sorted(int(x) for x in sel["epoch"].unique())
    ep = epochs[-1] if epoch == "last" else epoch
    if ep not in epochs:
        raise StudyError(f"expected 'last' or one of {epochs}, got {epoch!r}", where, "epoch")
    return sel[sel.epoch == ep]
