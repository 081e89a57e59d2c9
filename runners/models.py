"""Models from ``timm.create_model`` (never hand-written): presets plus architecture overrides.

Two families are read: timm Vision Transformers (``blocks`` after ``patch_embed``; the overrides
``patch_size``, ``embed_dim``, ``depth``, ``num_heads``) and CNNs made of residual blocks (timm's ResNet
family, ``layer1`` .. ``layer4``, and the stage-based families whose ``stages[i].blocks`` hold them, such
as ConvNeXt), whose own timm arguments go in ``model_args`` (:func:`residual_blocks` finds their blocks).

The settings (:class:`ModelSpec`, the design's ``model:`` section, and :class:`TimmModel`, what it
resolves to and what a run spec holds) import without torch or timm, so the hypothesis schema can use
them; :func:`build_model` imports timm when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from runners.model_table import cnn_blocks, family, timm_kwargs
from runners.residual import residual_blocks
from vitstudy_core.settings import Strict

__all__ = [  # family, cnn_blocks and residual_blocks live with the table and the blocks; named here too
    "MODEL_PRESETS",
    "ModelSpec",
    "TimmModel",
    "build_model",
    "cnn_blocks",
    "family",
    "residual_blocks",
]

if TYPE_CHECKING:
    import torch

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
    # CNNs sized like vit_cpu12 (minutes on 2 cores): timm's resnet18 (8 basic blocks) 16-128 channels wide,
    # 0.72 M parameters; convnext_atto (2 blocks a stage here) 16-128 wide, 0.42 M
    "resnet_cpu": {"name": "resnet18", "model_args": {"channels": [16, 32, 64, 128], "stem_width": 16}},
    "convnext_cpu": {
        "name": "convnext_atto",
        "model_args": {"dims": [16, 32, 64, 128], "depths": [2, 2, 2, 2]},
    },
}
VIT_FIELDS = ("patch_size", "embed_dim", "depth", "num_heads")  # the overrides a ViT takes, a CNN not
ModelArg = int | float | str | bool | list[int] | list[float] | list[str]


def _refused_arg(key: str) -> str | None:
    if key in ("num_classes", "img_size", "pretrained"):
        return f"{key} is set by the study (the dataset's classes and image size; weights are never loaded)"
    return None


class ModelSpec(Strict):
    """A timm model: a preset or any timm model name, plus overrides (a ViT's fields, or ``model_args``:
    further ``timm.create_model`` arguments, a CNN's ``channels`` or ``depths`` for instance)."""

    preset: Literal["vit_cpu12", "vit_tiny", "vit_small", "resnet_cpu", "convnext_cpu"] | None = "vit_cpu12"
    name: str | None = None
    patch_size: int | None = Field(None, ge=1)
    embed_dim: int | None = Field(None, ge=4)
    depth: int | None = Field(None, ge=1, le=48)
    num_heads: int | None = Field(None, ge=1)
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0)
    model_args: dict[str, ModelArg] | None = None

    @field_validator("model_args")
    @classmethod
    def _own_args(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in v or {}:
            why = _refused_arg(key)
            if why:
                raise ValueError(f"model_args.{key}: {why}")
        return v

    @model_validator(mode="after")
    def _fields_fit_the_family(self) -> ModelSpec:
        """A CNN takes no ViT field: its own arguments go in ``model_args``."""
        given = [key for key in VIT_FIELDS if getattr(self, key) is not None]
        if given and self.name and family(self.name) == "cnn":
            raise ValueError(
                f"{given[0]}: {self.name} is not a Vision Transformer: {', '.join(VIT_FIELDS)} are ViT fields; "
                "give a CNN's own timm arguments in model_args (e.g. resnet's channels, convnext's depths)"
            )
        return self

    def _base(self) -> dict:
        """The preset's fields, where one applies: the default preset (a ViT's) is not applied to a
        ``name`` of another family given without a preset."""
        preset = self.preset
        if self.name and "preset" not in self.model_fields_set and preset == "vit_cpu12":
            if family(self.name) == "cnn":
                preset = None
        return dict(MODEL_PRESETS[preset]) if preset else {}

    def resolved(self) -> dict:
        """The timm arguments (without img_size/num_classes), presets filled in, overrides applied.

        This dict is what a run spec (and so its run key) holds: its keys and values must not change. A ViT's
        holds ``depth`` (12 unless set); ``model_args`` appears only where a preset or the file sets it.
        """
        base = self._base()
        if self.name:
            base["name"] = self.name
        if "name" not in base:
            raise ValueError("give a preset or a timm model name")
        for key in VIT_FIELDS:
            value = getattr(self, key)
            if value is not None:
                base[key] = value
        args = {**base.pop("model_args", {}), **(self.model_args or {})}
        if family(base["name"]) != "cnn":  # a ViT (or a name timm lacks: refused by validate, named there)
            base.setdefault("depth", 12)
        base["drop_path_rate"] = self.drop_path_rate
        if args:
            base["model_args"] = args
        return base


class TimmModel(Strict):
    """A resolved model (:meth:`ModelSpec.resolved`, a run spec's ``model``) as typed settings.

    Unset fields (None) are left to timm's defaults for ``name``: they are not passed to timm at all.
    """

    name: str
    patch_size: int | None = None
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    drop_path_rate: float | None = None
    model_args: dict[str, ModelArg] | None = None

    def timm_kwargs(self) -> dict:
        """The ``timm.create_model`` keyword arguments this model sets (all but ``name``; None left out;
        ``model_args`` merged in, its lists as tuples as timm's signatures declare them)."""
        return timm_kwargs(self.model_dump())


def build_model(model: TimmModel | dict, img_size: int, num_classes: int, **extra: object) -> torch.nn.Module:
    """Create a randomly initialised timm model (a ViT or a CNN of residual blocks).

    Args:
        model: the resolved model (:class:`TimmModel`, or its dict as a run spec holds it).
        img_size: input side length in pixels (from the dataset).
        num_classes: classifier outputs (0 for a headless backbone, as DINO uses).
        extra: further ``timm.create_model`` arguments (DINO's student: ``dynamic_img_size=True``
            so that one network takes global and local crops).
    """
    import timm

    spec = TimmModel.model_validate(model) if isinstance(model, dict) else model
    kwargs = {**spec.timm_kwargs(), **extra}
    if family(spec.name) != "cnn":  # a CNN takes any image size: timm's CNNs have no img_size argument
        kwargs["img_size"] = img_size
    return timm.create_model(spec.name, pretrained=False, num_classes=num_classes, **kwargs)
