"""The stages of a study, each a function from one artifact to the next, callable on its own.

    plan -> check inputs -> triage -> (fetch stored) -> prepare data -> execute -> collect table
      -> evaluate -> write

:func:`fill_runs` is the look-filling chain (triage -> fetch -> clear -> prepare -> execute, each run logged
to the tracker as it ends, then the finished runs the store lacks): ``study.orchestrate.run_study`` calls it
per look of ``python -m study run`` and ``study.sweep`` per batch of trials, so both triage, log and catch
up alike. :func:`write_outputs` writes both's result folders. The ``table`` verb calls
:func:`collect_table` alone. Output folder layout::

    data/                      dataset caches (generated or decoded once)
    runs/<run key>/            one run folder per run (``vitstudy_core.runfolder``; result.json marks it finished)
    studies/<name>/            table.parquet, verdicts.json, verdicts.txt, hypothesis.yaml, report.*
    sweeps/<name>/             the same, and trials.csv and the optuna journal (``study.sweep``)
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pandas as pd

from analysis.table import make_table, rows_from_spectra, save_table
from analysis.verdicts import ClaimResult, evaluate_claims, format_verdicts
from study.runspecs import RunSpec, plan_runs
from study.schema import Hypothesis
from study.stopping import stopped_while_filling
from vitstudy_core.errors import Interrupted, StudyError, machine_fault
from vitstudy_core.hashing import canonical_json, file_digest
from vitstudy_core.io import atomic_write_json, atomic_write_text
from vitstudy_core.locks import file_lock, run_lock_path
from vitstudy_core.runfolder import RESULT, ROWS, SCALARS, SPECTRA, RunFolder

if TYPE_CHECKING:
    from study.tracking import TrackerProtocol

Log = Callable[[str], None]


@dataclass
class Triage:
    """The plan split by what must happen to each run.

    Attributes:
        finished: keys whose run folder here holds a finished run (reused as is).
        stored: key -> finished MLflow run in the tracking store, absent or damaged here (downloaded, then
            reused).
        todo: runs to fill (train), in plan order.
        damaged: key -> why, for each run whose folder says finished but cannot be read
            (``RunFolder.damage``): it is in ``stored`` when the store holds a copy, else in ``todo``.
    """

    finished: list[str] = field(default_factory=list)
    stored: dict[str, object] = field(default_factory=dict)
    todo: list[RunSpec] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)

    @property
    def reused_from(self) -> dict[str, str]:
        """key -> ``local`` or ``mlflow:<run id>`` for every reused run."""
        out = {k: "local" for k in self.finished}
        out.update({k: f"mlflow:{r.info.run_id}" for k, r in self.stored.items()})
        return out


@dataclass
class Collected:
    """The tidy table of a plan's finished runs, and what kept the others out of it."""

    table: pd.DataFrame
    rows: dict[str, pd.DataFrame]  # key -> that run's rows
    failed_seeds: dict[str, dict[int, str]]  # dataset -> seed -> reason
    missing: list[RunSpec]


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

    checked: set[str] = set()
    for spec in specs:
        run = spec.model_dump()
        # a training run checks its dataset folder, which its seeds share: once per dataset
        token = dataset_key(spec.dataset) if spec.source == "train" else spec.key
        if token in checked or (not force and RunFolder(runs_dir / spec.key).is_finished()):
            continue
        checked.add(token)
        get_source(spec.source).check(run)


