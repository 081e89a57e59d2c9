"""``python -m study doctor [--out DIR] [--repair]``: check an output folder and its tracking store.

Findings, and what ``--repair`` does about each:

* ``orphan``: a run folder no study's hypothesis plans (report only: it may belong to a file elsewhere);
* ``stale_partial``: an unfinished run folder whose lock no live process holds (its lock file is
  deleted; the folder stays and resumes on the next run);
* ``stale_parent``: a RUNNING parent run whose invocation is dead (marked KILLED, with its RUNNING
  children);
* ``missing_artifacts``: a FINISHED child run lacking an artifact a reuse needs (deleted from the store,
  so the next run logs its local folder or retrains);
* ``duplicate``: several FINISHED child runs with one ``run_key`` (all but the newest deleted);
* ``table_mismatch``: a study's ``table.parquet`` that differs from the table rebuilt from its runs
  (rebuilt with ``stages.collect_table``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from vitstudy_core.errors import StudyError
from vitstudy_core.locks import is_locked, run_lock_path
from vitstudy_core.runfolder import RunFolder


@dataclass
class Finding:
    kind: str
    what: str
    repaired: bool = False
    repairable: bool = True

    def line(self) -> str:
        state = "repaired" if self.repaired else ("report only" if not self.repairable else "found")
        return f"{self.kind:18s} {self.what} [{state}]"


def _studies(out_dir: Path) -> list[tuple[Path, object]]:
    """(study folder, its Hypothesis) for every study with a readable hypothesis.yaml."""
    from study.schema import load_hypothesis

    found = []
    for hyp_file in sorted((out_dir / "studies").glob("*/hypothesis.yaml")):
        try:
            found.append((hyp_file.parent, load_hypothesis(hyp_file)))
        except StudyError:
            continue
    return found


def check_runs(out_dir: Path, studies, repair: bool) -> list[Finding]:
    """Orphaned run folders and stale partial runs under ``out_dir/runs``."""
    from study.stages import plan

    runs_dir = out_dir / "runs"
    planned = {s.key for _, hyp in studies for s in plan(hyp)}
    out = []
    for path in sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []:
        if path.name not in planned:
            out.append(Finding("orphan", f"run folder {path} (no study here plans it)", repairable=False))
        lock = run_lock_path(runs_dir, path.name)
        if not RunFolder(path).is_finished() and not is_locked(lock):
            # the folder resumes on the next run; only a dead holder's lock file is left to remove
            f = Finding(
                "stale_partial", f"unfinished run {path} with no live process", repairable=lock.exists()
            )
            if repair and lock.exists():
                lock.unlink(missing_ok=True)
                f.repaired = True
            out.append(f)
    return out


def check_store(out_dir: Path, repair: bool) -> list[Finding]:
    """Stale parents, child runs missing artifacts, and run keys recorded twice in the tracking store."""
    from mlflow.tracking import MlflowClient

    from study.tracking import default_tracking_uri, quiet_library_logs, stale_parents, training_runs
    from vitstudy_core.runfolder import REQUIRED

    uri = default_tracking_uri(out_dir)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return []
    quiet_library_logs()
    client = MlflowClient(uri)
    out = []
    for r in stale_parents(client, out_dir):
        out.append(Finding("stale_parent", f"MLflow run {r.info.run_id} RUNNING, its invocation is dead"))
    if repair and any(f.kind == "stale_parent" for f in out):
        from study.tracking import close_stale

        close_stale(client, out_dir)
        for f in out:
            f.repaired = True
    seen: dict[str, str] = {}
    for r in training_runs(client):  # newest first: the first of a key is kept
        key, rid = r.data.tags.get("run_key", "?"), r.info.run_id
        if key in seen:
            f = Finding("duplicate", f"run key {key}: MLflow run {rid} repeats {seen[key]}")
        else:
            listed = {a.path for a in client.list_artifacts(rid)}
            missing = [n for n in REQUIRED if n not in listed]
            if not missing:
                seen[key] = rid
                continue
            f = Finding("missing_artifacts", f"MLflow run {rid} (key {key}) lacks {', '.join(missing)}")
        if repair:
            client.delete_run(rid)
            f.repaired = True
        out.append(f)
    return out


def check_tables(out_dir: Path, studies, repair: bool) -> list[Finding]:
    """Each study's table.parquet against the table rebuilt from its run folders."""
    from analysis.table import save_table
    from study.stages import collect_table, plan

    out = []
    for study_dir, hyp in studies:
        path = study_dir / "table.parquet"
        rebuilt = collect_table(plan(hyp), out_dir / "runs", hyp.design.layers).table
        try:
            saved = pd.read_parquet(path)
            pd.testing.assert_frame_equal(
                saved.reset_index(drop=True), rebuilt.reset_index(drop=True), check_dtype=False
            )
            continue
        except Exception as exc:  # noqa: BLE001 - unreadable, missing or different: all are a mismatch
            f = Finding("table_mismatch", f"{path} differs from its runs ({type(exc).__name__})")
        if repair:
            save_table(rebuilt, path)
            f.repaired = True
        out.append(f)
    return out


def doctor(out_dir: Path, repair: bool = False, log=print) -> int:
    """Check (and with ``repair`` fix) ``out_dir``; print one line per finding.

    Returns:
        0 when nothing repairable is left unrepaired, 1 otherwise.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise StudyError("expected the output folder of `python -m study run`", str(out_dir), "--out")
    studies = _studies(out_dir)
    findings = [
        *check_runs(out_dir, studies, repair),
        *check_store(out_dir, repair),
        *check_tables(out_dir, studies, repair),
    ]
    for f in findings:
        log(f.line())
    left = [f for f in findings if f.repairable and not f.repaired]
    log(f"doctor: {len(findings)} finding(s), {sum(f.repaired for f in findings)} repaired, {len(left)} left")
    return 1 if left else 0
