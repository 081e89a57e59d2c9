"""A plug-in package with one part of every registry (an eigenvalue metric, a token-count metric, an
observable, a claim kind, an objective, a generated dataset, a run source and an executor), built as a
wheel and installed in a fresh virtual environment: ``study plugins`` names each part's distribution,
a study using them runs in two spawned workers with every plug-in value in its table, a log imported
through the plug-in source is read, the shipped contract suite passes on the package's parts, and
upgrading the observable's declared version retrains exactly the runs of the study that names it.

The metric, the claim kind and the objective are docs/plugins.md's example files, as written; the rest
are this module's (slow: two wheel builds, three tiny studies and a rerun).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.plugins.test_plugins_everywhere import MEASURES
from tests.plugins.test_third_party_plugin import _run, build_commands, example_files, make_venv

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

DIST = "vitstudy-allparts"
GROUPS = {
    "vitstudy.metrics": ("top_share", "vitstudy_example.metric"),
    "vitstudy.kinds": ("higher", "vitstudy_example.kind"),
    "vitstudy.objectives": ("mirrored", "vitstudy_example.objective"),
    "vitstudy.observables": ("norm_cv", "vitstudy_example.measures"),
    "vitstudy.token_metrics": ("trace_mean", "vitstudy_example.measures"),
    "vitstudy.datasets": ("squares", "vitstudy_example.squares"),
    "vitstudy.sources": ("tidy_log", "vitstudy_example.tidy_log"),
    "vitstudy.executors": ("twin_local", "vitstudy_example.twin_local"),
}
TITLES = {  # `study plugins --json`'s title of each group's registry
    "vitstudy.metrics": "eigenvalue metrics",
    "vitstudy.kinds": "claim kinds",
    "vitstudy.objectives": "objectives",
    "vitstudy.observables": "observables",
    "vitstudy.token_metrics": "token-count metrics",
    "vitstudy.datasets": "datasets",
    "vitstudy.sources": "run sources",
    "vitstudy.executors": "executors",
}

SQUARES = '''"""A generated dataset kind: noisy images whose class (0..3) is their brightness."""

from typing import Literal

import numpy as np
from pydantic import Field

from runners.datasets.base import DATASETS, DatasetKind, ImageDatasetSettings


class SquaresDataset(ImageDatasetSettings):
    kind: Literal["squares"]
    image_size: int = Field(8, ge=8, le=64)
    n_train: int = Field(64, ge=16)
    n_test: int = Field(32, ge=16)


def load(spec, split, cache_dir, probe_size=None, probe_seed=None):
    n = spec["n_train"] if split == "train" else spec["n_test"]
    rng = np.random.default_rng(0 if split == "train" else 1)  # the probe is drawn from the test split
    labels = rng.integers(0, 4, n).astype(np.int64)
    side = spec["image_size"]
    images = (rng.integers(0, 40, (n, side, side, 3)) + 50 * labels[:, None, None, None]).astype(np.uint8)
    if split == "probe":
        pick = np.random.default_rng(probe_seed).choice(n, probe_size or n, replace=False)
        images, labels = images[pick], labels[pick]
    return images, labels


DATASETS.register(
    "squares",
    DatasetKind(
        name="squares",
        model=SquaresDataset,
        example={"name": "squares", "kind": "squares"},
        load=load,
        num_classes=lambda spec: 4,
        generated=True,
    ),
    version="1",
)
'''
TIDY_LOG = '''"""A run source: the built-in table importer under a name of its own (tidy CSV logs only)."""

from typing import Literal

from runners.sources.base import SOURCES
from runners.sources.table import TableSettings, TableSource


class TidyLogSettings(TableSettings):
    kind: Literal["tidy_log"]  # type: ignore[assignment]
    format: Literal["tidy"] = "tidy"  # type: ignore[assignment]


class TidyLogSource(TableSource):
    name = "tidy_log"
    settings = TidyLogSettings
    example = {"source": {"kind": "tidy_log", "path": "/logs/seed{seed}.csv"}}


SOURCES.register("tidy_log", TidyLogSource())
'''
TWIN_LOCAL = '''"""An executor: the local one under a name of its own."""

from dataclasses import replace

from runners.executors.local import EXECUTORS

EXECUTORS.register("twin_local", replace(EXECUTORS["local"], flags=None, summary="local, from a plug-in"))
'''
CONTRACT_TEST = """

