"""``python -m study sweep FILE``: optuna trials over a design dataset's knobs; each trial's seeds go through
the stages of ``study.pipeline.stages`` (plan, triage, execute, collect), so runs are keyed, cached, reused across
files and tracked like any other run.

    python -m study sweep hypotheses/complexity_sweep.yaml [--n-trials N] [--storage URL] [--workers N]

Each trial is one design point: the swept dataset with the trial's knob values. The runs of a batch of
trials are executed together, so different trials use the workers in parallel. A trial's value is the
objective averaged over its seeds (per-seed values and run keys are the trial's user attributes; every
child run carries its trial number and knob values as tags). The claims over a knob are tested on the
table of every complete trial, the seed being the unit: per seed, the curve against the knob.

Output (``--out``): ``sweeps/<name>/`` holds ``journal.log`` (the optuna study, unless ``--storage``),
``table.parquet`` (every trial's tidy rows, with the trial's knob values as columns), ``trials.csv`` (one
row per trial x seed: knob values, objective, test accuracy, run key), ``verdicts.json``/``.txt`` and the
report. Run folders live in ``runs/`` as for ``run``.

Resume: the same command continues a killed sweep. A finished trial is never run again; a trial left
RUNNING by a driver that is gone is marked FAIL and run again with the same parameters, and its finished
runs are reused. A gone driver is one whose process is dead (a trial of this host), or, on a database
storage, whatever host it ran on, one that stopped recording optuna's heartbeat for its trials (this
loop asks and tells, so :class:`Heartbeat` records it, where ``optimize()`` would). A complete trial's
runs the tracking store lacks are logged by the next invocation.

This module is the batch loop (ask a batch, fill its runs together, tell each trial, then conclude);
``study.sweep.storage`` opens the optuna study, ``study.sweep._heartbeat`` tells live trials from stale
ones, ``study.sweep.trials`` maps a trial to its runs, ``study.sweep._tables`` builds the trial and tidy
tables and ``study.sweep.report`` writes the report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from analysis.verdicts import ClaimResult, format_verdicts
from study import registration
from study.pipeline import outputs, stages
from study.pipeline import runlog as run_logging
from study.pipeline import triage as run_triage
from study.pipeline.stopping import stopping_cleanly
from study.preflight import check_hypothesis
from study.schema import Hypothesis, sweep_of
from study.sweep._heartbeat import OWNER, Heartbeat, _alive, recover_stale
from study.sweep._tables import _sweep_rows, accuracy_warnings, trials_table
from study.sweep.report import write_sweep_report
from study.sweep.storage import TPE_STARTUP, check_unchanged, heartbeat_s, open_optuna_study, storage_url
from study.sweep.trials import TrialPoint, _ask, _tags_by_key, _tell_trial, _trial_tags
from study.tracking.store import store_path
from study.tracking.tracker import TrackerProtocol, open_tracker
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import file_digest

Log = Callable[[str], None]


@dataclass
class SweepOutcome:
    results: list[ClaimResult]
    trials: pd.DataFrame
    table: pd.DataFrame
    sweep_dir: Path
    trained: list[str] = field(default_factory=list)
    report: Path | None = None


def _batch_size(hyp: Hypothesis, remaining: int, workers: int | str, asked: int = 0) -> int:
    """All remaining trials for samplers that do not learn from results. For TPE: its start-up trials
    that are still to be asked (``asked``: the trials complete or running), all together, since TPE samples
    them at random without looking at results; after them, enough trials to keep every worker busy (their
    runs execute together)."""
    if sweep_of(hyp).sampler != "tpe":
        return remaining
    cores = (os.cpu_count() or 1) if workers == "auto" else int(workers)
    busy = -(-cores // len(hyp.design.seeds))
    return max(1, min(remaining, max(busy, TPE_STARTUP - asked)))


def _counts(optuna_study) -> tuple[int, int]:
    from optuna.trial import TrialState

    trials = optuna_study.get_trials(deepcopy=False)
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    running = sum(t.state == TrialState.RUNNING and _alive(t.user_attrs.get(OWNER)) for t in trials)
    return done, running


def _run_batch(
    points: list[TrialPoint],
    hyp: Hypothesis,
    out_dir: Path,
    tracker: TrackerProtocol,
    opts: stages.RunOptions,
    log: Log,
    filled: stages.Filled,
) -> int:
    """Fill the runs of a batch of trials together (``stages.fill_runs``: each run reaches MLflow as it ends,
    tagged with its trial); each trial is told its value as soon as its own runs have ended, so optuna
    records when it completed, not when the batch did. ``filled`` gathers the batches' runs. Returns how
    many of the batch's trials completed."""
    runs_dir = out_dir / "runs"
    specs = list({s.key: s for p in points for s in p.specs}.values())
    trial_of = {s.key: p for p in reversed(points) for s in p.specs}
    waiting = {p.number: {s.key for s in p.specs} for p in points}  # each trial's runs still to end
    told: dict[int, bool] = {}

    def run_ended(key: str, failed: dict[str, str] | None = None) -> None:
        for p in points:
            if key in waiting[p.number]:
                waiting[p.number].discard(key)
                if not waiting[p.number] and p.number not in told:
                    told[p.number] = _tell_trial(p, hyp, runs_dir, log, failed)

    def triaged(
        _specs, tri: run_triage.Triage
    ) -> None:  # runs reused or finished before: nothing to wait for
        todo = {s.key for s in tri.todo}
        for key in {s.key for s in specs} - todo:
            run_ended(key)

    got_batch = stages.fill_runs(
        specs,
        out_dir,
        hyp,
        tracker,
        opts,
        log,
        heading=f"trials {[p.number for p in points]}",
        tags_of=lambda spec: _trial_tags(hyp, trial_of[spec.key]),
        on_triaged=triaged,
        on_ended=lambda spec, result: run_ended(spec.key),
    )
    filled.merge(got_batch)
    for p in points:  # a trial none of whose runs reached its end here (a run that raised)
        if p.number not in told:
            told[p.number] = _tell_trial(p, hyp, runs_dir, log, got_batch.failed)
    return sum(told.values())


