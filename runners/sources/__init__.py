"""Run sources as plug-ins: what fills a run folder. Every module in this package (but ``base``) registers
one source in :data:`SOURCES` on import.

    from runners.sources import SOURCES, get_source
    get_source("table").fill(run, run_dir, data_dir)

A run's ``source`` (``RunSpec.source``, default ``train``) names the source that fills its folder
``runs/<key>/``. Registered: ``train`` (a timm ViT trained with the run's objective; the source of a design
without a ``source`` section), ``checkpoints`` (a seed's saved weights measured exactly as a trained run is)
``table`` (an imported metric log's rows; no spectra) and ``pretrained`` (published timm models, hub or
file, each through its own preprocessing).

Adding a source is adding one module here (plus its test): a class deriving from
:class:`~runners.sources.base.SourceBase` (or ``ImportedSourceBase`` for files on disk), registered with
``SOURCES.register("<kind>", TheSource())``. It owns everything about itself; the hypothesis schema, run planning and
tracking find it through this registry (``tests/plugins/test_source_contract.py`` checks every entry):

* ``settings``: the pydantic model of its ``design.source`` section (a ``vitstudy_core.settings.Strict``
  subclass of ``ImportedSettings`` with ``kind: Literal["<kind>"]``); None for ``train``. ``example``: the
  design keys that select it.
* ``accepts_dataset(kind)``, ``check_design(settings, DesignFacts)``: the design-level checks the schema runs
  while validating the file (raise ``StudyError(message, None, field)``: one line naming the field);
  ``default_epochs(trained_epochs)``: the epochs measured when ``design.checkpoints`` is left out.
* ``fingerprint(settings, path, epochs)``: the content fingerprint of an imported run's files (its run key
  holds it, not the path); ``tag_fields``: its ``result.json`` ``source`` keys tracking tags. Optionally
  ``record(source, dataset, seed, epochs, n_seeds)``: a run's whole imported record, for a source whose
  runs are not one path per seed (``pretrained``: one model per seed).

Orchestration then calls it at three points:

* ``check(run)``: raise a one-line ``StudyError`` for bad input (a missing folder, a checkpoint that does
  not fit the model, an unmapped name in a log, ...) before anything is recorded; called for every run
  that is not finished yet, in the main process, before the tracker opens.
* ``prepare(run, data_dir)``: make what its runs share ready once, in the main process, before any
  worker starts (generate or decode a dataset into ``data_dir``, fingerprint imported files); return a
  :class:`DataRecord` describing the data (tracking logs it; None if there is none). It may be called
  for several runs of the same data: it must be cheap the second time (use the cache).
* ``fill(run, run_dir, data_dir, progress=None, bar=False) -> dict``: leave ``run_dir`` as a finished run
  folder (``vitstudy_core.runfolder``: ``spectra.npz`` with ``"{epoch}/{layer}/{token_set}"`` keys, or
  ``rows.parquet``; ``result.json`` written last with ``status: finished`` and ``n_tokens``; optionally
  ``scalars.json``, ``covariances.npz``, ``checkpoints/``) and return the ``result.json`` content, or
  write and return a ``failed`` result (``status``, ``error``, ``failed_epoch``). It runs in a worker
  process (arguments and result must pickle), must only write inside ``run_dir`` and the ``data_dir``
  caches, and must be resumable: called again on a partial folder, it continues or starts over, and never
  leaves a half-written file (write atomically, ``vitstudy_core.io``).

Importing this package never imports torch (the schema imports it to validate hypothesis files).
"""

from __future__ import annotations

import importlib
import pkgutil

from runners.sources.base import (
    DEFAULT_SOURCE,
    SOURCES,
    DataRecord,
    DesignFacts,
    ImportedSettings,
    ImportedSourceBase,
    RunSource,
    SourceBase,
    get_source,
    imported_record,
)

__all__ = [
    "DEFAULT_SOURCE",
    "SOURCES",
    "DataRecord",
    "DesignFacts",
    "ImportedSettings",
    "ImportedSourceBase",
    "RunSource",
    "SourceBase",
    "get_source",
    "imported_record",
]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base" and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")
