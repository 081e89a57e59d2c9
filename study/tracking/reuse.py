"""Reading runs back from the MLflow store for reuse: the finished child runs by ``run_key`` (across
experiments) and the download of one into a run folder (``study.tracking.tracker``'s reuse role)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import OPTIONAL, REQUIRED, RESULT, ROWS, SPECTRA, parse_spectrum_key

if TYPE_CHECKING:
    from typing import TypeAlias

    from mlflow.entities import Run

    StoredRun: TypeAlias = Run  # a finished run in the store (the modules outside tracking name it from here)

# artifacts of a child run that a reuse needs (required) or carries along when present (optional)
RUN_ARTIFACTS_REQUIRED = REQUIRED
RUN_ARTIFACTS_OPTIONAL = OPTIONAL
RESULT_SHA_TAG = "result_sha"  # a child run's tag: sha256 of the result.json it holds (which training it is)


class StoredRuns:
    """The finished child runs of a store, found by their ``run_key`` tag, and their download.

    Args:
        client: an ``MlflowClient`` on the store.
        uri: the store's URI (named in error messages).
    """

    def __init__(self, client, uri: str):
        self.client = client
        self.uri = uri

    def finished_runs(self) -> dict[str, StoredRun]:
        """Finished child runs in the whole store (every experiment), newest per ``run_key`` tag."""
        found: dict[str, StoredRun] = {}
        for r in training_runs(self.client):
            key = r.data.tags.get("run_key")
            if key and key not in found:
                found[key] = r
        return found

    def has_finished(self, key: str, result_sha: str | None = None) -> bool:
        """True when the store (any experiment) holds a FINISHED child run with this ``run_key`` now.

        With ``result_sha`` (the sha256 of a run folder's ``result.json``): one that records *that*
        training, i.e. whose tag ``result_sha`` is the same (a run downloaded from the store, or logged
        before), or that has no such tag (logged before the tag existed). Two output folders sharing a
        store each train their own copy of a run, and each copy is logged (``docs/scale-out.md``).
        """
        found = self.client.search_runs(
            active_experiments(self.client),
            f"tags.run_key = '{key}' and tags.`study.role` = 'training' and attributes.status = 'FINISHED'",
            max_results=1 if result_sha is None else 1000,
        )
        if result_sha is None:
            return bool(found)
        return any(r.data.tags.get(RESULT_SHA_TAG, result_sha) == result_sha for r in found)

    def fetch_run(self, run, spec, run_dir: Path) -> None:
        """Download a stored run's artifacts into ``run_dir`` (``result.json`` last, so it marks a finished
        run only once the spectra are in place). Checks that ``spectra.npz`` loads and matches the result.

        Raises:
            StudyError: one line naming the run, the artifact and what is wrong with it.
        """
        rid = run.info.run_id
        where = f"run {spec.label} (key {spec.key}, MLflow run {rid})"
        with tempfile.TemporaryDirectory() as tmp:
            listed = {a.path for a in self.client.list_artifacts(rid)}
            got: dict[str, Path] = {}
            # a run imported from a metric log holds tidy rows instead of spectra (vitstudy_core.runfolder)
            required = (RESULT, ROWS) if ROWS in listed and SPECTRA not in listed else RUN_ARTIFACTS_REQUIRED
            for name in dict.fromkeys(RUN_ARTIFACTS_REQUIRED + RUN_ARTIFACTS_OPTIONAL):
                if name not in listed:
                    if name in required:
                        raise StudyError(
                            f"{where}: artifact {name} is missing from the tracking store; "
                            "rerun with --force to retrain it",
                            self.uri,
                        )
                    continue
                try:
                    got[name] = Path(self.client.download_artifacts(rid, name, tmp))
                except Exception as exc:  # noqa: BLE001 - any store failure is reported as one line
                    raise StudyError(
                        f"{where}: artifact {name} cannot be downloaded ({type(exc).__name__}: {exc})",
                        self.uri,
                    ) from None
            try:
                result = json.loads(got["result.json"].read_text())
                if result.get("status") != "finished":
                    raise ValueError(f"status {result.get('status')!r}, expected 'finished'")
            except (OSError, ValueError) as exc:
                raise StudyError(f"{where}: artifact result.json is corrupt ({exc})", self.uri) from None
            measured = SPECTRA if SPECTRA in got else ROWS
            try:
                _check_measurements(got[measured])
            except Exception as exc:  # noqa: BLE001 - zip/pickle/parquet/value errors all mean a corrupt file
                raise StudyError(
                    f"{where}: artifact {measured} is corrupt ({type(exc).__name__}: {exc}); "
                    "rerun with --force to retrain it",
                    self.uri,
                ) from None
            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            for name, path in got.items():
                if name != "result.json":
                    shutil.copyfile(path, run_dir / name)
            shutil.copyfile(got["result.json"], run_dir / "result.json")


def _check_measurements(path: Path) -> None:
    """Read a downloaded ``spectra.npz`` in full (or ``rows.parquet``); raise on a truncated or odd file."""
    if path.name == ROWS:
        pd.read_parquet(path)
        return
    with np.load(path) as f:
        keys = list(f.files)
        for k in keys:
            f[k]  # noqa: B018 - reading every array is what detects a truncated file
    if not keys:
        raise ValueError("no '{epoch}/{layer}/{token_set}' keys")
    for k in keys:
        parse_spectrum_key(k)


def active_experiments(client) -> list[str]:
    from mlflow.entities import ViewType

    return [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]


def training_runs(client, status: str = "FINISHED") -> list:
    """Every child (training) run in the store with this status, newest first."""
    exp_ids = active_experiments(client)
    out, token = [], None
    while exp_ids:
        page = client.search_runs(
            exp_ids,
            f"tags.`study.role` = 'training' and attributes.status = '{status}'",
            order_by=["attributes.end_time DESC"],
            max_results=1000,
            page_token=token,
        )
        out.extend(page)
        token = page.token
        if not token:
            break
    return out
