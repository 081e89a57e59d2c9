"""The MLflow boundary: ``study/tracking/`` is the only package that talks to MLflow. This module opens the
store and the parent run (:class:`Tracker`, with :class:`NullTracker` for ``--no-mlflow``, both a
:class:`TrackerProtocol`); writing runs is ``study.tracking._write``, reading them back for reuse
``study.tracking.reuse``, cleaning stale runs ``study.tracking.cleanup``.

Layout, chosen to read naturally in the MLflow UI:

* an **experiment** per hypothesis (study) name;
* a **parent run** per invocation: the design as params; tags ``study.host``, ``study.out`` (the output
  folder), ``study.heartbeat`` (renewed while it lives: ``study.tracking.cleanup``), ``git_commit``, ``git_dirty``,
  ``spec_hash`` (sha256 of the hypothesis file), ``command``, ``verdict.N`` per claim and
  ``reused_runs`` (the runs taken from earlier invocations, ``label=key@mlflow_run_id``),
  ``registration.design`` and ``registration.claim.N`` (hash, first registration time and status of
  the design and each claim, ``study.registration``), ``sequential`` (the looks of ``--until-decided``);
  artifacts: the
  hypothesis file, the tidy table, the verdicts, ``reused_runs.json`` and the report
  (``report.html``, ``report.md``); metrics ``claim_N/{effect,ci_low,ci_high,p_value,p_adjusted}``;
  its description (``mlflow.note.content``) is the verdict table;
* a nested **child run** per trained (or imported) model: its spec as params; tags ``run_key``,
  ``study.out``, ``result_sha`` (sha256 of its ``result.json``: which training it records; two output
  folders sharing a store each log their own), ``git_commit``, ``git_dirty``, ``spec_hash`` (sha256 of the run spec); ``train/*`` metrics per epoch and spectral
  metrics named ``{metric}/{token_set}/{layer}`` with step = epoch (names reduced to the characters
  MLflow allows); artifacts ``spectra.npz`` (the eigenvalues), ``result.json`` and, when recorded,
  ``covariances.npz``; the dataset through ``log_inputs`` (a numpy dataset whose digest is the dataset
  spec hash and whose source carries the spec). Model weights only with ``log_model=True``. An imported
  run (``runners.sources``) is tagged ``source.kind``, ``source.path``, ``source.fingerprint``,
  ``source.format`` and ``source.mapping`` or ``source.state_dict_key``; a metric log's run carries
  ``rows.parquet`` (its tidy rows) in place of ``spectra.npz``.

A finished child run is found again by its ``run_key`` tag (searched across experiments), so another
hypothesis file that needs the same run reuses it instead of training again (:meth:`Tracker.fetch_run`).

The default store is embedded and local: ``sqlite:///<out>/mlflow.db`` with artifacts under
``<out>/mlartifacts`` (no server). ``MLFLOW_TRACKING_URI`` overrides it. Telemetry is off. MLflow records
artifact locations as absolute paths, so a copied or moved output folder's store still points into the
original: opening it is refused with one line (``study.tracking.store.refuse_foreign_artifacts``) rather
than writing there. Where the store lives, its locks and that refusal are ``study.tracking.store``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import pandas as pd

from study.tracking._write import RunWriter, sanitize_metric_name
from study.tracking.cleanup import (
    HEARTBEAT_S_TAG,
    HEARTBEAT_TAG,
    OUT_TAG,
    ParentHeartbeat,
    close_stale,
    heartbeat_s,
    parent_lock_path,
    stale_parents,
)
from study.tracking.reuse import (
    RUN_ARTIFACTS_OPTIONAL,
    RUN_ARTIFACTS_REQUIRED,
    StoredRuns,
    active_experiments,
    training_runs,
)
from study.tracking.store import (
    check_home,
    default_tracking_uri,
    experiment_artifact_location,
    quiet_library_logs,
    refuse_foreign_artifacts,
    schema_lock,
    store_lock_path,
    write_home,
)
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.locks import file_lock, hold_lock
from vitstudy_core.provenance import git_state

if TYPE_CHECKING:
    from analysis.verdicts import ClaimResult
    from study.pipeline.triage_state import Triage
    from study.runspecs import RunSpec
    from study.schema import Hypothesis
    from study.tracking.reuse import StoredRun

__all__ = [
    "RUN_ARTIFACTS_OPTIONAL",
    "RUN_ARTIFACTS_REQUIRED",
    "NullTracker",
    "Tracker",
    "TrackerProtocol",
    "active_experiments",
    "close_stale",
    "open_tracker",
    "parent_lock_path",
    "sanitize_metric_name",
    "stale_parents",
    "training_runs",
]

# MLflow 3 opens an experiment on its GenAI overview unless it is marked as model training
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_TAGS = {EXPERIMENT_KIND: "custom_model_development"}
VERBOSE = False  # set by ``--verbose``: let MLflow's and alembic's INFO lines through


class Tracker(RunWriter):
    """Logs one study invocation to MLflow and finds earlier runs by key: the store and the parent run's
    life here, its three roles in parts of their own (writing: ``study.tracking._write.RunWriter``; reading
    back for reuse: ``study.tracking.reuse.StoredRuns``; cleaning stale runs: ``study.tracking.cleanup``).

    Use as a context manager around the invocation (``__enter__`` opens the parent run); the store
    look-ups (:meth:`finished_runs`, :meth:`fetch_run`) work before that.

    Args:
        out_dir: the study output folder (holds the default sqlite store).
        experiment: the experiment name (the hypothesis name).
        log_model: also log weight files a run folder holds (off by default: ~88 MB per ViT-S seed).
    """

    def __init__(self, out_dir: Path, experiment: str, log_model: bool = False, role: str = "study"):
        own = not os.environ.get("MLFLOW_TRACKING_URI")  # a store of our own: this folder's
        home = own and check_home(
            Path(out_dir), experiment
        )  # a copied folder: refused before the store opens
        import mlflow
        from mlflow.tracking import MlflowClient

        self.mlflow = mlflow
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.uri = default_tracking_uri(self.out_dir)
        self.log_model = log_model
        # no mlflow.set_tracking_uri: it also sets MLFLOW_TRACKING_URI in os.environ, which would send
        # every later study in this process (and its subprocesses) to this store; the client is explicit
        quiet_library_logs(VERBOSE)
        # two invocations on a fresh folder would both create the sqlite tables, and two on a store
        # without this experiment would both insert it: one at a time, each getting what the other made
        # on a shared database, invocations of other folders and hosts too (schema_lock)
        with file_lock(store_lock_path(self.out_dir)):
            try:
                with schema_lock(self.uri):
                    self._create_store()
                    self.client = MlflowClient(self.uri)
                    if own and not home:  # no marker yet (a store made before it): the full scan
                        refuse_foreign_artifacts(self.client, self.out_dir, experiment)
                    self.experiment_id = self._get_or_create_experiment(experiment)
                    if own and self.uri.startswith("sqlite:///"):
                        write_home(self.out_dir, experiment)
            except StudyError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bad URI or unreachable store: one line, not a trace
                where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else None
                msg = " ".join(str(exc).split())[:300]
                raise StudyError(
                    f"cannot open the tracking store ({type(exc).__name__}: {msg})", self.uri, where
                ) from None
        self.stored = StoredRuns(self.client, self.uri)
        self.role = role
        self.parent_id: str | None = None
        self._parent_lock: int | None = None
        self._heartbeat: ParentHeartbeat | None = None
        state = git_state()
        self.git_commit = state["git_commit"] or "unknown"
        self.git_dirty = state["git_dirty"]

    def _create_store(self) -> None:
        """Create the default sqlite store under a temporary name, then rename it into place: a kill
        during MLflow's table migrations leaves no half-made ``mlflow.db`` (call under the store lock)."""
        if not self.uri.startswith("sqlite:///"):
            return
        db = Path(self.uri.removeprefix("sqlite:///"))
        for left in db.parent.glob(f".{db.name}.*.creating"):  # a killed creation's leftovers
            left.unlink(missing_ok=True)
        if db.exists():
            return
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        tmp = db.with_name(f".{db.name}.{os.getpid()}.creating")
        store = SqlAlchemyStore(f"sqlite:///{tmp}", (self.out_dir / "mlartifacts").resolve().as_uri())
        store.engine.dispose()
        fault_point("store.create")
        os.replace(tmp, db)

    def _get_or_create_experiment(self, name: str) -> str:
        for _ in range(3):  # a store user without our lock (a remote server's other clients) may race us
            exp = self.client.get_experiment_by_name(name)
            if exp is not None:
                if (exp.tags or {}).get(EXPERIMENT_KIND) != EXPERIMENT_TAGS[EXPERIMENT_KIND]:
                    self.client.set_experiment_tag(
                        exp.experiment_id, EXPERIMENT_KIND, EXPERIMENT_TAGS[EXPERIMENT_KIND]
                    )
                return exp.experiment_id
            artifacts = experiment_artifact_location(self.uri, self.out_dir, name)
            try:
                return self.client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_TAGS)
            except Exception:  # noqa: BLE001 - a UNIQUE clash surfaces as MlflowException or a DB error
                time.sleep(0.2)
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            raise StudyError(f"cannot create MLflow experiment {name!r}", self.uri)
        return exp.experiment_id

    # ---- the parent run ---------------------------------------------------------------------------
    def __enter__(self) -> Tracker:
        self.close_stale()
        period = heartbeat_s()
        run = self.client.create_run(
            self.experiment_id,
            run_name=time.strftime(f"{self.role} %Y-%m-%d %H:%M:%S"),
            tags={
                "study.role": self.role,
                "study.host": socket.gethostname(),
                "study.pid": str(os.getpid()),
                OUT_TAG: str(self.out_dir.resolve()),
                HEARTBEAT_TAG: f"{time.time():.3f}",
                HEARTBEAT_S_TAG: f"{period:g}",
                "git_commit": self.git_commit,
                "git_dirty": str(self.git_dirty).lower(),
                "mlflow.source.git.commit": self.git_commit,
            },
        )
        self.parent_id = run.info.run_id
        self._parent_lock = hold_lock(parent_lock_path(self.out_dir, self.parent_id))
        # other hosts and folders sharing the store tell this invocation is alive by it (tracking_cleanup)
        self._heartbeat = ParentHeartbeat(self.client, self.parent_id, period).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """End the parent run: FINISHED, KILLED (Ctrl-C, SIGTERM: a ``KeyboardInterrupt``) or FAILED.

        A clean end first closes the parents that went stale while it ran (:func:`close_stale`): a
        driver restarted soon after another died saw that one's parent alive. Leaving on an error, a
        store that cannot record the end (the error may be the store's: full, gone) leaves the parent
        RUNNING with its lock file there and free, which the next invocation on this host marks KILLED
        (:func:`close_stale`); the error that ended the study is the one reported.
        """
        if exc_type is None:
            status = "FINISHED"
        else:
            status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if exc_type is None:  # parents that died while this ran (one restarted within the grace time saw
            with contextlib.suppress(Exception):  # them alive); a store that fails here fails just below
                self.close_stale()
        ended = False
        try:
            self.client.set_terminated(self._parent, status)  # opened by __enter__
            ended = True
        except Exception:
            if exc_type is None:
                raise
        finally:
            if self._parent_lock is not None:
                os.close(self._parent_lock)
                if ended:  # a lock file left free says "dead" at once to the next invocation here
                    parent_lock_path(self.out_dir, self._parent).unlink(missing_ok=True)

    def close_stale(self) -> list[str]:
        """Mark the store's stale RUNNING parents and their RUNNING children KILLED (:func:`close_stale`)."""
        return close_stale(self.client, self.out_dir, exclude=self.parent_id)

    # ---- reading back for reuse (``study.tracking.reuse``) -------------------------------------------
    def finished_runs(self) -> dict[str, StoredRun]:
        """Finished child runs in the whole store (every experiment), newest per ``run_key`` tag."""
        return self.stored.finished_runs()

    def has_finished(self, key: str, result_sha: str | None = None) -> bool:
        """True when the store (any experiment) holds a FINISHED child run with this ``run_key`` now;
        with ``result_sha``, one of this training (:meth:`StoredRuns.has_finished`)."""
        return self.stored.has_finished(key, result_sha)

    def fetch_run(self, run, spec, run_dir: Path) -> None:
        """Download a stored run into ``run_dir`` (:meth:`study.tracking.reuse.StoredRuns.fetch_run`)."""
        self.stored.fetch_run(run, spec, run_dir)