@dataclass(frozen=True)
class SweepOptions:
    """``sweep``'s own flags: ``--n-trials`` (default: the file's, or the grid's size) and ``--storage`` (an
    optuna storage URL; default: the file's ``sweep.storage``, else a journal file in the output folder;
    the CLI's default is ``$STUDY_STORAGE`` first). ``storage_from``: what an error calls ``storage`` (the
    flag, or the variable it came from)."""

    n_trials: int | None = None
    storage: str | None = None
    storage_from: str = "--storage"


def run_sweep(
    hyp: Hypothesis,
    hyp_path: Path,
    out_dir: Path,
    opts: stages.RunOptions | None = None,
    sweep: SweepOptions | None = None,
    log: Log = print,
) -> SweepOutcome:
    """Run (or continue) a sweep, then test its claims over knobs. See the module docstring.

    ``opts``: as for ``run`` (``stages.RunOptions``; ``log_model`` aside); with a database storage and no
    lease store given, the runs' leases live in that database, so sweep processes sharing it train each run
    once. ``sweep``: the number of trials and the optuna storage.
    """
    out_dir, opts, sweep = Path(out_dir), opts or stages.RunOptions(), sweep or SweepOptions()
    # Ctrl-C / SIGTERM stop the workers and mark the parent KILLED; a full disk stops the sweep (exit 2)
    with stopping_cleanly(store_path(out_dir) if opts.track else None):
        return _run_sweep(hyp, hyp_path, out_dir, opts, sweep, log)


def _run_sweep(hyp, hyp_path, out_dir: Path, opts: stages.RunOptions, sweep, log: Log) -> SweepOutcome:
    """:func:`run_sweep` inside :func:`study.pipeline.stopping.stopping_cleanly`."""
    url = storage_url(hyp, sweep.storage)
    if opts.placement.leases is None and url and "://" in url:
        opts = replace(opts, placement=replace(opts.placement, leases=url))
    check_hypothesis(hyp, str(hyp_path), out_dir)  # what would stop the sweep later stops it now
    heartbeat_s()  # STUDY_TRIAL_HEARTBEAT: seconds > 0, checked before anything is written (any storage)
    target = trial_target(hyp, sweep.n_trials, str(hyp_path))
    optuna_study = open_optuna_study(hyp, out_dir, url, str(hyp_path), sweep.storage_from)
    check_unchanged(optuna_study, hyp, str(hyp_path))
    filled = stages.Filled()
    sweep_dir = out_dir / "sweeps" / hyp.name
    reg = registration.register(sweep_dir, hyp, data_existed=(sweep_dir / "verdicts.json").exists())
    with open_tracker(opts.track, out_dir, f"{hyp.name}.sweep", role="sweep") as tracker:
        tracker.set_tags(
            None,
            {
                "sweep.sampler": sweep_of(hyp).sampler,
                "sweep.space": sweep_of(hyp).model_dump()["space"],
                "sweep.n_trials": target,
                "spec_hash": file_digest(hyp_path),
                **({"command": opts.command} if opts.command else {}),
            },
        )
        with Heartbeat(optuna_study):  # another driver can tell these trials' driver is alive
            _optimize(optuna_study, hyp, out_dir, target, tracker, opts, log, filled)
        return _conclude(optuna_study, hyp, hyp_path, out_dir, tracker, opts, log, filled, reg)


