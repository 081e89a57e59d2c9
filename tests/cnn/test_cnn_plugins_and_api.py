"""A CNN study through the Python API, and with a plug-in's observable and token metric measured on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cnn.test_cnn_study import CNN
from tests.plugins.test_plugins_everywhere import ROOT, install


def test_the_api_validates_runs_loads_and_reanalyses_a_cnn_study(tmp_path):
    import study

    path = tmp_path / "h.yaml"
    path.write_text(CNN.replace("seeds: [0, 1, 2]", "seeds: [0, 1]"))
    checked = study.validate(path, tmp_path / "out")
    assert checked.hypothesis.design.layers == [
        "stem",
        "block_01",
        "block_02",
        "block_03",
        "block_04",
        "pool",
    ]
    study.run(path, tmp_path / "out", workers=1, track=False)
    result = study.load(tmp_path / "out", name="tiny")
    profile = result.profile("eed_pct", dataset="objects")  # seeds (and their mean) by layer, depth order
    assert list(profile.columns) == checked.hypothesis.design.layers and list(profile.index)[:3] == [
        0,
        1,
        "mean",
    ]
    again = study.analyze(result.hypothesis, result.table)
    assert list(again.frame.verdict) == list(result.verdicts.verdict)


@pytest.mark.slow  # two CNN trainings in two spawned workers, with the plug-in installed (~30 s on 2 cores)
def test_a_plugin_observable_and_token_metric_are_measured_at_every_cnn_point(tmp_path):
    doc = CNN.replace("seeds: [0, 1, 2]", "seeds: [0, 1]").replace("metric: eed_pct", "metric: norm_spread")
    path = tmp_path / "h.yaml"
    path.write_text(doc)
    out = tmp_path / "out"
    env = {"PYTHONPATH": f"{ROOT}:{install(tmp_path / 'plug')}"}
    cmd = [
        sys.executable,
        "-m",
        "study",
        "run",
        str(path),
        "--out",
        str(out),
        "--workers",
        "2",
        "--no-mlflow",
    ]
    import os

    done = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for file in out.glob("runs/*/scalars.json"):
        values = json.loads(file.read_text())["values"]
        for metric in ("norm_spread", "trace_per_dim"):
            points = {key.split("/")[1] for key in values if key.endswith(f"/{metric}")}
            assert points == {"stem", "block_01", "block_02", "block_03", "block_04", "pool"}, (
                metric,
                points,
            )
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert verdicts["claims"][0]["seeds_used"] == [0, 1]
