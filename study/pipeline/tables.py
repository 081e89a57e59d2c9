"""Table collection: the tidy rows of finished run folders (``analysis.table``), one run at a time or a
plan's runs together, with each condition's rows labelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.table import NOT_LEARNED, make_table, rows_from_spectra
from runners.objectives import learning_status
from study.runspecs import RunSpec
from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import ROWS, SCALARS, SPECTRA, RunFolder


@dataclass
class Collected:
    """The tidy table of a plan's finished runs, and what kept the others out of it."""

    table: pd.DataFrame
    rows: dict[str, pd.DataFrame]  # key -> that run's rows
    failed_seeds: dict[str, dict[int, str]]  # dataset -> seed -> reason
    missing: list[RunSpec]


def run_rows(spec: RunSpec, run_dir: Path, layers: list[str]) -> pd.DataFrame:
    """Tidy rows of one finished run, from its folder alone; one-line error naming an unreadable artifact.

    A run imported from a metric log holds its rows (``rows.parquet``) instead of spectra.
    """
    folder = RunFolder(run_dir)
    if not folder.has_spectra() and folder.file(ROWS).is_file():
        try:
            rows = folder.read_rows()
        except Exception as exc:  # noqa: BLE001 - a truncated parquet surfaces as many exception types
            raise StudyError(
                f"run {spec.label} (key {spec.key}): artifact {ROWS} is corrupt "
                f"({type(exc).__name__}: {exc}); `python -m study run` restores it from the tracking store "
                "or imports it again",
                str(folder.file(ROWS)),
            ) from None
        order = {name: i for i, name in enumerate(layers)}
        return rows.assign(run_key=spec.key, layer_index=rows.layer.map(order).fillna(-1).astype(int))
    try:
        spectra = folder.read_spectra()
    except Exception as exc:  # noqa: BLE001 - a missing/truncated npz surfaces as many exception types
        raise StudyError(
            f"run {spec.label} (key {spec.key}): artifact {SPECTRA} is missing or corrupt "
            f"({type(exc).__name__}: {exc}); `python -m study run` restores it from the tracking store "
            "or retrains this run",
            str(folder.file(SPECTRA)),
        ) from None
    result = folder.read_result() or {}
    n_tokens = result.get("n_tokens")
    if n_tokens is not None and not (
        isinstance(n_tokens, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in n_tokens.values())
    ):
        raise StudyError(
            f"run {spec.label} (key {spec.key}): expected a mapping of '{{layer}}/{{token_set}}' to token counts",
            str(folder.file("result.json")),
            "n_tokens",
        )
    try:
        scalars = folder.read_scalars()
    except Exception as exc:  # noqa: BLE001 - truncated JSON, a non-number value: the file is damaged
        raise StudyError(
            f"run {spec.label} (key {spec.key}): artifact {SCALARS} is corrupt ({type(exc).__name__}: "
            f"{exc}); `python -m study run` restores it from the tracking store or retrains this run",
            str(folder.file(SCALARS)),
        ) from None
    measured = rows_from_spectra(
        spec.key, spec.dataset["name"], spec.seed, spectra, layers, result.get("n_tokens"), scalars=scalars
    )
    return pd.DataFrame(measured)


def collect_table(
    specs: list[RunSpec], runs_dir: Path, layers: list[str], failed: dict[str, str] | None = None
) -> Collected:
    """Stage 5: the tidy table of every finished run of the plan (also the ``table`` verb).

    A run that failed or did not finish is left out; its seed is reported per dataset with the reason. In
    a design with conditions every row carries its cell's name (``condition``), and each untrained cell
    gets the epoch-0 rows of its twin's runs under its own name (:func:`condition_rows`).
    """
    rows: dict[str, pd.DataFrame] = {}
    failed_seeds: dict[str, dict[int, str]] = {}
    missing: list[RunSpec] = []
    for spec in specs:
        folder = RunFolder(runs_dir / spec.key)
        if (failed and spec.key in failed) or not folder.is_finished():
            reason = (failed or {}).get(spec.key, "run did not finish")
            failed_seeds.setdefault(spec.dataset["name"], {})[spec.seed] = reason
            missing.append(spec)
            continue
        rows[spec.key] = run_rows(spec, folder.path, layers)
        why = learning_status(folder.read_result() or {})
        if why:  # every claim that reads this run says so (analysis.verdicts)
            rows[spec.key] = rows[spec.key].assign(**{NOT_LEARNED: why})
    frames = [f for s in specs if s.key in rows for f in condition_rows(s, rows[s.key])]
    table = make_table(pd.concat(frames, ignore_index=True) if frames else [])
    return Collected(table, rows, failed_seeds, missing)


def condition_rows(spec: RunSpec, rows: pd.DataFrame) -> list[pd.DataFrame]:
    """A run's rows as the table holds them: as they are (no conditions), or with the column ``condition``
    = its cell's name, plus, per untrained cell that reads it, its epoch-0 rows under that cell's name."""
    if spec.condition is None:
        return [rows]
    out = [rows.assign(condition=spec.condition)]
    at_init = rows[rows["epoch"] == 0]
    out += [at_init.assign(condition=name) for name in spec.epoch0_conditions]
    return out
