"""Writing runs to the MLflow store: the parent run's params, tags, artifacts and results, and a child run
per trained (or imported) model (``study.tracking.tracker``'s writing role; the layout is in its docstring)."""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from study.tracking.reuse import RESULT_SHA_TAG, RUN_ARTIFACTS_OPTIONAL, RUN_ARTIFACTS_REQUIRED
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.hashing import digest, file_digest

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from analysis.verdicts import ClaimResult
    from study.pipeline.triage_state import Triage
    from study.runspecs import RunSpec
    from study.schema import Hypothesis

_BATCH = 1000  # MLflow's log_batch limit on metrics per call
_TAG_MAX = 5000  # MLflow's limit on a tag value's length
# files a runner may leave as the trained weights; logged under model/ only with log_model=True
_WEIGHT_PATTERNS = ("checkpoints/epoch_*.pt", "model*.pt", "model*.safetensors")


def sanitize_metric_name(name: str) -> str:
    """Replace every character MLflow rejects in a metric name (it allows letters, digits, ``_ - . /``
    and spaces) with ``_``: ``"eed%/block 1"`` -> ``"eed_/block 1"``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def metric_name(metric: str, layer: str, token_set: str) -> str:
    """A child run's name for one spectral metric: ``{metric}/{token_set}/{layer}`` (``eed_pct/all/block_05``),
    so MLflow's metrics tab, which puts charts whose names agree up to the last ``/`` in one section,
    shows each metric's layers together (one section per metric and token set, not per metric and layer). Stores written before this order
    (``{metric}/{layer}/{token_set}``) still restore: a run is restored from its artifacts, never from its
    metric names."""
    return sanitize_metric_name(f"{metric}/{token_set}/{layer}")


def _flatten(prefix: str, obj, out: dict, lists: bool = False) -> dict:
    """``{"a.b": value}`` of a nested mapping; ``lists``: a list of mappings too, by index (``a.0.b``)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out, lists)
    elif lists and isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            _flatten(f"{prefix}.{i}", v, out, lists)
    else:
        out[prefix] = obj
    return out


def _settings_text(settings: Any) -> str:
    """A settings model (an objective) as the JSON of its fields, keys sorted: readable in the UI."""
    dumped = settings.model_dump(mode="json") if hasattr(settings, "model_dump") else settings
    return json.dumps(dumped, sort_keys=True)


ARCHITECTURE = ("patch_size", "embed_dim", "depth", "num_heads", "blocks")  # blocks: a CNN's residual blocks


def _model_params(model: Any, preset: str | None) -> dict[str, Any]:
    """A child run's architecture as built (``architecture.patch_size``, ``.embed_dim``, ``.depth``,
    ``.num_heads``: timm's shape of the resolved model, else the fields the spec sets) and its preset
    (``model.preset``): the spec's ``model.name`` is the timm name the preset builds from, whatever the
    overrides (``vit_small_patch16_224`` for a 16-wide, 3-deep model)."""
    out: dict[str, Any] = {"model.preset": preset} if preset else {}
    if not isinstance(model, dict) or not model.get("name"):
        return out
    from runners.model_table import built_shape

    shape = built_shape(model) or {}
    for field in ARCHITECTURE:
        value = shape.get(field, model.get(field))
        if value is not None:
            out[f"architecture.{field}"] = value
    return out


