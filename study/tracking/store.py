"""Where a study's MLflow store lives and whether this output folder may write into it: the default
tracking URI (``sqlite:///<out>/mlflow.db``, or ``MLFLOW_TRACKING_URI``) and the store's name in errors, the
locks held while a store is created (:func:`store_lock_path`, :func:`schema_lock`), where an experiment
keeps its artifacts, the refusal of a copied or moved folder's store (:func:`refuse_foreign_artifacts`),
MLflow's telemetry off, and MLflow's and alembic's log lines kept out of the terminal. ``study.tracking.tracker``
opens the store with these.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vitstudy_core.errors import StudyError
from vitstudy_core.locks import database_lock

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

_QUIET_LOGGERS = ("mlflow", "alembic")  # their INFO lines ("Creating initial MLflow database tables...")


# logs every SQLAlchemy OperationalError it re-raises (as MlflowException) with its 80-line traceback:
# the error reaches us, and a full or lost store is reported as one line (study.pipeline.stopping)
_STORE_ERROR_LOGGER = "mlflow.store.db.utils"


def quiet_library_logs(verbose: bool = False) -> None:
    """Keep MLflow's and alembic's INFO lines, and MLflow's traceback of a store error it re-raises, out
    of the terminal (``--verbose`` lets them through)."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger(_STORE_ERROR_LOGGER).setLevel(logging.INFO if verbose else logging.CRITICAL)


def store_lock_path(out_dir: Path) -> Path:
    """The lock serialising store and experiment creation among invocations on one output folder."""
    return Path(out_dir) / ".locks" / "store.lock"


@contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Held while a store is opened: on PostgreSQL a database-wide advisory lock, so that invocations on
    any host and output folder opening a fresh database one after another, not together, create MLflow's
    tables once (together, both run the migrations and one fails). Other stores: nothing (a sqlite store
    is created under the output folder's :func:`store_lock_path`; a server creates its own)."""
    if not uri.startswith("postgresql"):
        yield
        return
    from runners.leases.sql import engine_for

    with database_lock(engine_for(uri), "study.mlflow.schema"):
        yield


def default_tracking_uri(out_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(out_dir).resolve() / 'mlflow.db'}"


def store_path(out_dir: Path) -> str:
    """The tracking store as a user names it: the sqlite file's path, else its URI (errors name it)."""
    uri = default_tracking_uri(out_dir)
    return uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else uri


SERVER_SCHEMES = ("http://", "https://")  # a tracking server: it decides where artifacts go


def experiment_artifact_location(uri: str, out_dir: Path, name: str) -> str | None:
    """Where a new experiment ``name`` keeps its artifacts: ``<out_dir>/mlartifacts/<name>`` (a file URI)
    for a store without a server (the default sqlite file, a database URL); None for a tracking server
    (``http(s)://``), which then chooses (its ``--artifacts-destination``, as ``mlflow-artifacts:/...``):
    a file path here would be one only this host sees, and would bypass the server's store."""
    if uri.startswith(SERVER_SCHEMES):
        return None
    return (Path(out_dir) / "mlartifacts" / name).resolve().as_uri()


def foreign_artifact_locations(client, out_dir: Path, name: str | None = None) -> list[tuple[str, str]]:
    """(experiment name, artifact location) of each study experiment of the store (``name``: that one
    alone) whose artifacts live on this host's file system outside ``<out_dir>/mlartifacts``: the output
    folder was copied or moved.

    MLflow stores each experiment's and each run's artifact location as an absolute URI (a relative
    ``artifact_location`` is resolved against the working directory when the experiment is created), so a
    copied ``mlflow.db`` keeps pointing into the original folder. Skipped: remote locations (``s3://``,
    ...), not this folder's business, and MLflow's own ``Default`` experiment (id 0), which nothing here
    logs to and whose location is whatever the client that made the store chose (``./mlruns`` of its
    working directory for stores made before ``mlartifacts`` was the root).
    """
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    from mlflow.entities import ViewType

    home = (Path(out_dir) / "mlartifacts").resolve()
    exps = (
        [client.get_experiment_by_name(name)]
        if name is not None
        else client.search_experiments(view_type=ViewType.ALL)
    )
    found = []
    for exp in exps:
        if exp is None or str(exp.experiment_id) == "0":
            continue
        loc = exp.artifact_location or ""
        parsed = urlparse(loc)
        if parsed.scheme not in ("", "file"):
            continue
        path = Path(url2pathname(parsed.path) if parsed.scheme else loc).resolve()
        if not path.is_relative_to(home):
            found.append((exp.name, loc))
    return found


def refuse_foreign_artifacts(client, out_dir: Path, experiment: str) -> None:
    """Raise a one-line :class:`StudyError` when any study experiment of this folder's store keeps its
    artifacts outside this output folder (:func:`foreign_artifact_locations`): the folder was copied or
    moved. The whole store is refused, whichever study this invocation runs (``experiment`` is named first
    when it is one of them): a study new to the copy would log its own artifacts here but reuse the other
    studies' runs, whose artifacts load from the original."""
    foreign = sorted(foreign_artifact_locations(client, out_dir), key=lambda f: f[0] != experiment)
    if not foreign:
        return
    name, loc = foreign[0]
    out = Path(out_dir)
    raise StudyError(_copied_message(out, name, loc), str(out / "mlflow.db"))


HOME_MARKER = (
    "mlflow.db.home.json"  # beside the default store: {"home": the folder it was made in, "experiments"}
)


def _copied_message(out: Path, experiment: str, location: str) -> str:
    return (
        f"this output folder was copied or moved: its tracking store keeps the artifacts of experiment "
        f"{experiment!r} at {location}, so logging here would write into the original; "
        f"move it back, or give this copy a fresh store (move {out / 'mlflow.db'} and "
        f"{out / 'mlartifacts'} aside: its run folders are reused and logged again), or pass --no-mlflow"
    )


def check_home(out_dir: Path, experiment: str) -> bool:
    """The cheap check of a copied or moved folder, before MLflow is imported: the default store's marker
    (:data:`HOME_MARKER`) names the folder the store was made in. Another folder: one-line
    :class:`StudyError` (the store's artifacts live there). Returns True when the marker names this folder
    (no scan of the store is needed), False when there is no store yet or no marker (a store made before
    the marker: :func:`refuse_foreign_artifacts` scans it, then :func:`write_home` marks it).

    Scanning the store's experiments took 42-57 s wall under load to refuse a copy; this reads one file."""
    import json

    out = Path(out_dir)
    marker = out / HOME_MARKER
    if not (out / "mlflow.db").is_file() or not marker.is_file():  # no store yet, or one moved aside
        return False
    try:
        data = json.loads(marker.read_text())
        home, names = Path(data["home"]), [str(n) for n in data.get("experiments", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable: the full scan decides, and the marker is written again
    if home == out.resolve():
        return True
    name = experiment if experiment in names or not names else names[0]
    raise StudyError(
        _copied_message(out, name, (home / "mlartifacts" / name).as_uri()), str(out / "mlflow.db")
    )


def write_home(out_dir: Path, experiment: str) -> None:
    """Mark the default store as this folder's (:func:`check_home`), with the experiments it holds."""
    import json

    from vitstudy_core.io import atomic_write_json

    out = Path(out_dir)
    marker = out / HOME_MARKER
    names: list[str] = []
    try:
        old = json.loads(marker.read_text())
        if Path(old["home"]) == out.resolve():
            names = [str(n) for n in old.get("experiments", [])]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    home = {"home": str(out.resolve()), "experiments": sorted({*names, experiment})}
    atomic_write_json(marker, home, indent=1)
