"""Imported runs: where their files lie, and metric logs read as tidy rows.

    path = resolve(raw_path(source, "objects", seed=0), strict=True)   # a run's file or folder
    rows, mapping = read_metric_log(run, layers)                        # a table source's rows

A source's ``path`` (or ``paths[seed]``) may hold ``${ENV}``, ``{seed}`` and ``{dataset}``. A run's key holds
its source's fingerprint of the files (``runners.sources``: sha256 of their bytes), so a changed file is a
new run and an unchanged one is reused. Which checkpoint file holds which epoch is
``runners.checkpoints.files``'s. A metric log is read into the columns of ``analysis.table`` with its layer and metric names mapped
to ours (declared in the file's ``design.source``, or inferred where unambiguous). Every bad input is one
``StudyError`` naming the file and the line (or row, or key). This module never imports torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import pandas as pd

from analysis.observables import ALL_METRICS
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import TOKEN_SETS

_FIELD = "design.source.path"


# --------------------------------------------------------------------------------------------------
# Paths and fingerprints
# --------------------------------------------------------------------------------------------------
def raw_path(source: dict, dataset: str, seed: int) -> str:
    """The source's path for one run, ``{seed}`` and ``{dataset}`` filled in (``${ENV}`` not yet)."""
    raw = source["paths"][seed] if source.get("paths") else source["path"]
    return raw.replace("{seed}", str(seed)).replace("{dataset}", dataset)


@overload
def resolve(raw: str, strict: Literal[True]) -> Path: ...
@overload
def resolve(raw: str, strict: bool) -> Path | None: ...
def resolve(raw: str, strict: bool) -> Path | None:
    """Expand ``${ENV}`` and ``~``; an unset variable gives None, or a StudyError with ``strict``."""
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" not in expanded:
        return Path(expanded)
    if not strict:
        return None
    var = re.search(r"\$\{?(\w+)", expanded)
    raise StudyError(
        f"environment variable {var.group(1) if var else expanded} is not set; set it or pass "
        "--data-root source=PATH",
        raw,
        _FIELD,
    )


def table_format(source: dict, path: Path) -> str:
    """``jsonl`` or ``tidy``: the declared format, else the file's extension decides."""
    if source.get("format", "auto") != "auto":
        return source["format"]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".parquet", ".pq"):
        return "tidy"
    raise StudyError(
        f"expected a .jsonl, .csv or .parquet file (or set design.source.format), got {suffix or 'no suffix'!r}",
        str(path),
        _FIELD,
    )


# --------------------------------------------------------------------------------------------------
# Metric logs
# --------------------------------------------------------------------------------------------------
# TGO-I's observation-point names (tgo_v1/trainer.py LAYER_NAMES) -> ours; the final entry is the class
# token at the final norm's output.
_INFERRED = (
    (re.compile(r"^Layer_\d+_PatchEmbed$"), lambda m: "patch_embed"),
    (re.compile(r"^Layer_\d+_PosEmbed$"), lambda m: "pos_embed"),
    (re.compile(r"^Layer_(\d+)_Block(\d+)$"), lambda m: f"block_{int(m[1]):02d}" if m[1] == m[2] else None),
    (re.compile(r"^Layer_\d+_CLS_Final$"), lambda m: "norm/cls"),
)


def infer_layer(name: str) -> str | None:
    """Our observation point (``layer`` or ``layer/token_set``) for a file's layer name, or None."""
    if re.fullmatch(r"patch_embed|pos_embed|norm|block_\d+", name):
        return name
    for pattern, target in _INFERRED:
        m = pattern.match(name)
        if m:
            return target(m)
    return None