@runtime_checkable
class TrackerProtocol(Protocol):
    """What orchestration asks of a tracker: :class:`Tracker` (MLflow) and :class:`NullTracker`
    (``--no-mlflow``) both provide it (``tests/tracking/test_tracking.py`` checks their public methods match)."""

    parent_id: str | None

    def __enter__(self) -> TrackerProtocol: ...

    def __exit__(self, exc_type, exc, tb) -> None: ...

    def close_stale(self) -> list[str]: ...

    def finished_runs(self) -> dict[str, StoredRun]: ...

    def has_finished(self, key: str, result_sha: str | None = None) -> bool: ...

    def fetch_run(self, run, spec, run_dir: Path) -> None: ...

    def log_study(
        self,
        hyp: Hypothesis,
        hyp_path: Path,
        plan: list[RunSpec],
        triage: Triage | None = None,
        command: str | None = None,
    ) -> None: ...

    def log_reused(self, reused: list[dict]) -> None: ...

    def log_registration(self, design: tuple[str, str], claims: list[tuple[str, dict]]) -> None: ...

    def set_tag(self, key: str, value: str) -> None: ...

    def set_tags(self, run_id: str | None, tags: dict) -> None: ...

    def log_results(
        self, artifacts: list[Path], results: list[ClaimResult], summary: str | None = None
    ) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def log_seed_aggregates(self, claims: list, table: pd.DataFrame) -> list[str]: ...

    def log_training_run(
        self,
        spec: RunSpec,
        result: dict,
        rows: pd.DataFrame,
        run_dir: Path | None = None,
        data: object = None,
        tags: dict | None = None,
    ) -> str | None: ...


