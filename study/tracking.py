"""The one module that talks to MLflow.

Layout, chosen to read naturally in the MLflow UI:

* an **experiment** per hypothesis (study) name;
* a **parent run** per invocation: the design as params; tags ``git_commit``, ``git_dirty``,
  ``spec_hash`` (sha256 of the hypothesis file), ``command``, ``verdict.N`` per claim and
  ``reused_runs`` (the runs taken from earlier invocations, ``label=key@mlflow_run_id``),
  ``registration.design`` and ``registration.claim.N`` (hash, first registration time and status of
  the design and each claim, ``study.registration``), ``sequential`` (the looks of ``--until-decided``);
  artifacts: the
  hypothesis file, the tidy table, the verdicts, ``reused_runs.json`` and the report
  (``report.html``, ``report.md``); metrics ``claim_N/{effect,ci_low,ci_high,p_value,p_adjusted}``;
  its description (``mlflow.note.content``) is the verdict table;
* a nested **child run** per trained (or imported) model: its spec as params; tags ``run_key``,
  ``git_commit``, ``git_dirty``, ``spec_hash`` (sha256 of the run spec); ``train/*`` metrics per epoch and spectral
  metrics named ``{metric}/{layer}/{token_set}`` with step = epoch (names reduced to the characters
  MLflow allows); artifacts ``spectra.npz`` (the eigenvalues), ``result.json`` and, when recorded,
  ``covariances.npz``; the dataset through ``log_inputs`` (a numpy dataset whose digest is the dataset
  spec hash and whose source carries the spec). Model weights only with ``log_model=True``. An imported
  run (``runners.sources``) is tagged ``source.kind``, ``source.path``, ``source.fingerprint``,
  ``source.format`` and ``source.mapping`` or ``source.state_dict_key``; a metric log's run carries
  ``rows.parquet`` (its tidy rows) in place of ``spectra.npz``.

A finished child run is found again by its ``run_key`` tag (searched across experiments), so another
hypothesis file that needs the same run reuses it instead of training again (:meth:`Tracker.fetch_run`).

The default store is embedded and local: ``sqlite:///<out>/mlflow.db`` with artifacts under
``<out>/mlartifacts`` (no server). ``MLFLOW_TRACKING_URI`` overrides it. Telemetry is off.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.hashing import digest, file_digest
from vitstudy_core.locks import file_lock, hold_lock, is_locked
from vitstudy_core.provenance import git_state
from vitstudy_core.runfolder import OPTIONAL, REQUIRED, RESULT, ROWS, SPECTRA, parse_spectrum_key

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# MLflow 3 opens an experiment on its GenAI overview unless it is marked as model training
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_TAGS = {EXPERIMENT_KIND: "custom_model_development"}
VERBOSE = False  # set by ``--verbose``: let MLflow's and alembic's INFO lines through
_BATCH = 1000  # MLflow's log_batch limit on metrics per call
_TAG_MAX = 5000  # MLflow's limit on a tag value's length
# artifacts of a child run that a reuse needs (required) or carries along when present (optional)
RUN_ARTIFACTS_REQUIRED = REQUIRED
RUN_ARTIFACTS_OPTIONAL = OPTIONAL
# files a runner may leave as the trained weights; logged under model/ only with log_model=True
_WEIGHT_PATTERNS = ("checkpoints/epoch_*.pt", "model*.pt", "model*.safetensors")


_QUIET_LOGGERS = ("mlflow", "alembic")  # their INFO lines ("Creating initial MLflow database tables...")


def quiet_library_logs(verbose: bool = False) -> None:
    """Keep MLflow's and alembic's INFO lines out of the terminal (``--verbose`` lets them through)."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def store_lock_path(out_dir: Path) -> Path:
    """The lock serialising store and experiment creation among invocations on one output folder."""
    return Path(out_dir) / ".locks" / "store.lock"