class _Mapping:
    """The file's names -> ours, declared or inferred; records what was inferred."""

    def __init__(self, record: dict, layers: list[str], file: str):
        self.declared_layers = record.get("layers") or {}
        self.declared_metrics = record.get("metrics") or {}
        self.layers, self.file = layers, file
        self.used_layers: dict[str, str | None] = {}
        self.used_metrics: dict[str, str | None] = {}
        self.inferred: list[str] = []

    def layer(self, name: str, where: str) -> tuple[str, str | None] | None:
        """(our layer, its token set or None: the cell's own) for a file's layer name; None: skipped."""
        if name not in self.used_layers:
            if name in self.declared_layers:
                target = self.declared_layers[name]
            else:
                target = infer_layer(name)
                if target is None or target.partition("/")[0] not in self.layers:
                    raise StudyError(
                        f"layer {name!r} is not mapped to an observation point {self.layers}; map it in "
                        "design.source.layers (null skips it)",
                        self.file,
                        where,
                    )
                self.inferred.append(name)
            taken = [n for n, t in self.used_layers.items() if t is not None and t == target]
            if taken:
                raise StudyError(
                    f"layers {taken[0]!r} and {name!r} both map to {target!r}; declare design.source.layers",
                    self.file,
                    where,
                )
            self.used_layers[name] = target
        target = self.used_layers[name]
        if target is None:
            return None
        layer, _, tset = target.partition("/")
        return layer, tset or None

    def metric(self, name: str, where: str) -> str | None:
        if name not in self.used_metrics:
            if name in self.declared_metrics:
                self.used_metrics[name] = self.declared_metrics[name]
            elif name in ALL_METRICS:
                self.used_metrics[name] = name
                self.inferred.append(name)
            else:
                raise StudyError(
                    f"metric {name!r} is not one of ours {list(ALL_METRICS)}; map it in design.source.metrics "
                    "(null skips it)",
                    self.file,
                    where,
                )
        return self.used_metrics[name]

    def as_record(self) -> dict:
        return {
            "layers": dict(self.used_layers),
            "metrics": dict(self.used_metrics),
            "inferred_layers": [n for n in self.inferred if n in self.used_layers],
            "inferred_metrics": [n for n in self.inferred if n in self.used_metrics],
        }


