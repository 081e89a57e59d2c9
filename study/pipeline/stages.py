"""The stages of a study, each a function from one artifact to the next, callable on its own.

    plan -> check inputs -> triage -> (fetch stored) -> prepare data -> execute -> collect table
      -> evaluate -> write

:func:`fill_runs` is the look-filling chain (triage -> fetch -> clear -> prepare -> execute, each run logged
to the tracker as it ends, then the finished runs the store lacks): ``study.pipeline.orchestrate.run_study`` calls it
per look of ``python -m study run`` and ``study.sweep.loop`` per batch of trials, so both triage, log and catch
up alike. :func:`write_outputs` writes both's result folders. The ``table`` verb calls
:func:`collect_table` alone. Output folder layout::

    data/                      dataset caches (generated or decoded once)
    runs/<run key>/            one run folder per run (``vitstudy_core.runfolder``; result.json marks it finished)
    studies/<name>/            table.parquet, verdicts.json, verdicts.txt, hypothesis.yaml, report.*
    sweeps/<name>/             the same, and trials.csv and the optuna journal (``study.sweep.loop``)

This module is placement and execution (the options of where and how runs execute, the dataset caches
made ready, :func:`fill_runs` and :func:`execute`); the other stages live beside it: ``study.pipeline.triage``
(plan, check inputs, triage, fetch, clear), ``study.pipeline.runlog`` (tracking each run), ``study.pipeline.tables``
(collect the table), ``study.pipeline.evaluation`` (test the claims) and ``study.pipeline.outputs`` (result folder, report).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from study.pipeline.runlog import log_missing, log_run
from study.pipeline.stopping import stopped_while_filling
from study.pipeline.triage import Triage, clear_for_training, dataset_key, fetch_stored, triage
from study.runspecs import RunSpec
from study.schema import Hypothesis
from vitstudy_core.errors import Interrupted, machine_fault
from vitstudy_core.fmt import count

if TYPE_CHECKING:
    from runners.executors.base import Executor
    from study.tracking.tracker import TrackerProtocol

Log = Callable[[str], None]


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
        executor: a name in ``runners.executors.local.EXECUTORS`` (``local``: processes on this host; ``ray``:
            tasks on a Ray cluster); an unknown one is a one-line ``StudyError`` listing them.
        address: the Ray cluster (``auto``: the one this host belongs to).
        cpus_per_run, gpus_per_run: what each Ray task requests.
        leases: the lease store (``runners.leases.store``): a database URL shared by every worker, or a folder;
            None: the folder ``<out>/leases``.
        options: the executor's own options as (name, value) pairs (Slurm: ``--slurm-*``).
    """

    executor: str = "local"
    address: str = "auto"
    cpus_per_run: float = 1
    gpus_per_run: float = 0
    leases: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        from runners.executors.local import EXECUTORS

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
    log(f"{heading}: {count(len(specs), 'run')} planned, {len(reused)} reused, {len(tri.todo)} to train")
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
    from runners.leases.members import record_planned  # status counts a study by all its runs

    record_planned(
        opts.placement.lease_store(runs_dir), runs_dir, hyp.name, [s.key for s in specs], bool(tri.todo)
    )
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
    from runners.leases.store import open_lease_store
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
    """Stage 4: fill every run to do through an executor (``runners.executors.local``), each under a lease.

    A run finished or being filled by another worker or invocation sharing the lease store is not filled
    again: its job returns at once and is sent again after a backoff (holding no worker) until the run is
    finished there (its result is reused) or its lease is free (``runners.leases.store.fill_once``).

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
    from runners.executors.jobs import execute_claimed_run
    from runners.executors.local import map_requeued
    from runners.leases.store import open_lease_store
    from runners.shared_out import lease_key, seen_by_driver, write_token

    place = placement or Placement()
    leases = place.lease_store(runs_dir)
    token = write_token(Path(runs_dir).resolve().parent)  # every job checks it sees this folder (shared_out)
    open_lease_store(leases).announce(study, [lease_key(s.key, token) for s in todo])  # this folder's leases
    executor = _executor(place, workers, len(todo), Path(runs_dir).resolve().parent)
    # absolute paths: a Ray worker runs in its own folder, and reaches the shared output folder by them
    runs_dir, data = Path(runs_dir).resolve(), str(Path(data_dir).resolve())
    jobs = [(s.model_dump(), str(runs_dir / s.key), data, leases, study, token, s.label) for s in todo]
    failed, t0 = dict[str, str](), time.perf_counter()
    # a run finished on disk is never failed; one reported finished but not readable here is (its host)
    requeue = _requeue_waiting(todo, log)  # a run leased live elsewhere: sent again later, holding no slot
    ended = seen_by_driver(map_requeued(executor, execute_claimed_run, jobs, requeue), [j[1] for j in jobs])
    try:
        for i, returned, exc in ended:
            spec = todo[i]
            result = cast(dict, returned)  # execute_claimed_run's result dict (None only with exc set)
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
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (study.pipeline.stopping): no queued run starts
        ended.close()
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, getattr(executor, "stopped", 0)) from None
    finally:
        ended.close()  # stopped early (an error here, a full disk): the workers are stopped too
    for line in getattr(executor, "summary_lines", list)():  # per GPU: runs and busy time
        log(line)
    return failed


def _executor(place: Placement, workers: int | str, n_jobs: int, out: Path) -> Executor:
    """The executor of ``place`` for ``n_jobs`` runs of the output folder ``out``."""
    from runners.executors.local import make_executor
    from runners.train import pick_device

    return make_executor(
        workers,
        n_jobs,
        cuda=pick_device().type == "cuda",
        kind=place.executor,
        address=place.address,
        cpus_per_run=place.cpus_per_run,
        gpus_per_run=place.gpus_per_run,
        out=out,
        options=dict(place.options),
    )


def _requeue_waiting(todo: list[RunSpec], log: Log) -> Callable[[int, object, int], float | None]:
    """The executor's ``requeue``: a job whose run another worker holds live is sent again after a backoff
    (``runners.leases.store.requeue_waiting``; its slot is free meanwhile), said once per run."""
    from runners.leases.store import requeue_waiting

    def requeue(i: int, result: object, times: int) -> float | None:
        delay = requeue_waiting(result, times)
        if delay is not None and times == 0:
            log(f"[{todo[i].label}] leased by another worker: waiting for it (the slot stays free)")
        return delay

    return requeue