def trial_target(hyp: Hypothesis, n_trials: int | None, file: str) -> int:
    """How many complete trials the sweep runs to: ``--n-trials``, the file's, or the grid's size. A grid
    has no more distinct points than its size: asking for more is refused (they would all be repeats)."""
    grid = sweep_of(hyp).grid_size()
    target = n_trials or sweep_of(hyp).n_trials or grid
    if sweep_of(hyp).sampler == "grid" and target > grid:
        where = "--n-trials" if n_trials else "sweep.n_trials"
        raise StudyError(
            f"expected at most the grid's {grid} points, got {target} trials (a grid trial beyond its size "
            "repeats a point; add values to sweep.space to sample more, under another sweep name)",
            file,
            where,
        )
    return target


def _optimize(optuna_study, hyp, out_dir, target, tracker, opts, log, filled) -> None:
    """Ask, fill and tell batches of trials until ``target`` trials are complete (here or elsewhere)."""
    recover_stale(optuna_study, hyp, log)
    while True:
        done, running = _counts(optuna_study)
        if done + running >= target and running:  # the rest runs in other sweep processes: wait for it
            log(f"waiting for {running} trial(s) running in other processes")
            time.sleep(5)
            recover_stale(optuna_study, hyp, log)
            continue
        if done + running >= target:
            return
        t0 = time.perf_counter()
        n = _batch_size(hyp, target - done - running, opts.workers, done + running)
        points = _ask(optuna_study, hyp, n, out_dir / "data")
        if not _run_batch(points, hyp, out_dir, tracker, opts, log, filled):
            log("no trial of this batch completed (see the failed runs above): stopping the sweep here")
            return
        log(
            f"{_counts(optuna_study)[0]}/{target} trials complete ({time.perf_counter() - t0:.0f}s for this batch)"
        )


def _conclude(optuna_study, hyp, hyp_path, out_dir, tracker, opts, log, filled, reg) -> SweepOutcome:
    """The trial and tidy tables, the claims over knobs, the outputs, the report and the parent run's results."""
    sweep_dir = out_dir / "sweeps" / hyp.name
    trials = trials_table(optuna_study, hyp)
    table, specs = _sweep_rows(trials, hyp, out_dir)
    # the runs of every complete trial: trained or reused in this invocation, or finished by an earlier one
    known = {s.key for s in filled.specs}
    earlier = list({s.key: s for s in specs if s.key not in known}.values())
    filled.merge(stages.Filled(earlier, run_triage.Triage(finished=[s.key for s in earlier])))
    # those the tracking store lacks (their invocation was killed before logging them, or the store lost
    # them) are logged now, tagged with their trial, as `run` catches up its missing runs
    run_logging.log_missing(
        tracker, earlier, out_dir / "runs", hyp.design.layers, tags_of=_tags_by_key(trials, hyp)
    )
    tracker.log_study(hyp, hyp_path, filled.specs, filled.tri, opts.command)
    knob_claims = [c for c in hyp.claims if c.knob() is not None]
    results = registration.evaluate_registered(reg, hyp, knob_claims, table, str(hyp_path))
    accuracy_warnings(results, knob_claims, trials)
    out = outputs.Outcome(hyp_path, filled, table, results, opts.command)
    paths = outputs.write_outputs(
        sweep_dir,
        out,
        {"sweep": sweep_dir.name, "trials": trials.to_dict(orient="records")},
        {"trials.csv": trials},
    )
    report_path = None
    if opts.report:
        report_path = write_sweep_report(sweep_dir, hyp, knob_claims, out, trials, optuna_study, out_dir)
    tracker.log_results(
        [*paths.values(), *([report_path] if report_path else [])],
        results,
        f"**{hyp.name}** (sweep)\n\n```\n{format_verdicts(results)}\n```",
    )
    return SweepOutcome(results, trials, table, sweep_dir, [s.key for s in filled.tri.todo], report_path)
