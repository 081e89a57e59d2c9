"""A CNN's observation points (stem, every residual block, pool) against timm's own intermediate outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners.extract import extract_spectra, observation_points
from runners.models import MODEL_PRESETS, ModelSpec, build_model, residual_blocks
from runners.token_moments import eigenvalues
from vitstudy_core.layers import cnn_layer_names, layer_order


def _reference_eigs(tokens: torch.Tensor) -> np.ndarray:
    """Two-pass float64 covariance of ``tokens: (n, C)``, descending clipped eigenvalues."""
    x = tokens.detach().double().numpy()
    xc = x - x.mean(0)
    return eigenvalues(xc.T @ xc / (x.shape[0] - 1))


def _positions(fmap: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B H W, C)``: each spatial position a token (written as NHWC, independently
    of the extraction's view)."""
    return fmap.permute(0, 2, 3, 1).reshape(-1, fmap.shape[1])


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    scale = max(float(ref[0]), 1e-300)
    assert np.max(np.abs(got - ref)) / scale < 1e-10, (got[:3], ref[:3])


def _model(preset: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(preset=preset).resolved(), img_size=16, num_classes=5).eval()


@pytest.mark.parametrize("preset, size", [("resnet_cpu", 16), ("convnext_cpu", 32)])
def test_every_point_equals_timm_s_intermediates_in_float64(preset, size):
    """Stage ends from ``forward_intermediates`` (timm's API, not our hooks), the stem from the model's
    own modules, the pooled feature as the mean over positions; streamed over uneven batches."""
    model = _model(preset)
    x = torch.randn(13, 3, size, size)
    sp = extract_spectra(model, x, batch_size=5)
    names = [p[0] for p in observation_points(model)]
    assert names == cnn_layer_names(8)
    with torch.no_grad():
        if preset == "resnet_cpu":
            act1, *stages = model.forward_intermediates(x, indices=5, intermediates_only=True)
            stem = model.maxpool(act1)
        else:
            stages = model.forward_intermediates(x, indices=4, intermediates_only=True)
            stem = model.stem(x)
        pooled = stages[-1].mean((2, 3))
    _close(sp.eigenvalues[("stem", "all")], _reference_eigs(_positions(stem)))
    for i, stage in enumerate(stages):  # 2 blocks a stage: a stage ends at block 2, 4, 6, 8
        name = f"block_{2 * i + 2:02d}"
        _close(sp.eigenvalues[(name, "all")], _reference_eigs(_positions(stage)))
        assert sp.n_tokens[(name, "all")] == 13 * stage.shape[2] * stage.shape[3]
    if preset == "resnet_cpu":  # ConvNeXt's head normalises after pooling: pre_logits is not the mean
        _close(sp.eigenvalues[("pool", "all")], _reference_eigs(pooled))
    assert sp.n_tokens[("pool", "all")] == 13
    # no prefix token: patch is every position, and there is no class token
    assert {t for (_, t) in sp.eigenvalues} == {"all", "patch"}
    for name in names:
        np.testing.assert_array_equal(sp.eigenvalues[(name, "all")], sp.eigenvalues[(name, "patch")])


def test_every_residual_block_is_observed_in_order_across_stages():
    """Each block's own output (hooked here, on the modules timm names ``layerI.J``), not only stage ends."""
    model = _model("resnet_cpu")
    x = torch.randn(9, 3, 16, 16)
    sp = extract_spectra(model, x, batch_size=9)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.get_submodule(f"layer{i}.{j}").register_forward_hook(
            lambda m, a, out, key=f"{i}.{j}": seen.__setitem__(key, out)
        )
        for i in range(1, 5)
        for j in range(2)
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for k, key in enumerate(sorted(seen)):
        _close(sp.eigenvalues[(f"block_{k + 1:02d}", "all")], _reference_eigs(_positions(seen[key])))


def test_a_model_without_residual_blocks_is_not_read():
    import timm

    mobile = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=3)
    assert residual_blocks(mobile) is None
    with pytest.raises(ValueError, match="no residual blocks"):
        observation_points(mobile)


def test_cnn_layer_names_order_from_names_alone():
    names = cnn_layer_names(3)
    assert names == ["stem", "block_01", "block_02", "block_03", "pool"]
    assert layer_order(names) == {n: i for i, n in enumerate(names)}
    assert layer_order(["stem", "norm"]) is None  # a ViT's and a CNN's names do not mix
    assert layer_order(["block_01", "norm"]) == {"block_01": 2, "norm": 3}  # ViT names unchanged


def test_presets_resolve_to_timm_arguments_and_vits_are_unchanged():
    assert ModelSpec(preset="resnet_cpu").resolved() == {
        "name": "resnet18",
        "drop_path_rate": 0.0,
        "model_args": {"channels": [16, 32, 64, 128], "stem_width": 16},
    }
    # a CNN named without a preset does not take the default ViT preset's fields
    assert ModelSpec(name="resnet18").resolved() == {"name": "resnet18", "drop_path_rate": 0.0}
    assert ModelSpec().resolved() == {**MODEL_PRESETS["vit_cpu12"], "drop_path_rate": 0.0}
    assert ModelSpec(name="vit_tiny_patch16_224").resolved() == {
        **MODEL_PRESETS["vit_cpu12"],
        "name": "vit_tiny_patch16_224",
        "drop_path_rate": 0.0,
    }
    assert "model_args" not in ModelSpec(preset="vit_small").resolved()
