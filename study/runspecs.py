"""Planner: a validated hypothesis -> the training runs it needs (dataset x seed), each with a stable key.

A run's key is a hash of everything that determines the trained model and its measurements (dataset
spec, resolved model, objective, training settings, seed, checkpoint epochs, probe set, and the
versions of the data generator and the extraction protocol). Two hypothesis files that need the same
run get the same key, so the run is trained once and reused.

An on-disk dataset enters the key by its content fingerprint and the loader's version, never by its path.
``run`` records the fingerprint in ``<out>/data/fingerprints.json``; planning against that folder
elsewhere (``table`` on a host without the data) reuses it, so the keys do not depend on where, or
whether, the data are present (``runners.datasets.resolve_fingerprint``). An imported run (``design.source``) is keyed by the sha256
fingerprint of its files' content (and how they are read) in place of training.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from runners.datasets import GENERATOR_VERSION, LOADER_VERSION, resolve_fingerprint, resolve_path
from runners.objectives import DEFAULT_OBJECTIVE, objective_payload, trainer_version
from runners.sources import DEFAULT_SOURCE
from study.measured_by import claimed_metrics, plugin_parts
from study.schema import Hypothesis
from vitstudy_core.hashing import digest

# Bump when what a run measures changes (observation points, token sets, covariance scheme).
PROTOCOL_VERSION = 2  # 2: activation observables (scalars.json) and covariance snapshots


class RunSpec(BaseModel):
    """Everything one training run needs; ``key`` identifies it across hypothesis files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    dataset: dict
    model: dict
    objective: str | dict  # "supervised" (plain) or the objective's settings
    training: dict
    seed: int
    checkpoints: list[int]
    probe: dict
    source: str = DEFAULT_SOURCE  # the run source that fills its folder (runners.sources); the default stays out of the key
    # an imported run: the source's settings, its resolved path and its content fingerprint (None: trained)
    imported: dict | None = None
    # "shuffled": trained on a seeded permutation of the training labels (in the key; "true" is not)
    labels: Literal["true", "shuffled"] = "true"
    # which condition of this file the run belongs to (None: a design without conditions), its factor
    # levels, and the untrained conditions that read its epoch-0 rows: a view of this file, never in the
    # key or the dump (another file may reuse the run under another name)
    condition: str | None = Field(None, exclude=True)
    levels: dict[str, str] = Field(default_factory=dict, exclude=True)
    epoch0_conditions: tuple[str, ...] = Field((), exclude=True)
    # the plug-in parts that shape the run, as its key holds them (study.measured_by.plugin_parts): the
    # worker that fills it refuses to when it lacks one (runners.executors.jobs.execute_run); a run of
    # built-ins only has none and dumps as runs did before plug-ins
    plugins: dict = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict:
        """A run on the true labels dumps as runs did before labels could be shuffled (what the runners
        receive, the child run's params and its ``spec_hash``)."""
        out = handler(self)
        if out.get("labels") == "true":
            del out["labels"]
        if not out.get("plugins", True):
            del out["plugins"]
        return out

    @property
    def label(self) -> str:
        """``dataset/seedN``, led by the condition's name in a design with conditions."""
        lead = f"{self.condition}/" if self.condition is not None else ""
        return f"{lead}{self.dataset['name']}/seed{self.seed}"


