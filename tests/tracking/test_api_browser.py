"""The study's parent MLflow run in MLflow's own UI (a real server, Debian's headless chromium): the run's
metric page plots the seed aggregates (``seed_mean/...``, ``seed_ci_low/...``, ``seed_ci_high/...``) against
step, the layer index: the study-level curve with its 95% CI. The screenshot is kept as ``tests/artifacts/mlflow_parent_run.png``.

Slow (an MLflow server starts: ~30 s): ``python -m pytest -m slow tests/tracking/test_api_browser.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

import study
from tests.conftest import env_for
from tests.planted import DIFF, U, plant, write_planted
from tests.report.test_report_browser import ARTIFACTS, _chromium, chromium  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, "the MLflow server exited"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"MLflow server not up at {url} after {timeout_s} s")


def _metric_page(base: str, experiment_id: str, run_id: str, keys: list[str]) -> str:
    """The URL of MLflow's metric page (``getMetricPageRoute``) plotting ``keys`` of one run against step."""
    q = lambda v: urllib.parse.quote(json.dumps(v))  # noqa: E731
    return (
        f"{base}/#/metric?runs={q([run_id])}&metric={q(keys[0])}&experiments={q([experiment_id])}"
        f"&plot_metric_keys={q(keys)}&plot_layout={q({})}&x_axis=step&y_axis_scale=linear&line_smoothness=1"
        f"&show_point=true&deselected_curves={q([])}&last_linear_y_axis_range={q([])}"
    )


def test_parent_run_page_shows_the_seed_mean_curves(chromium, tmp_path, monkeypatch):  # noqa: F811
    from mlflow.tracking import MlflowClient

    plant(monkeypatch, 0.5)
    result = study.run(write_planted(tmp_path, [DIFF, U]), tmp_path / "out", workers=1, report=False)
    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    (parent,) = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("study.role") == "study"
    ]
    assert "seed_mean/diagonality/all" in parent.data.metrics
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(
        cmd, env=env_for(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_up(f"{base}/health", proc)
        keys = [f"{p}/diagonality/all" for p in ("seed_mean", "seed_ci_low", "seed_ci_high")]
        page = _metric_page(base, exp.experiment_id, parent.info.run_id, keys)
        shot = tmp_path / "mlflow.png"
        budget = "--virtual-time-budget=30000"  # the UI is a single-page app: let it fetch and draw
        size = "--window-size=1900,1000"  # wide enough for the chart beside the UI's side panels
        got = _chromium(page, tmp_path / "p1", budget, size, f"--screenshot={shot}")
        assert got.returncode == 0, got.stderr[-2000:]
        dom = _chromium(page, tmp_path / "p2", budget, size, "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert "Completed Runs" in dom.stdout and all(k in dom.stdout for k in keys), dom.stdout[-2000:]
        assert "invalid URL" not in dom.stdout
        assert shot.stat().st_size > 20_000
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copyfile(shot, ARTIFACTS / "mlflow_parent_run.png")
        print(f"screenshot: {ARTIFACTS / 'mlflow_parent_run.png'} ({result.name})")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
