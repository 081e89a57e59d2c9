"""A sweep's report: the objective against each knob, optuna's plots over two knobs or more, then each knob
claim as in a study's report; written after a sweep, or again from its folder alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from study.pipeline import outputs
from study.schema import Hypothesis, sweep_of
from study.sweep._tables import learning_lines, learnt, with_task_size
from study.sweep.storage import open_optuna_study, storage_url
from vitstudy_core.errors import StudyError


def write_sweep_report(
    sweep_dir: Path,
    hyp: Hypothesis,
    claims: list,
    out: outputs.Outcome,
    trials: pd.DataFrame,
    optuna_study,
    out_dir: Path,
) -> Path:
    """The report of a sweep that just ran: :func:`sweep_report` over its runs (counts, environment,
    covariance snapshots of every complete trial's runs)."""
    inp = outputs.report_input(f"{hyp.name} (sweep)", hyp, out, out_dir / "runs", claims)
    return sweep_report(sweep_dir, hyp, inp, trials, optuna_study)


def sweep_report(sweep_dir: Path, hyp: Hypothesis, inp, trials: pd.DataFrame, optuna_study) -> Path:
    """The report: the objective against each knob (seeds, mean band, accuracy), optuna's contour and slice
    plots for searches over two knobs or more (when its study is at hand), then each knob claim as in a
    study's report. ``inp``: the ``analysis.report.sections.ReportInput`` of the claims and runs."""
    from analysis.report.figures import summary_bounds
    from analysis.report.knob_figures import optuna_figures, trials_figure
    from analysis.report.page import write_report

    obj = sweep_of(hyp).objective
    label = f"{obj.summary} of {obj.metric}" if obj.metric else f"effect of {obj.claim!r}"
    bounds = summary_bounds(obj.metric, obj.summary) if obj.metric else (None, None)
    knobs: list[str] = list(sweep_of(hyp).space)
    preface = [trials_figure(trials, knob, label, bounds, knobs) for knob in knobs]
    if len(sweep_of(hyp).space) >= 2 and optuna_study is not None:
        preface += optuna_figures(optuna_study)
    lines = [
        f"{len(trials.trial.unique()) if len(trials) else 0} complete trials of {sweep_of(hyp).sampler} sampling over "
        f"{', '.join(sweep_of(hyp).space)} on dataset {sweep_of(hyp).dataset}, {len(hyp.design.seeds)} seeds each; "
        f"objective: {label} ({obj.direction})",
        *_learning_summary(trials),
    ]
    title = f"{hyp.name} (sweep)"
    return write_report(sweep_dir, replace(inp, title=title, preface=preface, preface_lines=lines))[0]


def _learning_summary(trials: pd.DataFrame) -> list[str]:
    """The report's line on how many runs learnt the task (above chance beyond binomial error), and its
    warnings about those that did not (:func:`learning_lines`)."""
    above = learnt(trials) if len(trials) else pd.Series(dtype=object)
    known = above.notna()
    if not known.any():
        return []
    n_up = int((above[known] == 1).sum())
    head = (
        f"test accuracy: {n_up} of {int(known.sum())} runs above chance (1 / n_classes) beyond binomial "
        "error (one-sided binomial test at 5% on the test images)"
    )
    return [head, *(f"warning: {w}" for w in learning_lines(trials))]


def report_from_folder(sweep_dir: Path, storage: str | None = None) -> Path:
    """Rewrite a finished sweep's report from its folder alone (``python -m study report <out>/sweeps/NAME``):
    its ``hypothesis.yaml``, ``verdicts.json``, ``table.parquet`` and ``trials.csv``, and its optuna study
    for the plots over two knobs (the folder's journal, or ``storage``; left out when it cannot be opened).

    Raises:
        StudyError: the folder lacks a readable ``hypothesis.yaml`` or ``trials.csv``.
    """
    from analysis.report.page import read_study
    from study.schema import load_hypothesis

    hyp = load_hypothesis(sweep_dir / "hypothesis.yaml")
    try:
        trials = pd.read_csv(sweep_dir / "trials.csv")
    except (OSError, ValueError) as exc:
        raise StudyError(f"cannot read trials.csv ({type(exc).__name__}: {exc})", str(sweep_dir)) from None
    trials = with_task_size(trials, hyp)
    claims = [c for c in hyp.claims if c.knob() is not None]
    inp = read_study(sweep_dir, hyp.name, hyp.description.strip(), claims)
    url = storage_url(hyp, storage)
    optuna_study = None
    if len(sweep_of(hyp).space) >= 2 and (url or (sweep_dir / "journal.log").is_file()):
        try:
            optuna_study = open_optuna_study(hyp, sweep_dir.parent.parent, url, str(sweep_dir))
        except StudyError:
            optuna_study = None  # the plots of optuna's study are listed as missing, the rest is drawn
    return sweep_report(sweep_dir, hyp, inp, trials, optuna_study)