def triage(
    specs: list[RunSpec], runs_dir: Path, stored: dict[str, object] | None = None, force: bool = False
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
        folder = RunFolder(runs_dir / spec.key)
        # an ended run's files are read in full once here (a truncated zip passes the finished test)
        why = folder.damage() if not force and folder.file(RESULT).exists() else None
        if why is not None:
            out.damaged[spec.key] = why
        if not force and why is None and folder.is_finished():
            out.finished.append(spec.key)
        elif not force and spec.key in (stored or {}):
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


def prepare_data(todo: list[RunSpec], data_dir: Path, log: Log = print) -> dict[str, object]:
    """Stage 3: each distinct dataset of the runs to do made ready once, here, so workers only read caches.

    Returns:
        :func:`dataset_key` of the dataset spec -> the source's ``DataRecord`` (what tracking logs).
    """
    from runners.sources import get_source

    records: dict[str, object] = {}
    for spec in todo:
        ds_key = dataset_key(spec.dataset)
        if ds_key in records:
            continue
        t0 = time.perf_counter()
        records[ds_key] = get_source(spec.source).prepare(spec.model_dump(), data_dir)
        log(f"data {spec.dataset['name']}: ready ({time.perf_counter() - t0:.1f}s)")
    return records


@dataclass(frozen=True)
class Placement:
    """Where runs execute and where their claims live (``--executor``, ``--address``, ``--leases``).

    Attributes:
        executor: a name in ``runners.executors.EXECUTORS`` (``local``: processes on this host; ``ray``:
            tasks on a Ray cluster); an unknown one is a one-line ``StudyError`` listing them.
        address: the Ray cluster (``auto``: the one this host belongs to).
        cpus_per_run, gpus_per_run: what each Ray task requests.
        leases: the lease store (``runners.leases``): a database URL shared by every worker, or a folder;
            None: the folder ``<out>/leases``.
    """

    executor: str = "local"
    address: str = "auto"
    cpus_per_run: float = 1
    gpus_per_run: float = 0
    leases: str | None = None

    def __post_init__(self) -> None:
        from runners.executors import EXECUTORS

        EXECUTORS.get(self.executor)

    def lease_store(self, runs_dir: Path) -> str:
        return self.leases or str((Path(runs_dir).parent / "leases").resolve())


@dataclass(frozen=True)
class RunOptions:
    """How ``run`` and ``sweep`` fill runs and what they record, from their flags (built once by the CLI).

    Attributes:
        workers: parallel training processes (``auto``: one per CPU core).
        force: retrain every run even when a finished one exists (``--force``).
        track: log to MLflow (off: ``--no-mlflow``).
        log_model: log weight files of newly trained runs (``--log-model``; ~88 MB per ViT-S seed).
        report: write ``report.html``/``report.md`` (off: ``--no-report``).
        command: the command line that started this, recorded in MLflow and the report.
        placement: executor and lease store of the runs.
        progress: told how many runs each look (or batch) trains and as each ends (a progress bar:
            ``study.api.run``'s); None: only the log lines (the CLI).
        new_registration: start the study's registration afresh for this reason (``--new-registration``),
            once every input check has passed (a refused run leaves the registration as it was).
    """

    workers: int | str = "auto"
    force: bool = False
    track: bool = True
    log_model: bool = False
    report: bool = True
    command: str | None = None
    placement: Placement = Placement()
    progress: Progress | None = None
    new_registration: str | None = None


class Progress(Protocol):
    """Where :func:`fill_runs` reports training progress (``RunOptions.progress``)."""

    def start(self, heading: str, total: int) -> None:
        """``total`` runs are about to train under ``heading`` (a look's or a batch's triage line)."""

    def advance(self, label: str) -> None:
        """The run ``label`` ended (finished or failed)."""

    def close(self) -> None:
        """The look's (or batch's) runs have all ended."""


@dataclass
class Filled:
    """A set of planned runs after :func:`fill_runs`: how each was triaged and which failed.

    Attributes:
        specs: the planned runs, in plan order.
        tri: finished here / fetched from the store / trained.
        failed: key -> reason, for every run that failed.
        data: :func:`dataset_key` -> the prepared dataset's record (what tracking logs).
    """

    specs: list[RunSpec] = field(default_factory=list)
    tri: Triage = field(default_factory=Triage)
    failed: dict[str, str] = field(default_factory=dict)
    data: dict[str, object] = field(default_factory=dict)

    def merge(self, other: Filled) -> None:
        """Add a later look's (or batch's) runs: the union of the plans, in order."""
        known = {s.key for s in self.specs}
        self.specs += [s for s in other.specs if s.key not in known]
        self.tri.finished += other.tri.finished
        self.tri.stored.update(other.tri.stored)
        self.tri.todo += other.tri.todo
        self.failed.update(other.failed)
        self.data.update(other.data)

    def accounting(self) -> dict:
        """``verdicts.json``'s run fields: runs, labels, reused, reused_from, failed."""
        reused = self.tri.reused_from
        return {
            "runs": [s.key for s in self.specs],
            "labels": {s.key: s.label for s in self.specs},
            "reused": [s.key for s in self.specs if s.key in reused],
            "reused_from": reused,
            "failed": self.failed,
        }


def log_triage(log: Log, heading: str, specs: list[RunSpec], tri: Triage) -> None:
    """One line of counts under ``heading``, one per damaged run folder saying what replaces it, then one
    per reused run naming where it came from."""
    reused = tri.reused_from
    log(f"{heading}: {len(specs)} runs planned, {len(reused)} reused, {len(tri.todo)} to train")
    for spec in specs:
        if spec.key in tri.damaged:
            fix = (
                f"restored from MLflow run {tri.stored[spec.key].info.run_id}"
                if spec.key in tri.stored
                else "no copy in the tracking store: retraining this run only"
            )
            log(f"  damaged run folder {spec.label} (key {spec.key}: {tri.damaged[spec.key]}): {fix}")
        if spec.key in reused:
            src = reused[spec.key]
            where = "runs/ folder" if src == "local" else f"MLflow run {src.split(':', 1)[1]}"
            log(f"  reused {spec.label} (key {spec.key}, from {where})")


def fill_runs(
    specs: list[RunSpec],
    out_dir: Path,
    hyp: Hypothesis,
    tracker: TrackerProtocol,
    opts: RunOptions,
    log: Log = print,
    *,
    heading: str | None = None,
    tags_of: Callable[[RunSpec], dict] | None = None,
    on_triaged: Callable[[list[RunSpec], Triage], None] | None = None,
    on_ended: Callable[[RunSpec, dict | None], None] | None = None,
) -> Filled:
    """Stages 2-4b for ``run`` and ``sweep`` alike: triage, fetch stored runs, clear ended attempts, prepare
    the data, execute; each run is logged to the tracker as it ends (so a kill loses none that finished),
    and afterwards every finished run of ``specs`` the store lacks (an earlier invocation died before
    logging it) is logged too.

    Args:
        specs: the runs to fill (``out_dir/runs/<key>``), their data under ``out_dir/data``.
        hyp: the hypothesis: its name announces the runs in the lease store, its layers make their rows.
        heading: the triage line's lead (default ``study <name>``).
        tags_of: further child-run tags of a run (a sweep's trial number and knob values).
        on_triaged: called with ``(specs, triage)`` before anything trains (the parent run's params).
        on_ended: called with ``(spec, result)`` as each run ends, once it is logged (a sweep's trial ends).
    """
    runs_dir, data_dir, force = Path(out_dir) / "runs", Path(out_dir) / "data", opts.force
    layers = hyp.design.layers
    tri = triage(specs, runs_dir, {} if force else tracker.finished_runs(), force)
    reconcile_leases(opts.placement, runs_dir, tri.finished)
    fetch_stored(tri, specs, runs_dir, tracker)
    clear_for_training(tri.todo, runs_dir, force)
    log_triage(log, heading or f"study {hyp.name}", specs, tri)
    data = prepare_data(tri.todo, data_dir, log)
    if on_triaged is not None:
        on_triaged(specs, tri)
    bar = opts.progress if tri.todo else None
    if bar is not None:
        bar.start(heading or f"study {hyp.name}", len(tri.todo))

    def log_ended(spec: RunSpec, result: dict | None) -> None:  # each run reaches the store as it ends
        ds = data.get(dataset_key(spec.dataset))
        log_run(tracker, spec, runs_dir, layers, ds, again=force, tags=tags_of(spec) if tags_of else None)
        if bar is not None:
            bar.advance(spec.label)
        if on_ended is not None:
            on_ended(spec, result)

    try:
        failed = execute(tri.todo, runs_dir, data_dir, opts.workers, log, log_ended, opts.placement, hyp.name)
    finally:
        if bar is not None:
            bar.close()
    log_missing(tracker, specs, runs_dir, layers, data, tags_of)
    return Filled(list(specs), tri, failed, data)


def reconcile_leases(placement: Placement, runs_dir: Path, finished: list[str]) -> None:
    """Record as finished the leases of runs finished on disk whose release never reached the store (it was
    away), so ``status`` stops calling them stalled. Only a store that exists is touched."""
    where = placement.lease_store(runs_dir)
    if not finished or ("://" not in where and not Path(where).is_dir()):
        return
    from runners.leases import open_lease_store
    from runners.shared_out import lease_key, read_token

    token = read_token(Path(runs_dir).parent)  # this folder's leases (none: from before the token)
    keys = [lease_key(k, token) for k in finished] + (list(finished) if token else [])  # and pre-token ones
    try:
        open_lease_store(where).reconcile(keys, "finished")
    except Exception:  # noqa: BLE001 - bookkeeping only: the run folders decide, and a rerun tries again
        pass


def execute(
    todo: list[RunSpec],
    runs_dir: Path,
    data_dir: Path,
    workers: int | str = "auto",
    log: Log = print,
    on_result: Callable[[RunSpec, dict | None], None] | None = None,
    placement: Placement | None = None,
    study: str = "",
) -> dict[str, str]:
    """Stage 4: fill every run to do through an executor (``runners.executors``), each under a lease.

    A run finished or being filled by another worker or invocation sharing the lease store is not filled
    again: its job returns at once and is sent again after a backoff (holding no worker) until the run is
    finished there (its result is reused) or its lease is free (``runners.leases.fill_once``).

    Args:
        on_result: called in this process as each run ends, with its result (None when it raised).
        placement: executor and lease store (default: local processes, leases under ``<out>/leases``).
        study: the name the runs are announced under in the lease store (``python -m study status``).

    Returns:
        key -> reason, for every run that failed on its own (a NaN loss, an error of its own).

    Raises:
        MachineError: a run's folder or store could not be written (disk full, read-only, ...): the
            workers are stopped and the study stops, rather than test its claims on fewer seeds.
        Interrupted: Ctrl-C or SIGTERM: the workers are stopped and no queued run starts.
    """
    if not todo:  # torch is imported only when something runs: a cached rerun stays quick
        return {}
    from runners.executors import make_executor, map_requeued
    from runners.jobs import execute_claimed_run
    from runners.leases import open_lease_store
    from runners.shared_out import lease_key, seen_by_driver, write_token
    from runners.train import pick_device

    place = placement or Placement()
    leases = place.lease_store(runs_dir)
    token = write_token(Path(runs_dir).resolve().parent)  # every job checks it sees this folder (shared_out)
    open_lease_store(leases).announce(study, [lease_key(s.key, token) for s in todo])  # this folder's leases
    executor = make_executor(
        workers,
        len(todo),
        cuda=pick_device().type == "cuda",
        kind=place.executor,
        address=place.address,
        cpus_per_run=place.cpus_per_run,
        gpus_per_run=place.gpus_per_run,
    )
    # absolute paths: a Ray worker runs in its own folder, and reaches the shared output folder by them
    runs_dir, data_dir = Path(runs_dir).resolve(), Path(data_dir).resolve()
    jobs = [(s.model_dump(), str(runs_dir / s.key), str(data_dir), leases, study, token) for s in todo]
    failed, t0 = dict[str, str](), time.perf_counter()
    # a run finished on disk is never failed; one reported finished but not readable here is (its host)
    requeue = _requeue_waiting(todo, log)  # a run leased live elsewhere: sent again later, holding no slot
    ended = seen_by_driver(map_requeued(executor, execute_claimed_run, jobs, requeue), [j[1] for j in jobs])
    try:
        for i, result, exc in ended:
            spec = todo[i]
            fault = machine_fault(exc) if exc is not None else None
            if fault is not None:  # the machine's, not the run's: stop rather than test on fewer seeds
                raise stopped_while_filling(fault, spec.label, spec.key, str(runs_dir / spec.key))
            if exc is not None:
                failed[spec.key] = f"{type(exc).__name__}: {exc}"
                log(f"[{spec.label}] FAILED: {failed[spec.key]}")
            else:
                if result["status"] != "finished":
                    failed[spec.key] = f"failed at epoch {result.get('failed_epoch')}: {result.get('error')}"
                by = "" if result.get("claim", {}).get("filled", True) else " by another worker"
                log(f"[{spec.label}] {result['status']}{by} ({time.perf_counter() - t0:.0f}s since start)")
            if on_result:
                on_result(spec, result)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (study.stopping): no queued run starts
        ended.close()
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, getattr(executor, "stopped", 0)) from None
    finally:
        ended.close()  # stopped early (an error here, a full disk): the workers are stopped too
    return failed


