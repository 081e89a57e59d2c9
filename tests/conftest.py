"""Shared test set-up: environment, the tiny hypothesis and sweep, and helpers that several test files use.

Helpers here import what they need inside their bodies, so collecting any test imports nothing heavy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
for _var in ("STUDY_LEASES", "STUDY_STORAGE"):  # a shell's lease store / optuna storage is not the tests'
    os.environ.pop(_var, None)

# The files whose tests start clusters (Ray, PostgreSQL, Slurm: tests/clusters.py, tests/slurm_cluster.py),
# by fixture or by hand. Under pytest-xdist (``-n auto --dist loadgroup``, pyproject's addopts) they share one
# worker, so the session's clusters start once and never two at a time; every other file is a group of
# its own (its module fixtures are built once, on one worker).
CLUSTER_FILES = frozenset(
    {
        "test_cluster_cases.py",
        "test_cluster_cli.py",
        "test_cnn_on_clusters.py",
        "test_executors.py",
        "test_leases.py",
        "test_plugins_on_clusters.py",
        "test_scale.py",
        "test_slurm.py",
        "test_slurm_timeout.py",
    }
)


# Files of long, independent tests (pure computation, no fixtures), spread over the workers one test at a
# time: test_edges' boundary rows are 18 min of the slow tests, on one worker as a file.
SPREAD_FILES = frozenset({"test_edges.py"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        name = Path(file).name
        if name not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group("clusters" if name in CLUSTER_FILES else file))


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


TINY_SWEEP = """\
name: tiny_sweep
description: a seconds-long sweep for tests
design:
  datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  training: {epochs: 1, batch_size: 32}
  seeds: [0, 1]
  checkpoints: [1]
  probe: {size: 16}
sweep:
  dataset: objects
  space: {texture_reliance: [0.0, 0.5, 1.0]}
  sampler: grid
  objective: {metric: eed_pct, summary: min, layers: [block_01, block_02, block_03]}
claims:
  - name: eed floor rises with texture reliance
    kind: ordering
    metric: eed_pct
    subset: {token_set: all, epoch: last}
    over: texture_reliance
    direction: increasing
    layers: [block_01, block_02, block_03]
    summary: min
  - name: eed grows with texture reliance
    kind: trend
    metric: eed_pct
    subset: {token_set: all}
    over: texture_reliance
    direction: increasing
    layers: [block_01, block_02, block_03]
    level: 50.0
"""


@pytest.fixture(autouse=True, scope="session")
def _user_cache(tmp_path_factory):
    """The user cache folder (``runners.model_table``'s table of timm's models) is one of the session's,
    never the real ``~/.cache``; subprocesses inherit it. A test that needs an empty one sets its own."""
    folder = tmp_path_factory.mktemp("xdg_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


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


# ---- helpers shared by several test files ----------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def fresh_database(postgres_url: str, name: str) -> str:
    """A new empty database on the session's server; returns its URL."""
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


def env_for(**extra: str) -> dict[str, str]:
    """This process's environment for a ``python -m study`` subprocess: the repo first on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", **extra)
    return env


# the observation points of the 3-block ViT of TINY_HYPOTHESIS and SYNTH_HYPOTHESIS
LAYERS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]
BEHAVIOUR = Path(__file__).parent / "fixtures" / "behaviour"
SYNTH_HYPOTHESIS = """\
name: synth
description: EED% dips at block_02 (synthetic spectra, planted dip)
design:
  datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  training: {epochs: 2, batch_size: 32}
  seeds: [0, 1, 2]
  checkpoints: [0, 2]
  probe: {size: 16}
claims:
  - name: dip
    kind: u_shape
    metric: eed_pct
    subset: {dataset: objects}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
  - name: entropy grows with training
    kind: trend
    metric: spectral_entropy
    subset: {dataset: objects, token_set: all}
    direction: increasing
    layers: [block_01, norm]