def _number(value: object, file: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StudyError(f"expected a number, got {value!r}", file, where)
    if not math.isfinite(value):
        raise StudyError(f"non-finite value {value!r}", file, where)
    return float(value)


def _integer(value: object, name: str, file: str, where: str) -> int:
    """A table cell that must be a whole number (``seed``, ``epoch``, ``n_tokens``): an int, an integral
    float (a CSV column with gaps is read as floats) or a numeral; else one line naming the cell."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise StudyError(f"expected an integer {name!r}, got {value!r}", file, where)


def _jsonl_cells(path: Path, seed_field: str) -> list[tuple[str, int | None, int, str, str, object]]:
    """(where, seed or None, epoch, file layer, file metric, value) of every cell of a JSON-lines log."""
    file, cells = str(path), []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            where = f"line {n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StudyError(
                    f"not UTF-8 text (byte {raw[exc.start]:#04x} at position {exc.start + 1} of the line); JSON lines are UTF-8",
                    file,
                    where,
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StudyError(f"invalid JSON ({exc.msg})", file, where) from None
            if not isinstance(obj, dict):
                raise StudyError(
                    f'expected a JSON object {{"epoch": N, "layers": {{...}}}}, got {type(obj).__name__}',
                    file,
                    where,
                )
            epoch, layers = obj.get("epoch"), obj.get("layers")
            if isinstance(epoch, bool) or not isinstance(epoch, int):
                raise StudyError(f"expected an integer 'epoch', got {epoch!r}", file, where)
            if not isinstance(layers, dict):
                raise StudyError(f"expected 'layers' as an object of layers, got {layers!r}", file, where)
            seed = obj.get(seed_field)
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise StudyError(f"expected an integer {seed_field!r}, got {seed!r}", file, where)
            for layer, metrics in layers.items():
                if not isinstance(metrics, dict):
                    raise StudyError(f"layer {layer!r}: expected an object of metrics", file, where)
                for metric, value in metrics.items():
                    cells.append((where, seed, epoch, layer, metric, value))
    return cells


def _tidy_cells(
    path: Path, token_set: str
) -> list[tuple[str, int | None, int, str, str, object, str, int, Any]]:
    """As :func:`_jsonl_cells` plus (token_set, n_tokens, dataset or None), from a tidy CSV/Parquet table."""
    file = str(path)
    try:
        df = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a user-facing input error
        raise StudyError(f"cannot read table: {type(exc).__name__}: {exc}", file) from None
    missing = [c for c in ("epoch", "layer", "metric", "value") if c not in df.columns]
    if missing:
        raise StudyError(f"missing columns {missing}; expected those of the tidy table", file)
    first = 2 if path.suffix.lower() == ".csv" else 0  # CSV: the line in the file (header is line 1)
    cells = []
    for i, row in enumerate(df.to_dict("records")):
        where = f"line {i + first}" if first else f"row {i}"
        seed = row.get("seed")
        tset = row.get("token_set", token_set)
        n_tok = row.get("n_tokens", -1)
        cells.append(
            (
                where,
                None if seed is None or pd.isna(seed) else _integer(seed, "seed", file, where),
                _integer(row["epoch"], "epoch", file, where),
                str(row["layer"]),
                str(row["metric"]),
                row["value"].item() if isinstance(row["value"], np.generic) else row["value"],
                str(tset) if tset is not None and not pd.isna(tset) else token_set,
                -1 if n_tok is None or pd.isna(n_tok) else _integer(n_tok, "n_tokens", file, where),
                row.get("dataset"),
            )
        )
    return cells


def read_metric_log(run: dict, layers: list[str]) -> tuple[pd.DataFrame, dict]:
    """A table source's rows for one run, and the name mapping used.

    Args:
        run: the run spec (``imported`` holds the resolved path, format and mapping; ``seed``; ``dataset``).
        layers: the design's observation points (a mapped layer must be one of them).

    Returns:
        (rows with the columns of ``analysis.table.COLUMNS``, ``layer_index`` -1 and ``n_tokens`` -1 where the
        log does not say; the mapping ``{"layers", "metrics", "inferred_layers"}``).

    Raises:
        StudyError: a missing or unreadable file, a line that is not an object, an unmapped layer or metric,
            a duplicate epoch, a non-finite value, or a seed or epoch the design needs that the log lacks.
    """
    rec = run["imported"]
    path = resolve(rec["path"], strict=True)
    file = str(path)
    if not path.is_file():
        raise StudyError("file not found (expected a metric log: .jsonl, .csv or .parquet)", file, _FIELD)
    cells = _run_cells(run, path)
    mapping = _Mapping(rec, layers, file)
    df = pd.DataFrame(_mapped_rows(run, cells, mapping, file))
    have = sorted({int(e) for e in df.epoch.unique()}) if len(df) else []
    wanted = run.get("checkpoints") or have
    missing = [e for e in wanted if e not in have]
    if missing:
        raise StudyError(f"epoch {missing[0]} is not in the file (it has epochs {have})", file)
    if not len(df):
        raise StudyError("no rows left after mapping (every layer or metric skipped)", file)
    return df[df.epoch.isin(wanted)].reset_index(drop=True), mapping.as_record()


def _run_cells(run: dict, path: Path) -> list[tuple]:
    """The log's cells (as :func:`_tidy_cells`) that are this run's: its seed's and its dataset's."""
    rec, seed, name, file = run["imported"], int(run["seed"]), run["dataset"]["name"], str(path)
    token_set = rec.get("token_set", "all")
    cells: list[tuple[str, int | None, int, str, str, object, str, int, Any]]
    if table_format(rec, path) == "jsonl":
        cells = [(*c, token_set, -1, None) for c in _jsonl_cells(path, rec.get("seed_field", "seed"))]
    else:
        cells = _tidy_cells(path, token_set)
    seeds_in_file = sorted({c[1] for c in cells if c[1] is not None})
    if seeds_in_file:  # the file says whose rows they are
        cells = [c for c in cells if c[1] == seed]
        if not cells:
            raise StudyError(f"seed {seed} is not in the file (it has seeds {seeds_in_file})", file)
    elif rec.get("shared"):  # one file for several seeds, and nothing in it tells them apart
        raise StudyError(
            "no seed in the file; give one file per seed ({seed} in design.source.path, or paths) or a "
            f"{rec.get('seed_field', 'seed')!r} field",
            file,
        )
    datasets_in_file = sorted({str(c[8]) for c in cells if c[8] is not None and not pd.isna(c[8])})
    if datasets_in_file:
        cells = [c for c in cells if c[8] == name]
        if not cells:
            raise StudyError(f"dataset {name!r} is not in the file (it has {datasets_in_file})", file)
    return cells


def _mapped_rows(run: dict, cells: list[tuple], mapping: _Mapping, file: str) -> list[dict]:
    """Tidy rows of the cells whose layer and metric map to ours (a skipped name drops its cells)."""
    rows, seen = [], dict[tuple, str]()
    for where, _, epoch, layer, metric, value, cell_tset, n_tok, _ in cells:
        point = mapping.layer(layer, where)
        ours = mapping.metric(metric, where)
        if point is None or ours is None:
            continue
        value = _number(value, file, f"{where}, layer {layer!r}, metric {metric!r}")
        point = (point[0], point[1] or cell_tset)  # the mapping's token set, else the cell's own
        if point[1] not in TOKEN_SETS:
            raise StudyError(
                f"unknown token set {point[1]!r}; expected one of {list(TOKEN_SETS)}", file, where
            )
        cell = (epoch, point[0], point[1], ours)
        if cell in seen:
            raise StudyError(
                f"duplicate epoch {epoch} for layer {layer!r}, metric {metric!r} (first at {seen[cell]})",
                file,
                where,
            )
        seen[cell] = where
        rows.append(
            {
                "run_key": run["key"],
                "dataset": run["dataset"]["name"],
                "seed": int(run["seed"]),
                "epoch": epoch,
                "layer": point[0],
                "layer_index": -1,
                "token_set": point[1],
                "n_tokens": n_tok,
                "metric": ours,
                "value": value,
            }
        )
    return rows
