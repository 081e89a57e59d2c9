"""The ``design`` of a hypothesis file: what to train and measure. The probe set, and the :class:`Design`
model (datasets, model, objective, training, seeds, checkpoints, source, conditions) with its checks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from runners.models import ModelSpec, TimmModel, cnn_blocks, family
from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    TrainingSpec,
    find_preset,
    objective_names,
    preset_names,
)
from runners.sources import DEFAULT_SOURCE, SOURCES, DesignFacts, RunSource
from runners.sources.base import declares
from study.schema._conditions import DEFAULT_MAX_RUNS, Cell, ConditionSpec, Labels, check_size, expand
from study.schema._conditions import FieldError as _FieldError
from study.schema._errors import _error_of
from study.schema._unions import DatasetSpec, ObjectiveSpec, SourceSpec
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import cnn_layer_names, layer_names
from vitstudy_core.settings import Strict


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


class Design(Strict):
    datasets: list[DatasetSpec] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    objective: ObjectiveSpec = OBJECTIVES[DEFAULT_OBJECTIVE].model_validate({})  # its defaults
    training: TrainingSpec = TrainingSpec()
    seeds: list[int] = Field(min_length=1)
    checkpoints: list[int] | None = None  # epochs at which spectra are measured; default: last epoch
    probe: ProbeSpec = ProbeSpec()
    source: SourceSpec | None = None  # None: train every run; else import them (objective/training unused)
    # built-in controls (study.schema._conditions): a seeded permutation of the training labels; no training at all
    labels: Labels = "true"
    untrained: bool = False
    # conditions: a list of named cells, or factors crossed into cells (study.schema._conditions); neither: one cell
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

    @model_validator(mode="before")
    @classmethod
    def _models_are_seeds(cls, data: object) -> object:
        """A pretrained source's models are its seeds ``0 .. M-1`` (runners.sources.pretrained)."""
        if not isinstance(data, dict):
            return data
        src = data.get("source")
        if isinstance(src, dict) and declares(src.get("kind"), "models_are_seeds") and "seeds" not in data:
            models = src.get("models")
            data = {**data, "seeds": list(range(len(models))) if isinstance(models, dict) else [0]}
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _expand_cells(cls, data: object, handler, info: ValidationInfo) -> Design:
        """The conditions' cells, each validated as a design of its own from the raw base design (so a
        cell is keyed as the single-condition file with the same parts: ``study.schema._conditions``)."""
        design = handler(data)
        is_cell = bool(info.context and info.context.get("cell"))
        trains = not (info.context and info.context.get("trains") is False)  # max_runs bounds training only
        if design.untrained and not is_cell:
            raise _FieldError(
                "design.untrained",
                "untrained: true goes in a condition (its rows are the epoch-0 rows of a trained condition's runs)",
            )
        if design.conditions is None and design.factors is None:
            if trains:
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
        cells = expand(
            data if isinstance(data, dict) else design.model_dump(),
            design.conditions,
            design.factors,
            lambda raw: cls.model_validate(raw, context={**(info.context or {}), "cell": True}),
            _error_of,
        )
        if trains:
            design._check_size(cells, "design.factors" if design.factors else "design.conditions")
        design._cells = cells
        return design

    def _check_size(self, cells: list[Cell], where: str) -> None:
        check_size(cells, len(self.datasets), len(self.seeds), self.max_runs, where)

    def cells(self) -> list[Cell]:
        """The design's cells (``study.schema._conditions.Cell``): one unnamed cell (itself) without conditions."""
        return list(self._cells) if self._cells is not None else [Cell(None, self)]

    def condition_names(self) -> list[str]:
        """The conditions' names, in order ([] without conditions)."""
        return [c.name for c in self._cells or [] if c.name is not None]  # conditions' cells are all named

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
        if found is not None and isinstance(obj, dict):  # (a preset is found only in a mapping)
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

    @field_validator("seeds", "checkpoints", mode="before")
    @classmethod
    def _no_bools(cls, v: object, info: ValidationInfo) -> object:
        """YAML's ``true`` would pass as the integer 1: a bool is neither a seed nor an epoch."""
        if isinstance(v, list):
            what = "seed" if info.field_name == "seeds" else "checkpoint epoch"
            for i, x in enumerate(v):
                if isinstance(x, bool):
                    raise ValueError(f"expected integers; [{i}] is {str(x).lower()}, a bool, not a {what}")
        return v

    @field_validator("seeds", "checkpoints")
    @classmethod
    def _each_once(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        """A repeated seed or checkpoint epoch changes no run but the design's hash (pre-registration)."""
        twice = sorted({x for i, x in enumerate(v or []) if x in v[:i]}) if v else []
        if twice:
            what = "seed" if info.field_name == "seeds" else "epoch"
            raise ValueError(f"expected each {what} once; {', '.join(map(str, twice))} given more than once")
        return v

    @model_validator(mode="after")
    def _check(self) -> Design:
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")
        self._check_source()
        m = self.model.resolved()
        if "embed_dim" in m and "num_heads" in m and m["embed_dim"] % m["num_heads"]:
            raise _FieldError(
                "design.model.num_heads",
                f"embed_dim {m['embed_dim']} is not divisible by num_heads {m['num_heads']}",
            )
        if family(m["name"]) == "cnn":
            self._check_cnn(m)
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
        for d in self.datasets:
            size = getattr(d, "image_size", None)
            problem = self.objective.check_data(TimmModel.model_validate(m), size) if size else None
            if problem is not None:
                raise _FieldError(f"design.objective.{problem[0]}", f"dataset {d.name}: {problem[1]}")
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

    def _check_cnn(self, model: dict) -> None:
        """A CNN is trained here or published (``source: pretrained``; imported runs are read for ViTs only),
        timm builds it, and it has residual blocks the extraction can observe."""
        if self.source is not None and not declares(self.source.kind, "reads_cnns"):
            raise _FieldError(
                "design.model.name",
                f"{model['name']} is a CNN: CNNs are trained by the study or published (source: pretrained); "
                f"imported runs (source: {self.source.kind}) are read for timm Vision Transformers only",
            )
        from runners.model_table import built_shape

        shape = built_shape(model)
        args = f" with model_args {model['model_args']}" if model.get("model_args") else ""
        if shape is None:
            raise _FieldError("design.model", f"timm cannot build {model['name']}{args}")
        if not shape.get("blocks"):
            raise _FieldError(
                "design.model.name",
                f"{model['name']} has no residual blocks to observe: expected a timm ViT, a ResNet-family CNN "
                "(layer1, layer2, ...) or a CNN of stages[i].blocks (ConvNeXt, ...)",
            )

    @property
    def layers(self) -> list[str]:
        """Observation points in depth order: a ViT's patch_embed, pos_embed, block_01..block_NN, norm; a
        CNN's stem, block_01..block_NN (its residual blocks, counted on the model timm builds on the meta
        device: ``runners.model_table.built_shape``), pool."""
        model = self.model.resolved()
        if family(model["name"]) == "cnn":
            return cnn_layer_names(cnn_blocks(model))
        return layer_names(model["depth"])
