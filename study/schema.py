"""Hypothesis file schema: pydantic models with ``extra="forbid"``, loaded with ``yaml.safe_load``.

A hypothesis file has a ``name``, a ``description``, a ``design`` (what to train and measure) and a
list of ``claims`` (what to test on the measurements). ``load_hypothesis`` turns a file into a validated
:class:`Hypothesis` or raises :class:`~study.errors.StudyError` with one line naming the file, the
field and what was expected. Nothing in a hypothesis file executes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from analysis.observables import ALL_METRICS
from study.errors import StudyError

TOKEN_SETS = ("all", "cls", "patch")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------
# Design
# --------------------------------------------------------------------------------------------------
class ProceduralDataset(_Strict):
    """A dataset generated from a seed (no download): shapes on textured backgrounds, or textures."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["procedural"] = "procedural"
    variant: Literal["objects", "textures"] = "objects"
    n_classes: int = Field(10, ge=2, le=10)
    n_train: int = Field(10_000, ge=16)  # 10k images x 8 epochs fits the CPU budget (SCIENCE.md s4)
    n_test: int = Field(2_000, ge=16)
    image_size: int = Field(16, ge=8, le=256)
    data_seed: int = 0  # the images; run seeds change init and data order only


DatasetSpec = ProceduralDataset  # more kinds (real datasets on disk) join as a tagged union

MODEL_PRESETS: dict[str, dict] = {
    # 12 blocks keep the papers' depth; D=64 with 4 heads is what 2 CPU cores train in minutes.
    "vit_cpu12": {
        "name": "vit_small_patch16_224",
        "patch_size": 4,
        "embed_dim": 64,
        "depth": 12,
        "num_heads": 4,
    },
    # timm's own configurations; img_size always comes from the dataset.
    "vit_tiny": {"name": "vit_tiny_patch16_224"},
    "vit_small": {"name": "vit_small_patch16_224"},
}


class ModelSpec(_Strict):
    """A timm ViT: a preset or any timm model name, plus architecture overrides."""

    preset: Literal["vit_cpu12", "vit_tiny", "vit_small"] | None = "vit_cpu12"
    name: str | None = None
    patch_size: int | None = Field(None, ge=1)
    embed_dim: int | None = Field(None, ge=4)
    depth: int | None = Field(None, ge=1, le=48)
    num_heads: int | None = Field(None, ge=1)
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0)

    def resolved(self) -> dict:
        """The timm arguments (without img_size/num_classes), presets filled in, overrides applied."""
        base = dict(MODEL_PRESETS[self.preset]) if self.preset else {}
        if self.name:
            base["name"] = self.name
        if "name" not in base:
            raise ValueError("give a preset or a timm model name")
        for key in ("patch_size", "embed_dim", "depth", "num_heads"):
            value = getattr(self, key)
            if value is not None:
                base[key] = value
        base.setdefault("depth", 12)
        base["drop_path_rate"] = self.drop_path_rate
        return base


class TrainingSpec(_Strict):
    """Optimisation settings of one training run (supervised cross-entropy, AdamW, warmup + cosine)."""

    epochs: int = Field(8, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)  # AdamW 1e-3 / wd 0.05: the TGO-I recipe
    weight_decay: float = Field(0.05, ge=0)
    warmup_epochs: float = Field(1.0, ge=0)  # short linear warmup keeps early ViT training stable
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    max_steps_per_epoch: int | None = Field(None, ge=1)  # for smoke tests only


class ProbeSpec(_Strict):
    """The fixed held-out probe set on which covariances are measured (same for every seed)."""

    size: int = Field(512, ge=8)
    seed: int = 12345  # its own seed: never one of the training seeds' streams
    batch_size: int = Field(256, ge=1)
    # float32 covariance matrices of token set `all` per layer, saved to covariances.npz for heatmaps:
    # first and last checkpoint by default (2 x layers x D^2 x 4 bytes: ~3 MB at D = 64, 15 points)
    covariance_epochs: Literal["first_last", "none"] | list[int] = "first_last"


