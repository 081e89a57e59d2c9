"""Orchestration: plan -> (reuse or train) runs -> tidy table -> verdicts -> files + MLflow.

Output folder layout (``--out``, default ``study_results``)::

    data/                      generated datasets (cached .npz), decoded on-disk datasets (.npy maps)
    data/fingerprints.json     the content fingerprint each on-disk dataset was run with
    runs/<run key>/            one folder per training run (result.json marks it finished)
    studies/<name>/            table.parquet, verdicts.json, verdicts.txt, hypothesis.yaml
    mlflow.db, mlartifacts/    the embedded MLflow store (unless MLFLOW_TRACKING_URI is set)

A run whose folder holds a finished ``result.json`` is reused, never retrained (``force`` retrains);
so is a finished run found in the MLflow store by its key (its artifacts are downloaded into
``runs/<key>/`` first), e.g. one trained by another hypothesis file over the same design. A store
artifact that is missing or corrupt stops the study with one line naming the run and the artifact
(``--force`` retrains instead). An interrupted run resumes from its last complete epoch. At the end,
``studies/<name>/report.html`` and ``report.md`` are written (``analysis.report``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.table import load_scalars, make_table, rows_from_spectra, save_table
from analysis.verdicts import ClaimResult, evaluate_claims, format_verdicts
from runners.data import load_split
from study.errors import StudyError
from study.planner import RunSpec, plan_runs
from study.schema import Hypothesis


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


def read_run(run_dir: Path) -> dict | None:
    """The run's result.json if the run ended (finished or failed), else None."""
    path = run_dir / "result.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_rows(spec: RunSpec, run_dir: Path, layers: list[str]) -> pd.DataFrame:
    """Tidy rows of one finished run from its saved files only (spectra.npz, scalars.json, result.json)."""
    result = read_run(run_dir)
    with np.load(run_dir / "spectra.npz") as f:
        spectra = {k: f[k] for k in f.files}
    return pd.DataFrame(
        rows_from_spectra(
            spec.key,
            spec.dataset["name"],
            spec.seed,
            spectra,
            layers,
            result.get("n_tokens"),
            scalars=load_scalars(run_dir / "scalars.json"),
        )
    )


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _rows_or_error(spec: RunSpec, run_dir: Path, layers: list[str]) -> pd.DataFrame:
    """``run_rows`` with a one-line error naming the run and the artifact when its spectra are unreadable."""
    try:
        return run_rows(spec, run_dir, layers)
    except Exception as exc:  # noqa: BLE001 - a missing/truncated npz surfaces as many exception types
        raise StudyError(
            f"run {spec.label} (key {spec.key}): artifact spectra.npz is missing or corrupt "
            f"({type(exc).__name__}: {exc}); rerun with --force to retrain it",
            str(run_dir / "spectra.npz"),
        ) from None


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
    """Run (or reuse) every planned training run, then test the claims. See the module docstring.

    Args:
        log_model: log weight files of newly trained runs to MLflow (off: ~88 MB per ViT-S seed).
        report: write ``report.html``/``report.md`` into the study folder (and log them to MLflow).
        command: the command line that started this, recorded in MLflow and the report.
    """
    from runners.datasets import check_dataset_folder, fingerprint_record_key, recorded_fingerprints

    out_dir = Path(out_dir)
    runs_dir, data_dir = out_dir / "runs", out_dir / "data"
    layers = hyp.design.layers
    for ds in hyp.design.datasets:  # bad data paths stop the study before anything is written
        check_dataset_folder(ds.model_dump())
    before = recorded_fingerprints(data_dir)
    plan = plan_runs(hyp, data_dir, record=True)  # on-disk fingerprints recorded for hosts without the data
    for s in {s.dataset["name"]: s for s in plan if "path" in s.dataset}.values():
        old = before.get(fingerprint_record_key(s.dataset), {}).get("fingerprint")
        if old and old != s.dataset["fingerprint"]:
            log(
                f"data {s.dataset['name']}: the folder's content changed since it was recorded "
                f"(fingerprint {old} -> {s.dataset['fingerprint']}): its runs get new keys"
            )

    tracker = None
    stored: dict[str, object] = {}
    if track:
        from study.tracking import Tracker

        tracker = Tracker(out_dir, hyp.name, log_model=log_model)
        if not force:
            stored = tracker.finished_runs()

    todo: list[RunSpec] = []
    reused: list[str] = []
    reused_from: dict[str, str] = {}
    for spec in plan:
        run_dir = runs_dir / spec.key
        if force and run_dir.exists():
            shutil.rmtree(run_dir)
        result = read_run(run_dir)
        if result is not None and result.get("status") == "finished":
            reused.append(spec.key)
            reused_from[spec.key] = "local"
        elif spec.key in stored:
            if run_dir.exists():  # a partial or failed local attempt; the store has the finished run
                shutil.rmtree(run_dir)
            tracker.fetch_run(stored[spec.key], spec, run_dir)
            reused.append(spec.key)
            reused_from[spec.key] = f"mlflow:{stored[spec.key].info.run_id}"
        else:
            if result is not None:  # a failed run is tried again from scratch
                shutil.rmtree(run_dir)
            todo.append(spec)
    log(f"study {hyp.name}: {len(plan)} runs planned, {len(reused)} reused, {len(todo)} to train")
    for spec in plan:
        if spec.key in reused_from:
            src = reused_from[spec.key]
            where = "runs/ folder" if src == "local" else f"MLflow run {src.split(':', 1)[1]}"
            log(f"  reused {spec.label} (key {spec.key}, from {where})")

    # generate each dataset once, here, so parallel workers only read the cache
    for ds in {json.dumps(s.dataset, sort_keys=True): s for s in todo}.values():
        t0 = time.perf_counter()
        for split in ("train", "test"):
            load_split(ds.dataset, split, data_dir)
        load_split(ds.dataset, "probe", data_dir, ds.probe["size"], ds.probe["seed"])
        log(f"data {ds.dataset['name']}: ready ({time.perf_counter() - t0:.1f}s)")

    if tracker:
        tracker.__enter__()
        tracker.log_study(hyp, hyp_path, plan, command=command)
        tracker.log_reused(
            [
                {
                    "key": s.key,
                    "label": s.label,
                    "source": reused_from[s.key].split(":")[0],
                    "mlflow_run_id": stored[s.key].info.run_id if s.key in stored else None,
                }
                for s in plan
                if s.key in reused_from
            ]
        )
    try:
        failed: dict[str, str] = {}
        executor, jobs = None, []
        if todo:  # torch is imported only when something is trained: a cached rerun stays quick
            from runners.executors import make_executor
            from runners.jobs import execute_run
            from runners.train import pick_device

            executor = make_executor(workers, len(todo), cuda=pick_device().type == "cuda")
            jobs = [(s.model_dump(), str(runs_dir / s.key), str(data_dir)) for s in todo]
        t0 = time.perf_counter()
        for i, result, exc in executor.map_jobs(execute_run, jobs) if executor else []:
            spec = todo[i]
            if exc is not None:
                failed[spec.key] = f"{type(exc).__name__}: {exc}"
                log(f"[{spec.label}] FAILED: {failed[spec.key]}")
                continue
            if result["status"] != "finished":
                failed[spec.key] = f"failed at epoch {result.get('failed_epoch')}: {result.get('error')}"
            log(f"[{spec.label}] {result['status']} ({time.perf_counter() - t0:.0f}s since start)")

        frames, failed_seeds = [], {}
        for spec in plan:
            run_dir = runs_dir / spec.key
            result = read_run(run_dir)
            if spec.key in failed or result is None or result.get("status") != "finished":
                reason = failed.get(spec.key, "run did not finish")
                failed_seeds.setdefault(spec.dataset["name"], {})[spec.seed] = reason
                if tracker and result is not None:
                    tracker.log_training_run(spec, result, pd.DataFrame(columns=["value"]), run_dir=run_dir)
                continue
            rows = _rows_or_error(spec, run_dir, layers)
            frames.append(rows)
            if tracker and spec.key not in reused:
                tracker.log_training_run(spec, result, rows, reused=False, run_dir=run_dir)
        table = make_table(pd.concat(frames, ignore_index=True) if frames else [])
        results = evaluate_claims(hyp, table, source=str(hyp_path), failed=failed_seeds)

        study_dir = out_dir / "studies" / hyp.name
        study_dir.mkdir(parents=True, exist_ok=True)
        table_path = save_table(table, study_dir / "table.parquet")
        verdicts_path = study_dir / "verdicts.json"
        payload = {
            "hypothesis": hyp.name,
            "file": str(hyp_path),
            "runs": [s.key for s in plan],
            "labels": {s.key: s.label for s in plan},
            "reused": reused,
            "reused_from": reused_from,
            "failed": failed,
            "command": command,
            "claims": [r.to_dict() for r in results],
        }
        _atomic_write(verdicts_path, json.dumps(payload, indent=1, default=float))
        text_path = study_dir / "verdicts.txt"
        _atomic_write(text_path, format_verdicts(results) + "\n")
        shutil.copyfile(hyp_path, study_dir / "hypothesis.yaml")
        report_paths: list[Path] = []
        if report:
            from analysis.report import write_report

            t0 = time.perf_counter()
            report_paths = list(write_report(study_dir, runs_dir=runs_dir, command=command))
            log(f"report: {report_paths[0]} ({time.perf_counter() - t0:.1f}s)")
        if tracker:
            summary = f"**{hyp.name}**: {hyp.description}\n\n```\n{format_verdicts(results)}\n```"
            tracker.log_results([table_path, verdicts_path, text_path, *report_paths], results, summary)
    except BaseException as exc:
        if tracker and tracker.parent_id:
            tracker.__exit__(type(exc), exc, None)
        raise
    if tracker:
        tracker.__exit__(None, None, None)
    return StudyOutcome(
        results,
        table,
        study_dir,
        [s.key for s in todo],
        reused,
        failed,
        reused_from,
        report_paths[0] if report_paths else None,
    )
