"""The ``table`` source: an imported metric log (``runners.imported``) whose rows go to ``rows.parquet``;
no spectra, no images (its datasets may be ``external``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import field_validator

from analysis.observables import ALL_METRICS
from runners.sources.base import SOURCES, DataRecord, DesignFacts, ImportedSettings, ImportedSourceBase
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.layers import TOKEN_SETS, TokenSet, layer_names
from vitstudy_core.runfolder import RunFolder


class TableSettings(ImportedSettings):
    """An imported metric log: a tidy table (``.csv``/``.parquet``, columns of ``analysis.table``) or
    JSON lines, one object per epoch: ``{"epoch": 1, "layers": {"<layer>": {"<metric>": value}}}``.

    ``layers`` maps the file's layer names to observation points (``block_05``, or ``norm/cls`` for one token
    set; ``null`` skips a layer); ``metrics`` maps metric names (``null`` skips). Names left out are
    inferred when unambiguous (our own names; TGO-I's ``Layer_05_Block05``-style names) and reported.
    ``token_set``: the token set of a layer whose mapping names none. The seed is the file's (``{seed}`` in
    the path, or ``paths``), or each line's ``seed_field`` / the table's ``seed`` column.
    """

    kind: Literal["table"]
    format: Literal["auto", "tidy", "jsonl"] = "auto"  # auto: .jsonl/.json -> jsonl, .csv/.parquet -> tidy
    layers: dict[str, str | None] | None = None
    metrics: dict[str, str | None] | None = None
    token_set: TokenSet = "all"
    seed_field: str = "seed"

    @field_validator("layers")
    @classmethod
    def _points(cls, v: dict | None) -> dict | None:
        for name, target in (v or {}).items():
            if target is not None:
                layer, _, tset = target.partition("/")
                if tset and tset not in TOKEN_SETS:
                    raise ValueError(f"layer {name!r}: expected 'layer' or 'layer/token_set', got {target!r}")
        return v

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, v: dict | None) -> dict | None:
        for name, target in (v or {}).items():
            if target is not None and target not in ALL_METRICS:
                raise ValueError(
                    f"metric {name!r}: unknown metric {target!r}; expected one of {list(ALL_METRICS)}"
                )
        return v


class TableSource(ImportedSourceBase):
    """An imported metric log (``runners.imported``): its rows go to ``rows.parquet``, no spectra."""

    name = "table"
    settings = TableSettings
    measures_spectra = False  # metric rows only: no token counts to match, no probe to resample
    example = {"source": {"kind": "table", "path": "/logs/seed{seed}.jsonl"}}
    tag_fields = ("mapping",)

    def accepts_dataset(self, kind: str) -> bool:
        return True  # a log's rows need no images: an ``external`` dataset is a name only

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """Paths name every seed; every layer the mapping names is an observation point of the model."""
        super().check_design(settings, design)
        for name, target in (getattr(settings, "layers", None) or {}).items():
            if target is not None and target.partition("/")[0] not in design.layers:
                raise StudyError(
                    f"unknown layer {target.partition('/')[0]!r}; expected one of {list(design.layers)}",
                    None,
                    f"design.source.layers.{name}",
                )

    def default_epochs(self, trained_epochs: int) -> list[int]:
        return []  # every epoch of the log

    def fingerprint(self, settings: dict, path: Path, epochs: list[int]) -> dict:
        """sha256 of the log's bytes, and its format (the declared one, else its extension's)."""
        from runners.imported import table_format
        from vitstudy_core.hashing import file_digest

        if not path.is_file():
            return {}
        return {"format": table_format(settings, path), "fingerprint": file_digest(path)[:16]}

    def check(self, run: dict) -> None:
        from runners.imported import read_metric_log

        read_metric_log(run, layer_names(run["model"]["depth"]))

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        ds = run["dataset"]
        return DataRecord(ds["name"], ds, digest(ds, 16), {"log": run["imported"]["path"]})

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.imported import read_metric_log
        from vitstudy_core.provenance import git_state, package_versions

        rows, mapping = read_metric_log(run, layer_names(run["model"]["depth"]))
        rec = run["imported"]
        folder = RunFolder(run_dir)
        folder.path.mkdir(parents=True, exist_ok=True)
        folder.write_rows(rows)
        if progress is not None:
            inferred = mapping["inferred_layers"]
            named = ", ".join(f"{k} -> {mapping['layers'][k]}" for k in inferred) or "none"
            progress(
                f"[{run['dataset']['name']}/seed{run['seed']}] imported {len(rows)} rows from {rec['path']} "
                f"({rec.get('format')}); layer names inferred: {named}"
            )
        source = {k: rec.get(k) for k in ("kind", "path", "fingerprint", "format")}
        result = {
            "status": "finished",
            "run": run,
            "history": [],
            "n_tokens": {},
            "environment": {**package_versions(("numpy", "pandas", "pyarrow")), **git_state()},
            "source": {**source, "mapping": mapping, "epochs": sorted(int(e) for e in rows.epoch.unique())},
        }
        folder.write_result(result)
        return result


SOURCES.register("table", TableSource())
