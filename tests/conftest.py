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


# ---- real services for the scale-out tests (tests/clusters.py), started once per session when asked ----
LEASE_TTL_S = "4"  # Ray workers of the test cluster: a dead worker's run is taken over within seconds


@pytest.fixture(scope="session")
def postgres_url():
    from tests.clusters import postgres

    with postgres() as url:
        yield url


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory):
    """A loopback Ray cluster: a head and one more node, 1 CPU each; this process is its driver."""
    from tests.clusters import ray_cluster

    env = {"STUDY_LEASE_TTL": LEASE_TTL_S, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with ray_cluster(tmp_path_factory.mktemp("ray"), workers=2, env=env) as cluster:
        yield cluster.address
