"""ViT models from ``timm.create_model`` (never hand-written): presets plus architecture overrides.

The settings (:class:`ModelSpec`, the design's ``model:`` section, and :class:`TimmModel`, what it
resolves to and what a run spec holds) import without torch or timm, so the hypothesis schema can use
them; :func:`build_model` imports timm when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from vitstudy_core.settings import Strict

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
}


class ModelSpec(Strict):
    """A timm ViT: a preset or any timm model name, plus architecture overrides."""

    preset: Literal["vit_cpu12", "vit_tiny", "vit_small"] | None = "vit_cpu12"
    name: str | None = None
    patch_size: int | None = Field(None, ge=1)
    embed_dim: int | None = Field(None, ge=4)
    depth: int | None = Field(None, ge=1, le=48)
    num_heads: int | None = Field(None, ge=1)
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0)

    def resolved(self) -> dict:
        """The timm arguments (without img_size/num_classes), presets filled in, overrides applied.

        This dict is what a run spec (and so its run key) holds: its keys and values must not change.
        """
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

    def timm_kwargs(self) -> dict:
        """The ``timm.create_model`` keyword arguments this model sets (all but ``name``; None left out)."""
        return {k: v for k, v in self.model_dump(exclude={"name"}).items() if v is not None}


def build_model(model: TimmModel | dict, img_size: int, num_classes: int, **extra: object) -> torch.nn.Module:
    """Create a randomly initialised timm ViT.

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
    return timm.create_model(
        spec.name, pretrained=False, img_size=img_size, num_classes=num_classes, **kwargs
    )
