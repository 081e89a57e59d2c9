"""Hypothesis file schema: pydantic models with ``extra="forbid"``, loaded with ``yaml.safe_load``.

A hypothesis file has a ``name``, a ``description``, a ``design`` (what to train and measure) and a
list of ``claims`` (what to test on the measurements). ``load_hypothesis`` turns a file into a validated
:class:`Hypothesis` or raises :class:`~vitstudy_core.errors.StudyError` with one line naming the file, the
field and what was expected. Nothing in a hypothesis file executes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from analysis.kinds import KINDS, claim_models
from analysis.kinds.base import Condition, Subset  # noqa: F401 - part of the schema's public names
from analysis.observables import ALL_METRICS
from runners.datasets import DATASETS, kind_of
from runners.datasets.procedural import ProceduralDataset
from runners.models import ModelSpec, TimmModel
from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    TrainingSpec,
    find_preset,
    objective_names,
    preset_names,
)
from runners.sources import DEFAULT_SOURCE, SOURCES, DesignFacts, RunSource
from study import conditions as cond
from study.conditions import DEFAULT_MAX_RUNS, Cell, ConditionSpec, Labels
from study.conditions import FieldError as _FieldError
from vitstudy_core.errors import StudyError
from vitstudy_core.knobs import INTEGER_KNOBS, Knob
from vitstudy_core.layers import TokenSet, layer_names
from vitstudy_core.plugins import load_plugins
from vitstudy_core.settings import Strict

# the installed plug-ins register before any union below is built from the registries
load_plugins()


# --------------------------------------------------------------------------------------------------
# Design
# --------------------------------------------------------------------------------------------------
def _dataset_kind(v: object) -> str:
    """The tag of a ``design.datasets`` entry: its ``kind`` (none given: ``runners.datasets.DEFAULT_KIND``)."""
    return kind_of(v)  # files written before real datasets existed have no kind


# one union member per registered dataset kind (runners.datasets), tagged by its kind
DATASET_KINDS = tuple(DATASETS)
DatasetSpec = Annotated[
    Union[tuple(Annotated[k.model, Tag(k.name)] for k in DATASETS.values())],  # noqa: UP007 - built at run time
    Discriminator(_dataset_kind),
]


# --------------------------------------------------------------------------------------------------
# Model, training and objective: their settings live beside the code that uses them (runners.models,
# runners.objectives); the objective union is built from the registry, one member per objective
# --------------------------------------------------------------------------------------------------
def _objective_kind(v: object) -> str:
    if isinstance(v, dict):
        return v.get("kind", DEFAULT_OBJECTIVE)
    return getattr(v, "kind", DEFAULT_OBJECTIVE)


ObjectiveSpec = Annotated[
    Union[tuple(Annotated[OBJECTIVES[name], Tag(name)] for name in objective_names())],  # noqa: UP007 - built at run time
    Discriminator(_objective_kind),
]


class ProbeSpec(Strict):
    """The fixed held-out probe set on which covariances are measured (same for every seed)."""

    size: int = Field(512, ge=8)
    seed: int = 12345  # its own seed: never one of the training seeds' streams
    batch_size: int = Field(256, ge=1)
    # float32 covariance matrices of token set `all` per layer, saved to covariances.npz for heatmaps:
    # first and last checkpoint by default (2 x layers x D^2 x 4 bytes: ~3 MB at D = 64, 15 points)
    covariance_epochs: Literal["first_last", "none"] | list[int] = "first_last"
    # K >= 2: extraction also keeps token sums over K contiguous blocks of probe images (blocks.npz), so a
    # claim with `uncertainty: seeds+probe` can resample the probe without a second pass; 0: off (opt-in:
    # K x D^2 float64 per point and checkpoint, 12 MB at D = 64 and 426 MB at ViT-S for K = 16)
    blocks: int = Field(0, ge=0, le=256)

    @model_validator(mode="after")
    def _enough_images(self) -> ProbeSpec:
        if self.blocks == 1:
            raise ValueError("expected 0 (off) or at least 2 blocks, got 1")
        if self.blocks and self.size < 2 * self.blocks:
            raise ValueError(
                f"a probe of {self.size} images is too small for {self.blocks} blocks (needs >= 2 images per block)"
            )
        return self


# --------------------------------------------------------------------------------------------------
# Run sources: training (no ``source``), or runs imported from disk; each source's settings model and
# design checks live in its plug-in (runners.sources), this section only assembles them
# --------------------------------------------------------------------------------------------------
_IMPORTED_SOURCES = [s for s in SOURCES.values() if s.settings is not None]
SOURCE_TAGS = tuple(f"{s.name}_source" for s in _IMPORTED_SOURCES)  # "_source": never a field's name


def _source_kind(v: object) -> str:
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return f"{kind}_source"


SourceSpec = Annotated[
    Union[tuple(Annotated[s.settings, Tag(f"{s.name}_source")] for s in _IMPORTED_SOURCES)],  # noqa: UP007
    Discriminator(_source_kind),
]


class Design(Strict):
    datasets: list[DatasetSpec] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    objective: ObjectiveSpec = OBJECTIVES[DEFAULT_OBJECTIVE]()
    training: TrainingSpec = TrainingSpec()
    seeds: list[int] = Field(min_length=1)
    checkpoints: list[int] | None = None  # epochs at which spectra are measured; default: last epoch
    probe: ProbeSpec = ProbeSpec()
    source: SourceSpec | None = None  # None: train every run; else import them (objective/training unused)
    # built-in controls (study.conditions): a seeded permutation of the training labels; no training at all
    labels: Labels = "true"
    untrained: bool = False
    # conditions: a list of named cells, or factors crossed into cells (study.conditions); neither: one cell
    conditions: list[ConditionSpec] | None = Field(None, min_length=1)
    factors: dict[str, list] | None = Field(None, min_length=1)
    max_runs: int = Field(DEFAULT_MAX_RUNS, ge=1)  # a larger design is refused before anything is written
    _cells: list[Cell] | None = PrivateAttr(None)

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict:
        """The fields added with conditions are left out at their defaults: a design without them dumps
        (and so hashes, for the registration) as it did before they existed."""
        out = handler(self)
        for name in ("labels", "untrained", "conditions", "factors", "max_runs"):
            if name in out and out[name] == type(self).model_fields[name].default:
                del out[name]
        return out

    @model_validator(mode="wrap")
    @classmethod
    def _expand_cells(cls, data: object, handler, info: ValidationInfo) -> Design:
        """The conditions' cells, each validated as a design of its own from the raw base design (so a
        cell is keyed as the single-condition file with the same parts: ``study.conditions``)."""
        design = handler(data)
        is_cell = bool(info.context and info.context.get("cell"))
        if design.untrained and not is_cell:
            raise _FieldError(
                "design.untrained",
                "untrained: true goes in a condition (its rows are the epoch-0 rows of a trained condition's runs)",
            )
        if design.conditions is None and design.factors is None:
            design._check_size([Cell(None, design)], "design.seeds")
            return design
        if design.conditions is not None and design.factors is not None:
            raise _FieldError("design.factors", "give conditions or factors, not both")
        if design.source is not None:
            raise _FieldError("design.conditions", "imported runs (design.source) take no conditions")
        if design.conditions is not None:
            names = [c.name for c in design.conditions]
            for i, name in enumerate(names):
                if name in names[:i]:
                    raise _FieldError(
                        f"design.conditions[{i}].name", f"condition name {name!r} is used twice"
                    )
        cells = cond.expand(
            data if isinstance(data, dict) else design.model_dump(),
            design.conditions,
            design.factors,
            lambda raw: cls.model_validate(raw, context={"cell": True}),
            _error_of,
        )
        design._check_size(cells, "design.factors" if design.factors else "design.conditions")
        design._cells = cells
        return design

    def _check_size(self, cells: list[Cell], where: str) -> None:
        cond.check_size(cells, len(self.datasets), len(self.seeds), self.max_runs, where)

    def cells(self) -> list[Cell]:
        """The design's cells (``study.conditions.Cell``): one unnamed cell (itself) without conditions."""
        return list(self._cells) if self._cells is not None else [Cell(None, self)]

    def condition_names(self) -> list[str]:
        """The conditions' names, in order ([] without conditions)."""
        return [c.name for c in self._cells or []]

    @model_validator(mode="before")
    @classmethod
    def _apply_objective_preset(cls, data: object) -> object:
        """``objective: NAME`` (an objective or a preset) -> a mapping; a preset fills unset training/model
        keys (the objective's own fields: ``runners.objectives.ObjectiveSettings``)."""
        if not isinstance(data, dict):
            return data
        obj = data.get("objective")
        if isinstance(obj, str):
            found = find_preset(obj)
            if found is not None:
                obj = {"kind": found[0], "preset": obj}
            elif obj in OBJECTIVES:
                obj = {"kind": obj}
            else:
                names = ", ".join(map(repr, objective_names()))
                raise _FieldError(
                    "design.objective", f"expected {names} or a preset {preset_names()}, got {obj!r}"
                )
        preset = obj.get("preset") if isinstance(obj, dict) else None
        found = find_preset(preset) if isinstance(preset, str) else None
        if found is not None:
            kind, preset = found
            if kind != obj.get("kind", DEFAULT_OBJECTIVE):
                raise _FieldError(
                    "design.objective.preset",
                    f"preset {obj['preset']!r} is a {kind} preset, got kind {obj.get('kind', DEFAULT_OBJECTIVE)!r}",
                )
            data = dict(data)
            for part in ("training", "model"):
                given = data.get(part) or {}
                if isinstance(given, dict):
                    data[part] = {**getattr(preset, part), **given}
        if obj is not None:
            data = {**data, "objective": obj}
        return data

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be unique")
        return v

    @model_validator(mode="after")
    def _check(self) -> Design:
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")
        self._check_source()
        m = self.model.resolved()
        if "embed_dim" in m and "num_heads" in m and m["embed_dim"] % m["num_heads"]:
            raise ValueError(f"embed_dim {m['embed_dim']} is not divisible by num_heads {m['num_heads']}")
        problem = self.objective.check_model(TimmModel.model_validate(m))
        if problem is not None:
            raise _FieldError(f"design.objective.{problem[0]}", problem[1])
        if self.labels == "shuffled" and not self.objective.uses_labels:
            raise _FieldError(
                "design.labels",
                f"objective {self.objective.kind} trains without labels: shuffling them changes nothing "
                "(use shuffled labels with a supervised objective)",
            )
        if isinstance(self.probe.covariance_epochs, list):
            for ep in self.probe.covariance_epochs:
                if ep not in self.checkpoint_epochs:
                    raise _FieldError(
                        "design.probe.covariance_epochs",
                        f"expected checkpoint epochs {self.checkpoint_epochs}, got {ep}",
                    )
        return self

    def _check_source(self) -> None:
        """The design's run source takes every dataset, and its own checks pass (``RunSource.check_design``:
        paths per seed and dataset, layer names, the epochs it needs, ...)."""
        source = self.run_source
        for d in self.datasets:
            if not source.accepts_dataset(d.kind):
                takers = " or ".join(n for n, s in SOURCES.items() if s.accepts_dataset(d.kind))
                raise _FieldError(
                    "design.datasets", f"dataset {d.name!r} (kind {d.kind}) needs a {takers} source"
                )
        facts = DesignFacts(
            seeds=tuple(self.seeds),
            datasets=tuple(d.name for d in self.datasets),
            layers=tuple(self.layers),
            checkpoints=tuple(self.checkpoints) if self.checkpoints is not None else None,
            trained_epochs=self.training.epochs,
        )
        try:
            source.check_design(self.source, facts)
        except StudyError as exc:
            raise _FieldError(exc.field or "design", exc.message) from None

    @property
    def run_source(self) -> RunSource:
        """The registered source that fills this design's runs (``runners.sources``)."""
        return SOURCES.get(self.source.kind if self.source is not None else DEFAULT_SOURCE)

    @property
    def checkpoint_epochs(self) -> list[int]:
        """Epochs measured: ``checkpoints``, else the source's default (training: the last epoch; a table
        source: every epoch of its log, ``[]``)."""
        if self.checkpoints:
            return sorted(set(self.checkpoints))
        return self.run_source.default_epochs(self.training.epochs)

    @property
    def layers(self) -> list[str]:
        """Observation points in depth order: patch_embed, pos_embed, block_01..block_NN, norm."""
        return layer_names(self.model.resolved()["depth"])


