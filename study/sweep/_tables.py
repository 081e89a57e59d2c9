"""A sweep's tables: one row per complete trial x seed (``trials.csv``), the tidy rows of every complete
trial with the knob values as columns, and the test-accuracy checks beside a knob claim (runs that never
learnt the task, accuracy that moves with the knob).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.table import make_table
from analysis.verdicts import ClaimResult
from runners.datasets.procedural import ProceduralDataset
from study.pipeline import tables as run_tables
from study.pipeline.scalars import with_run_scalars
from study.runspecs import RunSpec
from study.schema import Hypothesis, sweep_of
from study.sweep.trials import trial_point


def trials_table(optuna_study, hyp: Hypothesis) -> pd.DataFrame:
    """One row per complete trial x seed: trial, knob values, seed, run key, objective, test accuracy."""
    from optuna.trial import TrialState

    rows = []
    for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        keys = dict(zip(hyp.design.seeds, t.user_attrs.get("run_keys", []), strict=False))
        obj, acc = t.user_attrs.get("objective_per_seed", {}), t.user_attrs.get("test_acc_per_seed", {})
        for seed in hyp.design.seeds:
            rows.append(
                {
                    "trial": t.number,
                    **{k: float(v) for k, v in t.params.items()},
                    "seed": seed,
                    "run_key": keys.get(seed),
                    "objective": obj.get(str(seed), float("nan")),
                    "test_acc": acc.get(str(seed), float("nan")),
                    "trial_value": t.value,
                }
            )
    return with_task_size(pd.DataFrame(rows), hyp)


def with_task_size(trials: pd.DataFrame, hyp: Hypothesis) -> pd.DataFrame:
    """``trials`` with each trial's ``chance`` (1 / n_classes: the accuracy of guessing, which moves with an
    ``n_classes`` knob) and ``n_test`` (test images its accuracy is measured on), where not there yet
    (a ``trials.csv`` written before they were recorded)."""
    if trials.empty or {"chance", "n_test"} <= set(trials.columns):
        return trials
    base = next(d for d in hyp.design.datasets if d.name == sweep_of(hyp).dataset)
    assert isinstance(base, ProceduralDataset)  # Hypothesis refuses a sweep.dataset that is not procedural
    n_classes = (
        trials["n_classes"] if "n_classes" in trials else pd.Series(float(base.n_classes), trials.index)
    )
    return trials.assign(chance=1.0 / n_classes.astype(float), n_test=int(base.n_test))


def sweep_table(trials: pd.DataFrame, hyp: Hypothesis, out_dir: Path) -> pd.DataFrame:
    """The tidy rows of every complete trial (one per distinct design point), with the knob values as columns."""
    return _sweep_rows(trials, hyp, out_dir)[0]


def _sweep_rows(trials: pd.DataFrame, hyp: Hypothesis, out_dir: Path) -> tuple[pd.DataFrame, list[RunSpec]]:
    """:func:`sweep_table`, and the runs of the complete trials' design points."""
    frames, specs = [], []
    knobs = list(sweep_of(hyp).space)
    for _, first in (trials.drop_duplicates(knobs) if len(trials) else trials).iterrows():
        point = trial_point(hyp, int(first.trial), {k: first[k] for k in knobs}, out_dir / "data")
        got = run_tables.collect_table(point.specs, out_dir / "runs", hyp.design.layers)
        frames.append(got.table.assign(**point.params))
        specs += point.specs
    table = pd.concat(frames, ignore_index=True) if frames else make_table([])
    # per-run scalars the knob claims adjust for (adjust_for: test_accuracy): columns of the table
    return with_run_scalars(table, hyp.claims, out_dir / "runs"), specs


CHANCE_LEVEL = 0.05  # one-sided binomial test of a run's test accuracy against chance


