"""The residual blocks of a timm CNN: what the extraction observes of it (``runners.extract``) and what
``validate`` counts on the meta device (``runners.model_table.built_shape``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def residual_blocks(model: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Module]] | None:
    """A CNN's stem (its output: the first feature map) and every residual block in depth order, or None
    for a model that has neither form: timm's ResNet family (``maxpool`` after the stem, then the blocks
    of ``layer1``, ``layer2``, ...) and stage-based models (``stem``, then each ``stages[i].blocks``:
    ConvNeXt and others)."""
    layers: list[torch.nn.Module] = []
    while hasattr(model, f"layer{len(layers) + 1}"):
        layers.append(model.get_submodule(f"layer{len(layers) + 1}"))
    if layers and hasattr(model, "maxpool"):  # each layerN an nn.Sequential of blocks
        return model.get_submodule("maxpool"), [blk for layer in layers for blk in layer.children()]
    stages, stem = getattr(model, "stages", None), getattr(model, "stem", None)
    if stages is not None and stem is not None and all(hasattr(s, "blocks") for s in stages):
        blocks = [blk for stage in stages for blk in stage.blocks]
        return (stem, blocks) if blocks else None
    return None