def parent_lock_path(out_dir: Path, run_id: str) -> Path:
    """The lock a live invocation holds on its own parent run (free once the invocation has died)."""
    return Path(out_dir) / ".locks" / f"study-{run_id}.lock"


def default_tracking_uri(out_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(out_dir).resolve() / 'mlflow.db'}"


def sanitize_metric_name(name: str) -> str:
    """Replace every character MLflow rejects in a metric name (it allows letters, digits, ``_ - . /``
    and spaces) with ``_``: ``"eed%/block 1"`` -> ``"eed_/block 1"``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def _flatten(prefix: str, obj, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj
    return out


class Tracker:
    """Logs one study invocation to MLflow and finds earlier runs by key.

    Use as a context manager around the invocation (``__enter__`` opens the parent run); the store
    look-ups (:meth:`finished_runs`, :meth:`fetch_run`) work before that.

    Args:
        out_dir: the study output folder (holds the default sqlite store).
        experiment: the experiment name (the hypothesis name).
        log_model: also log weight files a run folder holds (off by default: ~88 MB per ViT-S seed).
    """

    def __init__(self, out_dir: Path, experiment: str, log_model: bool = False, role: str = "study"):
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
        with file_lock(store_lock_path(self.out_dir)):
            try:
                self._create_store()
                self.client = MlflowClient(self.uri)
                self.experiment_id = self._get_or_create_experiment(experiment)
            except StudyError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bad URI or unreachable store: one line, not a trace
                where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else None
                msg = " ".join(str(exc).split())[:300]
                raise StudyError(
                    f"cannot open the tracking store ({type(exc).__name__}: {msg})", self.uri, where
                ) from None
        self.role = role
        self.parent_id: str | None = None
        self._parent_lock: int | None = None
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
            artifacts = (self.out_dir / "mlartifacts" / name).resolve().as_uri()
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
        run = self.client.create_run(
            self.experiment_id,
            run_name=time.strftime(f"{self.role} %Y-%m-%d %H:%M:%S"),
            tags={
                "study.role": self.role,
                "study.host": socket.gethostname(),
                "study.pid": str(os.getpid()),
                "git_commit": self.git_commit,
                "git_dirty": str(self.git_dirty).lower(),
                "mlflow.source.git.commit": self.git_commit,
            },
        )
        self.parent_id = run.info.run_id
        self._parent_lock = hold_lock(parent_lock_path(self.out_dir, self.parent_id))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.client.set_terminated(self.parent_id, "FAILED" if exc_type else "FINISHED")
        if self._parent_lock is not None:
            os.close(self._parent_lock)
            parent_lock_path(self.out_dir, self.parent_id).unlink(missing_ok=True)

    def close_stale(self) -> list[str]:
        """Mark the store's stale RUNNING parents and their RUNNING children KILLED (:func:`close_stale`)."""
        return close_stale(self.client, self.out_dir, exclude=self.parent_id)

    def log_study(self, hyp, hyp_path: Path, plan, triage=None, command: str | None = None) -> None:
        """The study's params, file and command on the parent run; the runs ``triage`` reused, linked."""
        params = {
            "hypothesis": hyp.name,
            "n_runs": len(plan),
            "seeds": ",".join(map(str, hyp.design.seeds)),
            "datasets": ",".join(d.name for d in hyp.design.datasets),
            "objective": hyp.design.objective,
        }
        self._log_params(self.parent_id, params)
        self.client.set_tag(self.parent_id, "spec_hash", file_digest(hyp_path))
        if command:
            self.client.set_tag(self.parent_id, "command", command[:_TAG_MAX])
        self.client.log_artifact(self.parent_id, str(hyp_path))
        if triage is not None:
            reused = triage.reused_from
            self.log_reused(
                [
                    {
                        "key": s.key,
                        "label": s.label,
                        "source": reused[s.key].split(":")[0],
                        "mlflow_run_id": triage.stored[s.key].info.run_id if s.key in triage.stored else None,
                    }
                    for s in plan
                    if s.key in reused
                ]
            )

    def log_reused(self, reused: list[dict]) -> None:
        """Link the runs this invocation reused: ``[{key, label, source, mlflow_run_id}]``.

        A reused run is not logged again as a child; the parent names it in tag ``reused_runs`` and in
        the artifact ``reused_runs.json`` (with the MLflow run id of the original child, when known).
        """
        if not reused:
            return
        text = ", ".join(f"{r['label']}={r['key']}@{r.get('mlflow_run_id') or 'local'}" for r in reused)
        self.client.set_tag(self.parent_id, "reused_runs", text[:_TAG_MAX])
        self.client.set_tag(self.parent_id, "n_reused", str(len(reused)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "reused_runs.json"
            path.write_text(json.dumps(reused, indent=1))
            self.client.log_artifact(self.parent_id, str(path))

    def log_registration(self, design: tuple[str, str], claims: list[tuple[str, dict]]) -> None:
        """Tags ``registration.design`` = ``hash @ time`` and ``registration.claim.N`` = ``name: hash @ time
        (status)`` for each (name, ``study.registration.claim_status`` entry or {hash, registered_at})."""
        self.client.set_tag(self.parent_id, "registration.design", f"{design[0][:16]} @ {design[1]}")
        for i, (name, reg) in enumerate(claims):
            status = f" ({reg['status']})" if reg.get("status") else ""
            text = f"{name}: {reg['hash'][:16]} @ {reg['registered_at']}{status}"
            self.client.set_tag(self.parent_id, f"registration.claim.{i}", text[:_TAG_MAX])

    def set_tag(self, key: str, value: str) -> None:
        """One tag on the parent run (cut to MLflow's length limit)."""
        self.set_tags(None, {key: value})

    def log_results(self, artifacts: list[Path], results, summary: str | None = None) -> None:
        for path in artifacts:
            if Path(path).exists():
                self.client.log_artifact(self.parent_id, str(path))
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for i, r in enumerate(results):
            self.client.set_tag(self.parent_id, f"verdict.{i}", f"{r.verdict}: {r.name}"[:_TAG_MAX])
            # per-claim numbers as metrics, so invocations can be compared side by side in the UI
            for field in ("effect", "ci_low", "ci_high", "p_value", "p_adjusted"):
                value = getattr(r, field, None)
                if value is not None and np.isfinite(value):
                    metrics.append(Metric(f"claim_{i}/{field}", float(value), now, 0))
        if metrics:
            self.client.log_batch(self.parent_id, metrics=metrics)
        if summary:
            # shown as the run's description in the UI
            self.client.set_tag(self.parent_id, "mlflow.note.content", summary[:_TAG_MAX])
        # named by what it holds: the study and its verdict counts (the start time stays in its start_time)
        counts = {}
        for r in results:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
        what = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no claims"
        name = self.client.get_experiment(self.experiment_id).name
        self.client.update_run(self.parent_id, name=f"{name}: {what}"[:250])

    def set_tags(self, run_id: str | None, tags: dict) -> None:
        """Set tags on a run (the parent when ``run_id`` is None); values cut to MLflow's length limit."""
        for k, v in tags.items():
            self.client.set_tag(run_id or self.parent_id, k, str(v)[:_TAG_MAX])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.parent_id, str(path))

    # ---- child runs -------------------------------------------------------------------------------
    def log_training_run(
        self, spec, result: dict, rows: pd.DataFrame, run_dir: Path | None = None, data=None, tags=None
    ) -> str:
        """A nested child run for one trained model; returns its MLflow run id.

        Args:
            spec: the ``RunSpec``.
            result: its ``result.json`` content.
            rows: its tidy rows (columns ``metric, layer, token_set, epoch, value``).
            run_dir: the run folder; its ``spectra.npz``, ``result.json``, ``covariances.npz`` and
                ``scalars.json`` become artifacts (and weight files, with ``log_model``).
            data: the run source's ``DataRecord`` for its dataset (from the prepare-data stage), logged as
                the run's training input; None logs the dataset spec alone.
            tags: more tags (a sweep's trial number and knob values).
        """

        status = "FINISHED" if result.get("status") == "finished" else "FAILED"
        extra, tags = (
            tags,
            {
                "mlflow.parentRunId": self.parent_id,
                "run_key": spec.key,
                "dataset": spec.dataset["name"],
                "seed": str(spec.seed),
                "reused": "false",
                "study.role": "training",
                "git_commit": self.git_commit,
                "git_dirty": str(self.git_dirty).lower(),
                "mlflow.source.git.commit": self.git_commit,
                "spec_hash": digest(spec.model_dump()),
            },
        )
        tags.update({k: str(v)[:_TAG_MAX] for k, v in (extra or {}).items()})
        if result.get("environment"):
            tags.update({f"env.{k}": str(v) for k, v in result["environment"].items()})
        if result.get("source"):  # an imported run: where it came from and how it was read
            tags.update(_source_tags(result["source"]))
        run = self.client.create_run(self.experiment_id, run_name=spec.label, tags=tags)
        rid = run.info.run_id
        try:
            self._fill_training_run(rid, spec, result, rows, run_dir, data)
        except BaseException:
            self.client.set_terminated(rid, "FAILED")  # never a child left RUNNING by an error here
            raise
        self.client.set_terminated(rid, status)
        return rid

    def _fill_training_run(self, rid: str, spec, result: dict, rows: pd.DataFrame, run_dir, data) -> None:
        """Params, metrics, dataset and artifacts of a child run (:meth:`log_training_run`)."""
        from mlflow.entities import Metric

        params = _flatten("", {k: v for k, v in spec.model_dump().items() if k != "key"}, {})
        self._log_params(rid, params)
        fault_point("mlflow.log")

        now = int(time.time() * 1000)
        metrics = []
        for h in result.get("history", []):
            for k, v in h.items():
                if k != "epoch" and v is not None:
                    metrics.append(Metric(sanitize_metric_name(f"train/{k}"), float(v), now, int(h["epoch"])))
        for r in rows.itertuples(index=False):
            if pd.notna(r.value):
                name = sanitize_metric_name(f"{r.metric}/{r.layer}/{r.token_set}")
                metrics.append(Metric(name, float(r.value), now, int(r.epoch)))
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(rid, metrics=metrics[i : i + _BATCH])
        self._log_dataset(rid, spec, data)
        if run_dir is not None:
            for name in RUN_ARTIFACTS_REQUIRED + RUN_ARTIFACTS_OPTIONAL:
                if (Path(run_dir) / name).is_file():
                    self.client.log_artifact(rid, str(Path(run_dir) / name))
            if self.log_model:
                weights = [p for pat in _WEIGHT_PATTERNS for p in sorted(Path(run_dir).glob(pat))]
                for p in weights:
                    self.client.log_artifact(rid, str(p), artifact_path="model")
                # say so when a run folder holds no weights rather than log nothing silently
                self.client.set_tag(rid, "model_weights", "logged" if weights else "none in run folder")
        if result.get("status") != "finished":
            self.client.set_tag(rid, "failed_epoch", str(result.get("failed_epoch")))

    def _log_dataset(self, rid: str, spec, data) -> None:
        """Record the training data as an MLflow dataset input (context ``training``).

        ``data`` is the ``DataRecord`` the prepare-data stage made (its digest: the dataset spec's hash, the
        images being a function of it; its profile: split shapes and class count), or None (the spec alone).
        The source (a ``code`` source) carries the spec and the profile as tags.
        """
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        ds = spec.dataset
        tags = {"dataset_spec": json.dumps(ds, sort_keys=True)}
        if data is not None:
            tags["profile"] = json.dumps(data.profile, sort_keys=True)
        dataset = MetaDataset(CodeDatasetSource(tags=tags), name=ds["name"], digest=digest(ds, 16))
        inp = DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", "training")])
        self.client.log_inputs(rid, datasets=[inp])

    # ---- reuse ------------------------------------------------------------------------------------
    def finished_runs(self) -> dict[str, object]:
        """Finished child runs in the whole store (every experiment), newest per ``run_key`` tag."""
        found: dict[str, object] = {}
        for r in training_runs(self.client):
            key = r.data.tags.get("run_key")
            if key and key not in found:
                found[key] = r
        return found

    def has_finished(self, key: str) -> bool:
        """True when the store (any experiment) holds a FINISHED child run with this ``run_key`` now."""
        found = self.client.search_runs(
            _active_experiments(self.client),
            f"tags.run_key = '{key}' and tags.`study.role` = 'training' and attributes.status = 'FINISHED'",
            max_results=1,
        )
        return bool(found)

    def fetch_run(self, run, spec, run_dir: Path) -> None:
        """Download a stored run's artifacts into ``run_dir`` (``result.json`` last, so it marks a finished
        run only once the spectra are in place). Checks that ``spectra.npz`` loads and matches the result.

        Raises:
            StudyError: one line naming the run, the artifact and what is wrong with it.
        """
        rid = run.info.run_id
        where = f"run {spec.label} (key {spec.key}, MLflow run {rid})"
        with tempfile.TemporaryDirectory() as tmp:
            listed = {a.path for a in self.client.list_artifacts(rid)}
            got: dict[str, Path] = {}
            # a run imported from a metric log holds tidy rows instead of spectra (vitstudy_core.runfolder)
            required = (RESULT, ROWS) if ROWS in listed and SPECTRA not in listed else RUN_ARTIFACTS_REQUIRED
            for name in dict.fromkeys(RUN_ARTIFACTS_REQUIRED + RUN_ARTIFACTS_OPTIONAL):
                if name not in listed:
                    if name in required:
                        raise StudyError(
                            f"{where}: artifact {name} is missing from the tracking store; "
                            "rerun with --force to retrain it",
                            self.uri,
                        )
                    continue
                try:
                    got[name] = Path(self.client.download_artifacts(rid, name, tmp))
                except Exception as exc:  # noqa: BLE001 - any store failure is reported as one line
                    raise StudyError(
                        f"{where}: artifact {name} cannot be downloaded ({type(exc).__name__}: {exc})",
                        self.uri,
                    ) from None
            try:
                result = json.loads(got["result.json"].read_text())
                if result.get("status") != "finished":
                    raise ValueError(f"status {result.get('status')!r}, expected 'finished'")
            except (OSError, ValueError) as exc:
                raise StudyError(f"{where}: artifact result.json is corrupt ({exc})", self.uri) from None
            measured = SPECTRA if SPECTRA in got else ROWS
            try:
                _check_measurements(got[measured])
            except Exception as exc:  # noqa: BLE001 - zip/pickle/parquet/value errors all mean a corrupt file
                raise StudyError(
                    f"{where}: artifact {measured} is corrupt ({type(exc).__name__}: {exc}); "
                    "rerun with --force to retrain it",
                    self.uri,
                ) from None
            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            for name, path in got.items():
                if name != "result.json":
                    shutil.copyfile(path, run_dir / name)
            shutil.copyfile(got["result.json"], run_dir / "result.json")

    def _log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])