def _requeue_waiting(todo: list[RunSpec], log: Log) -> Callable[[int, object, int], float | None]:
    """The executor's ``requeue``: a job whose run another worker holds live is sent again after a backoff
    (``runners.leases.requeue_waiting``; its slot is free meanwhile), said once per run."""
    from runners.leases import requeue_waiting

    def requeue(i: int, result: object, times: int) -> float | None:
        delay = requeue_waiting(result, times)
        if delay is not None and times == 0:
            log(f"[{todo[i].label}] leased by another worker: waiting for it (the slot stays free)")
        return delay

    return requeue


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


def run_rows(spec: RunSpec, run_dir: Path, layers: list[str]) -> pd.DataFrame:
    """Tidy rows of one finished run, from its folder alone; one-line error naming an unreadable artifact.

    A run imported from a metric log holds its rows (``rows.parquet``) instead of spectra.
    """
    folder = RunFolder(run_dir)
    if not folder.has_spectra() and folder.file(ROWS).is_file():
        try:
            rows = folder.read_rows()
        except Exception as exc:  # noqa: BLE001 - a truncated parquet surfaces as many exception types
            raise StudyError(
                f"run {spec.label} (key {spec.key}): artifact {ROWS} is corrupt "
                f"({type(exc).__name__}: {exc}); `python -m study run` restores it from the tracking store "
                "or imports it again",
                str(folder.file(ROWS)),
            ) from None
        order = {name: i for i, name in enumerate(layers)}
        return rows.assign(run_key=spec.key, layer_index=rows.layer.map(order).fillna(-1).astype(int))
    try:
        spectra = folder.read_spectra()
    except Exception as exc:  # noqa: BLE001 - a missing/truncated npz surfaces as many exception types
        raise StudyError(
            f"run {spec.label} (key {spec.key}): artifact {SPECTRA} is missing or corrupt "
            f"({type(exc).__name__}: {exc}); `python -m study run` restores it from the tracking store "
            "or retrains this run",
            str(folder.file(SPECTRA)),
        ) from None
    result = folder.read_result() or {}
    n_tokens = result.get("n_tokens")
    if n_tokens is not None and not (
        isinstance(n_tokens, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in n_tokens.values())
    ):
        raise StudyError(
            f"run {spec.label} (key {spec.key}): expected a mapping of '{{layer}}/{{token_set}}' to token counts",
            str(folder.file("result.json")),
            "n_tokens",
        )
    try:
        scalars = folder.read_scalars()
    except Exception as exc:  # noqa: BLE001 - truncated JSON, a non-number value: the file is damaged
        raise StudyError(
            f"run {spec.label} (key {spec.key}): artifact {SCALARS} is corrupt ({type(exc).__name__}: "
            f"{exc}); `python -m study run` restores it from the tracking store or retrains this run",
            str(folder.file(SCALARS)),
        ) from None
    rows = rows_from_spectra(
        spec.key, spec.dataset["name"], spec.seed, spectra, layers, result.get("n_tokens"), scalars=scalars
    )
    return pd.DataFrame(rows)


