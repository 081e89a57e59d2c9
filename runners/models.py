"""ViT models from ``timm.create_model`` (never hand-written): presets plus architecture overrides."""

from __future__ import annotations

import timm
import torch


def build_model(model: dict, img_size: int, num_classes: int, **extra) -> torch.nn.Module:
    """Create a randomly initialised timm ViT.

    Args:
        model: resolved model spec (``ModelSpec.resolved()``): ``name`` plus optional ``patch_size``,
            ``embed_dim``, ``depth``, ``num_heads``, ``drop_path_rate``.
        img_size: input side length in pixels (from the dataset).
        num_classes: classifier outputs (0 for a headless backbone, as DINO uses).
        extra: further ``timm.create_model`` arguments (DINO's student: ``dynamic_img_size=True``
            so that one network takes global and local crops).
    """
    kwargs = {**{k: v for k, v in model.items() if k != "name"}, **extra}
    return timm.create_model(
        model["name"], pretrained=False, img_size=img_size, num_classes=num_classes, **kwargs
    )