def learnt(trials: pd.DataFrame) -> pd.Series:
    """Per row (trial x seed) whether its run learnt the task: its test accuracy is above chance beyond
    binomial error (one-sided exact binomial test at 5% of ``round(test_acc * n_test)`` correct out of
    ``n_test`` with success probability ``chance``): 1.0 learnt, 0.0 not, NaN where unknown."""
    from scipy import stats

    if not {"chance", "n_test"} <= set(trials.columns):
        return pd.Series(np.nan, index=trials.index)  # a trials.csv from before they were recorded
    known = trials.test_acc.notna() & trials.chance.notna() & trials.n_test.notna()
    rows = trials[known]
    n = rows.n_test.to_numpy(dtype=float)
    k = np.round(rows.test_acc.to_numpy(dtype=float) * n)
    p = stats.binom.sf(k - 1, n, rows.chance.to_numpy(dtype=float))  # P(X >= k) at chance
    out = pd.Series(np.nan, index=trials.index)
    out[known] = (p < CHANCE_LEVEL).astype(float)
    return out


def learning_lines(trials: pd.DataFrame, knob: str | None = None) -> list[str]:
    """Warnings about runs that never learnt: every run (the curves describe networks that learnt nothing)
    or the trials none of whose seeds did (``knob``: name them by its values). None when all is known
    to be fine or unknown."""
    above = learnt(trials)
    known = above.notna()
    if not known.any():
        return []
    n_test = "/".join(str(int(v)) for v in sorted(trials.loc[known, "n_test"].unique()))
    if not (above[known] == 1).any():
        return [
            f"no run learnt the task: all {int(known.sum())} runs' test accuracy is within binomial error of "
            f"chance (1 / n_classes; one-sided binomial test at 5% on n_test = {n_test}), so every curve "
            "describes networks that learnt nothing (train longer or on more data before reading them)"
        ]
    per_trial = trials[known].assign(up=(above[known] == 1)).groupby("trial").up.any()
    stuck = per_trial[~per_trial].index.tolist()
    if not stuck:
        return []
    where = ""
    if knob is not None and knob in trials:
        values = trials[trials.trial.isin(stuck)][knob].drop_duplicates().sort_values()
        where = f" (at {knob} = {', '.join(f'{v:g}' for v in values)})"
    return [
        f"{len(stuck)} of {len(per_trial)} trials never learnt{where}: every seed's test accuracy is within "
        f"binomial error of chance (n_test = {n_test}); their points describe networks that learnt nothing"
    ]


def accuracy_warnings(results: list[ClaimResult], claims, trials: pd.DataFrame) -> None:
    """Put each trial's test accuracy and chance level beside a knob claim; warn when runs never learnt
    (:func:`learning_lines`), and when accuracy above chance itself moves with the knob: then an effect
    over the knob is also an effect of how well the task is learnt. With every run at chance there is
    nothing learnt to move, and a chance level that moves (an ``n_classes`` knob) is no confound."""
    from analysis.inference import per_seed_slopes, t_test

    for claim, r in zip(claims, results, strict=True):
        knob = claim.knob()
        if knob is None or trials.empty or trials.test_acc.isna().all():
            continue
        acc = trials.pivot_table(index="seed", columns=knob, values="test_acc", aggfunc="mean").sort_index(
            axis=1
        )
        r.details["accuracy"] = {
            "x": [float(v) for v in acc.columns],
            "per_seed": {int(s): row.tolist() for s, row in acc.iterrows()},
        }
        above = trials.test_acc
        if "chance" in trials and trials.chance.notna().all():
            chance = trials.groupby(knob).chance.mean().reindex(acc.columns)
            r.details["accuracy"]["chance"] = chance.tolist()
            above = trials.test_acc - trials.chance
        never = learning_lines(trials, knob)
        r.warnings += never
        if never and never[0].startswith("no run learnt"):
            continue
        excess = trials.assign(above=above).pivot_table(
            index="seed", columns=knob, values="above", aggfunc="mean"
        )
        y = excess.sort_index(axis=1).dropna().to_numpy(dtype=float)
        if y.shape[0] >= 2 and y.shape[1] >= 2:
            t = t_test(per_seed_slopes(acc.columns.to_numpy(dtype=float), y), "two-sided")
            r.details["accuracy"].update(slope=t.mean, ci=list(t.ci), p=t.p)
            if t.p < 0.05:
                r.warnings.append(
                    f"test accuracy above chance changes with {knob} (per-seed slope {t.mean:.3g} per unit, "
                    f"95% CI {t.ci[0]:.3g} to {t.ci[1]:.3g}, p {t.p:.3g}): {knob} also changes how well the "
                    "task is learnt, so this effect is not of the knob alone"
                )
