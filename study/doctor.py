"""``python -m study doctor [--out DIR] [--repair]``: check an output folder and its tracking store.

Findings, and what ``--repair`` does about each:

* ``orphan``: a run folder that no study's hypothesis plans and no sweep's trial needs (report only: it
  may belong to a file elsewhere);
* ``stale_partial``: an unfinished run folder whose lock no live process holds (its lock file is
  deleted; the folder stays and resumes on the next run);
* ``moved_store``: an experiment whose artifact location lies outside ``<out>/mlartifacts``: the folder
  was copied or moved, and ``run`` refuses to log into it (report only: move the folder back, or move
  ``mlflow.db`` and ``mlartifacts`` aside for a fresh store);
* ``stale_parent``: a RUNNING parent run whose invocation is dead (marked KILLED, with its RUNNING
  children);
* ``missing_artifacts``: a FINISHED child run lacking an artifact a reuse needs (deleted from the store,
  so the next run logs its local folder or retrains);
* ``duplicate``: several FINISHED child runs with one ``run_key`` from one output folder (tag
  ``study.out``; all but the newest deleted): two folders sharing a store each keep their own copy;
* ``superseded_child``: a KILLED child run (an invocation stopped while logging it) whose ``run_key``
  has a FINISHED child: a partial copy of that run (deleted, as ``run`` deletes it once it logs the
  FINISHED one: ``study.tracking._write.RunWriter._retire_superseded``);
* ``damaged_run``: a run folder whose ``result.json``, ``spectra.npz``, ``rows.parquet`` or
  ``scalars.json`` cannot be read (e.g. truncated; ``vitstudy_core.runfolder.RunFolder.damage``):
  restored from the tracking store's FINISHED copy of its key when there is one (downloaded and checked
  before anything is replaced), else report only (the next ``run`` retrains that run alone);
* ``running_child``: a RUNNING child run whose parent is no longer RUNNING (marked KILLED);
* ``missing_child``: a finished run folder of a study or a sweep's trial that the tracking store holds no
  FINISHED child run of (e.g. its invocation was killed while logging it; report only: the next ``run``
  of its study, or ``sweep`` that runs its trial, logs it);
* ``untagged_child``: a child (training) run without its ``run_key`` tag: no study can ever reuse it
  (deleted from the store);
* ``table_mismatch``: a study's ``table.parquet`` that differs from the table rebuilt from its runs
  (rebuilt with ``stages.collect_table``), unless the rebuilt table would hold fewer runs than the saved
  table or ``verdicts.json``: a table is never shrunk (report only: rerun ``run`` to retrain the missing
  runs, which rewrites table and verdicts together).

Every check runs, and every finding is printed, before ``--repair`` changes anything: a check that fails
on a damaged file reports it instead of stopping the others.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from vitstudy_core.errors import StudyError
from vitstudy_core.locks import is_locked, run_lock_path
from vitstudy_core.runfolder import RunFolder

if TYPE_CHECKING:
    from study.schema import Hypothesis


@dataclass
class Finding:
    kind: str
    what: str
    repaired: bool = False
    repairable: bool = True
    fix: Callable[[], object] | None = field(
        default=None, repr=False
    )  # run only by --repair, after the report
    path: Path | None = None  # the run folder a finding is about, where it is about one

    def line(self) -> str:
        state = "repaired" if self.repaired else ("report only" if not self.repairable else "found")
        return f"{self.kind:18s} {self.what} [{state}]"


def _studies(out_dir: Path) -> list[tuple[Path, Hypothesis]]:
    """(study folder, its Hypothesis) for every study with a readable hypothesis.yaml."""
    from study.schema import load_hypothesis

    found = []
    for hyp_file in sorted((out_dir / "studies").glob("*/hypothesis.yaml")):
        try:
            found.append((hyp_file.parent, load_hypothesis(hyp_file)))
        except StudyError:
            continue
    return found


def _sweeps(out_dir: Path) -> list[tuple[Path, Hypothesis | None]]:
    """(sweep folder, its Hypothesis or None) for every folder under ``sweeps/``: a sweep killed before
    its first outputs has its journal but no ``hypothesis.yaml`` yet."""
    from study.schema import load_hypothesis

    found: list[tuple[Path, Hypothesis | None]] = []
    for sweep_dir in sorted(p for p in (out_dir / "sweeps").glob("*") if p.is_dir()):
        try:
            found.append((sweep_dir, load_hypothesis(sweep_dir / "hypothesis.yaml")))
        except StudyError:
            found.append((sweep_dir, None))
    return found


def _sweep_trials(sweep_dir: Path, hyp) -> list:
    """The trials of a sweep's optuna study (the file's ``sweep.storage``, else the folder's journal)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if hyp is not None and hyp.sweep.storage:
        storage = optuna.storages.get_storage(hyp.sweep.storage)
    else:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        if not (sweep_dir / "journal.log").is_file():
            raise FileNotFoundError(sweep_dir / "journal.log")
        storage = JournalStorage(JournalFileBackend(str(sweep_dir / "journal.log")))
    return optuna.load_study(study_name=sweep_dir.name, storage=storage).trials