def with_data_roots(hyp: Hypothesis, roots: dict[str, str], file: str | None = None) -> Hypothesis:
    """A copy of ``hyp`` whose on-disk datasets named in ``roots`` (name -> folder) get those paths.

    The name ``source`` sets the path (template) of an import source (``design.source.path``).
    """
    known = {d.name: d for d in hyp.design.datasets}
    source = hyp.design.source
    for name in roots:
        if (name not in known or not hasattr(known[name], "path")) and not (name == "source" and source):
            disk = sorted(n for n, d in known.items() if hasattr(d, "path")) + (["source"] if source else [])
            raise StudyError(
                f"expected the name of an on-disk dataset {disk}, got {name!r}", file, "--data-root"
            )
    datasets = [
        d.model_copy(update={"path": roots[d.name]}) if d.name in roots and d.name in known else d
        for d in hyp.design.datasets
    ]
    update: dict = {"datasets": datasets}
    if source is not None and "source" in roots:
        update["source"] = source.model_copy(update={"path": roots["source"], "paths": None})
    return hyp.model_copy(update={"design": hyp.design.model_copy(update=update)})


# --------------------------------------------------------------------------------------------------
# Claims: one model per registered kind (analysis.kinds), discriminated by ``kind``
# --------------------------------------------------------------------------------------------------
CLAIM_KINDS = tuple(KINDS)
Claim = Annotated[Union[tuple(claim_models())], Field(discriminator="kind")]  # noqa: UP007 - built at run time


