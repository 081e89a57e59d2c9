"""Triage, the stages before anything runs: plan a hypothesis's runs, check their inputs, split them into
finished, stored elsewhere and still to train (:class:`study.pipeline.triage_state.Triage`), fetch the stored ones and clear the
folders of those to train.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from study.pipeline.triage_state import Triage
from study.runspecs import RunSpec, plan_runs
from study.schema import Hypothesis
from vitstudy_core.hashing import canonical_json
from vitstudy_core.locks import file_lock, run_lock_path
from vitstudy_core.runfolder import RESULT, RunFolder

if TYPE_CHECKING:
    from study.tracking.reuse import StoredRun
    from study.tracking.tracker import TrackerProtocol

Log = Callable[[str], None]


def plan(
    hyp: Hypothesis, data_dir: Path | None = None, record: bool = False, log: Log | None = None
) -> list[RunSpec]:
    """Stage 1: the runs a hypothesis needs (``study.runspecs``).

    Args:
        data_dir: the output folder's ``data/``: on-disk datasets are keyed by the fingerprint recorded
            there when their folder is not on this host (``table`` on an analysis host).
        record: key each on-disk dataset by its folder's own fingerprint (``run``, with the data present;
            :func:`record_fingerprints` writes them there once the inputs are checked), and ``log`` a line
            when a folder's content changed since it was recorded (its runs get new keys).
    """
    from runners.datasets import fingerprint_record_key, recorded_fingerprints

    before = recorded_fingerprints(data_dir) if record and data_dir is not None else {}
    # with record, the folders' own fingerprints, written nowhere yet: bad data must leave no file behind
    specs = plan_runs(hyp, None if record else data_dir, record=record)
    for s in {s.dataset["name"]: s for s in specs if "path" in s.dataset}.values():
        old = before.get(fingerprint_record_key(s.dataset), {}).get("fingerprint")
        if old and old != s.dataset["fingerprint"] and log is not None:
            log(
                f"data {s.dataset['name']}: the folder's content changed since it was recorded "
                f"(fingerprint {old} -> {s.dataset['fingerprint']}): its runs get new keys"
            )
    return specs


def record_fingerprints(specs: list[RunSpec], data_dir: Path) -> None:
    """Stage 1c: record each on-disk dataset's fingerprint in ``data_dir/fingerprints.json`` (after
    :func:`check_inputs`: a refused study writes nothing), for hosts without the data."""
    from runners.datasets import resolve_fingerprint

    for dataset in {dataset_key(s.dataset): s.dataset for s in specs if "path" in s.dataset}.values():
        resolve_fingerprint(dataset, data_dir, record=True)


def check_inputs(specs: list[RunSpec], runs_dir: Path, force: bool = False) -> None:
    """Stage 1b: each run's source checks its inputs (``RunSource.check``): bad input stops the study with
    one line before anything is written or recorded. Runs finished here (and not forced) are skipped: they
    were checked when filled, and their key holds their inputs' fingerprint."""
    from runners.sources import get_source
    from runners.sources.base import declares

    checked: set[str] = set()
    for spec in specs:
        run = spec.model_dump()
        # a training run checks its dataset folder, which its seeds share: once per dataset
        token = dataset_key(spec.dataset) if declares(spec.source, "trains") else spec.key
        if token in checked or (not force and RunFolder(runs_dir / spec.key).is_finished()):
            continue
        checked.add(token)
        get_source(spec.source).check(run)


def triage(
    specs: list[RunSpec], runs_dir: Path, stored: dict[str, StoredRun] | None = None, force: bool = False
) -> Triage:
    """Stage 2: which runs are finished here, finished in the tracking store, or to do. Touches nothing.

    A folder that says finished but cannot be read (a truncated ``spectra.npz``, ...) is not finished: the
    store's copy replaces it, or, without one, that run alone is retrained (``Triage.damaged``).

    Args:
        stored: run key -> finished MLflow run (``Tracker.finished_runs``); ignored with ``force``.
        force: every run is to do.
    """
    out = Triage()
    for spec in specs:
        if stored is not None and spec.key in stored:
            out.logged[spec.key] = stored[spec.key].info.run_id
        folder = RunFolder(runs_dir / spec.key)
        # an ended run's files are read in full once here (a truncated zip passes the finished test)
        why = folder.damage() if not force and folder.file(RESULT).exists() else None
        if why is not None:
            out.damaged[spec.key] = why
        if not force and why is None and folder.is_finished():
            out.finished.append(spec.key)
        elif not force and stored is not None and spec.key in stored:
            out.stored[spec.key] = stored[spec.key]
        else:
            out.todo.append(spec)
    return out


def fetch_stored(tri: Triage, specs: list[RunSpec], runs_dir: Path, tracker: TrackerProtocol) -> None:
    """Stage 2b: download each stored run into its folder (replacing a partial local attempt or a damaged
    folder; ``StoredRuns.fetch_run`` checks the copy reads in full)."""
    by_key = {s.key: s for s in specs}
    for key, run in tri.stored.items():
        run_dir = runs_dir / key
        if run_dir.exists():
            shutil.rmtree(run_dir)
        tracker.fetch_run(run, by_key[key], run_dir)


def clear_for_training(todo: list[RunSpec], runs_dir: Path, force: bool = False) -> None:
    """Remove what must not be resumed: an ended (failed) attempt, or everything with ``force``.

    A folder without ``result.json`` is an interrupted run: it is kept and resumes. A finished folder that
    cannot be read (``RunFolder.damage``) is removed and retrained. Each run is cleared under its lock; a
    run another invocation finished since :func:`triage` is kept (unless ``force``).
    """
    for spec in todo:
        folder = RunFolder(runs_dir / spec.key)
        if not folder.path.exists():
            continue
        with file_lock(run_lock_path(runs_dir, spec.key)):
            result = folder.read_result()
            ended = result is not None and (not folder.is_finished() or folder.damage() is not None)
            if force or ended or (result is None and folder.file(RESULT).exists()):
                shutil.rmtree(folder.path)


def dataset_key(dataset: dict) -> str:
    """The key of a dataset spec in :func:`prepare_data`'s records."""
    return canonical_json(dataset)