def _source_tags(source: dict) -> dict[str, str]:
    """Tags of an imported run (``result.json``'s ``source``): ``source.kind``, ``source.path``,
    ``source.fingerprint``, ``source.format``, and the source's own ``tag_fields`` (``runners.sources``:
    ``source.mapping`` of a table, ``source.state_dict_key`` of checkpoints)."""
    from runners.sources import SOURCES

    tags = {f"source.{k}": str(source[k]) for k in ("kind", "path", "fingerprint", "format") if k in source}
    entry = SOURCES.get(str(source.get("kind")), None)
    for k in entry.tag_fields if entry is not None else ():
        if source.get(k) is not None:
            value = source[k] if isinstance(source[k], str) else json.dumps(source[k], sort_keys=True)
            tags[f"source.{k}"] = value[:_TAG_MAX]
    return tags


def _check_measurements(path: Path) -> None:
    """Read a downloaded ``spectra.npz`` in full (or ``rows.parquet``); raise on a truncated or odd file."""
    if path.name == ROWS:
        pd.read_parquet(path)
        return
    with np.load(path) as f:
        keys = list(f.files)
        for k in keys:
            f[k]  # noqa: B018 - reading every array is what detects a truncated file
    if not keys:
        raise ValueError("no '{epoch}/{layer}/{token_set}' keys")
    for k in keys:
        parse_spectrum_key(k)


