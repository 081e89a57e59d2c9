"""One sweep trial and its runs: the trial's design point (the swept dataset with its knob values, one run
per seed), its objective per seed, its child runs' tags, and what is written to optuna when it is asked
and told (owner, run keys, per-seed values, its start moved to its first run's).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from analysis.kinds.base import summarise_layers
from runners.datasets.procedural import ProceduralDataset
from study.pipeline import tables as run_tables
from study.pipeline import triage as run_triage
from study.runspecs import RunSpec
from study.schema import Hypothesis, sweep_of
from study.sweep._heartbeat import OWNER, _owner
from study.sweep.storage import _distributions, _rdb, _uncached
from vitstudy_core.errors import StudyError
from vitstudy_core.knobs import INTEGER_KNOBS
from vitstudy_core.runfolder import RunFolder

Log = Callable[[str], None]


@dataclass
class TrialPoint:
    """One trial: its optuna number, knob values, dataset spec and the runs it needs."""

    number: int
    params: dict[str, float]
    dataset: ProceduralDataset
    specs: list[RunSpec]
    trial: optuna.trial.Trial | None = None  # the optuna Trial while it runs (set by _ask)


def trial_label(base: str, params: dict) -> str:
    """The trial dataset's name: the swept dataset's name and the knob values (``objects-texture_reliance0.25``)."""
    return base + "".join(f"-{k}{v:g}" for k, v in sorted(params.items()))


def trial_point(hyp: Hypothesis, number: int, params: dict, data_dir: Path) -> TrialPoint:
    """The design point of one trial: the swept dataset with the knob values, and its runs (one per seed)."""
    base = next(d for d in hyp.design.datasets if d.name == sweep_of(hyp).dataset)
    values = {k: int(v) if k in INTEGER_KNOBS else float(v) for k, v in params.items()}
    ds = ProceduralDataset.model_validate(
        {**base.model_dump(), **values, "name": trial_label(base.name, values)}
    )
    design = hyp.design.model_copy(update={"datasets": [ds]})
    specs = run_triage.plan(hyp.model_copy(update={"design": design}), data_dir)
    return TrialPoint(number, values, ds, specs)


def seed_objective(hyp: Hypothesis, table: pd.DataFrame, base_name: str) -> pd.Series:
    """Per seed, the sweep's objective on one trial's table (seed -> value; NaN where undefined).

    A claim objective is the claim's per-seed effect values (its kind's ``evaluate`` on the trial's rows,
    the trial dataset read under the swept dataset's name); a metric objective is the per-seed summary.
    """
    obj = sweep_of(hyp).objective
    if obj.claim is not None:
        from analysis.kinds import get_kind
        from analysis.kinds.base import TableView

        claim = next(c for c in hyp.claims if c.name == obj.claim)
        out = get_kind(claim.kind).evaluate(
            TableView(table.assign(dataset=base_name)), claim, "sweep.objective.claim", {}
        )
        if len(out.effect_values) != len(out.seeds_used):
            raise StudyError(
                f"claim {obj.claim!r} has no per-seed effect values (e.g. method: mixed); use a metric objective",
                None,
                "sweep.objective.claim",
            )
        return pd.Series(dict(zip(out.seeds_used, out.effect_values, strict=True)), dtype=float)
    layers = obj.layers or [x for x in hyp.design.layers if x.startswith("block_")]
    rows = table[(table.metric == obj.metric) & (table.token_set == obj.token_set)]
    if rows.empty:
        return pd.Series(dtype=float)
    epoch = int(rows.epoch.max()) if obj.epoch == "last" else int(obj.epoch)
    rows = rows[(rows.epoch == epoch) & rows.layer.isin(layers)]
    wide = rows.pivot_table(index="seed", columns="layer", values="value", aggfunc="mean").reindex(
        columns=layers
    )
    order = dict(zip(hyp.design.layers, range(len(hyp.design.layers)), strict=True))
    return summarise_layers(wide, obj.summary, order)


def last_test_accuracy(runs_dir: Path, spec: RunSpec) -> float:
    """The run's last recorded test accuracy (NaN when its objective records none, e.g. DINO)."""
    history = (RunFolder(runs_dir / spec.key).read_result() or {}).get("history") or []
    value = history[-1].get("test_acc") if history else None
    return float("nan") if value is None else float(value)


# ---- asking and telling --------------------------------------------------------------------------------
def _ask(optuna_study, hyp: Hypothesis, n: int, data_dir: Path) -> list[TrialPoint]:
    dists, owner, beat = _distributions(hyp), _owner(), _rdb(optuna_study)
    points = []
    for _ in range(n):
        with warnings.catch_warnings():  # optuna expects its heartbeat inside optimize(): Heartbeat does it
            warnings.simplefilter("ignore", UserWarning)
            trial = optuna_study.ask(dists)
        if beat is not None:  # before the owner: an owned trial without a heartbeat is a gone driver's
            beat.record_heartbeat(trial._trial_id)
        trial.set_user_attr(OWNER, owner)
        point = trial_point(hyp, trial.number, dict(trial.params), data_dir)
        trial.set_user_attr("run_keys", [s.key for s in point.specs])  # doctor finds a killed trial's runs
        point.trial = trial
        points.append(point)
    return points


def _trial_tags(hyp: Hypothesis, point: TrialPoint) -> dict:
    """A child run's tags naming its trial and knob values (and the sweep)."""
    return {"trial": point.number, **{f"knob.{k}": v for k, v in point.params.items()}, "sweep": hyp.name}