# --------------------------------------------------------------------------------------------------
# Sweep: a design dataset's knobs varied over trials (python -m study sweep)
# --------------------------------------------------------------------------------------------------
class KnobRange(Strict):
    """A range of a knob for the ``qmc``, ``random`` and ``tpe`` samplers (integers for integer knobs)."""

    low: float
    high: float
    step: float | None = Field(None, gt=0)  # a discrete grid inside the range
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> KnobRange:
        if not self.low < self.high:
            raise ValueError(f"expected low < high, got low {self.low} and high {self.high} (an empty range)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got low {self.low:g}")
        if self.log and self.step is not None:
            raise ValueError("a log range takes no step (give log or step, not both)")
        return self


class SweepObjective(Strict):
    """Each trial's objective: a per-seed number, averaged over seeds; optuna maximises or minimises it.

    Either a per-seed summary of ``metric`` over ``layers`` at ``epoch`` (``min``, ``mean``, ``range`` =
    max - min, ``argmin`` = the depth index of the minimum), or the effect of the claim named ``claim``
    (a claim of the file that is not over a knob; its per-seed values on the trial's runs).
    """

    metric: str | None = None
    summary: Literal["min", "mean", "range", "argmin"] = "min"
    layers: list[str] | None = None  # default: every block
    epoch: int | Literal["last"] = "last"
    token_set: TokenSet = "all"
    claim: str | None = None
    direction: Literal["maximize", "minimize"] = "maximize"

    @model_validator(mode="after")
    def _one_of(self) -> SweepObjective:
        if (self.metric is None) == (self.claim is None):
            raise ValueError("give either metric (a per-seed summary) or claim (a claim's effect)")
        return self