def _trial_runs(out_dir: Path, sweep_dir: Path, hyp) -> dict[str, object | None]:
    """Run key -> RunSpec (None where the sweep's file is not at hand) of every trial a sweep asked: each
    trial's ``run_keys`` (recorded when it is asked) or, with the file, its knob values' runs; from
    ``trials.csv`` when the optuna study cannot be read."""
    from study.sweep.trials import trial_point

    try:
        trials = [
            (t.number, t.params, t.user_attrs.get("run_keys") or []) for t in _sweep_trials(sweep_dir, hyp)
        ]
    except Exception:  # noqa: BLE001 - an unreadable journal: the trial table still names the runs
        try:
            table = pd.read_csv(sweep_dir / "trials.csv")
            return {str(k): None for k in table.run_key.dropna()}
        except (OSError, ValueError, AttributeError):
            return {}
    found: dict[str, object | None] = {}
    for number, params, keys in trials:
        found.update({str(k): None for k in keys})
        if hyp is not None and params:
            found.update({s.key: s for s in trial_point(hyp, number, params, out_dir / "data").specs})
    return found


def planned_runs(out_dir: Path, studies, sweeps=()) -> dict[str, object | None]:
    """Run key -> RunSpec (None: known by key only) of every run the studies plan and the sweeps' trials
    need (``sweeps``: :func:`_sweeps`)."""
    from study.pipeline.triage import plan

    planned: dict[str, object | None] = {}
    for sweep_dir, hyp in sweeps:
        planned.update(_trial_runs(out_dir, sweep_dir, hyp))
    planned.update({s.key: s for _, hyp in studies for s in plan(hyp)})
    return planned


def check_runs(out_dir: Path, studies, repair: bool = False, planned: dict | None = None) -> list[Finding]:
    """Orphaned run folders, damaged run folders and stale partial runs under ``out_dir/runs``
    (``planned``: :func:`planned_runs`, by default the studies' runs alone)."""
    runs_dir = out_dir / "runs"
    planned = planned if planned is not None else planned_runs(out_dir, studies)
    out = []
    for path in sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []:
        if path.name not in planned:
            what = f"run folder {path} (no study here plans it, no sweep's trial needs it)"
            out.append(Finding("orphan", what, repairable=False))
        why = RunFolder(path).damage()
        if why is not None:
            out.append(Finding("damaged_run", f"run folder {path}: {why}", repairable=False, path=path))
            continue
        lock = run_lock_path(runs_dir, path.name)
        if not RunFolder(path).is_finished() and not is_locked(lock):
            # the folder resumes on the next run; only a dead holder's lock file is left to remove
            out.append(
                Finding(
                    "stale_partial",
                    f"unfinished run {path} with no live process",
                    repairable=lock.exists(),
                    fix=functools.partial(lock.unlink, missing_ok=True),
                )
            )
    return out


def _restore_from_store(findings: list[Finding], client, uri: str, specs: dict) -> None:
    """Give each ``damaged_run`` with a FINISHED copy in the store a fix that downloads that copy
    (``specs``: :func:`planned_runs`)."""
    from study.tracking.reuse import StoredRuns

    for f in findings:
        if f.kind != "damaged_run":
            continue
        path = f.path
        if path is None:  # every damaged_run names its folder
            continue
        copies = [r for r in _children(client, "FINISHED") if r.data.tags.get("run_key") == path.name]
        if copies and specs.get(path.name) is not None:
            f.what += f" (the store holds a copy: MLflow run {copies[0].info.run_id})"
            f.repairable = True
            f.fix = lambda r=copies[0], s=specs[path.name], d=path: StoredRuns(client, uri).fetch_run(r, s, d)


def check_logged(out_dir: Path, client, planned: dict) -> list[Finding]:
    """Finished run folders of planned runs whose key has no FINISHED child run in the store."""
    stored = {r.data.tags.get("run_key") for r in _children(client, "FINISHED")}
    out = []
    for key, spec in sorted(planned.items()):
        folder = RunFolder(out_dir / "runs" / key)
        if key not in stored and folder.path.is_dir() and folder.is_finished():
            name = f"run {spec.label} (key {key})" if spec is not None else f"run {key}"
            what = f"{name} finished here, but the tracking store has no finished child run of it"
            out.append(Finding("missing_child", what, repairable=False, path=folder.path))
    return out