def _tags_by_key(trials: pd.DataFrame, hyp: Hypothesis) -> Callable[[RunSpec], dict]:
    """A run's child-run tags (:func:`_trial_tags`) from the trials table: the first trial that has it."""
    knobs = list(sweep_of(hyp).space)
    first = trials.drop_duplicates("run_key").set_index("run_key") if len(trials) else trials

    def tags(spec: RunSpec) -> dict:
        row = first.loc[spec.key]
        values = {k: int(row[k]) if k in INTEGER_KNOBS else float(row[k]) for k in knobs}  # as trial_point
        return {"trial": int(row.trial), **{f"knob.{k}": v for k, v in values.items()}, "sweep": hyp.name}

    return tags


def _tell_trial(p: TrialPoint, hyp: Hypothesis, runs_dir: Path, log: Log, failed: dict | None) -> bool:
    """Collect one trial's table and tell the trial its objective (FAIL when no seed gives one); its user
    attributes: run keys, per-seed objective and test accuracy, and the span of its runs' own training
    (``runs_started_at``/``runs_finished_at``, unix seconds), which is also its start in optuna
    (:func:`restamp_start`). True when the trial completed. A trial another driver failed meanwhile (its
    heartbeat stopped during a database outage) is left to its queued copy, which reuses these runs."""
    got = run_tables.collect_table(p.specs, runs_dir, hyp.design.layers, failed)
    per_seed = (
        seed_objective(hyp, got.table, sweep_of(hyp).dataset) if len(got.table) else pd.Series(dtype=float)
    )
    finite = per_seed[np.isfinite(per_seed.to_numpy(dtype=float))]
    try:
        return _record_trial(p, runs_dir, per_seed, finite, log)
    except optuna.exceptions.UpdateFinishedTrialError:
        log(
            f"trial {p.number} {p.params}: failed as stale by another driver; its queued copy reuses its runs"
        )
        return False


def _record_trial(p: TrialPoint, runs_dir: Path, per_seed: pd.Series, finite: pd.Series, log: Log) -> bool:
    """:func:`_tell_trial`'s writes to the optuna study."""
    from optuna.trial import TrialState

    trial = p.trial
    assert trial is not None  # the points told are those _ask returned, each with its trial
    trial.set_user_attr("run_keys", [s.key for s in p.specs])
    trial.set_user_attr("objective_per_seed", {str(k): float(v) for k, v in per_seed.items()})
    trial.set_user_attr("test_acc_per_seed", {str(s.seed): last_test_accuracy(runs_dir, s) for s in p.specs})
    results = [RunFolder(runs_dir / s.key).read_result() or {} for s in p.specs]
    starts = [r["started_at"] for r in results if isinstance(r.get("started_at"), (int, float))]
    ends = [r["finished_at"] for r in results if isinstance(r.get("finished_at"), (int, float))]
    if starts:  # a run from before ``started_at`` was kept has none
        trial.set_user_attr("runs_started_at", min(starts))
        restamp_start(trial, min(starts))
    if ends:
        trial.set_user_attr("runs_finished_at", max(ends))
    if finite.empty:
        trial.study.tell(trial, state=TrialState.FAIL)
        log(f"trial {p.number} {p.params}: FAILED (no seed finished)")
        return False
    trial.study.tell(trial, float(finite.mean()))
    log(f"trial {p.number} {p.params}: objective {finite.mean():.4g} over {len(finite)} seeds")
    return True


RESTAMP_WORKER = "study.sweep.restamp"  # the journal writer id of :func:`restamp_start` (no process's own)


def restamp_start(trial, started_at: float) -> bool:
    """Move a running trial's ``datetime_start`` (optuna stamps it when the trial is asked, for a batch the
    batch's start) to when its own first run began (``started_at``, unix seconds), so optuna-dashboard
    shows each trial its own duration; never before it was asked (reused runs began earlier). optuna has
    no call for it, so this writes what its storages keep: on a database the ``trials.datetime_start``
    column, in a journal file the two records a queued trial's start leaves (WAITING, then RUNNING with
    its start), appended together so no reader sees the trial WAITING. Returns True when moved."""
    import datetime as dt

    from optuna.storages.journal import JournalFileBackend
    from optuna.storages.journal._storage import JournalOperation
    from optuna.trial import TrialState

    asked, start = trial.datetime_start, dt.datetime.fromtimestamp(started_at)  # both local, naive
    if asked is None or start <= asked:
        return False
    storage = _uncached(trial.study._storage)
    if isinstance(storage, optuna.storages.RDBStorage):
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        # through optuna's own model: its setter stores the column as optuna's version keeps it (naive UTC
        # in optuna 5, where a raw UPDATE of local time put every trial off by the host's UTC offset)
        with _create_scoped_session(storage.scoped_session, True) as session:
            row = models.TrialModel.find_or_raise_by_id(trial._trial_id, session, for_update=True)
            if row.state != TrialState.RUNNING:
                return False
            row.datetime_start = start
        return True
    backend = getattr(storage, "_backend", None)
    if not isinstance(storage, optuna.storages.JournalStorage) or not isinstance(backend, JournalFileBackend):
        return False  # another storage: its start stays the moment it was asked
    op, iso = int(JournalOperation.SET_TRIAL_STATE_VALUES), start.astimezone(dt.timezone.utc).isoformat()
    base = {"op_code": op, "worker_id": RESTAMP_WORKER, "trial_id": trial._trial_id, "values": None}
    backend.append_logs(
        [
            {**base, "state": int(TrialState.WAITING)},
            {**base, "state": int(TrialState.RUNNING), "datetime_start": iso},
        ]
    )
    return True