def collect_table(
    specs: list[RunSpec], runs_dir: Path, layers: list[str], failed: dict[str, str] | None = None
) -> Collected:
    """Stage 5: the tidy table of every finished run of the plan (also the ``table`` verb).

    A run that failed or did not finish is left out; its seed is reported per dataset with the reason. In
    a design with conditions every row carries its cell's name (``condition``), and each untrained cell
    gets the epoch-0 rows of its twin's runs under its own name (:func:`condition_rows`).
    """
    rows, failed_seeds, missing = {}, {}, []
    for spec in specs:
        folder = RunFolder(runs_dir / spec.key)
        if (failed and spec.key in failed) or not folder.is_finished():
            reason = (failed or {}).get(spec.key, "run did not finish")
            failed_seeds.setdefault(spec.dataset["name"], {})[spec.seed] = reason
            missing.append(spec)
            continue
        rows[spec.key] = run_rows(spec, folder.path, layers)
    frames = [f for s in specs if s.key in rows for f in condition_rows(s, rows[s.key])]
    table = make_table(pd.concat(frames, ignore_index=True) if frames else [])
    return Collected(table, rows, failed_seeds, missing)


def condition_rows(spec: RunSpec, rows: pd.DataFrame) -> list[pd.DataFrame]:
    """A run's rows as the table holds them: as they are (no conditions), or with the column ``condition``
    = its cell's name, plus, per untrained cell that reads it, its epoch-0 rows under that cell's name."""
    if spec.condition is None:
        return [rows]
    out = [rows.assign(condition=spec.condition)]
    at_init = rows[rows["epoch"] == 0]
    out += [at_init.assign(condition=name) for name in spec.epoch0_conditions]
    return out


