"""``python -m study ui``: the MLflow UI on a study store, opened on a study's runs table
(``study.tracking.tracker``'s browsing role).

MLflow 3.17 opens its home page and every experiment on the GenAI overview (traces, latency, token usage),
whatever the experiment's ``mlflow.experimentKind`` tag says; the address
``#/experiments/<id>/runs?workflowType=machine_learning`` opens the experiment's runs table, so that is the
address printed (and opened in a browser, where there is one). The server gets one web worker and no job
consumers (MLflow's huey job runner serves GenAI evaluation jobs, which a study never submits; with it and
four workers start-up took 70-80 s on 2 cores), and telemetry off.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from study.tracking.cleanup import ROLES
from study.tracking.store import SERVER_SCHEMES, default_tracking_uri, quiet_library_logs
from study.tracking.tracker import active_experiments
from vitstudy_core.errors import StudyError
from vitstudy_core.redact import redact

RUNS_PAGE = "#/experiments/{id}/runs?workflowType=machine_learning"
# the server's environment: telemetry off (mlflow.telemetry.utils.is_telemetry_disabled reads both), and
# no job execution (mlflow.server: MLFLOW_SERVER_ENABLE_JOB_EXECUTION starts huey consumers otherwise)
SERVER_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


@dataclass
class UiPlan:
    """What ``study ui`` starts and prints.

    Attributes:
        cmd: the server's command line.
        env: variables added to this process's environment for the server.
        base: the server's address (``http://127.0.0.1:PORT``).
        url: the address that lands on the chosen study's runs table (the home page without one).
        experiments: (experiment name, runs-table address) of every study in the store, newest first.
    """

    cmd: list[str]
    env: dict[str, str]
    base: str
    url: str
    experiments: list[tuple[str, str]] = field(default_factory=list)


def runs_url(base: str, experiment_id: str) -> str:
    """The address of an experiment's runs table: ``http://127.0.0.1:5000/#/experiments/1/runs?...``."""
    return f"{base}/{RUNS_PAGE.format(id=experiment_id)}"


def study_experiments(uri: str) -> list[tuple[str, str]]:
    """(name, id) of each experiment holding a study's or sweep's parent run, newest parent first."""
    from mlflow.tracking import MlflowClient

    quiet_library_logs()
    client = MlflowClient(uri)
    ids = active_experiments(client)
    if not ids:
        return []
    parents = [  # MLflow's filter has no OR: one search per role
        r
        for role in ROLES
        for r in client.search_runs(ids, f"tags.`study.role` = '{role}'", max_results=1000)
    ]
    parents.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    order = list(dict.fromkeys(r.info.experiment_id for r in parents))
    return [(client.get_experiment(i).name, i) for i in order]


def store_hint(uri: str) -> str:
    """How to look at the tracking store ``uri`` (printed after a study): a tracking server's own address
    (``mlflow ui --backend-store-uri http://...`` would not start), else the ``mlflow ui`` command."""
    if uri.startswith(SERVER_SCHEMES):
        return f"{redact(uri)} (the tracking server's UI: open it in a browser)"
    return f"mlflow ui --backend-store-uri {redact(uri)}"


def ui_plan(out_dir: Path, port: int, study: str | None = None) -> UiPlan:
    """The server to start on ``out_dir``'s store and the runs table to open: ``study``'s (its experiment
    ``study`` or ``study.sweep.loop``), else the study logged last. A tracking server (``MLFLOW_TRACKING_URI``
    ``http(s)://``) is its own UI: nothing to start (``cmd`` empty), its runs table is the address.

    Raises:
        StudyError: no store here, or ``study`` names no study in it (one line listing those there).
    """
    uri = default_tracking_uri(out_dir)
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if db is not None and not db.is_file():
        raise StudyError("no MLflow store here (run a study first)", str(db))
    server = uri.startswith(SERVER_SCHEMES)
    base = uri.rstrip("/") if server else f"http://127.0.0.1:{port}"
    cmd = [] if server else [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    cmd += [] if server else ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    try:  # an empty file holds no study yet (the server makes its tables; reading it here would too)
        found = study_experiments(uri) if db is None or db.stat().st_size else []
    except Exception:  # noqa: BLE001 - a store the client cannot read yet: the server still shows it
        found = []
    experiments = [(name, runs_url(base, i)) for name, i in found]
    chosen = experiments[:1]
    if study is not None:
        chosen = [e for e in experiments if e[0] in (study, f"{study}.sweep")]
        if not chosen:
            there = ", ".join(name for name, _ in experiments) or "none"
            raise StudyError(
                f"no study {study!r} in this MLflow store (studies there: {there})", redact(uri), "--study"
            )
    return UiPlan(cmd, dict(SERVER_ENV), base, chosen[0][1] if chosen else f"{base}/", experiments)


def can_open_browser() -> bool:
    """True where a graphical browser can be opened: macOS, Windows, or a display (``DISPLAY`` /
    ``WAYLAND_DISPLAY``) or a ``BROWSER`` set. Elsewhere ``webbrowser`` would fall back to a console
    browser (lynx, w3m) that takes over the terminal the server logs to."""
    if sys.platform in ("darwin", "win32"):
        return True
    return any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"))


def wait_until_up(base: str, alive: Callable[[], bool], timeout_s: float = 600.0) -> bool:
    """Poll the server's ``/health`` until it answers (True), the server exits or ``timeout_s`` passes."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end and alive():
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def announce_when_up(plan: UiPlan, alive: Callable[[], bool], browser: bool, log=print) -> None:
    """Once the server answers: print the runs-table address and open it in a browser (when ``browser``
    and :func:`can_open_browser`). Runs in a thread beside the server."""
    import webbrowser

    t0 = time.perf_counter()
    if not wait_until_up(plan.base, alive):
        return
    opened = browser and can_open_browser() and webbrowser.open(plan.url)
    how = "opened in the browser" if opened else "open it in a browser"
    log(f"ready after {time.perf_counter() - t0:.0f}s: {plan.url} ({how})")
