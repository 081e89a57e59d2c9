"""Run sources: what fills a run folder. Training is one source; imported runs plug in beside it.

A run's ``source`` (``RunSpec.source``, default ``train``) names the :class:`RunSource` that fills its
folder ``runs/<key>/``. Orchestration calls a source at three points only, so a new source is one class
registered in :data:`SOURCES` and nothing else changes. Registered: ``train`` (a timm ViT trained with
the run's objective), ``checkpoints`` (a seed's saved weights measured exactly as a trained run is) and
``table`` (an imported metric log's rows; no spectra). A source must:

* ``check(run)``: raise a one-line ``StudyError`` for bad input (a missing folder, a checkpoint that does
  not fit the model, an unmapped name in a log, ...) before anything is recorded; called for every run
  that is not finished yet, in the main process, before the tracker opens.

* ``prepare(run, data_dir)``: make what its runs share ready once, in the main process, before any
  worker starts (generate or decode a dataset into ``data_dir``, fingerprint imported files); return a
  :class:`DataRecord` describing the data (tracking logs it; None if there is none). It may be called
  for several runs of the same data: it must be cheap the second time (use the cache).
* ``fill(run, run_dir, data_dir, progress=None, bar=False) -> dict``: leave ``run_dir`` as a finished run
  folder (``vitstudy_core.runfolder``: ``spectra.npz`` with ``"{epoch}/{layer}/{token_set}"`` keys,
  ``result.json`` written last with ``status: finished`` and ``n_tokens``; optionally ``scalars.json``,
  ``covariances.npz``, ``checkpoints/``) and return the ``result.json`` content, or write and return a
  ``failed`` result (``status``, ``error``, ``failed_epoch``). It runs in a worker process (arguments and
  result must pickle), must only write inside ``run_dir`` and the ``data_dir`` caches, and must be
  resumable: called again on a partial folder, it continues or starts over, and never leaves a
  half-written file (write atomically, ``vitstudy_core.io``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from vitstudy_core.hashing import digest
from vitstudy_core.layers import layer_names
from vitstudy_core.runfolder import RunFolder


@dataclass(frozen=True)
class DataRecord:
    """What a source tells tracking about the data a run uses.

    Attributes:
        name: the dataset's name in the hypothesis file.
        spec: the dataset spec (as in the run spec).
        digest: 16 hex digits identifying the data (the spec's hash; the images are a function of it).
        profile: sizes and shapes, e.g. ``{"train": [N, H, W, 3], "test": [...], "probe": [...],
            "n_classes": K}``.
    """

    name: str
    spec: dict
    digest: str
    profile: dict = field(default_factory=dict)


class RunSource(Protocol):
    name: str

    def check(self, run: dict) -> None:
        """Raise StudyError for bad input before anything is recorded (see the module docstring)."""
        ...

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord | None:
        """Make the run's shared inputs ready (see the module docstring)."""
        ...

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        """Fill ``run_dir`` as a finished (or failed) run folder; return its ``result.json`` content."""
        ...


class TrainingSource:
    """Train a timm ViT with the run's objective and measure its spectra (``runners.train``)."""

    name = "train"

    def check(self, run: dict) -> None:
        from runners.datasets import check_dataset_folder

        check_dataset_folder(run["dataset"])

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        from runners.datasets import load_split, num_classes

        ds = run["dataset"]
        shapes = {split: list(load_split(ds, split, data_dir)[0].shape) for split in ("train", "test")}
        probe = load_split(ds, "probe", data_dir, run["probe"]["size"], run["probe"]["seed"])[0]
        profile = {**shapes, "probe": list(probe.shape), "n_classes": int(num_classes(ds))}
        return DataRecord(ds["name"], ds, digest(ds, 16), profile)

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.train import train_run

        return train_run(run, run_dir, data_dir, progress=progress, bar=bar)


class CheckpointSource:
    """Saved checkpoints of the design's timm ViT, one folder per seed (``runners.checkpoints``)."""

    name = "checkpoints"

    def check(self, run: dict) -> None:
        from runners.checkpoints import check_checkpoints
        from runners.datasets import check_dataset_folder

        check_dataset_folder(run["dataset"])
        check_checkpoints(run)

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        from runners.datasets import load_split

        ds, probe = run["dataset"], run["probe"]
        shape = list(load_split(ds, "probe", data_dir, probe["size"], probe["seed"])[0].shape)
        return DataRecord(ds["name"], ds, digest(ds, 16), {"probe": shape})

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.checkpoints import import_checkpoints

        return import_checkpoints(run, run_dir, data_dir, progress=progress)


class TableSource:
    """An imported metric log (``runners.imported``): its rows go to ``rows.parquet``, no spectra."""

    name = "table"

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


SOURCES: dict[str, RunSource] = {
    "train": TrainingSource(),
    "checkpoints": CheckpointSource(),
    "table": TableSource(),
}


def get_source(name: str) -> RunSource:
    return SOURCES[name]