class Sweep(Strict):
    """Which dataset's knobs vary, over what, with which optuna sampler, for how many trials.

    ``space`` maps a knob to a list of values (any sampler; ``grid`` needs lists) or a range
    (``{low, high, step?, log?}``; ``qmc``, ``random``, ``tpe``). ``storage``: any optuna storage URL
    (e.g. a database shared by many workers); default an embedded journal file in the output folder.
    """

    dataset: str
    space: dict[Knob, list[float] | KnobRange] = Field(min_length=1)
    sampler: Literal["grid", "qmc", "random", "tpe"] = "grid"
    n_trials: int | None = Field(None, ge=1)  # default: the grid's size (grid), else required
    objective: SweepObjective
    storage: str | None = None
    seed: int = 0  # the sampler's seed

    @field_validator("space", mode="before")
    @classmethod
    def _ranges(cls, space: object) -> object:
        """A mapping value is a range: validated here so an error names the knob and the problem."""
        if not isinstance(space, dict):
            return space
        out = {}
        for knob, values in space.items():
            if isinstance(values, dict):
                try:
                    values = KnobRange.model_validate(values)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    what = (
                        "unknown key"
                        if err["type"] == "extra_forbidden"
                        else err["msg"].removeprefix("Value error, ")
                    )
                    loc = ".".join(map(str, err["loc"]))
                    raise _FieldError(f"sweep.space.{knob}" + (f".{loc}" if loc else ""), what) from None
            elif not isinstance(values, list):
                raise _FieldError(
                    f"sweep.space.{knob}",
                    f"expected a list of values or a range {{low, high}}, got {values!r}",
                )
            out[knob] = values
        return out

    @model_validator(mode="after")
    def _space(self) -> Sweep:
        for knob, values in self.space.items():
            if isinstance(values, list) and not values:
                raise _FieldError(f"sweep.space.{knob}", "expected at least one value, got an empty list")
            if self.sampler == "grid" and not isinstance(values, list):
                raise _FieldError(
                    f"sweep.space.{knob}", "the grid sampler needs a list of values, got a range"
                )
        if self.sampler != "grid" and self.n_trials is None:
            raise _FieldError("sweep.n_trials", f"the {self.sampler} sampler needs n_trials")
        return self

    def grid_size(self) -> int:
        size = 1
        for values in self.space.values():
            size *= len(values) if isinstance(values, list) else 1
        return size


