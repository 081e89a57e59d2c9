"""``python -m study run``: the stages of ``study.pipeline.stages`` in order, with the tracker around them.

    plan -> check inputs -> triage (finished here / finished in the store / to do) -> prepare data -> execute
      -> collect the table -> evaluate -> write outputs and the report -> log results

A finished run is never trained again (``force`` retrains); a run finished in the MLflow store (e.g. by
another hypothesis file over the same design) is downloaded instead; an interrupted run resumes from its
last complete epoch. A store artifact that is missing or corrupt stops the study with one line naming
the run and the artifact. On-disk datasets are decoded once into memory-mappable ``.npy`` caches under
``data/``, and their content fingerprints are recorded in ``data/fingerprints.json``.

Before anything is trained the claims and the design are registered (``study.registration``); a claim
first registered after some of its runs had finished is ``post hoc`` and adjusted as exploratory. With
a :class:`SequentialPlan` (``run --until-decided``) seeds are added in batches after each look until every
confirmatory claim is decided or the maximum is reached, and the verdicts come from group-sequential
boundaries over the looks (``analysis.sequential_verdicts.decide_sequential``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.sequential import Spending
from analysis.sequential_verdicts import decide_sequential, looks_spent
from analysis.verdicts import INCONCLUSIVE, ClaimResult, Families, families, format_verdicts
from study import registration, rerun
from study.pipeline import evaluation, outputs, stages
from study.pipeline import tables as run_tables
from study.pipeline import triage as run_triage
from study.pipeline.scalars import with_run_scalars
from study.pipeline.stopping import stopping_cleanly
from study.preflight import check_hypothesis
from study.schema import Hypothesis
from study.tracking.store import store_path
from study.tracking.tracker import TrackerProtocol, open_tracker
from vitstudy_core.fmt import count
from vitstudy_core.io import remove_temporaries
from vitstudy_core.locks import file_lock


@dataclass
class StudyOutcome:
    results: list[ClaimResult]
    table: pd.DataFrame
    study_dir: Path
    trained: list[str]
    reused: list[str]
    failed: dict[str, str]
    reused_from: dict[str, str] | None = None  # key -> "local" or "mlflow:<run id>"
    report: Path | None = None
    sequential: dict | None = None  # the looks of --until-decided (verdicts.json "sequential")
    unchanged: bool = False  # nothing recomputed (study.rerun): results and table are read from the folder


@dataclass(frozen=True)
class SequentialPlan:
    """``run --until-decided``: add ``batch`` seeds per look up to ``max_seeds``, alpha spent by ``spending``."""

    max_seeds: int
    batch: int = 2  # a look per two new seeds: seeds train in parallel, and each look costs a little power
    spending: Spending = "obf"  # O'Brien-Fleming type: almost no alpha early, near-full power at the maximum

    def as_dict(self) -> dict:
        return {"max_seeds": self.max_seeds, "batch": self.batch, "spending": self.spending}


def seed_schedule(seeds: list[int], plan: SequentialPlan | None) -> list[list[int]]:
    """The seeds of each look: the file's, then ``batch`` more at a time (the next integers, counting up
    from the smallest seed, that the file does not list) up to ``max_seeds``."""
    if plan is None:
        return [list(seeds)]
    extra: list[int] = []
    n = min(seeds)
    while len(seeds) + len(extra) < plan.max_seeds:
        if n not in seeds:
            extra.append(n)
        n += 1
    looks = [list(seeds)]
    while len(looks[-1]) < plan.max_seeds:
        looks.append(list(seeds) + extra[: len(looks[-1]) - len(seeds) + plan.batch])
    return looks


def with_seeds(hyp: Hypothesis, seeds: list[int]) -> Hypothesis:
    return hyp.model_copy(update={"design": hyp.design.model_copy(update={"seeds": list(seeds)})})


@dataclass
class _Looked:
    """What every look of a study gave, for writing its outputs."""

    runs: stages.Filled  # merged over the looks (specs: the last look's plan)
    collected: run_tables.Collected  # the last look's table
    results: list[ClaimResult]
    status: dict[str, dict]  # claim name -> registration status
    sequential: dict | None  # the summary of --until-decided's looks; None for one look


def _train_look(
    hyp: Hypothesis,
    out_dir: Path,
    tracker: TrackerProtocol,
    done: set[str],
    opts: stages.RunOptions,
    log,
    on_triaged=None,
    specs: list | None = None,
) -> tuple[stages.Filled, run_tables.Collected]:
    """Fill (``stages.fill_runs``) and collect the runs of one look.

    ``done``: keys handled by earlier looks (never retrained, not counted as reused); updated here.
    ``on_triaged(specs, tri)``: called before training. ``specs``: the look's runs when the caller has
    planned them (the first look's are the study's plan); None: planned here.
    """
    specs = specs if specs is not None else run_triage.plan(hyp, out_dir / "data")
    new = [s for s in specs if s.key not in done]
    filled = stages.fill_runs(new, out_dir, hyp, tracker, opts, log, on_triaged=on_triaged)
    collected = run_tables.collect_table(specs, out_dir / "runs", hyp.design.layers, filled.failed)
    # per-run scalars a claim adjusts for (adjust_for) become columns; no such claim: today's table
    collected.table = with_run_scalars(collected.table, hyp.claims, out_dir / "runs")
    done.update(s.key for s in specs)
    return stages.Filled(specs, filled.tri, filled.failed, filled.data), collected


def _decided(results: list[ClaimResult], fams: Families) -> bool:
    """Every confirmatory claim (every claim, if none is confirmatory) is ACCEPTED or REJECTED."""
    return all(results[i].verdict != INCONCLUSIVE for i in fams.deciding)


def _run_looks(
    hyp: Hypothesis,
    hyp_path: Path,
    out_dir: Path,
    tracker: TrackerProtocol,
    plan: SequentialPlan | None,
    schedule: list[list[int]],
    planned: list,
    opts: stages.RunOptions,
    log,
    reg: dict,
) -> _Looked:
    """Every look of the study: ``schedule``, the seeds of each (:func:`seed_schedule`); ``planned``, the
    study's plan, which is the first look's."""
    done: set[str] = set()
    merged, looks, seeds_at = stages.Filled(), [], []

    def on_first(specs, tri):
        tracker.log_study(hyp, hyp_path, specs, tri, opts.command)

    for k, seeds in enumerate(schedule):
        hyp_k = with_seeds(hyp, seeds) if plan else hyp
        first = k == 0  # the first look logs the study and trains the study's plan
        filled, collected = _train_look(
            hyp_k,
            out_dir,
            tracker,
            done,
            opts,
            log,
            on_triaged=on_first if first else None,
            specs=planned if first else None,
        )
        merged.merge(filled)
        merged.specs = filled.specs  # the outputs list the last look's plan
        status = registration.claim_status(reg, hyp_k, filled.specs, out_dir / "runs")
        post_hoc = {n for n, st in status.items() if st["status"] == registration.POST_HOC}
        fams = families(hyp_k, post_hoc)  # this look's families: every reader below is handed them
        looks.append(
            evaluation.evaluate(
                hyp_k,
                collected.table,
                str(hyp_path),
                collected.failed_seeds,
                runs_dir=out_dir / "runs",
                fams=fams,
            )
        )
        seeds_at.append(len(seeds))
        if plan is None:
            return _Looked(merged, collected, looks[-1], status, None)
        results = decide_sequential(hyp_k, looks, seeds_at, plan.max_seeds, fams, plan.spending)
        stop = _decided(results, fams)
        log(
            f"look {k + 1}: {len(seeds)} seeds, {'every confirmatory claim decided' if stop else 'undecided'}"
        )
        if stop or k == len(schedule) - 1:
            break
    assert plan is not None  # without a plan the loop returns at its first look
    summary = {
        **plan.as_dict(),
        "looks": looks_spent(hyp_k, results, seeds_at, plan.max_seeds, fams, plan.spending),
        "stopped_at": seeds_at[-1],
        "stopped_because": "every confirmatory claim decided" if stop else "the maximum number of seeds",
    }
    return _Looked(merged, collected, results, status, summary)


def run_study(
    hyp: Hypothesis,
    hyp_path: Path,
    out_dir: Path,
    opts: stages.RunOptions | None = None,
    sequential: SequentialPlan | None = None,
    log: Callable[[str], None] = print,
) -> StudyOutcome:
    """Run (or reuse) every planned run, then test the claims. See the module docstring.

    Args:
        opts: workers, ``force``, tracking, report, the command line and where runs execute
            (``stages.RunOptions``, from ``run``'s flags; default: its defaults).
        sequential: add seeds until the claims are decided (``run --until-decided``).
        log: where progress lines go.
    """
    out_dir, opts = Path(out_dir), opts or stages.RunOptions()
    # Ctrl-C / SIGTERM stop the workers and mark the parent KILLED; a full disk stops the study (exit 2)
    with stopping_cleanly(store_path(out_dir) if opts.track else None):
        return _run_study(hyp, hyp_path, out_dir, opts, sequential, log)


def _run_study(hyp, hyp_path, out_dir: Path, opts: stages.RunOptions, sequential, log) -> StudyOutcome:
    """:func:`run_study` inside :func:`study.pipeline.stopping.stopping_cleanly`."""
    runs_dir, data_dir, study_dir = out_dir / "runs", out_dir / "data", out_dir / "studies" / hyp.name
    # each look's seeds, resolved once; a bad plan stops the study before anything is written
    schedule = seed_schedule(hyp.design.seeds, sequential)
    asked = rerun.Asked(opts.track, opts.report, opts.log_model, opts.command)
    planned = None
    if sequential is None and not opts.force and opts.new_registration is None:
        same, planned = _unchanged_rerun(hyp, hyp_path, out_dir, study_dir, asked, log)
        if same is not None:
            return same
    check_hypothesis(hyp, str(hyp_path), out_dir)  # what would stop the study later stops it now
    (study_dir / rerun.STAMP).unlink(missing_ok=True)  # stamped again only when this run finishes
    # bad data paths or imports stop the study before anything is written or recorded; on-disk
    # fingerprints are recorded for hosts without the data. The plan is made once: the rerun check's
    # (when it planned) is this one, and it is the first look's
    if planned is None:
        planned = run_triage.plan(hyp, data_dir, record=True, log=log)
    run_triage.check_inputs(planned, runs_dir, opts.force)
    plan = sequential.as_dict() if sequential else None
    if opts.new_registration is not None:  # only now: every input check above has passed
        registration.start_new(study_dir, opts.new_registration)
    registration.check_binding(study_dir, hyp, plan)
    run_triage.record_fingerprints(planned, data_dir)
    with open_tracker(opts.track, out_dir, hyp.name, opts.log_model) as tracker:
        # what the study declares is recorded before anything is trained (post hoc is decided here)
        reg = registration.register(study_dir, hyp, plan, runs=(planned, runs_dir), force=opts.force)
        looked = _run_looks(hyp, hyp_path, out_dir, tracker, sequential, schedule, planned, opts, log, reg)
        status, seq = looked.status, looked.sequential
        for r in looked.results:
            r.registration = status[r.name]
        final_hyp = with_seeds(hyp, sorted({s.seed for s in looked.runs.specs})) if sequential else hyp
        design = registration.design_hash(hyp.design)
        tracker.log_registration(
            (design, reg["designs"][design]["registered_at"]), [(c.name, status[c.name]) for c in hyp.claims]
        )
        if seq:
            tracker.set_tag(
                "sequential",
                f"{len(seq['looks'])} looks, stopped at {seq['stopped_at']} seeds: {seq['stopped_because']}",
            )
        out = outputs.Outcome(
            hyp_path, looked.runs, looked.collected.table, looked.results, opts.command, list(hyp.claims)
        )
        done = _finish(final_hyp, study_dir, runs_dir, out, seq, tracker, opts.report, log)
    if sequential is None and not done.failed:  # every run finished: an unchanged rerun reads this back
        keys = [s.key for s in looked.runs.specs]
        rerun.stamp(study_dir, rerun.digest(hyp, hyp_path, keys, out_dir, study_dir, asked), asked)
    return done


def _unchanged_rerun(
    hyp: Hypothesis, hyp_path: Path, out_dir: Path, study_dir: Path, asked: rerun.Asked, log
) -> tuple[StudyOutcome | None, list | None]:
    """The outcome of a rerun that nothing new would change (``study.rerun``), read from the study
    folder, or None when anything changed (then the full path runs, its checks first); and the study's
    plan when it was made here (None: not made, or it failed, for the full path to report)."""
    from vitstudy_core.errors import StudyError

    specs = None
    try:  # an output folder or a plan that fails is the full path's to report, in its checks' order
        if not (study_dir / rerun.STAMP).is_file():
            return None, None
        specs = run_triage.plan(hyp, out_dir / "data", record=True, log=log)
        keys = [s.key for s in specs]
        now = rerun.digest(hyp, hyp_path, keys, out_dir, study_dir, asked)
    except (StudyError, OSError):
        return None, specs
    if not rerun.unchanged(study_dir, now, asked):
        return None, specs
    registration.check_binding(study_dir, hyp, None)
    log(f"study {hyp.name}: {count(len(keys), 'run')} planned, {len(keys)} reused, 0 to train")
    log(
        "unchanged since the last run (claims, runs, code and outputs): verdicts read from "
        f"{study_dir / 'verdicts.json'}; nothing recomputed, nothing new for MLflow"
    )
    report = study_dir / "report.html"
    outcome = StudyOutcome(
        [],
        pd.DataFrame(),
        study_dir,
        [],
        keys,
        {},
        dict.fromkeys(keys, "local"),
        report if asked.report and report.is_file() else None,
        unchanged=True,
    )
    return outcome, specs


def _finish(
    hyp: Hypothesis,
    study_dir: Path,
    runs_dir: Path,
    out: outputs.Outcome,
    seq: dict | None,
    tracker: TrackerProtocol,
    report: bool,
    log,
) -> StudyOutcome:
    """Write outputs and the report, log the results; the :class:`StudyOutcome`."""
    extra = {"sequential": seq} if seq else {}
    report_paths = []
    # one invocation writes the study folder at a time, so the temporary files of a killed writer can be
    # removed without touching a live one's
    with file_lock(study_dir.parent / f"{study_dir.name}.lock"):
        remove_temporaries(study_dir)
        paths = outputs.write_outputs(study_dir, out, {"hypothesis": study_dir.name, **extra})
        if report:
            report_paths = outputs.write_study_report(
                study_dir, hyp, out, runs_dir, seq
            )  # the CLI prints it last
    tracker.log_seed_aggregates(list(hyp.claims), out.table)  # the study-level curves in MLflow's views
    summary = f"**{hyp.name}**: {hyp.description}\n\n```\n{format_verdicts(out.results)}\n```"
    tracker.log_results(
        [paths["table"], paths["verdicts"], paths["text"], *report_paths], out.results, summary
    )
    runs = out.runs
    return StudyOutcome(
        out.results,
        out.table,
        study_dir,
        [s.key for s in runs.tri.todo],
        [s.key for s in runs.specs if s.key in runs.tri.reused_from],
        runs.failed,
        runs.tri.reused_from,
        report_paths[0] if report_paths else None,
        seq,
    )