class Design(_Strict):
    datasets: list[DatasetSpec] = Field(min_length=1)
    model: ModelSpec = ModelSpec()
    objective: Literal["supervised"] = "supervised"
    training: TrainingSpec = TrainingSpec()
    seeds: list[int] = Field(min_length=1)
    checkpoints: list[int] | None = None  # epochs at which spectra are measured; default: last epoch
    probe: ProbeSpec = ProbeSpec()

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
        for ep in self.checkpoint_epochs:
            if not 0 <= ep <= self.training.epochs:
                raise ValueError(f"checkpoint epoch {ep} outside 0..{self.training.epochs}")
        m = self.model.resolved()
        if "embed_dim" in m and "num_heads" in m and m["embed_dim"] % m["num_heads"]:
            raise ValueError(f"embed_dim {m['embed_dim']} is not divisible by num_heads {m['num_heads']}")
        if isinstance(self.probe.covariance_epochs, list):
            for ep in self.probe.covariance_epochs:
                if ep not in self.checkpoint_epochs:
                    raise _FieldError(
                        "design.probe.covariance_epochs",
                        f"expected checkpoint epochs {self.checkpoint_epochs}, got {ep}",
                    )
        return self

    @property
    def checkpoint_epochs(self) -> list[int]:
        return sorted(set(self.checkpoints)) if self.checkpoints else [self.training.epochs]

    @property
    def layers(self) -> list[str]:
        """Observation points in depth order: patch_embed, pos_embed, block_01..block_NN, norm."""
        return layer_names(self.model.resolved()["depth"])


def layer_names(depth: int) -> list[str]:
    return ["patch_embed", "pos_embed", *[f"block_{i:02d}" for i in range(1, depth + 1)], "norm"]


# --------------------------------------------------------------------------------------------------
# Claims
# --------------------------------------------------------------------------------------------------
class Subset(_Strict):
    """Which slice of the tidy table a claim is tested on."""

    dataset: str
    token_set: Literal["all", "cls", "patch"] = "all"
    epoch: int | Literal["last"] = "last"


class Regions(_Strict):
    """Layer regions of a U-shape, declared before looking at the data."""

    early: list[str] = Field(min_length=1)
    bottleneck: list[str] = Field(min_length=1)
    late: list[str] = Field(min_length=1)


class UShapeClaim(_Strict):
    """The metric dips in the bottleneck region and is higher both before and after it.

    Tested as an intersection-union test of two per-seed contrasts (see ``analysis.claims``).
    """

    name: str
    kind: Literal["u_shape"]
    metric: str
    subset: Subset
    regions: Regions
    alpha: float = Field(0.05, gt=0, lt=0.5)
    confirmatory: bool = True  # Holm-adjusted together with the file's other confirmatory claims

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in ALL_METRICS:
            raise ValueError(f"unknown metric {v!r}; expected one of {list(ALL_METRICS)}")
        return v


Claim = Annotated[UShapeClaim, Field(discriminator="kind")]


class Hypothesis(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    design: Design
    claims: list[Claim] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_claims(self) -> Hypothesis:
        datasets = {d.name for d in self.design.datasets}
        layers = set(self.design.layers)
        for i, claim in enumerate(self.claims):
            where = f"claims[{i}]"
            if claim.subset.dataset not in datasets:
                raise _FieldError(
                    f"{where}.subset.dataset",
                    f"expected one of the design's datasets {sorted(datasets)}, got {claim.subset.dataset!r}",
                )
            if claim.subset.epoch != "last" and claim.subset.epoch not in self.design.checkpoint_epochs:
                raise _FieldError(
                    f"{where}.subset.epoch",
                    f"expected a checkpoint epoch {self.design.checkpoint_epochs} or 'last', got {claim.subset.epoch}",
                )
            for region in ("early", "bottleneck", "late"):
                for layer in getattr(claim.regions, region):
                    if layer not in layers:
                        raise _FieldError(
                            f"{where}.regions.{region}",
                            f"unknown layer {layer!r}; expected one of {self.design.layers}",
                        )
        return self


class _FieldError(ValueError):
    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(message)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("procedural", "u_shape"):  # discriminator tags pydantic inserts in the path
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_hypothesis(data: object, file: str = "<hypothesis>") -> Hypothesis:
    """Validate already-parsed YAML data; raise StudyError naming file, field and expectation."""
    if not isinstance(data, dict):
        raise StudyError(f"expected a mapping at the top level, got {type(data).__name__}", file)
    try:
        return Hypothesis.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _FieldError):
            raise StudyError(ctx_err.message, file, ctx_err.field) from None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not part of the schema)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict | list):
            msg = f"{msg}, got {err['input']!r}"
        raise StudyError(msg, file, _loc(err["loc"])) from None


def load_hypothesis(path: str | Path) -> Hypothesis:
    """Read and validate a hypothesis YAML file (safe loader: nothing in the file executes)."""
    path = Path(path)
    if not path.is_file():
        raise StudyError("file not found (expected a hypothesis YAML file)", str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise StudyError(f"invalid YAML: {problem}", str(path), where) from None
    except UnicodeDecodeError:
        raise StudyError("expected a UTF-8 text file", str(path)) from None
    return parse_hypothesis(data, str(path))