class NullTracker:
    """The tracker of ``--no-mlflow``: every call does nothing, and no run is found in a store."""

    parent_id: str | None = None

    def __enter__(self) -> NullTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def close_stale(self) -> list[str]:
        return []

    def finished_runs(self) -> dict[str, StoredRun]:
        return {}

    def has_finished(self, key: str, result_sha: str | None = None) -> bool:  # nothing is ever to be logged
        return True

    def fetch_run(self, run, spec, run_dir: Path) -> None:  # never called: nothing is stored
        raise RuntimeError("no tracking store")

    def log_study(
        self,
        hyp: Hypothesis,
        hyp_path: Path,
        plan: list[RunSpec],
        triage: Triage | None = None,
        command: str | None = None,
    ) -> None:
        return None

    def log_reused(self, reused: list[dict]) -> None:
        return None

    def log_registration(self, design: tuple[str, str], claims: list[tuple[str, dict]]) -> None:
        return None

    def set_tag(self, key: str, value: str) -> None:
        return None

    def set_tags(self, run_id: str | None, tags: dict) -> None:
        return None

    def log_results(
        self, artifacts: list[Path], results: list[ClaimResult], summary: str | None = None
    ) -> None:
        return None

    def log_artifact(self, path: Path) -> None:
        return None

    def log_seed_aggregates(self, claims: list, table: pd.DataFrame) -> list[str]:
        return []

    def log_training_run(
        self,
        spec: RunSpec,
        result: dict,
        rows: pd.DataFrame,
        run_dir: Path | None = None,
        data: object = None,
        tags: dict | None = None,
    ) -> None:
        return None


@contextmanager
def open_tracker(
    track: bool, out_dir: Path, experiment: str, log_model: bool = False, role: str = "study"
) -> Iterator[TrackerProtocol]:
    """A :class:`Tracker` whose parent run is open inside the block (FAILED if the block raises, KILLED
    if it is interrupted), or a
    :class:`NullTracker` when ``track`` is False."""
    with Tracker(out_dir, experiment, log_model=log_model, role=role) if track else NullTracker() as tracker:
        yield tracker
