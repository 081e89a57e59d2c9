"""Run sources: what fills a run folder. Training is one source; imported runs plug in beside it.

A run's ``source`` (``RunSpec.source``, default ``train``) names the :class:`RunSource` that fills its
folder ``runs/<key>/``. Orchestration calls a source at two points only, so a new source (imported
checkpoints, an imported metric log, ...) is one class registered in :data:`SOURCES` and nothing else
changes. A source must:

* ``prepare(run, data_dir)``: make what its runs share ready once, in the main process, before any
  worker starts (generate or decode a dataset into ``data_dir``, fingerprint imported files); return a
  :class:`DataRecord` describing the data (tracking logs it; None if there is none). It may be called
  for several runs of the same data: it must be cheap the second time (use the cache).
* ``fill(run, run_dir, data_dir, progress=None, bar=False) -> dict``: leave ``run_dir`` as a finished run
  folder (``core.runfolder``: ``spectra.npz`` with ``"{epoch}/{layer}/{token_set}"`` keys,
  ``result.json`` written last with ``status: finished`` and ``n_tokens``; optionally ``scalars.json``,
  ``covariances.npz``, ``checkpoints/``) and return the ``result.json`` content, or write and return a
  ``failed`` result (``status``, ``error``, ``failed_epoch``). It runs in a worker process (arguments and
  result must pickle), must only write inside ``run_dir`` and the ``data_dir`` caches, and must be
  resumable: called again on a partial folder, it continues or starts over, and never leaves a
  half-written file (write atomically, ``core.io``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from core.hashing import digest


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

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        from runners.data import load_split, num_classes

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


SOURCES: dict[str, RunSource] = {"train": TrainingSource()}


def get_source(name: str) -> RunSource:
    return SOURCES[name]
