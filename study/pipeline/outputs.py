"""The outputs of a study or sweep: its result folder (``table.parquet``, ``verdicts.json``/``.txt``,
``hypothesis.yaml``) and its report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.table import save_table
from analysis.verdicts import ClaimResult, format_verdicts
from study.pipeline.stages import Filled
from study.schema import Hypothesis
from vitstudy_core.errors import StudyError
from vitstudy_core.io import atomic_write_json, atomic_write_text


@dataclass
class Outcome:
    """What the writers need from a study (or a sweep): its runs, its table and its claims' results."""

    hyp_path: Path
    runs: Filled
    table: pd.DataFrame
    results: list[ClaimResult]
    command: str | None = None
    claims: list | None = None  # the claims of ``results`` (a study's): each gets its mean profile


def mean_profiles(claim: Any, table: pd.DataFrame) -> list[dict[str, Any]]:
    """The claim's metric by layer across seeds: the mean and its 95% t CI per layer
    (``analysis.table.seed_profile``), at the claim's epoch (``last`` for a claim over epochs) and token
    set(s), per dataset it names (every dataset of the table when it names none) and per condition.

    Returns:
        ``[{"dataset", "condition", "token_set", "epoch", "layers": [{"layer", "mean", "ci_low",
        "ci_high", "n"}]}]`` (None for a number that is not finite); a slice the table lacks is left out.
    """
    from analysis.table import conditions_of, seed_profile

    subset = claim.subset
    epoch = subset.epoch if claim.reads_subset_epoch() else "last"
    token_sets = list(
        dict.fromkeys([subset.token_set, *(c.token_set for _, _, c in claim.operands() if c.token_set)])
    )
    datasets = claim.datasets_named() or sorted(map(str, table["dataset"].unique()))
    out = []
    for ds in datasets:
        for token_set in token_sets:
            conditions: list[str | None] = [*conditions_of(table)] or [None]
            for cond in conditions:
                try:
                    prof = seed_profile(table, claim.metric, ds, epoch, token_set, condition=cond)
                except StudyError:
                    continue
                rows = [
                    {
                        "layer": str(layer),
                        **{k: _finite(prof.at[k, layer]) for k in ("mean", "ci_low", "ci_high", "n")},
                    }
                    for layer in prof.columns
                ]
                out.append(
                    {"dataset": ds, "condition": cond, "token_set": token_set, "epoch": epoch, "layers": rows}
                )
    return out


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def write_outputs(
    folder: Path, out: Outcome, fields: dict, tables: dict[str, pd.DataFrame] | None = None
) -> dict[str, Path]:
    """Stage 7: ``table.parquet``, ``verdicts.json``, ``verdicts.txt`` and ``hypothesis.yaml``, each atomic.

    Args:
        fields: ``verdicts.json``'s lead fields (the study's or sweep's name, ``registration``,
            ``sequential``, a sweep's ``trials``); the file, the runs' accounting
            (:meth:`Filled.accounting`), the command and the claims follow.
        tables: further tables by file name (a sweep's ``trials.csv``); their paths are returned by stem.
    """
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        **fields,
        "file": str(out.hyp_path),
        **out.runs.accounting(),
        "command": out.command,
        "claims": [r.to_dict() for r in out.results],
    }
    for entry, claim in zip(payload["claims"], out.claims or [], strict=False):
        entry["mean_profile"] = mean_profiles(claim, out.table)
    paths = {"table": save_table(out.table, folder / "table.parquet")}
    for name, frame in (tables or {}).items():
        paths[Path(name).stem] = save_table(frame, folder / name)
    paths.update(
        verdicts=atomic_write_json(folder / "verdicts.json", payload, indent=1, default=float),
        text=atomic_write_text(folder / "verdicts.txt", format_verdicts(out.results) + "\n"),
        hypothesis=atomic_write_text(
            folder / "hypothesis.yaml", Path(out.hyp_path).read_text(encoding="utf-8")
        ),
    )
    return paths


def report_input(
    title: str, hyp: Hypothesis, out: Outcome, runs_dir: Path, claims: list | None = None, **more
):
    """The :class:`analysis.report.sections.ReportInput` of a study or sweep (``more``: its other fields)."""
    from analysis.report.sections import ReportInput

    acc = out.runs.accounting()
    return ReportInput(
        title=title,
        description=hyp.description.strip(),
        claims=list(hyp.claims) if claims is None else claims,
        results=out.results,
        table=out.table,
        runs_dir=runs_dir,
        runs=acc["runs"],
        labels=acc["labels"],
        reused=acc["reused"],
        failed=acc["failed"],
        file=str(out.hyp_path),
        command=out.command,
        **more,
    )


def write_study_report(
    study_dir: Path, hyp: Hypothesis, out: Outcome, runs_dir: Path, sequential: dict | None = None
) -> list[Path]:
    """Stage 8: ``report.html`` and ``report.md`` from the typed claims and results (``sequential``: the
    looks of ``--until-decided``, see ``analysis.report.sections.ReportInput``); a design with conditions opens with
    its conditions grid, as ``python -m study report`` writes it (``analysis.report.page.read_study``)."""
    from analysis.report.page import write_report
    from analysis.report.sections import conditions_preface

    preface = conditions_preface(out.table, list(hyp.claims), hyp.design.condition_names())
    more: dict = {"preface": preface, "preface_title": "Conditions"} if preface else {}
    inp = report_input(hyp.name, hyp, out, runs_dir, sequential=sequential, **more)
    return list(write_report(study_dir, inp))