def evaluate(
    hyp: Hypothesis,
    table: pd.DataFrame,
    source: str,
    failed_seeds=None,
    post_hoc: set[str] | None = None,
    runs_dir: Path | None = None,
) -> list[ClaimResult]:
    """Stage 6: every claim tested, adjusted and decided (``analysis.verdicts``); ``post_hoc`` claims
    (registered after their data existed) are adjusted as exploratory. With ``runs_dir`` the runs' probe
    files give each claim its probe-size sensitivity, ``match_tokens`` and ``uncertainty: seeds+probe``."""
    from analysis.probe import ProbeData

    check_token_metrics(hyp, table, source)
    probe = ProbeData.of_table(table, runs_dir) if runs_dir is not None else None
    return evaluate_claims(hyp, table, source=source, failed=failed_seeds, post_hoc=post_hoc, probe=probe)


def check_token_metrics(hyp: Hypothesis, table: pd.DataFrame, source: str) -> None:
    """A token-count metric (``participation_ratio_bc``) asked of a table that lacks it and the token counts
    (an imported metric log): one line, not an untestable claim, because no rerun of the log can give it."""
    from analysis.spectral import TOKEN_METRICS

    for i, claim in enumerate(hyp.claims):
        if claim.metric not in TOKEN_METRICS or (table.metric == claim.metric).any():
            continue
        if "n_tokens" in table and (table.n_tokens >= 0).any():
            continue
        raise StudyError(
            f"{claim.metric} needs the token counts and fourth-order token sums measured at extraction; this "
            "table (an imported metric log) records neither: import checkpoints instead, or use participation_ratio",
            f"{source}: claims[{i}]",
            "metric",
        )