def _active_experiments(client) -> list[str]:
    from mlflow.entities import ViewType

    return [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]


def stale_parents(client, out_dir: Path, exclude: str | None = None) -> list:
    """RUNNING parent runs in the store whose invocation is dead: started on this host, and their lock
    (:func:`parent_lock_path`) is free. A run from another host is left alone (its liveness is unknowable
    here); ``exclude`` is the caller's own parent run."""
    exp_ids = _active_experiments(client)
    if not exp_ids:
        return []
    running = client.search_runs(
        exp_ids, "tags.`study.role` = 'study' and attributes.status = 'RUNNING'", max_results=1000
    )
    host = socket.gethostname()
    return [
        r
        for r in running
        if r.data.tags.get("study.host") == host
        and r.info.run_id != exclude
        and not is_locked(parent_lock_path(out_dir, r.info.run_id))
    ]


def close_stale(client, out_dir: Path, exclude: str | None = None) -> list[str]:
    """Mark every stale RUNNING parent (:func:`stale_parents`) and its RUNNING children KILLED.

    Returns:
        the run ids marked.
    """
    marked = []
    for parent in stale_parents(client, out_dir, exclude):
        children = client.search_runs(
            [parent.info.experiment_id],
            f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and attributes.status = 'RUNNING'",
            max_results=1000,
        )
        for r in [*children, parent]:
            client.set_terminated(r.info.run_id, "KILLED")
            marked.append(r.info.run_id)
        parent_lock_path(out_dir, parent.info.run_id).unlink(missing_ok=True)
    return marked


