"""A plug-in's observable and token-count metric measured by every cluster worker: a study naming them,
run on a two-node Ray cluster and on the suite's Slurm, finds their values in every run; Ray workers
that lack the plug-in refuse the runs with one line (the run key names the part) instead of measuring
without it.

Without Ray or Slurm these skip (under CI, which installs both, they fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.test_plugins_everywhere import TINY, install

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a cluster's start and two tiny trainings each (~1 min on 2 cores)


def _study(tmp_path: Path, plugin: Path, *executor: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``study run`` of the tiny plug-in study on ``executor``, the driver finding the plug-in."""
    hyp, out = tmp_path / "tiny.yaml", tmp_path / "out"
    hyp.write_text(json.dumps(TINY))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugin)])}
    cmd = [sys.executable, "-m", "study", "run", str(hyp), "--out", str(out), *executor]
    done = subprocess.run(
        [*cmd, "--no-mlflow", "--no-report"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    return done, out


def _measured_in_every_run(out: Path) -> None:
    scalars = [json.loads(p.read_text())["values"] for p in sorted(out.glob("runs/*/scalars.json"))]
    assert len(scalars) == 2
    for values in scalars:
        names = {key.rpartition("/")[2] for key in values}
        assert {"norm_spread", "trace_per_dim", "diagonality"} <= names, sorted(names)
        assert sum(k.endswith("/norm_spread") for k in values) == sum(
            k.endswith("/diagonality") for k in values
        )
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert verdicts["claims"][0]["seeds_used"] == [0, 1]


def test_two_ray_workers_with_the_plugin_measure_its_parts_in_every_run(tmp_path):
    from tests.clusters import ray_cluster

    plugin = install(tmp_path / "plug")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(plugin)]), "MLFLOW_DISABLE_TELEMETRY": "true"}
    (tmp_path / "ray").mkdir()
    with ray_cluster(tmp_path / "ray", workers=2, env=env) as cluster:  # the plug-in installed on its nodes
        done, out = _study(tmp_path, plugin, "--executor", "ray", "--address", cluster.address)
    assert done.returncode == 0, done.stderr[-3000:]
    _measured_in_every_run(out)  # filled on the nodes: the next test's nodes, without it, refuse


def test_ray_workers_without_the_plugin_refuse_its_runs_with_one_line(tmp_path, ray_address):
    """The session's cluster: its nodes were started without the plug-in, which only the driver has."""
    done, out = _study(tmp_path, install(tmp_path / "plug"), "--executor", "ray", "--address", ray_address)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]  # the study's one line
    assert "lacks a plug-in part the run's key names: observable 'norm_spread' of measure-plugins" in line
    assert "(version 1) is not installed: install the plug-in where the runs execute, then rerun" in line
    assert not list(out.glob("runs/*/scalars.json"))  # nothing measured without the part
    assert "Unhandled error" not in done.stderr  # the other run's refusal is read, not printed by Ray


def test_slurm_tasks_measure_the_plugins_parts_in_every_run(tmp_path, slurm_cluster):
    done, out = _study(tmp_path, install(tmp_path / "plug"), "--executor", "slurm")
    assert done.returncode == 0, done.stderr[-3000:]
    _measured_in_every_run(out)
    assert len(list((out / "slurm").glob("*/*_log.out"))) == 2  # one array task per run