"""


def _spectrum(rng: np.random.Generator, decay: float, d: int = 16) -> np.ndarray:
    return np.exp(-decay * np.arange(d)) * (1 + 0.05 * rng.random(d))


def make_study(root: Path, covariances: bool = True) -> Path:
    """A study folder as ``run`` leaves it, from synthetic spectra (a dip at block_02), plus run folders."""
    from analysis.table import make_table, rows_from_spectra, save_table
    from analysis.verdicts import evaluate_claims
    from study.schema import load_hypothesis

    root.mkdir(parents=True, exist_ok=True)
    hyp_path = root / "synth.yaml"
    hyp_path.write_text(SYNTH_HYPOTHESIS)
    hyp = load_hypothesis(hyp_path)
    rng = np.random.default_rng(0)
    rows, keys = [], []
    for seed in (0, 1, 2):
        key = f"k{seed:015d}"
        keys.append(key)
        spectra = {}
        for epoch in (0, 2):
            for layer in LAYERS:
                decay = 0.6 if (layer == "block_02" and epoch == 2) else 0.2 + 0.02 * seed
                spectra[f"{epoch}/{layer}/all"] = _spectrum(rng, decay)
        rows += rows_from_spectra(key, "objects", seed, spectra, LAYERS)
        run_dir = root / "out" / "runs" / key
        run_dir.mkdir(parents=True)
        (run_dir / "result.json").write_text(
            json.dumps({"status": "finished", "environment": {"torch": "x"}})
        )
        if covariances:
            covs = {}
            for epoch in (0, 2):
                for layer in LAYERS:
                    a = rng.standard_normal((16, 16)).astype(np.float32)
                    covs[f"{epoch}/{layer}"] = a @ a.T
            np.savez(run_dir / "covariances.npz", **covs)
    table = make_table(rows)
    results = evaluate_claims(hyp, table, source=str(hyp_path))
    study_dir = root / "out" / "studies" / "synth"
    study_dir.mkdir(parents=True)
    save_table(table, study_dir / "table.parquet")
    claims = [r.to_dict() for r in results]
    payload = {
        "hypothesis": "synth",
        "file": str(hyp_path),
        "runs": keys,
        "labels": {k: f"objects/seed{i}" for i, k in enumerate(keys)},
        "reused": [],
        "failed": {},
        "command": f"python -m study run {hyp_path}",
        "claims": claims,
    }
    (study_dir / "verdicts.json").write_text(json.dumps(payload, default=float))
    (study_dir / "hypothesis.yaml").write_text(SYNTH_HYPOTHESIS)
    return study_dir


def report(study_dir: Path) -> tuple[Path, Path]:
    """What ``python -m study report`` does: the typed claims from the study's hypothesis file."""
    from analysis.report.page import read_study, write_report
    from study.schema import load_hypothesis

    hyp = load_hypothesis(study_dir / "hypothesis.yaml")
    return write_report(study_dir, read_study(study_dir, hyp.name, hyp.description, list(hyp.claims)))


def write_runs(tmp: Path) -> tuple[Path, Path]:
    """The tiny hypothesis file and an output folder holding a finished run per planned key."""
    hyp = tmp / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    keys = json.loads((BEHAVIOUR / "tiny_keys.json").read_text())
    rng = np.random.default_rng(7)
    for seed, key in keys.items():
        run = tmp / "out" / "runs" / key
        run.mkdir(parents=True)
        spectra, scalars, n_tokens = {}, {}, {}
        for epoch in (0, 2):
            for layer in LAYERS:
                for tset in ("all", "cls", "patch"):
                    if layer == "patch_embed" and tset == "cls":
                        continue
                    spectra[f"{epoch}/{layer}/{tset}"] = np.sort(rng.gamma(1.0, 1.0, 16))[::-1]
                    scalars[f"{epoch}/{layer}/{tset}/diagonality"] = float(rng.uniform())
                    n_tokens[f"{layer}/{tset}"] = {"all": 16 * 5, "cls": 16, "patch": 16 * 4}[tset]
        np.savez(run / "spectra.npz", **spectra)
        (run / "scalars.json").write_text(json.dumps({"values": scalars}))
        (run / "result.json").write_text(
            json.dumps({"status": "finished", "seed": int(seed), "n_tokens": n_tokens})
        )
    return hyp, tmp / "out"


@pytest.fixture
def planted(monkeypatch):
    """``planted(effect)``: the ``train`` source fills runs with a planted effect (``tests.planted``)."""
    from tests.planted import plant

    return lambda effect: plant(monkeypatch, effect)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A single-node Slurm on this host (tests/slurm_cluster.py); ``SLURM_CONF`` set for the session."""
    from tests.slurm_cluster import slurm_cluster

    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_address(slurm_cluster):
    """What the executors' shared contract asks a cluster executor for: Slurm needs no address."""
    return "auto"