def training_runs(client, status: str = "FINISHED") -> list:
    """Every child (training) run in the store with this status, newest first."""
    exp_ids = _active_experiments(client)
    out, token = [], None
    while exp_ids:
        page = client.search_runs(
            exp_ids,
            f"tags.`study.role` = 'training' and attributes.status = '{status}'",
            order_by=["attributes.end_time DESC"],
            max_results=1000,
            page_token=token,
        )
        out.extend(page)
        token = page.token
        if not token:
            break
    return out


class NullTracker:
    """The tracker of ``--no-mlflow``: every call does nothing, and no run is found in a store."""

    parent_id = None

    def __enter__(self) -> NullTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def finished_runs(self) -> dict[str, object]:
        return {}

    def has_finished(self, key: str) -> bool:  # nothing is ever to be logged
        return True

    def fetch_run(self, run, spec, run_dir: Path) -> None:  # never called: nothing is stored
        raise RuntimeError("no tracking store")

    def log_study(self, *args, **kwargs) -> None:
        return None

    def log_training_run(self, *args, **kwargs) -> None:
        return None

    def log_results(self, *args, **kwargs) -> None:
        return None

    def set_tags(self, *args, **kwargs) -> None:
        return None

    def log_artifact(self, *args, **kwargs) -> None:
        return None

    def log_registration(self, *args, **kwargs) -> None:
        return None

    def set_tag(self, *args, **kwargs) -> None:
        return None


@contextmanager
def open_tracker(track: bool, out_dir: Path, experiment: str, log_model: bool = False, role: str = "study"):
    """A :class:`Tracker` whose parent run is open inside the block (FAILED if the block raises), or a
    :class:`NullTracker` when ``track`` is False."""
    with Tracker(out_dir, experiment, log_model=log_model, role=role) if track else NullTracker() as tracker:
        yield tracker