@dataclass
class Outcome:
    """What the writers need from a study (or a sweep): its runs, its table and its claims' results."""

    hyp_path: Path
    runs: Filled
    table: pd.DataFrame
    results: list[ClaimResult]
    command: str | None = None


def write_outputs(
    folder: Path, out: Outcome, fields: dict, tables: dict[str, pd.DataFrame] | None = None
) -> dict[str, Path]:
    """Stage 7: ``table.parquet``, ``verdicts.json``, ``verdicts.txt`` and ``hypothesis.yaml``, each atomic.

    Args:
        fields: ``verdicts.json``'s lead fields (the study's or sweep's name, ``registration``,
            ``sequential``, a sweep's ``trials``); the file, the runs' accounting
            (:meth:`Filled.accounting`), the command and the claims follow.
        tables: further tables by file name (a sweep's ``trials.csv``); their paths are returned by stem.
    """
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        **fields,
        "file": str(out.hyp_path),
        **out.runs.accounting(),
        "command": out.command,
        "claims": [r.to_dict() for r in out.results],
    }
    paths = {"table": save_table(out.table, folder / "table.parquet")}
    for name, frame in (tables or {}).items():
        paths[Path(name).stem] = save_table(frame, folder / name)
    paths.update(
        verdicts=atomic_write_json(folder / "verdicts.json", payload, indent=1, default=float),
        text=atomic_write_text(folder / "verdicts.txt", format_verdicts(out.results) + "\n"),
        hypothesis=atomic_write_text(
            folder / "hypothesis.yaml", Path(out.hyp_path).read_text(encoding="utf-8")
        ),
    )
    return paths


def report_input(
    title: str, hyp: Hypothesis, out: Outcome, runs_dir: Path, claims: list | None = None, **more
):
    """The :class:`analysis.report.ReportInput` of a study or sweep (``more``: its other fields)."""
    from analysis.report import ReportInput

    acc = out.runs.accounting()
    return ReportInput(
        title=title,
        description=hyp.description.strip(),
        claims=list(hyp.claims) if claims is None else claims,
        results=out.results,
        table=out.table,
        runs_dir=runs_dir,
        runs=acc["runs"],
        labels=acc["labels"],
        reused=acc["reused"],
        failed=acc["failed"],
        file=str(out.hyp_path),
        command=out.command,
        **more,
    )


def write_study_report(
    study_dir: Path, hyp: Hypothesis, out: Outcome, runs_dir: Path, sequential: dict | None = None
) -> list[Path]:
    """Stage 8: ``report.html`` and ``report.md`` from the typed claims and results (``sequential``: the
    looks of ``--until-decided``, see ``analysis.report.ReportInput``); a design with conditions opens with
    its conditions grid, as ``python -m study report`` writes it (``analysis.report.read_study``)."""
    from analysis.report import conditions_preface, write_report

    preface = conditions_preface(out.table, list(hyp.claims))
    more: dict = {"preface": preface, "preface_title": "Conditions"} if preface else {}
    inp = report_input(hyp.name, hyp, out, runs_dir, sequential=sequential, **more)
    return list(write_report(study_dir, inp))