NAME_MAX = 128  # the study's name is a folder name (studies/<name>, <name>.lock) and an MLflow experiment's


class Hypothesis(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=NAME_MAX)
    description: str = ""
    design: Design
    claims: list[Claim] = Field(min_length=1)
    sweep: Sweep | None = None
    # every claim at a matched token count unless it sets its own match_tokens (analysis.probe)
    match_tokens: bool = False

    @model_validator(mode="after")
    def _check_probe_needs(self) -> Hypothesis:
        """``uncertainty: seeds+probe`` needs probe blocks and a covariance metric; matching needs spectra."""
        from analysis.probe import resamplable

        log = not self.design.run_source.measures_spectra  # a metric log: no spectra, no probe
        for i, claim in enumerate(self.claims):
            match = claim.match_tokens if claim.match_tokens is not None else self.match_tokens
            if match and log:
                raise _FieldError(
                    f"claims[{i}].match_tokens",
                    "matching token counts needs spectra; a metric log (table source) has none",
                )
            if claim.uncertainty != "seeds+probe":
                continue
            if match:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe resamples the full populations' block sums; it cannot be combined with "
                    "match_tokens (give one claim each)",
                )
            if log:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe resamples the probe's covariances; a metric log has none",
                )
            if self.design.probe.blocks < 2:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe needs design.probe.blocks >= 2 (e.g. 16): the probe's image blocks are resampled",
                )
            if not resamplable(claim.metric):
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    f"seeds+probe recomputes the metric from resampled covariances; {claim.metric!r} is "
                    "measured on a token subsample",
                )
        return self

    @model_validator(mode="after")
    def _check_sweep(self) -> Hypothesis:
        """A sweep varies knobs of a procedural design dataset within their domains; knob claims need it."""
        if self.sweep is not None and self.design.condition_names():
            which = "design.factors" if self.design.factors else "design.conditions"
            raise _FieldError(which, "a sweep varies one design's data: its design takes no conditions")
        varied = set(self.sweep.space) if self.sweep else set()
        for i, claim in enumerate(self.claims):
            knob = claim.knob()
            if knob is not None and knob not in varied:
                what = f"the sweep varies {sorted(varied)}" if varied else "the file has no sweep section"
                raise _FieldError(
                    f"claims[{i}].over", f"a claim over {knob!r} needs a sweep that varies it; {what}"
                )
        if self.sweep is None:
            return self
        names = {d.name: d for d in self.design.datasets}
        ds = names.get(self.sweep.dataset)
        if not isinstance(ds, ProceduralDataset):
            procedural = sorted(n for n, d in names.items() if isinstance(d, ProceduralDataset))
            raise _FieldError(
                "sweep.dataset",
                f"expected a procedural design dataset {procedural}, got {self.sweep.dataset!r}",
            )
        for knob, values in self.sweep.space.items():
            points = values if isinstance(values, list) else [values.low, values.high]
            if knob in INTEGER_KNOBS:
                given = points if isinstance(values, list) else [values.low, values.high, values.step or 1]
                odd = [v for v in given if float(v) != int(v)]
                if odd:
                    raise _FieldError(f"sweep.space.{knob}", f"{knob} takes integers, got {odd[0]!r}")
            for v in points:
                try:
                    ProceduralDataset.model_validate(
                        {**ds.model_dump(), knob: int(v) if knob in INTEGER_KNOBS else v}
                    )
                except ValidationError as exc:
                    why = exc.errors()[0]["msg"].removeprefix("Value error, ")
                    raise _FieldError(
                        f"sweep.space.{knob}", f"{v!r} is outside the knob's domain: {why}"
                    ) from None
        obj = self.sweep.objective
        if obj.epoch != "last" and obj.epoch not in self.design.checkpoint_epochs:
            raise _FieldError(
                "sweep.objective.epoch",
                f"expected 'last' or a checkpoint epoch {self.design.checkpoint_epochs}, got {obj.epoch!r}",
            )
        if obj.claim is not None:
            plain = [c.name for c in self.claims if c.knob() is None]
            if obj.claim not in plain:
                raise _FieldError(
                    "sweep.objective.claim",
                    f"expected the name of a claim not over a knob {plain}, got {obj.claim!r}",
                )
        if obj.metric is not None and obj.metric not in ALL_METRICS:
            raise _FieldError(
                "sweep.objective.metric",
                f"unknown metric {obj.metric!r}; expected one of {list(ALL_METRICS)}",
            )
        for layer in obj.layers or []:
            if layer not in self.design.layers:
                raise _FieldError(
                    "sweep.objective.layers", f"unknown layer {layer!r}; expected one of {self.design.layers}"
                )
        return self

    @field_validator("name")
    @classmethod
    def _folder_name(cls, v: str) -> str:
        if set(v) == {"."}:  # '.' or '..' would put the study's files outside studies/
            raise ValueError("expected a name with a letter, digit, '_' or '-' (it names a folder)")
        return v

    @model_validator(mode="after")
    def _check_claims(self) -> Hypothesis:
        """Every dataset, layer and epoch a claim names must exist in the design."""
        datasets = sorted(d.name for d in self.design.datasets)
        layers = set(self.design.layers)
        epochs = self.design.checkpoint_epochs
        for i, claim in enumerate(self.claims):
            for fld, what, value in claim.named():
                where = f"claims[{i}].{fld}"
                if what == "dataset" and value not in datasets:
                    raise _FieldError(
                        where, f"expected one of the design's datasets {datasets}, got {value!r}"
                    )
                if what == "layer" and value not in layers:
                    raise _FieldError(where, f"unknown layer {value!r}; expected one of {self.design.layers}")
                if what == "epoch" and value != "last" and epochs and value not in epochs:
                    raise _FieldError(where, f"expected a checkpoint epoch {epochs} or 'last', got {value}")
        self._check_conditions_named()
        self._check_adjust_for()
        return self

    def _check_adjust_for(self) -> None:
        """A claim's ``adjust_for`` scalar is one its runs record, in every cell (checked before training)."""
        from analysis.kinds.base import RUN_SCALARS

        objectives = [self.design.objective, *(c.design.objective for c in self.design.cells())]
        for i, claim in enumerate(self.claims):
            name = getattr(claim, "adjust_for", None)
            if name is None:
                continue
            for objective in objectives:
                if RUN_SCALARS[name] not in objective.records:
                    have = sorted(k for k, v in RUN_SCALARS.items() if v in objective.records)
                    raise _FieldError(
                        f"claims[{i}].adjust_for",
                        f"objective {objective.kind} does not record {name!r} (its runs record {have})",
                    )

    def _check_conditions_named(self) -> None:
        """Every condition a claim names is one of the design's (``ClaimBase.conditions_named``)."""
        names = self.design.condition_names()
        for i, claim in enumerate(self.claims):
            for fld, name in claim.conditions_named():
                if name not in names:
                    has = f"it has {names}" if names else "it has no conditions"
                    raise _FieldError(
                        f"claims[{i}].{fld}", f"condition {name!r} is not in the design ({has})"
                    )


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in (
            *DATASET_KINDS,
            *CLAIM_KINDS,
            *SOURCE_TAGS,
            *OBJECTIVES,
        ):  # discriminator tags pydantic inserts
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _error_of(exc: ValidationError) -> tuple[str, str]:
    """``(field, message)`` of a validation error's first error, as the one-line error gives them."""
    err = exc.errors()[0]
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _FieldError):
        return ctx_err.field, ctx_err.message
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key (not part of the schema)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict | list):
        msg = f"{msg}, got {err['input']!r}"
    return _loc(err["loc"]), msg


