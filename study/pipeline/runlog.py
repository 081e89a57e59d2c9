"""Tracking the runs of a study: each run logged to the tracker as it ends (:func:`log_run`), and the
finished runs the tracking store lacks logged afterwards (:func:`log_missing`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from study.pipeline.tables import run_rows
from study.pipeline.triage import dataset_key
from study.runspecs import RunSpec
from vitstudy_core.hashing import file_digest
from vitstudy_core.locks import file_lock, run_lock_path
from vitstudy_core.runfolder import RESULT, RunFolder

if TYPE_CHECKING:
    from study.tracking.tracker import TrackerProtocol


def log_run(
    tracker: TrackerProtocol,
    spec: RunSpec,
    runs_dir: Path,
    layers: list[str],
    data: object = None,
    again: bool = False,
    tags: dict | None = None,
) -> bool:
    """Stage 4b: log one ended run to the tracking store as a child run, unless it is there already.

    Under the run's lock, so of two invocations that both saw the run end, one logs it. A finished run is
    logged when the store has no FINISHED child with its key (e.g. the invocation that trained it was
    killed before logging it); a failed run is logged as FAILED by the invocation that ran it. ``again``
    (``--force``: the run was retrained on purpose) logs it even when the store has it already. ``tags``:
    more tags for the child run (a sweep's trial number and knob values).

    Returns:
        True when this call logged the run.
    """
    folder = RunFolder(runs_dir / spec.key)
    with file_lock(run_lock_path(runs_dir, spec.key)):
        result = folder.read_result()
        # this folder's training: another folder's copy of the run in a shared store is not this one
        if result is None or (
            folder.is_finished()
            and not again
            and tracker.has_finished(spec.key, file_digest(folder.file(RESULT)))
        ):
            return False
        empty = pd.DataFrame(columns=["metric", "layer", "token_set", "epoch", "value"])
        rows = run_rows(spec, folder.path, layers) if folder.is_finished() else empty
        tracker.log_training_run(spec, result, rows, folder.path, data, tags=tags)
    return True


def log_missing(
    tracker: TrackerProtocol,
    specs: list[RunSpec],
    runs_dir: Path,
    layers: list[str],
    data: dict | None = None,
    tags_of: Callable[[RunSpec], dict] | None = None,
) -> list[str]:
    """Log every finished run of the plan that the tracking store lacks (:func:`log_run`); their keys.

    ``tags_of``: a run's further child-run tags (a sweep's trial and knob values)."""
    data = data or {}
    return [
        s.key
        for s in specs
        if RunFolder(runs_dir / s.key).is_finished()
        and log_run(
            tracker,
            s,
            runs_dir,
            layers,
            data.get(dataset_key(s.dataset)),
            tags=tags_of(s) if tags_of else None,
        )
    ]
