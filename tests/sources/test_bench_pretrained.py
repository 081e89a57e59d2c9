"""bench/pretrained_study.py's generated inputs: the ImageNet-style folder reads as the ``imagefolder``
dataset kind reads it, and a random-init model written into the Hugging Face cache layout is what the
``pretrained`` source finds and builds offline (the same weights). The full benchmark takes minutes
(``bench/README.md``), too long for a test even at its smallest probe (256 images: about 13 min on
the loaded 2-core machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "pretrained_study.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_pretrained_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_folder_is_an_imagenet_style_tree(tmp_path):
    from PIL import Image

    from runners.datasets.imagefolder import read

    bench = _module()
    root = bench.write_image_folder(tmp_path / "inet", classes=3, val=7, train_per_class=1, px=32, seed=0)
    splits, classes = read({"name": "inet", "train_dir": "train", "test_dir": "val"}, root)
    assert classes == ["class_00", "class_01", "class_02"]
    paths, labels = splits["test"]
    assert len(paths) == 7 and np.bincount(labels).tolist() == [3, 2, 2]
    assert len(splits["train"][0]) == 3
    assert all(p.suffix == ".JPEG" for p in paths)
    with Image.open(paths[0]) as img:
        assert img.format == "JPEG" and img.size == (32, 32) and img.mode == "RGB"
    again = bench.write_image_folder(tmp_path / "again", classes=3, val=7, train_per_class=1, px=32, seed=0)
    assert (again / "val/class_01/val_01_00001.JPEG").read_bytes() == (
        root / "val/class_01/val_01_00001.JPEG"
    ).read_bytes()  # seeded: the same folder every time
    # each class is its own shape and colour: class means differ more than images of one class do
    a, b = (bench.make_image(c, 64, np.random.default_rng(1)).astype(float) for c in (0, 1))
    assert np.abs(a - b).mean() > 5


def _offline_cache(monkeypatch, hf: Path) -> None:
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def test_hub_repo_layout_is_what_the_source_reads_offline(tmp_path, monkeypatch):
    """A tiny timm ViT written by ``write_hub_repo`` (an ``hf-hub:`` name: its config.json builds it)."""
    import timm
    import torch

    from runners.pretrained import build, weights_file

    bench = _module()
    torch.manual_seed(0)
    args: dict[str, Any] = {"img_size": 16, "patch_size": 8, "embed_dim": 24, "depth": 2, "num_heads": 2}
    tiny = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **args)
    cfg = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "num_classes": 0}
    config = {
        "architecture": "vit_tiny_patch16_224",
        "num_classes": 0,
        "model_args": args,
        "pretrained_cfg": cfg,
    }
    written = bench.write_hub_repo(tmp_path / "hf", "bench_tiny", tiny.state_dict(), config)
    _offline_cache(monkeypatch, tmp_path / "hf")
    record = {
        "path": "timm:hf-hub:timm/bench_tiny",
        "model": "t",
        "timm": "hf-hub:timm/bench_tiny",
        "model_args": {},
    }
    assert weights_file(record) == written
    model, _ = build(record)
    assert all(torch.equal(v, tiny.state_dict()[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_random_model_in_the_hub_cache_is_what_the_source_builds(tmp_path, monkeypatch):
    """The published name itself (a full ViT-S/16: about a minute on a loaded 2-core CPU)."""
    import timm
    import torch

    from runners.pretrained import build, preprocessing_of, weights_file

    bench = _module()
    name = "vit_small_patch16_224.dino"
    (written,) = bench.cache_random_models(tmp_path / "hf", [name], seed=3)
    _offline_cache(monkeypatch, tmp_path / "hf")
    record = {"path": f"timm:{name}", "model": "dino", "timm": name, "model_args": {}}
    assert weights_file(record) == written
    model, _ = build(record)
    torch.manual_seed(3)
    expected = timm.create_model(name, pretrained=False).state_dict()
    got = model.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert preprocessing_of(record)["input_size"] == [3, 224, 224]  # the published model's own config