def parse_hypothesis(data: object, file: str = "<hypothesis>") -> Hypothesis:
    """Validate already-parsed YAML data; raise StudyError naming file, field and expectation."""
    if not isinstance(data, dict):
        raise StudyError(f"expected a mapping at the top level, got {type(data).__name__}", file)
    try:
        return Hypothesis.model_validate(data)
    except ValidationError as exc:
        raise _study_error(exc, file) from None


def parse_claims(data: object, file: str = "<claims>") -> list:
    """Validate a list of claim mappings (or one) on their own, without a design: ``study.api.analyze`` on
    a table from anywhere. Errors name ``claims[i].field`` as in a hypothesis file.

    Returns:
        The validated claim models (the kinds' settings, ``analysis.kinds``), in order.
    """
    from pydantic import TypeAdapter

    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise StudyError(
            f"expected a claim mapping or a non-empty list of them, got {type(data).__name__}", file
        )
    try:
        return TypeAdapter(list[Claim]).validate_python(items)
    except ValidationError as exc:
        err = _study_error(exc, file)
        raise StudyError(err.message, file, f"claims{err.field}" if err.field else "claims") from None


def _study_error(exc: ValidationError, file: str) -> StudyError:
    """pydantic's first error as the one-line StudyError: file, field, expectation."""
    field, msg = _error_of(exc)
    return StudyError(msg, file, field)