def _children(client, status: str) -> list:
    from study.tracking.tracker import training_runs

    return training_runs(client, status)


def _open_store(out_dir: Path):
    from mlflow.tracking import MlflowClient

    from study.tracking.store import default_tracking_uri, quiet_library_logs

    uri = default_tracking_uri(out_dir)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None, uri
    quiet_library_logs()
    try:  # a damaged database fails here, in one line, not in the middle of the report
        client = MlflowClient(uri)
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - sqlite, SQLAlchemy and MLflow errors all mean unreadable
        raise StudyError(
            f"cannot read the tracking store ({type(exc).__name__}: {_first_words(exc)}); "
            "move it aside and `run` starts a fresh one (the run folders are kept and reused)",
            uri,
        ) from None
    return client, uri


def _first_words(exc: Exception) -> str:
    """An exception's message without SQLAlchemy's statement and link (``[SQL: ...]``, background)."""
    return " ".join(str(exc).split("[SQL:")[0].split())[:200]


def check_store(out_dir: Path, client) -> list[Finding]:
    """Stale parents, RUNNING children of ended parents, untagged children, child runs missing artifacts,
    and run keys recorded twice in the tracking store."""
    from study.tracking.store import foreign_artifact_locations
    from study.tracking.tracker import close_stale, stale_parents
    from vitstudy_core.runfolder import REQUIRED

    out = []
    own = not os.environ.get("MLFLOW_TRACKING_URI")  # a store of our own must keep artifacts here
    for name, loc in foreign_artifact_locations(client, out_dir) if own else []:
        what = f"experiment {name!r} keeps its artifacts at {loc}, outside this folder (copied or moved)"
        out.append(Finding("moved_store", what + ": `run` refuses this store", repairable=False))
    for r in stale_parents(client, out_dir):
        out.append(
            Finding(
                "stale_parent",
                f"{r.data.tags.get('study.role', 'study')} parent run {r.info.run_id} (experiment "
                f"{client.get_experiment(r.info.experiment_id).name!r}) RUNNING, its invocation is dead",
                fix=lambda: close_stale(client, out_dir),
            )
        )
    stale = {r.info.run_id for r in stale_parents(client, out_dir)}
    for r in _children(client, "RUNNING"):
        parent = r.data.tags.get("mlflow.parentRunId")
        if parent and parent not in stale and client.get_run(parent).info.status != "RUNNING":
            what = f"MLflow run {r.info.run_id} RUNNING under parent {parent}, which has ended"
            out.append(
                Finding(
                    "running_child",
                    what,
                    fix=functools.partial(client.set_terminated, r.info.run_id, "KILLED"),
                )
            )
    seen: dict[tuple, str] = {}  # (run key, output folder) -> the FINISHED child kept
    first_kept: dict[str, str] = {}  # run key -> the first FINISHED child kept, whatever its folder
    finished: dict[str, str] = {}  # run key -> its newest FINISHED child
    for r in _children(client, "FINISHED"):
        finished.setdefault(r.data.tags.get("run_key"), r.info.run_id)
    for status in ("FINISHED", "RUNNING", "FAILED", "KILLED"):
        for r in _children(client, status):  # newest first: the first of a key is kept
            key, rid = r.data.tags.get("run_key"), r.info.run_id
            if not key:
                what = f"MLflow run {rid} ({status}) has no run_key tag: no study can reuse it"
                out.append(Finding("untagged_child", what, fix=functools.partial(client.delete_run, rid)))
                continue
            if status == "KILLED" and key in finished:
                what = (
                    f"MLflow run {rid} (KILLED) is a partial copy of run key {key}, held by {finished[key]}"
                )
                out.append(Finding("superseded_child", what, fix=functools.partial(client.delete_run, rid)))
                continue
            if status != "FINISHED":
                continue
            copy = (key, r.data.tags.get("study.out"))  # another folder's training is not a repeat
            # a child from before the tag (no ``study.out``) may be any folder's: it repeats any copy of its key
            kept = seen.get(copy) or (first_kept.get(key) if copy[1] is None else None)
            if kept is not None:
                f = Finding("duplicate", f"run key {key}: MLflow run {rid} repeats {kept}")
            else:
                listed = {a.path for a in client.list_artifacts(rid)}
                missing = [n for n in REQUIRED if n not in listed]
                if not missing:
                    seen[copy] = rid
                    first_kept.setdefault(key, rid)
                    continue
                f = Finding("missing_artifacts", f"MLflow run {rid} (key {key}) lacks {', '.join(missing)}")
            f.fix = lambda rid=rid: client.delete_run(rid)
            out.append(f)
    return out


