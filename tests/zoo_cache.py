"""Tiny timm ViTs saved as timm and the Hugging Face hub save them, so the ``pretrained`` source loads them
offline (``HF_HUB_OFFLINE=1``) exactly as it loads a published model; nothing is downloaded.

    hub = hub_cache(tmp_path / "hf", {"tiny_a": 0, "tiny_b": 1, "tiny_c": (0, OTHER_NORM)})
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}

A hub repo is ``models--timm--<name>/snapshots/<rev>/{model.safetensors, config.json}`` with
``refs/main`` naming ``<rev>`` (what ``huggingface_hub`` writes, blobs inlined); ``config.json`` is timm's
(``architecture``, ``model_args``, ``pretrained_cfg`` with the model's mean and std), so
``timm.create_model("hf-hub:timm/<name>", pretrained=True)`` builds it.
"""

from __future__ import annotations

import json
from pathlib import Path

ARCH = "vit_tiny_patch16_224"
MODEL_ARGS = {"img_size": 16, "patch_size": 8, "embed_dim": 24, "depth": 2, "num_heads": 2, "num_classes": 0}
DESIGN_MODEL = {"preset": "vit_cpu12", "embed_dim": 24, "depth": 2, "num_heads": 2, "patch_size": 8}
IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OTHER_NORM = ((0.2, 0.7, 0.4), (0.6, 0.3, 0.45))
REV = "0123456789abcdef0123456789abcdef01234567"


def tiny_model(seed: int):
    """The tiny ViT with weights drawn from ``seed`` (timm's own init, then a seeded perturbation)."""
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, **MODEL_ARGS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def pretrained_cfg(norm: tuple = IMAGENET_NORM) -> dict:
    return {
        "tag": "test",
        "input_size": [3, 16, 16],
        "fixed_input_size": True,
        "interpolation": "bicubic",
        "crop_pct": 0.875,
        "crop_mode": "center",
        "mean": list(norm[0]),
        "std": list(norm[1]),
        "num_classes": 0,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }


def hub_cache(root: Path, models: dict[str, int | tuple[int, tuple]]) -> Path:
    """Write each ``name: seed`` (or ``name: (seed, (mean, std))``) as a timm hub repo under
    ``root/hub``; returns ``root`` (the ``HF_HOME``)."""
    from safetensors.torch import save_file

    for name, spec in models.items():
        seed, norm = (spec, IMAGENET_NORM) if isinstance(spec, int) else spec
        repo = root / "hub" / f"models--timm--{name}"
        snap = repo / "snapshots" / REV
        snap.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REV)
        sd = {k: v.contiguous() for k, v in tiny_model(seed).state_dict().items()}
        save_file(sd, str(snap / "model.safetensors"))
        config = {
            "architecture": ARCH,
            "num_classes": 0,
            "num_features": MODEL_ARGS["embed_dim"],
            "model_args": {k: v for k, v in MODEL_ARGS.items() if k != "num_classes"},
            "pretrained_cfg": pretrained_cfg(norm),
        }
        (snap / "config.json").write_text(json.dumps(config))
    return root


def checkpoint_file(path: Path, seed: int, teacher: bool = False) -> Path:
    """The tiny ViT as a released file: ``.safetensors``, or a DINO-style ``.pth`` (``{"teacher":
    {"backbone.<key>": ...}}``) with ``teacher``."""
    import torch

    sd = {k: v.contiguous() for k, v in tiny_model(seed).state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    if teacher:
        torch.save({"teacher": {f"backbone.{k}": v for k, v in sd.items()}, "epoch": 100}, path)
    else:
        from safetensors.torch import save_file

        save_file(sd, str(path))
    return path