def run_key(payload: dict, metrics: Collection[str] = (), parts: dict | None = None) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of a run's determining fields; ``metrics``: what
    the study's claims name (a plug-in's observable or token-count metric among them enters the key);
    ``parts``: ``plugin_parts(payload, metrics)`` when the caller has it."""
    payload = {**payload, "protocol_version": PROTOCOL_VERSION, "generator_version": GENERATOR_VERSION}
    if "path" in payload["dataset"]:  # on disk; procedural keys stay as they were
        payload["loader_version"] = LOADER_VERSION
    # The display name and where the files live do not change what is trained (the folder's content
    # fingerprint does); unset procedural knobs are left out so older files keep their keys.
    payload["dataset"] = {
        k: v for k, v in payload["dataset"].items() if k not in ("name", "path") and v is not None
    }
    # probe blocks off (0, the default) keeps the keys runs had before blocks existed
    if "probe" in payload:
        payload["probe"] = {k: v for k, v in payload["probe"].items() if not (k == "blocks" and not v)}
    # torch.compile changes speed, not the result (beyond float rounding on GPU)
    payload["training"] = {k: v for k, v in payload["training"].items() if k != "compile"}
    # an objective whose trainer changed what the same settings train (DINO's warmup, version 2) keys on it
    version = trainer_version(payload.get("objective", DEFAULT_OBJECTIVE))
    if version > 1:
        payload["trainer_version"] = version
    if payload.get("source", DEFAULT_SOURCE) == DEFAULT_SOURCE:
        payload.pop("source", None)
    if payload.get("imported") is None:
        payload.pop("imported", None)
    else:  # an imported run is its files' content: where they lie does not change it
        payload["imported"] = {k: v for k, v in payload["imported"].items() if k not in ("path", "paths")}
    parts = plugin_parts(payload, metrics) if parts is None else parts
    if parts:  # a plug-in's part shapes this run (study.measured_by); built-ins only keep their keys
        payload["plugins"] = parts
    return digest(payload, 16)


def _spec(payload: dict, metrics: Collection[str], **view) -> RunSpec:
    """The run of ``payload``: its key, and the plug-in parts the key holds (for the worker's check)."""
    parts = plugin_parts(payload, metrics)
    return RunSpec(key=run_key(payload, metrics, parts), plugins=parts, **payload, **view)


def plan_runs(hyp: Hypothesis, data_dir: str | Path | None = None, record: bool = False) -> list[RunSpec]:
    """One RunSpec per (trained cell, dataset, seed) of the design, in file order.

    A cell's runs are keyed as the runs of a single-condition file with the cell's design
    (``study.schema._conditions``); an untrained cell has no runs of its own: its twin's runs name it in
    ``epoch0_conditions``.

    Args:
        data_dir: the output folder's ``data/``, where on-disk fingerprints are recorded (None: the
            folder's own fingerprint if it is here, else None: ``dataset["fingerprint"]`` is None and the
            keys of that dataset's runs are not those it was trained under).
        record: record the fingerprint of each on-disk dataset's folder (``run``, with the data present).
    """
    if hyp.design.source is not None:
        return _plan_imports(hyp)
    cells = hyp.design.cells()
    metrics = claimed_metrics(hyp.claims)
    datasets = [_dataset_payload(ds, data_dir, record) for ds in hyp.design.datasets]
    runs = []
    for cell in cells:
        if cell.untrained:
            continue
        design = cell.design
        obj = objective_payload(
            design.objective
        )  # plain supervised stays the string "supervised": stable keys
        view = {
            "condition": cell.name,
            "levels": cell.levels,
            "epoch0_conditions": tuple(c.name for c in cells if c.untrained and c.twin == cell.name),
        }
        for dataset in datasets:
            for seed in design.seeds:
                payload = {
                    "dataset": dataset,
                    "model": design.model.resolved(),
                    "objective": obj,
                    "training": design.training.model_dump(),
                    "seed": seed,
                    "checkpoints": design.checkpoint_epochs,
                    "probe": design.probe.model_dump(),
                }
                if design.labels != "true":  # true labels stay out of the payload: today's keys
                    payload["labels"] = design.labels
                runs.append(_spec(payload, metrics, **view))
    return runs


def unknown_fingerprints(plan: list[RunSpec]) -> list[str]:
    """Names of on-disk datasets in ``plan`` whose fingerprint (so whose run keys) is unknown here."""
    return list(
        dict.fromkeys(s.dataset["name"] for s in plan if "path" in s.dataset and not s.dataset["fingerprint"])
    )


def _dataset_payload(ds, data_dir=None, record: bool = False) -> dict:
    dataset = ds.model_dump()
    if "path" in dataset:  # on disk: resolve ${ENV} if set; the recorded or the content's fingerprint
        path = resolve_path(dataset["path"], strict=False)
        dataset["path"] = str(path) if path is not None else dataset["path"]
        dataset["fingerprint"] = resolve_fingerprint(dataset, data_dir, record)
    return dataset


def _plan_imports(hyp: Hypothesis) -> list[RunSpec]:
    """Imported runs (``design.source``): keyed by their files' content fingerprint, not by training."""
    from runners.sources import imported_record

    design = hyp.design
    assert design.source is not None  # plan_runs calls this for a design with a source only
    source = design.source.model_dump()
    runs = []
    for ds in design.datasets:
        dataset = _dataset_payload(ds)
        for seed in design.seeds:
            payload = {
                "dataset": dataset,
                "model": design.model.resolved(),
                "objective": "none",  # nothing is trained
                "training": {},
                "seed": seed,
                "checkpoints": design.checkpoint_epochs,
                "probe": design.probe.model_dump(),
                "source": source["kind"],
                "imported": imported_record(
                    source, dataset["name"], seed, design.checkpoint_epochs, len(design.seeds)
                ),
            }
            runs.append(_spec(payload, claimed_metrics(hyp.claims)))
    return runs