@parametrize_with_checks({part!r}, names=[{name!r}])
def test_{part}(name, check):
    check(name)
"""
DESIGN = {
    "datasets": [{"name": "squares", "kind": "squares", "n_train": 64, "n_test": 32}],
    "model": {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2},
    "objective": "mirrored",
    "training": {"epochs": 1, "batch_size": 32},
    "seeds": [0, 1],
    "checkpoints": [0, 1],
    "probe": {"size": 16},
}


def _compare(name: str, kind: str, metric: str) -> dict:
    return {
        "name": name,
        "kind": kind,
        "metric": metric,
        "subset": {"dataset": "squares", "epoch": 1},
        "a": {"layers": ["block_01"]},
        "b": {"layers": ["block_03"]},
    }


PLUGGED = {  # claims on the plug-in's observable, token-count metric and eigenvalue metric
    "name": "plugged",
    "design": DESIGN,
    "claims": [
        _compare("top share", "higher", "top_share"),
        _compare("norm spread", "compare", "norm_cv"),
        _compare("trace per dimension", "compare", "trace_mean"),
    ],
}
BUILT_IN = {"name": "built_in", "design": DESIGN, "claims": [_compare("eed", "compare", "eed_pct")]}


def _write_package(pkg: Path, version: str, observable_version: str) -> None:
    for rel, text in example_files().items():
        if rel.startswith("vitstudy_example/") or rel == "pyproject.toml":
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / rel).write_text(text)
    mod = pkg / "vitstudy_example"
    # tests/plugins/test_plugins_everywhere.py's parts under names of their own (that file's plug-in takes its
    # names: installing this package must change no test result of ours)
    measures = MEASURES.replace("norm_spread", "norm_cv").replace("trace_per_dim", "trace_mean")
    (mod / "measures.py").write_text(measures.replace("VERSION", repr(observable_version)))
    (mod / "squares.py").write_text(SQUARES)
    (mod / "tidy_log.py").write_text(TIDY_LOG)
    (mod / "twin_local.py").write_text(TWIN_LOCAL)
    parts = {group.rpartition(".")[2]: [name] for group, (name, _) in GROUPS.items()}
    (pkg / "tests").mkdir(exist_ok=True)
    tests = "".join(CONTRACT_TEST.format(part=part, name=name) for part, [name] in parts.items())
    (pkg / "tests" / "test_contract.py").write_text(
        f"from vitstudy.testing import parametrize_with_checks\n{tests}"
    )
    toml = (pkg / "pyproject.toml").read_text()
    toml = re.sub(
        r'name = "vitstudy-example"\nversion = "0.1.0"', f'name = "{DIST}"\nversion = "{version}"', toml
    )
    toml = toml.split("[project.entry-points.", 1)[0]
    for group, (name, module) in GROUPS.items():
        toml += f'[project.entry-points."{group}"]\n{name} = "{module}"\n\n'
    (pkg / "pyproject.toml").write_text(toml + '[tool.setuptools]\npackages = ["vitstudy_example"]\n')


def _install(py: Path, pkg: Path, env: dict, version: str, observable_version: str) -> None:
    """Build the package's wheel by docs/plugins.md's commands and install it (over an older one)."""
    _write_package(pkg, version, observable_version)
    for line in build_commands()[:2]:  # docs/plugins.md's setuptools and wheel lines, as written
        _run([str(py), *shlex.split(line)[1:], "--no-index"], pkg, env)
    (wheel,) = (pkg / "dist").glob(f"vitstudy_allparts-{version}-*.whl")
    _run(
        [str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
        pkg,
        env,
    )


@pytest.fixture(scope="module")
def allparts(tmp_path_factory):
    root = tmp_path_factory.mktemp("allparts")
    py, env = make_venv(root / "venv")
    pkg = root / "vitstudy-allparts"
    _install(py, pkg, env, "0.1.0", "1")
    for name, doc in (("plugged", PLUGGED), ("built_in", BUILT_IN)):
        (pkg / f"{name}.yaml").write_text(json.dumps(doc))
    return py, pkg, env


def _study(allparts, name: str) -> str:
    py, pkg, env = allparts
    cmd = [str(py), "-m", "study", "run", f"{name}.yaml", "--out", "out", "--executor", "twin_local"]
    done = _run([*cmd, "--workers", "2", "--no-mlflow", "--no-report"], pkg, env)
    return done.stdout + done.stderr


def _planned(log: str) -> tuple[int, int]:
    found = re.search(r"(\d+) runs planned, (\d+) reused", log)
    assert found, log[-3000:]
    return int(found[1]), int(found[2])


def test_every_part_is_listed_with_the_distribution(allparts):
    py, pkg, env = allparts
    out = json.loads(_run([str(py), "-m", "study", "plugins", "--json"], pkg, env).stdout)
    assert out["broken"] == []
    for group, (name, _) in GROUPS.items():
        assert out["registries"][TITLES[group]]["origins"][name] == f"{DIST} 0.1.0", group


def test_the_shipped_contract_suite_passes_on_every_part(allparts):
    py, pkg, env = allparts
    done = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], pkg, env)
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]


def test_a_study_of_every_part_at_two_workers_then_an_upgraded_observable(allparts):
    py, pkg, env = allparts
    assert _planned(_study(allparts, "plugged")) == (2, 0)
    table = pd.read_parquet(pkg / "out" / "studies" / "plugged" / "table.parquet")
    assert table.run_key.nunique() == 2
    for metric in ("top_share", "norm_cv", "trace_mean"):  # every run, both epochs, every layer
        rows = table[table.metric == metric]
        assert set(rows.run_key) == set(table.run_key) and set(rows.epoch) == {0, 1}, metric
        assert rows.value.notna().all(), metric
    verdicts = json.loads((pkg / "out" / "studies" / "plugged" / "verdicts.json").read_text())
    assert [c["seeds_used"] for c in verdicts["claims"]] == [[0, 1]] * 3
    assert _planned(_study(allparts, "built_in")) == (2, 0)  # not naming the observable: keys of its own

    # the plug-in source imports a log (rows of the plugged study's first run, as a tidy CSV)
    rows = table[(table.run_key == table.run_key.min()) & (table.metric == "norm_cv")]
    rows[["epoch", "layer", "token_set", "metric", "value"]].to_csv(pkg / "log_0.csv", index=False)
    imported = {
        "name": "imported",
        "design": {
            "datasets": [{"name": "squares", "kind": "external"}],
            "model": {"depth": 3},
            "seeds": [0],
            "source": {"kind": "tidy_log", "path": "log_{seed}.csv"},
        },
        "claims": [_compare("imported spread", "compare", "norm_cv")],
    }
    (pkg / "imported.yaml").write_text(json.dumps(imported))
    _study(allparts, "imported")
    got = pd.read_parquet(pkg / "out" / "studies" / "imported" / "table.parquet")
    assert sorted(got.value) == sorted(rows.value)

    # the observable's declared version bumped in a new release: the study naming it trains its runs
    # again (new keys); the study that does not reuses all of its runs
    _install(py, pkg, env, "0.2.0", "2")
    assert _planned(_study(allparts, "plugged")) == (2, 0)
    assert _planned(_study(allparts, "built_in")) == (2, 2)


# our test files that read every registry (contracts over every registered part, listings, the schema's
# unions, the CLI's choices, name scans): with the package installed each must give the same result
REGISTRY_READERS = [
    "tests/plugins/test_source_contract.py",
    "tests/plugins/test_kind_contract.py",
    "tests/plugins/test_objective_contract.py",
    "tests/datasets/test_contract.py",
    "tests/plugins/test_plugins.py",
    "tests/plugins/test_plugins_everywhere.py",
    "tests/plugins/test_contract_catches.py",
    "tests/plugins/test_registered_names.py",
    "tests/plugins/test_registry.py",
    "tests/schema/test_schema.py",
    "tests/spectra/test_observables.py",
    "tests/spectra/test_spectral.py",
    "tests/test_cli.py",
    "tests/test_verb_imports.py",
    "tests/schema/test_messages.py",
    "tests/schema/test_bad_input.py",
    "tests/scale_out/test_gpu_check.py",
]


def test_installing_the_package_changes_no_test_result_of_ours(allparts):
    py, _, env = allparts
    done = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *REGISTRY_READERS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert re.search(r"\b\d{3,} passed\b", done.stdout) and "failed" not in done.stdout, done.stdout[-2000:]