class RunWriter:
    """What an invocation writes to the store: its parent run's record and its child runs.

    A part of ``study.tracking.tracker.Tracker``, which sets the attributes it writes with: ``client`` (an
    ``MlflowClient``), ``experiment_id``, ``parent_id`` (the open parent run), ``git_commit``, ``git_dirty``,
    ``log_model`` and ``out_dir`` (the output folder: a child run's tag ``study.out``).
    """

    client: MlflowClient
    experiment_id: str
    parent_id: str | None
    git_commit: str
    git_dirty: bool
    log_model: bool

    @property
    def _parent(self) -> str:
        """The open parent run's id (``Tracker`` opens it before anything is written to it)."""
        if self.parent_id is None:
            raise RuntimeError("no parent run is open: Tracker.start() opens it")
        return self.parent_id

    def log_study(
        self,
        hyp: Hypothesis,
        hyp_path: Path,
        plan: list[RunSpec],
        triage: Triage | None = None,
        command: str | None = None,
    ) -> None:
        """The study's params (a summary, and the design flattened: ``design.training.epochs``,
        ``design.datasets.0.n_train``, ...), file and command on the parent run; the runs ``triage``
        reused, linked by their MLflow run ids."""
        params: dict[str, Any] = {
            "hypothesis": hyp.name,
            "n_runs": len(plan),
            "seeds": ",".join(map(str, hyp.design.seeds)),
            "datasets": ",".join(d.name for d in hyp.design.datasets),
            "objective": _settings_text(hyp.design.objective),
        }
        params.update(_flatten("design", hyp.design.model_dump(mode="json"), {}, lists=True))
        cells_by_name = {c.name: c.design for c in hyp.design.cells()}
        self._presets = {
            s.key: getattr((cells_by_name.get(s.condition) or hyp.design).model, "preset", None) for s in plan
        }
        cells = [c for c in hyp.design.cells() if c.name is not None]
        if cells:  # the cells, each with its runs (an untrained cell's are its twin's)
            params["n_cells"] = len(cells)
            text = "; ".join(f"{c.name} ({_cell_runs(c, plan)} runs)" for c in cells)
            self.client.set_tag(self._parent, "cells", text[:_TAG_MAX])
        self._log_params(self._parent, params)
        self.client.set_tag(self._parent, "spec_hash", file_digest(hyp_path))
        if command:
            self.client.set_tag(self._parent, "command", command[:_TAG_MAX])
        self.client.log_artifact(self._parent, str(hyp_path))
        if triage is not None:
            reused = triage.reused_from
            self.log_reused(
                [
                    {
                        "key": s.key,
                        "label": s.label,
                        "source": reused[s.key].split(":")[0],
                        # the store's child of the run, whether its files came from there or from this folder
                        "mlflow_run_id": triage.logged.get(s.key),
                    }
                    for s in plan
                    if s.key in reused
                ]
            )

    def log_reused(self, reused: list[dict]) -> None:
        """Link the runs this invocation reused: ``[{key, label, source, mlflow_run_id}]``.

        A reused run is not logged again as a child; the parent names it in tag ``reused_runs``
        (``label=key@mlflow_run_id``: the original child's id; ``@local`` only where the store holds no
        child of it, a run made with ``--no-mlflow``) and in the artifact ``reused_runs.json``.
        """
        if not reused:
            return
        text = ", ".join(f"{r['label']}={r['key']}@{r.get('mlflow_run_id') or 'local'}" for r in reused)
        self.client.set_tag(self._parent, "reused_runs", text[:_TAG_MAX])
        self.client.set_tag(self._parent, "n_reused", str(len(reused)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "reused_runs.json"
            path.write_text(json.dumps(reused, indent=1))
            self.client.log_artifact(self._parent, str(path))

    def log_registration(self, design: tuple[str, str], claims: list[tuple[str, dict]]) -> None:
        """Tags ``registration.design`` = ``hash @ time`` and ``registration.claim.N`` = ``name: hash @ time
        (status)`` for each (name, ``study.registration.claim_status`` entry or {hash, registered_at})."""
        self.client.set_tag(self._parent, "registration.design", f"{design[0][:16]} @ {design[1]}")
        for i, (name, reg) in enumerate(claims):
            status = f" ({reg['status']})" if reg.get("status") else ""
            text = f"{name}: {reg['hash'][:16]} @ {reg['registered_at']}{status}"
            self.client.set_tag(self._parent, f"registration.claim.{i}", text[:_TAG_MAX])

    def set_tag(self, key: str, value: str) -> None:
        """One tag on the parent run (cut to MLflow's length limit)."""
        self.set_tags(None, {key: value})

    def log_results(
        self, artifacts: list[Path], results: list[ClaimResult], summary: str | None = None
    ) -> None:
        for path in artifacts:
            if Path(path).exists():
                self.client.log_artifact(self._parent, str(path))
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for i, r in enumerate(results):
            self.client.set_tag(self._parent, f"verdict.{i}", f"{r.verdict}: {r.name}"[:_TAG_MAX])
            # per-claim numbers as metrics, so invocations can be compared side by side in the UI
            for field in ("effect", "ci_low", "ci_high", "p_value", "p_adjusted"):
                value = getattr(r, field, None)
                if value is not None and np.isfinite(value):
                    metrics.append(Metric(f"claim_{i}/{field}", float(value), now, 0))
        if metrics:
            self.client.log_batch(self._parent, metrics=metrics)
        if summary:
            # shown as the run's description in the UI
            self.client.set_tag(self._parent, "mlflow.note.content", summary[:_TAG_MAX])
        # named by what it holds: the study and its verdict counts (the start time stays in its start_time)
        counts: dict[str, int] = {}
        for r in results:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
        what = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no claims"
        name = self.client.get_experiment(self.experiment_id).name
        self.client.update_run(self._parent, name=f"{name}: {what}"[:250])

    def log_seed_aggregates(self, claims: list, table: pd.DataFrame) -> list[str]:
        """The across-seed profile of every claimed metric on the parent run, so MLflow's own charts and
        compare view show the study-level curve, one set per condition (never averaged over conditions).

        Per (metric, token set, dataset) a claim reads, at its epoch (``last``: each condition's own), and
        per condition of the table: step metrics ``seed_mean/{metric}/{token_set}``, ``seed_ci_low/...``
        and ``seed_ci_high/...``, ``/{dataset}`` appended in a study of several datasets and
        ``/{condition}`` in a design with conditions (step = layer index; the two-sided 95% t interval
        across seeds, ``analysis.table.seed_profile``). MLflow's steps carry no names, so the tag
        ``seed_aggregates`` says which layer each step is, and the artifact
        ``seed_aggregates/{metric}_{token_set}[_{dataset}].png`` draws every condition in one chart over
        the layer names (``analysis.report.condition_figures.seed_aggregate_figure``).

        Returns:
            The metric names logged (``seed_mean/...`` only).
        """
        from mlflow.entities import Metric

        from analysis.report.condition_figures import seed_aggregate_figure
        from analysis.table import conditions_of, seed_profile

        if table is None or table.empty:
            return []
        now, metrics, logged = int(time.time() * 1000), [], []
        several = table["dataset"].nunique() > 1
        conditions: list[str | None] = list(conditions_of(table)) or [None]
        layers = table.drop_duplicates("layer").sort_values("layer_index")
        index = layers.set_index("layer")["layer_index"]
        for metric, token_set, dataset, epoch in _claimed_slices(claims, table):
            base = f"{metric}/{token_set}" + (f"/{dataset}" if several else "")
            drew = False
            for cond in conditions:
                try:
                    prof = seed_profile(table, metric, dataset, epoch, token_set, condition=cond)
                except StudyError:  # a slice the table lacks: that claim is not testable; log the rest
                    continue
                tail = sanitize_metric_name(base + (f"/{cond}" if cond is not None else ""))
                for layer in prof.columns:
                    for row, prefix in (
                        ("mean", "seed_mean"),
                        ("ci_low", "seed_ci_low"),
                        ("ci_high", "seed_ci_high"),
                    ):
                        cell: Any = prof.at[row, layer]  # a float: seed_profile's frame is numeric
                        value = float(cell)
                        if np.isfinite(value):
                            metrics.append(Metric(f"{prefix}/{tail}", value, now, int(index[layer])))
                logged.append(f"seed_mean/{tail}")
                drew = True
            if not drew:
                continue
            fig = seed_aggregate_figure(table, metric, token_set, dataset, epoch)
            if fig.png is not None:
                name = sanitize_metric_name(base).replace("/", "_") + ".png"
                with tempfile.TemporaryDirectory() as tmp:
                    (Path(tmp) / name).write_bytes(fig.png)
                    self.client.log_artifact(self._parent, str(Path(tmp) / name), "seed_aggregates")
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self._parent, metrics=metrics[i : i + _BATCH])
        if logged:
            self.client.set_tag(
                self._parent, "seed_aggregates", _aggregates_note(layers, conditions)[:_TAG_MAX]
            )
        return logged

    def set_tags(self, run_id: str | None, tags: dict) -> None:
        """Set tags on a run (the parent when ``run_id`` is None); values cut to MLflow's length limit."""
        for k, v in tags.items():
            self.client.set_tag(run_id or self._parent, k, str(v)[:_TAG_MAX])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self._parent, str(path))

    # ---- child runs -------------------------------------------------------------------------------
    def log_training_run(
        self,
        spec: RunSpec,
        result: dict,
        rows: pd.DataFrame,
        run_dir: Path | None = None,
        data: object = None,
        tags: dict | None = None,
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
        out_dir = getattr(self, "out_dir", None)
        if out_dir is not None:  # which output folder's copy of the run this is
            tags["study.out"] = str(Path(out_dir).resolve())
        if run_dir is not None and (Path(run_dir) / "result.json").is_file():  # which training it is
            tags[RESULT_SHA_TAG] = file_digest(Path(run_dir) / "result.json")
        tags.update({k: str(v)[:_TAG_MAX] for k, v in (extra or {}).items()})
        if spec.condition is not None:  # a design with conditions: the cell and its factors' levels
            tags.update({"condition": spec.condition, **{f"factor.{k}": v for k, v in spec.levels.items()}})
        if result.get("environment"):
            tags.update({f"env.{k}": str(v) for k, v in result["environment"].items()})
        if result.get("source"):  # an imported run: where it came from and how it was read
            tags.update(_source_tags(result["source"]))
        start, end = run_times(result)
        run = self.client.create_run(self.experiment_id, start_time=start, run_name=spec.label, tags=tags)
        rid = run.info.run_id
        try:
            self._fill_training_run(rid, spec, result, rows, run_dir, data)
        except BaseException:
            # never a child left RUNNING: a record cut short (interrupted, or the store failed) is KILLED,
            # as close_stale marks one whose invocation died (FAILED is a run whose training failed); a
            # store too broken to record even that leaves it to the next invocation's close_stale
            with contextlib.suppress(Exception):
                self.client.set_terminated(rid, "KILLED")
            raise
        self.client.set_terminated(rid, status, end_time=end)
        if status == "FINISHED":
            self._retire_superseded(spec.key, rid)
        return rid

    def _retire_superseded(self, key: str, keep: str) -> list[str]:
        """Delete the KILLED child runs of ``key`` now that ``keep`` (FINISHED) holds the run; their ids.

        A KILLED child is an attempt to *log* the run that an invocation did not finish (killed,
        interrupted or stopped by a store error while logging it, then marked KILLED by
        :func:`study.tracking.cleanup.close_stale` or here): its params, metrics and artifacts are partial copies of what ``keep`` holds whole, and left
        beside it the store would show two children for one run. Deleted as MLflow deletes (hidden from
        the UI and from every search, restorable with ``mlflow runs restore``, purged by ``mlflow gc``), as
        ``doctor --repair`` deletes duplicates (``superseded_child`` there finds any left behind).
        """
        from study.tracking.reuse import active_experiments

        stale = self.client.search_runs(
            active_experiments(self.client),
            f"tags.run_key = '{key}' and tags.`study.role` = 'training' and attributes.status = 'KILLED'",
            max_results=1000,
        )
        gone = [r.info.run_id for r in stale if r.info.run_id != keep]
        for rid in gone:
            self.client.delete_run(rid)
        return gone

    def _fill_training_run(self, rid: str, spec, result: dict, rows: pd.DataFrame, run_dir, data) -> None:
        """Params, metrics, dataset and artifacts of a child run (:meth:`log_training_run`)."""
        from mlflow.entities import Metric

        params = _flatten("", {k: v for k, v in spec.model_dump().items() if k != "key"}, {})
        params.update(
            _model_params(getattr(spec, "model", None), getattr(self, "_presets", {}).get(spec.key))
        )
        self._log_params(rid, params)
        fault_point("mlflow.log")

        now = int(time.time() * 1000)
        metrics = []
        # the evaluation at initialisation is step 0 of the same curves (k-NN, test accuracy, collapse)
        initial = [result["initial"]] if isinstance(result.get("initial"), dict) else []
        for h in initial + list(result.get("history", [])):
            for k, v in h.items():
                if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool):
                    metrics.append(Metric(sanitize_metric_name(f"train/{k}"), float(v), now, int(h["epoch"])))
        r: Any  # a row of the run's spectra table (metric, layer, token_set: str; epoch: int; value: float)
        for r in rows.itertuples(index=False):
            if pd.notna(r.value):
                name = metric_name(r.metric, r.layer, r.token_set)
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
        else:  # runners.objectives.learning_status: what every claim reading this run also says
            from runners.objectives import learning_status

            why = learning_status(result)
            if why:
                self.client.set_tag(rid, "not_learned", why)

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
        # mlflow marks Dataset.profile abstract but MetaDataset, its own concrete class, leaves it out
        # (Dataset is not an ABC, so it instantiates)
        dataset = MetaDataset(CodeDatasetSource(tags=tags), name=ds["name"], digest=digest(ds, 16))  # type: ignore[abstract]
        inp = DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", "training")])
        log_inputs_once(self.client, rid, [inp])

    def _log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])


