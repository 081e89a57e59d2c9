"""Published CNNs (``source: pretrained``, weights in files the test writes): measured at every block."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
ARGS = {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8}


def _weights(path: Path, seed: int, args: dict) -> None:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = timm.create_model("resnet18", pretrained=False, num_classes=7, **args)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def _doc(weights: Path, models: dict) -> dict:
    return {
        "name": "cnn_zoo",
        "design": {
            "datasets": [{"name": "objects", "n_train": 32, "n_test": 256, "image_size": 16}],
            "model": {"name": "resnet18", "model_args": ARGS},
            "probe": {"size": 256, "blocks": 8},
            "source": {"kind": "pretrained", "path": str(weights), "models": models},
        },
        "claims": [
            {
                "name": "dip in a",
                "kind": "u_shape",
                "unit": "images",
                "metric": "eed_pct",
                "subset": {"dataset": "objects", "condition": "a"},
                "regions": {
                    "early": ["block_01"],
                    "bottleneck": ["block_02", "block_03"],
                    "late": ["block_04"],
                },
            }
        ],
    }


def _study(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf")}
    return subprocess.run(
        [sys.executable, "-m", "study", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # a whole study of two published files in a subprocess (~20 s on 2 cores)
def test_a_published_cnn_is_measured_at_stem_every_block_and_pool(tmp_path):
    (tmp_path / "w").mkdir()
    _weights(tmp_path / "w" / "a.safetensors", 0, ARGS)
    _weights(tmp_path / "w" / "b.safetensors", 1, ARGS)
    models = {
        k: {"timm": "resnet18", "file": f"{k}.safetensors", "model_args": {**ARGS, "img_size": 32}}
        for k in "ab"
    }
    hyp = tmp_path / "zoo.yaml"
    hyp.write_text(yaml.safe_dump(_doc(tmp_path / "w", models)))
    out = tmp_path / "out"
    done = _study(["run", str(hyp), "--out", str(out), "--no-mlflow", "--workers", "1"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")]
    assert sorted(r["source"]["model"] for r in runs) == ["a", "b"]
    assert all(r["source"]["preprocessing"]["input_size"] == [3, 32, 32] for r in runs)  # img_size: 32
    spectra = np.load(next((out / "runs").glob("*/spectra.npz")))
    layers = sorted({k.split("/")[1] for k in spectra.files})
    assert layers == sorted(["stem", "block_01", "block_02", "block_03", "block_04", "pool"])
    verdict = json.loads((out / "studies" / "cnn_zoo" / "verdicts.json").read_text())["claims"][0]
    assert verdict["verdict"] in ("ACCEPTED", "REJECTED", "INCONCLUSIVE") and verdict["n_seeds"] == 8


def test_a_published_cnn_of_another_depth_than_the_design_s_is_one_line(tmp_path):
    (tmp_path / "w").mkdir()
    deeper = {**ARGS, "layers": [2, 1, 1, 1]}
    _weights(tmp_path / "w" / "a.safetensors", 0, deeper)
    models = {"a": {"timm": "resnet18", "file": "a.safetensors", "model_args": deeper}}
    doc = _doc(tmp_path / "w", models)
    hyp = tmp_path / "zoo.yaml"
    hyp.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    done = _study(["run", str(hyp), "--out", str(out), "--no-mlflow"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: design.model: model 'a' has 5 residual blocks and design.model 4: name a design.model "
        "of its architecture (the claims' layers are named from it)"
    ]
    assert not (out / "runs").exists() or not any((out / "runs").glob("*/result.json"))
