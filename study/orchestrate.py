"""``python -m study run``: the stages of ``study.stages`` in order, with the tracker around them.

    plan -> triage (finished here / finished in the store / to do) -> prepare data -> execute
      -> collect the table -> evaluate -> write outputs and the report -> log results

A finished run is never trained again (``force`` retrains); a run finished in the MLflow store (e.g. by
another hypothesis file over the same design) is downloaded instead; an interrupted run resumes from its
last complete epoch. A store artifact that is missing or corrupt stops the study with one line naming
the run and the artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.verdicts import ClaimResult, format_verdicts
from core.locks import file_lock
from study import stages
from study.preflight import check_hypothesis
from study.schema import Hypothesis
from study.tracking import open_tracker


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


def _log_triage(log: Callable[[str], None], hyp: Hypothesis, specs, tri: stages.Triage) -> None:
    reused = tri.reused_from
    log(f"study {hyp.name}: {len(specs)} runs planned, {len(reused)} reused, {len(tri.todo)} to train")
    for spec in specs:
        if spec.key in reused:
            src = reused[spec.key]
            where = "runs/ folder" if src == "local" else f"MLflow run {src.split(':', 1)[1]}"
            log(f"  reused {spec.label} (key {spec.key}, from {where})")


def run_study(
    hyp: Hypothesis,
    hyp_path: Path,
    out_dir: Path,
    workers: int | str = "auto",
    force: bool = False,
    log: Callable[[str], None] = print,
    track: bool = True,
    log_model: bool = False,
    report: bool = True,
    command: str | None = None,
) -> StudyOutcome:
    """Run (or reuse) every planned run, then test the claims. See the module docstring.

    Args:
        log_model: log weight files of newly trained runs to MLflow (off: ~88 MB per ViT-S seed).
        report: write ``report.html``/``report.md`` into the study folder (and log them to MLflow).
        command: the command line that started this, recorded in MLflow and the report.
    """
    from runners.datasets import check_dataset_folder

    out_dir = Path(out_dir)
    runs_dir, data_dir, study_dir = out_dir / "runs", out_dir / "data", out_dir / "studies" / hyp.name
    specs = stages.plan(hyp)
    check_hypothesis(hyp, str(hyp_path), out_dir)  # what would stop the study later stops it now
    for ds in hyp.design.datasets:  # bad data paths stop the study before anything is written
        check_dataset_folder(ds.model_dump())
    with open_tracker(track, out_dir, hyp.name, log_model) as tracker:
        tri = stages.triage(specs, runs_dir, {} if force else tracker.finished_runs(), force)
        stages.fetch_stored(tri, specs, runs_dir, tracker)
        stages.clear_for_training(tri.todo, runs_dir, force)
        _log_triage(log, hyp, specs, tri)
        data = stages.prepare_data(tri.todo, data_dir, log)
        tracker.log_study(hyp, hyp_path, specs, tri, command)
        layers = hyp.design.layers

        def log_ended(spec, result) -> None:  # each run reaches the store as it ends, not at the end
            ds = data.get(stages.dataset_key(spec.dataset))
            stages.log_run(tracker, spec, runs_dir, layers, ds, again=force)

        failed = stages.execute(tri.todo, runs_dir, data_dir, workers, log, on_result=log_ended)
        # finished runs the store lacks (their invocation died before logging them) are logged now
        stages.log_missing(tracker, specs, runs_dir, layers, data)
        collected = stages.collect_table(specs, runs_dir, layers, failed)
        results = stages.evaluate(hyp, collected.table, str(hyp_path), collected.failed_seeds)
        report_paths = []
        # one invocation writes the study folder at a time, so the temporary files of a killed writer
        # can be removed without touching a live one's
        with file_lock(study_dir.parent / f"{hyp.name}.lock"):
            stages.remove_temporaries(study_dir)
            paths = stages.write_outputs(
                study_dir, hyp_path, specs, tri, failed, collected.table, results, command
            )
            if report:
                report_paths = stages.write_study_report(
                    study_dir, hyp, results, collected.table, runs_dir, specs, tri, failed, hyp_path, command
                )
                log(f"report: {report_paths[0]}")
        summary = f"**{hyp.name}**: {hyp.description}\n\n```\n{format_verdicts(results)}\n```"
        tracker.log_results(
            [paths["table"], paths["verdicts"], paths["text"], *report_paths], results, summary
        )
    return StudyOutcome(
        results,
        collected.table,
        study_dir,
        [s.key for s in tri.todo],
        [s.key for s in specs if s.key in tri.reused_from],
        failed,
        tri.reused_from,
        report_paths[0] if report_paths else None,
    )