def _aggregates_note(layers: pd.DataFrame, conditions: list[str | None]) -> str:
    """What the parent run's ``seed_mean/``, ``seed_ci_low/``, ``seed_ci_high/`` step metrics hold: the
    layer each step is (MLflow's steps carry no names) and, in a design with conditions, which set is
    which condition."""
    rows: list[Any] = list(layers.itertuples())  # (layer, layer_index, ...) rows of the run table
    steps = ", ".join(f"{int(r.layer_index)} {r.layer}" for r in rows)
    note = (
        "seed_mean/, seed_ci_low/, seed_ci_high/: the mean over seeds and its 95% t CI by layer, step = "
        f"layer ({steps}); one chart over layer names per metric: artifacts seed_aggregates/*.png"
    )
    named = [c for c in conditions if c is not None]
    if named:
        sets = ", ".join(
            f".../{sanitize_metric_name(c)}" + (f" = {c}" if sanitize_metric_name(c) != c else "")
            for c in named
        )
        note += f"; one set per condition, never averaged over conditions: {sets}"
    return note


def _claimed_slices(claims: list, table: pd.DataFrame) -> list[tuple[str, str, str, int | str]]:
    """(metric, token set, dataset, epoch) of every claim, once each: the claim's subset (default token set
    ``all``, epoch ``last``) over the datasets it names (default: every dataset of the table)."""
    out: dict[tuple, None] = {}
    for claim in claims:
        subset = getattr(claim, "subset", None)
        token_set = getattr(subset, "token_set", None) or "all"
        epoch = getattr(subset, "epoch", None) or "last"
        datasets = claim.datasets_named() or sorted(map(str, table["dataset"].unique()))
        for ds in datasets:
            out[(claim.metric, token_set, ds, epoch)] = None
    return list(out)


