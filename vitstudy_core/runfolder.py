"""The run-folder contract: what a finished run leaves on disk, and the one place that reads and writes it.

A run folder ``runs/<run key>/`` is filled by a *run source* (``runners.sources``: training today; imported
checkpoints or metric logs plug in the same way) and read by everything downstream (the tidy table, the
report, tracking, reuse). Files:

* ``result.json``: ``{"status": "finished" | "failed", "run": <run spec>, "n_tokens": {"{layer}/{token_set}":
  n}, "history": [...], "environment": {...}, "started_at": <unix seconds>, "finished_at": <unix seconds>, ...}`` (a failed run:
  ``"started_at"``, ``"failed_at"``; a trained run's times, for its MLflow child run; a trained run's
  ``"measure_s"``: seconds each checkpoint's measurement took, by epoch, which ``plan`` reads); an imported run adds
  ``"source"`` (kind, path, fingerprint, format, the state-dict key or the name mapping used). Written last: a folder whose ``result.json`` says
  ``finished`` is a finished run, and nothing else is.
* ``spectra.npz``: covariance eigenvalues ``(D,)`` float64, keyed :func:`spectrum_key`
  (``"{epoch}/{layer}/{token_set}"``). A finished run holds it, or ``rows.parquet`` instead.
* ``rows.parquet`` (instead of ``spectra.npz``, for a run imported from a metric log, which has no
  spectra): the run's tidy rows, columns ``analysis.table.COLUMNS`` (``layer_index`` is recomputed from the
  design when the table is collected; ``n_tokens`` is -1 when the log does not say).
* ``scalars.json`` (optional): activation observables, ``{"values": {"{epoch}/{layer}/{token_set}/{name}":
  value | null}, ...}``.
* ``covariances.npz`` (optional): float32 ``(D, D)`` covariance snapshots keyed ``"{epoch}/{layer}"``.
* ``probe.npz`` (optional; every run measured since probe resampling): spectra of the same covariances on
  smaller probes, keys ``"{epoch}/{layer}/{token_set}/{label}/lam"`` ``(D,)`` float64, ``.../n`` (tokens)
  and ``.../m/{metric}`` (covariance observables, token-count metrics); labels ``images_1_4``,
  ``images_1_2`` (the probe's first quarter and half of the images) and ``tokens_matched`` (a seeded
  subsample of as many tokens as probe images).
* ``blocks.npz`` (optional, ``probe.blocks: K``): shifted token sums over K contiguous blocks of probe
  images, keys ``"{epoch}/{layer}/{token_set}/{n|s|u|w|qtril}"``: ``(K,)``, ``(K, D)``, ``(K, D)``,
  ``(K,)`` and the lower triangle of ``sum y y^T`` ``(K, D (D + 1) / 2)`` (``numpy.tril_indices`` order).
* ``checkpoints/epoch_NNN.pt`` (optional): weights at checkpoint epochs; ``resume.pt`` while a run is
  in progress.

Every write is atomic (:mod:`vitstudy_core.io`). This module imports numpy (and pandas inside the ``rows.parquet``
reader and writer) only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vitstudy_core.io import atomic_path, atomic_save_npz, atomic_write_json

if TYPE_CHECKING:
    import pandas as pd

RESULT, SPECTRA, SCALARS, COVARIANCES = "result.json", "spectra.npz", "scalars.json", "covariances.npz"
ROWS = "rows.parquet"
PROBE, BLOCKS = "probe.npz", "blocks.npz"
REQUIRED = (SPECTRA, RESULT)  # what a finished run must hold (and what a copy of it must carry)
MEASUREMENTS = (SPECTRA, ROWS)  # a finished run holds one of them: spectra, or imported rows
OPTIONAL = (COVARIANCES, SCALARS, ROWS, PROBE, BLOCKS)


def spectrum_key(epoch: int, layer: str, token_set: str) -> str:
    """The key of one spectrum in ``spectra.npz``: ``"{epoch}/{layer}/{token_set}"``."""
    return f"{int(epoch)}/{layer}/{token_set}"


def parse_spectrum_key(key: str) -> tuple[int, str, str]:
    """``"{epoch}/{layer}/{token_set}"`` -> (epoch, layer, token_set); ValueError on any other shape."""
    parts = key.split("/")
    if len(parts) != 3:
        raise ValueError(f"expected '{{epoch}}/{{layer}}/{{token_set}}', got {key!r}")
    return int(parts[0]), parts[1], parts[2]


class RunFolder:
    """One run's folder. Paths, the finished test, and typed readers and writers of its files."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    # ---- state ------------------------------------------------------------------------------------
    def read_result(self) -> dict | None:
        """``result.json`` if the run ended (finished or failed); None if absent, unreadable or not a mapping."""
        try:
            result = json.loads(self.file(RESULT).read_text())
        except (OSError, ValueError):  # ValueError: bad JSON or bytes that are not UTF-8
            return None
        return result if isinstance(result, dict) else None

    def finished_at(self) -> float | None:
        """When the run finished (unix seconds): ``result.json``'s ``finished_at``, else its file time;
        None for a run that did not finish."""
        result = self.read_result()
        if not result or result.get("status") != "finished":
            return None
        at = result.get("finished_at")
        return float(at) if isinstance(at, int | float) else self.file(RESULT).stat().st_mtime

    def is_finished(self) -> bool:
        """True when ``result.json`` says finished and ``spectra.npz`` (or imported ``rows.parquet``) exists."""
        result = self.read_result()
        return bool(
            result
            and result.get("status") == "finished"
            and any(self.file(m).is_file() for m in MEASUREMENTS)
        )

    def has_spectra(self) -> bool:
        return self.file(SPECTRA).is_file()

    def damage(self) -> str | None:
        """Why this folder's files cannot be read, or None: ``result.json`` (when present) must parse, and
        each of ``spectra.npz`` (every array read, so a truncated zip is caught), ``rows.parquet`` and
        ``scalars.json`` that is present must load. One short line (type and message, at most 200
        characters). A finished run that is damaged is not finished for reuse: the run stage restores it
        from the tracking store or retrains it; ``python -m study doctor`` reports it."""
        name = RESULT
        try:
            if self.file(RESULT).exists():
                json.loads(self.file(RESULT).read_text())
            if self.file(SPECTRA).exists():
                name = SPECTRA
                self.read_spectra()  # reads every array: what detects a truncated zip
            if self.file(ROWS).exists():
                name = ROWS
                self.read_rows()
            if self.file(SCALARS).exists():
                name = SCALARS
                self.read_scalars()
        except Exception as exc:  # noqa: BLE001 - zip, json, parquet and value errors all mean damage
            return f"{name}: {type(exc).__name__}: {exc}"[:200]
        return None

    # ---- readers ----------------------------------------------------------------------------------
    def read_spectra(self) -> dict[str, np.ndarray]:
        """Every spectrum, keyed :func:`spectrum_key`. Raises whatever numpy raises on a bad file, and
        ValueError on an array that is not real numbers (strings, objects, booleans: no spectrum)."""
        with np.load(self.file(SPECTRA)) as f:
            spectra = {k: f[k] for k in f.files}
        for k, v in spectra.items():
            if v.dtype.kind not in "iuf":
                raise ValueError(f"array {k!r} holds {v.dtype} values, not eigenvalues (real numbers)")
        return spectra

    def read_scalars(self) -> dict[str, float]:
        """Observables ``{"{epoch}/{layer}/{token_set}/{name}": value}`` (null -> NaN); {} without the file."""
        path = self.file(SCALARS)
        if not path.exists():
            return {}
        values = json.loads(path.read_text()).get("values", {})
        return {k: float("nan") if v is None else float(v) for k, v in values.items()}

    def read_covariances(self) -> dict[tuple[int, str], np.ndarray]:
        """Covariance snapshots keyed (epoch, layer); {} without the file."""
        path = self.file(COVARIANCES)
        if not path.exists():
            return {}
        with np.load(path) as f:
            return {(int(k.split("/")[0]), k.split("/")[1]): f[k] for k in f.files}

    def read_npz(self, name: str) -> dict[str, np.ndarray]:
        """Every array of ``probe.npz`` or ``blocks.npz`` by key; {} without the file."""
        path = self.file(name)
        if not path.exists():
            return {}
        with np.load(path) as f:
            return {k: f[k] for k in f.files}

    def read_rows(self) -> pd.DataFrame:
        """The imported tidy rows (``rows.parquet``) as a pandas DataFrame; raises what pandas raises."""
        import pandas as pd

        return pd.read_parquet(self.file(ROWS))

    # ---- writers ----------------------------------------------------------------------------------
    def write_result(self, result: dict) -> None:
        atomic_write_json(self.file(RESULT), result, indent=1)

    def write_spectra(self, spectra: dict[str, np.ndarray]) -> None:
        atomic_save_npz(self.file(SPECTRA), **spectra)

    def write_rows(self, rows: pd.DataFrame) -> None:
        """Write imported tidy rows (a pandas DataFrame) to ``rows.parquet`` atomically."""
        with atomic_path(self.file(ROWS)) as tmp:
            rows.to_parquet(tmp, index=False)

    def merge_scalars(self, values: dict[str, float], meta: dict | None = None) -> None:
        """Add observables to ``scalars.json`` (read, merge, atomic write); NaN is stored as null.

        ``meta``: top-level entries set when absent, and dict entries merged (e.g. ``n_subsample``).
        """
        path = self.file(SCALARS)
        data = json.loads(path.read_text()) if path.exists() else {}
        for k, v in (meta or {}).items():
            if isinstance(v, dict):
                data.setdefault(k, {}).update(v)
            else:
                data.setdefault(k, v)
        data.setdefault("values", {}).update(
            {k: float(v) if np.isfinite(v) else None for k, v in values.items()}
        )
        atomic_write_json(path, data, indent=1, sort_keys=True)

    def merge_npz(self, name: str, epoch: int, arrays: dict[str, np.ndarray]) -> None:
        """Replace one epoch's keys (``"{epoch}/..."``) of ``probe.npz``/``blocks.npz`` (read, merge, atomic
        write): re-measuring an epoch overwrites it."""
        kept = {k: v for k, v in self.read_npz(name).items() if not k.startswith(f"{int(epoch)}/")}
        atomic_save_npz(self.file(name), **kept, **arrays)

    def merge_covariances(self, epoch: int, covariances: dict[str, np.ndarray]) -> None:
        """Add one epoch's ``layer -> (D, D)`` snapshots to ``covariances.npz`` (read, merge, atomic write)."""
        path = self.file(COVARIANCES)
        arrays: dict[str, np.ndarray] = {}
        if path.exists():
            with np.load(path) as f:
                arrays = {k: f[k] for k in f.files}
        arrays.update({f"{int(epoch)}/{layer}": cov for layer, cov in covariances.items()})
        atomic_save_npz(path, **arrays)