MAX_FILE_BYTES = 1 << 20  # a hypothesis file is a page of YAML; 1 MiB leaves room for long claim lists
MAX_DEPTH = 64  # the schema nests about 6 levels; deeper input is junk (and would exhaust the stack)
MAX_NODES = 200_000  # nodes after expanding aliases: stops "billion laughs" anchor bombs


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no tag executes code or builds an object) that also refuses duplicate
    mapping keys, nesting deeper than :data:`MAX_DEPTH` and alias expansions over :data:`MAX_NODES`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' merges; keys written next to it override on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "expected a plain mapping key", key_node.start_mark
                ) from None
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node, memo: dict[int, int]) -> int:
    """Nodes in ``node`` with every alias expanded (shared sub-trees counted each time they appear)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a node reached again while being counted (a recursive alias) counts once
    n = 1
    if isinstance(node, yaml.SequenceNode):
        n += sum(_expanded_size(v, memo) for v in node.value)
    elif isinstance(node, yaml.MappingNode):
        n += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = n
    return n


def _read_yaml(path: Path) -> object:
    """Parse a YAML file with :class:`StrictLoader`; one-line StudyError on any problem."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise StudyError(
            f"file is {path.stat().st_size} bytes; expected a hypothesis file under 1 MiB", str(path)
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise StudyError("expected a UTF-8 text file", str(path)) from None
    loader = None
    try:
        loader = StrictLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise StudyError(f"expands to over {MAX_NODES} YAML nodes through its aliases", str(path))
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise StudyError(f"invalid YAML: {problem}", str(path), where) from None
    except RecursionError:  # a recursive alias through a merge key
        raise StudyError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels", str(path)) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_hypothesis(path: str | Path) -> Hypothesis:
    """Read and validate a hypothesis YAML file.

    The loader is safe (no tag executes code or constructs an object) and strict: a duplicate key, nesting
    deeper than :data:`MAX_DEPTH`, an alias bomb or a file over :data:`MAX_FILE_BYTES` is an error.
    """
    path = Path(path)
    if not path.is_file():
        raise StudyError("file not found (expected a hypothesis YAML file)", str(path))
    return parse_hypothesis(_read_yaml(path), str(path))