def _runs_in(study_dir: Path, saved: pd.DataFrame | None) -> tuple[int, str]:
    """How many runs the study's outputs say it has (the larger of verdicts.json's runs and the saved
    table's (dataset, seed) pairs), and where that number comes from."""
    n, where = 0, ""
    try:
        runs = json.loads((study_dir / "verdicts.json").read_text()).get("runs") or []
        n, where = len(runs), "verdicts.json"
    except (OSError, ValueError, AttributeError):
        pass
    if saved is not None and {"dataset", "seed"} <= set(saved.columns):
        pairs = len(saved[["dataset", "seed"]].drop_duplicates())
        if pairs > n:
            n, where = pairs, "table.parquet"
    return n, where


def check_tables(out_dir: Path, studies, repair: bool = False) -> list[Finding]:
    """Each study's table.parquet against the table rebuilt from its run folders (never shrunk)."""
    from analysis.table import save_table
    from study.pipeline.tables import collect_table
    from study.pipeline.triage import plan

    out = []
    for study_dir, hyp in studies:
        path = study_dir / "table.parquet"
        try:
            rebuilt = collect_table(plan(hyp), out_dir / "runs", hyp.design.layers).table
        except Exception as exc:  # noqa: BLE001 - a damaged run is reported by check_runs
            out.append(
                Finding("table_mismatch", f"{path}: cannot rebuild ({type(exc).__name__})", repairable=False)
            )
            continue
        saved = None
        try:
            saved = pd.read_parquet(path)
            pd.testing.assert_frame_equal(
                saved.reset_index(drop=True), rebuilt.reset_index(drop=True), check_dtype=False
            )
            continue
        except Exception as exc:  # noqa: BLE001 - unreadable, missing or different: all are a mismatch
            why = type(exc).__name__
        have = len(rebuilt[["dataset", "seed"]].drop_duplicates()) if len(rebuilt) else 0
        need, where = _runs_in(study_dir, saved)
        if have < need:
            what = (
                f"{path} differs from its runs ({why}), but its runs rebuild {have} of the {need} in {where}"
            )
            out.append(
                Finding("table_mismatch", what + ": rerun `run` to retrain the rest", repairable=False)
            )
            continue
        out.append(
            Finding(
                "table_mismatch",
                f"{path} differs from its runs ({why})",
                fix=functools.partial(save_table, rebuilt, path),
            )
        )
    return out


def doctor(out_dir: Path, repair: bool = False, log=print) -> int:
    """Check ``out_dir`` and print one line per finding; with ``repair``, then fix what can be fixed.

    Every check runs and the whole report is printed before anything is changed.

    Returns:
        0 when nothing repairable is left unrepaired, 1 otherwise.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise StudyError("expected the output folder of `python -m study run`", str(out_dir), "--out")
    studies = _studies(out_dir)
    planned = planned_runs(out_dir, studies, _sweeps(out_dir))
    findings = check_runs(out_dir, studies, planned=planned)
    client, uri = _open_store(out_dir)
    if client is not None:
        findings += check_store(out_dir, client)
        findings += check_logged(out_dir, client, planned)
        _restore_from_store(findings, client, uri, planned)
    findings += check_tables(out_dir, studies)
    for f in findings:
        log(f.line())
    if repair:
        _repair(findings, log)
    left = [f for f in findings if f.repairable and not f.repaired]
    log(summary(findings, repair))
    return 1 if left else 0


def summary(findings: list[Finding], repair: bool) -> str:
    """The last line: how many findings, and of them how many were repaired, are reported only (nothing
    for ``--repair`` to do: they are not counted as repaired or as left) and are left to repair."""
    if not findings:
        return "doctor: 0 finding(s)"
    repaired = sum(f.repaired for f in findings)
    reported = sum(not f.repairable for f in findings)
    left = len(findings) - repaired - reported
    hint = " (--repair fixes them)" if left and not repair else ""
    return (
        f"doctor: {len(findings)} finding(s): {repaired} repaired, {reported} report only, "
        f"{left} left to repair{hint}"
    )


def _repair(findings: list[Finding], log) -> None:
    """Run each finding's fix once (a fix shared by several findings, e.g. closing stale parents, once)."""
    todo = [f for f in findings if f.repairable and f.fix]
    log(f"repair: {len(todo)} finding(s) to fix (the report above is complete)")
    done: dict[int, bool] = {}
    for f in todo:
        fix = f.fix
        assert fix is not None  # todo holds the findings with a fix
        key = id(getattr(fix, "__code__", fix)) if f.kind == "stale_parent" else id(f)
        if key not in done:
            try:
                fix()
                done[key] = True
            except Exception as exc:  # noqa: BLE001 - one failed repair must not stop the others
                done[key] = False
                log(f"repair failed: {f.kind} {f.what}: {type(exc).__name__}: {exc}")
        f.repaired = done[key]
        log(f.line())
