"""``python -m study ui`` (issue 27): the address that lands on a study's runs table (MLflow 3.17 opens
experiments on its GenAI overview otherwise), printed and opened once the server answers; a server with
one worker, no job consumers and telemetry off. The slow test starts the real server and keeps a headless
browser's screenshot of the page in ``tests/artifacts/``."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        return None


def test_ui_opens_the_runs_table_once_the_server_answers(monkeypatch):
    from study.tracking.ui import UiPlan, announce_when_up

    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    plan = UiPlan([], {}, base, f"{base}/#/experiments/3/runs?workflowType=machine_learning")
    opened, said = [], []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    monkeypatch.setenv("DISPLAY", ":0")
    try:
        announce_when_up(plan, lambda: True, True, said.append)
        assert opened == [plan.url] and plan.url in said[0] and "opened in the browser" in said[0]
        # no display: the address is printed, no browser started (a console one would take the terminal)
        for var in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
            monkeypatch.delenv(var, raising=False)
        announce_when_up(plan, lambda: True, True, said.append)
        assert opened == [plan.url] and "open it in a browser" in said[1]
    finally:
        server.shutdown()
    # a server that exits before it answers: nothing printed, nothing opened
    announce_when_up(plan, lambda: False, True, said.append)
    assert len(said) == 2


CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parents[1] / "artifacts"


def _chromium(url: str, profile: Path, *extra: str) -> str:
    """A headless chromium on ``url``; the page's DOM after 40 s of virtual time (the UI is a React app
    that renders after its requests return). Returns stdout (with ``--dump-dom``: the DOM)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    cmd += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    cmd += [f"--user-data-dir={profile}", "--virtual-time-budget=40000", "--window-size=1400,900"]
    done = subprocess.run([*cmd, *extra, url], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_ui_first_page_shows_the_runs_table_in_a_headless_browser(tiny_yaml, tmp_path):
    """The real ``study ui`` on a finished tiny study: the address it prints shows the runs table (the
    parent run, its children nested under it; no telemetry notice); the screenshot is kept as tests/artifacts/mlflow_ui_runs.png.
    The experiment's own address without ``workflowType`` is the GenAI overview (no runs table): why the
    printed address carries it."""
    from study.cli import main
    from tests.conftest import env_for

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    out = tmp_path / "out"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--workers", "1", "--no-report"]) == 0
    port = _free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "study", "ui", "--out", str(out), "--port", str(port), "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env_for(PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    try:
        t0, lines = time.perf_counter(), []
        for line in ui.stdout:
            lines.append(line)
            if line.startswith("ready after"):
                break
        print(f"study ui answered after {time.perf_counter() - t0:.1f}s")
        url = next(x for x in lines if x.startswith("runs of tiny:")).split(": ", 1)[1].strip()
        assert url.endswith("/runs?workflowType=machine_learning") and url in lines[-1], lines
        for attempt in range(3):  # on a loaded machine the app may still wait on the server: look again
            dom = _chromium(url, tmp_path / f"p1-{attempt}", "--dump-dom")
            if "matching runs" in dom:
                break
        (tmp_path / "runs.html").write_text(dom)
        # the runs table: the study's parent run (its 3 child runs nested under it), no telemetry notice
        assert "tiny: 1 " in dom and "<strong>4</strong> matching runs" in dom, tmp_path / "runs.html"
        assert "Information about UI telemetry" not in dom
        shot = tmp_path / "runs.png"
        _chromium(url, tmp_path / "p2", f"--screenshot={shot}")
        assert shot.stat().st_size > 20_000
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copyfile(shot, ARTIFACTS / "mlflow_ui_runs.png")
        # the experiment's address without the workflow type: MLflow 3.17's GenAI overview, no runs
        overview = _chromium(url.split("/runs?")[0], tmp_path / "p3", "--dump-dom")
        assert "matching runs" not in overview and "Overview" in overview
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
