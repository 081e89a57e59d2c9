from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

TINY_HYPOTHESIS = """\
name: tiny
description: a seconds-long study for tests
design:
  datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  training: {epochs: 2, batch_size: 32}
  seeds: [0, 1, 2]
  checkpoints: [0, 2]
  probe: {size: 16}
claims:
  - name: u
    kind: u_shape
    metric: eed_pct
    subset: {dataset: objects}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
"""


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_HYPOTHESIS)
    return path