def run_times(result: dict) -> tuple[int | None, int | None]:
    """A child run's start and end (ms since the epoch) from its training run's own times (``result.json``'s
    ``started_at`` and ``finished_at`` or ``failed_at``, unix seconds), so MLflow shows how long it trained,
    not how long logging took. (None, None) where they are missing or out of order (an imported run, a
    run from before they were kept): MLflow then takes the logging times."""
    start, end = result.get("started_at"), result.get("finished_at") or result.get("failed_at")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)) or end < start:
        return None, None
    return int(start * 1000), int(end * 1000)


def _cell_runs(cell, plan: list) -> int:
    """Runs of the plan a cell reads (an untrained cell: its twin's)."""
    return sum(1 for s in plan if s.condition == (cell.twin or cell.name))


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


DUPLICATE_KEY = ("UniqueViolation", "unique constraint", "UNIQUE constraint failed", "Duplicate entry")


def log_inputs_once(client: Any, run_id: str, datasets: list, tries: int = 3) -> None:
    """``client.log_inputs`` that survives another process logging the same dataset at the same moment.

    MLflow's SQL store looks the dataset (experiment, name, digest) up and inserts it when absent; two
    processes on one database (two output folders, or Ray workers) can both find it absent, and the second
    insert fails with a duplicate key (seen on PostgreSQL: ``dataset_pk``). The failed transaction is rolled
    back, and a retry finds the dataset and links this run to it.
    """
    from mlflow.exceptions import MlflowException

    for attempt in range(tries):
        try:
            client.log_inputs(run_id, datasets=datasets)
            return
        except MlflowException as e:
            if attempt == tries - 1 or not any(k in str(e) for k in DUPLICATE_KEY):
                raise
            time.sleep(0.05 * (attempt + 1))
