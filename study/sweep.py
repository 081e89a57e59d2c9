"""``python -m study sweep FILE``: optuna trials over a design dataset's knobs; each trial's seeds go through
the stages of ``study.stages`` (plan, triage, execute, collect), so runs are keyed, cached, reused across
files and tracked like any other run.

    python -m study sweep hypotheses/complexity_sweep.yaml [--n-trials N] [--storage URL] [--workers N]

Each trial is one design point: the swept dataset with the trial's knob values. The runs of a batch of
trials are executed together, so different trials use the workers in parallel. A trial's value is the
objective averaged over its seeds (per-seed values and run keys are the trial's user attributes; every
child run carries its trial number and knob values as tags). The claims over a knob are tested on the
table of every complete trial, the seed being the unit: per seed, the curve against the knob.

Output (``--out``): ``sweeps/<name>/`` holds ``journal.log`` (the optuna study, unless ``--storage``),
``table.parquet`` (every trial's tidy rows, with the trial's knob values as columns), ``trials.csv`` (one
row per trial x seed: knob values, objective, test accuracy, run key), ``verdicts.json``/``.txt`` and the
report. Run folders live in ``runs/`` as for ``run``.

Resume: the same command continues a killed sweep. A finished trial is never run again; a trial left
RUNNING by a driver that is gone is marked FAIL and run again with the same parameters, and its finished
runs are reused. A gone driver is one whose process is dead (a trial of this host), or, on a database
storage, whatever host it ran on, one that stopped recording optuna's heartbeat for its trials (this
loop asks and tells, so :class:`Heartbeat` records it, where ``optimize()`` would). A complete trial's
runs the tracking store lacks are logged by the next invocation.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from analysis.kinds._curves import summarise_layers
from analysis.table import make_table
from analysis.verdicts import ClaimResult, format_verdicts
from runners.datasets.procedural import ProceduralDataset
from study import registration, stages
from study.preflight import check_hypothesis
from study.run_scalars import with_run_scalars
from study.runspecs import RunSpec
from study.schema import Hypothesis
from study.stopping import stopping_cleanly
from study.tracking import TrackerProtocol, open_tracker, store_path
from vitstudy_core.errors import StudyError, env_seconds
from vitstudy_core.hashing import file_digest
from vitstudy_core.knobs import INTEGER_KNOBS
from vitstudy_core.runfolder import RunFolder

Log = Callable[[str], None]
OWNER = "study.owner"  # trial user attribute: "<host>:<pid>" of the process running it


@dataclass
class TrialPoint:
    """One trial: its optuna number, knob values, dataset spec and the runs it needs."""

    number: int
    params: dict[str, float]
    dataset: ProceduralDataset
    specs: list[RunSpec]
    trial: object = None  # the optuna Trial while it runs


@dataclass
class SweepOutcome:
    results: list[ClaimResult]
    trials: pd.DataFrame
    table: pd.DataFrame
    sweep_dir: Path
    trained: list[str] = field(default_factory=list)
    report: Path | None = None


# ---- optuna -------------------------------------------------------------------------------------------
def _distributions(hyp: Hypothesis) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for knob, values in hyp.sweep.space.items():
        if isinstance(values, list):
            out[knob] = CategoricalDistribution(
                [int(v) if knob in INTEGER_KNOBS else float(v) for v in values]
            )
        elif knob in INTEGER_KNOBS:
            out[knob] = IntDistribution(
                int(values.low), int(values.high), step=int(values.step or 1), log=values.log
            )
        else:
            out[knob] = FloatDistribution(values.low, values.high, step=values.step, log=values.log)
    return out


class _GridSampler(optuna.samplers.GridSampler):
    """optuna's grid sampler without its ``after_trial`` stop: ``Study.stop`` works only inside
    ``optimize()``, and this loop asks and tells, counting the trials itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


TPE_STARTUP = 10  # TPE's start-up trials (optuna's default): sampled at random, so asked as one batch


def _sampler(hyp: Hypothesis):
    sw = hyp.sweep
    if sw.sampler == "grid":
        return _GridSampler({k: list(v) for k, v in sw.space.items()}, seed=sw.seed)
    if sw.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=sw.seed)
    if sw.sampler == "random":
        return optuna.samplers.RandomSampler(seed=sw.seed)
    return optuna.samplers.TPESampler(n_startup_trials=TPE_STARTUP, seed=sw.seed)


def storage_url(hyp: Hypothesis, override: str | None = None) -> str | None:
    """The optuna storage: ``--storage``, the file's ``sweep.storage``, else None (the embedded journal)."""
    return override or hyp.sweep.storage


OPTUNA_SCHEMA = "optuna"  # PostgreSQL: optuna's tables live here, apart from MLflow's in the same database


def optuna_schema(url: str) -> str | None:
    """The PostgreSQL schema for optuna's tables at ``url`` (created when absent), or None (``public``).

    MLflow and optuna both keep their schema version in a table named ``alembic_version``; in one schema
    whichever comes second fails ("Can't locate revision" / "no longer compatible"). So one database URL
    serves both (and the run leases) when optuna has a schema of its own. A database whose ``public``
    schema already holds optuna's tables (a sweep begun before) keeps them there.
    """
    if not url.startswith("postgresql"):
        return None
    import sqlalchemy as sa

    from runners.leases import engine_for

    with engine_for(url).connect() as conn:
        legacy = conn.execute(
            sa.text(
                "SELECT to_regclass('public.studies') IS NOT NULL AND to_regclass('public.trials') IS NOT NULL"
            )
        ).scalar()
    if legacy:
        return None
    try:  # two sweep processes may create it at once: the loser finds it there
        with engine_for(url).begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{OPTUNA_SCHEMA}"'))
    except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
        pass
    return OPTUNA_SCHEMA


HEARTBEAT_ENV = "STUDY_TRIAL_HEARTBEAT"  # seconds between a running trial's heartbeats (database storages)
DEFAULT_HEARTBEAT_S = 20
GRACE_BEATS = 3  # a trial whose last heartbeat is older than 3 intervals is stale (its driver is gone)


def heartbeat_s() -> int:
    """Seconds between the heartbeats of a sweep's running trials: ``STUDY_TRIAL_HEARTBEAT`` or 20."""
    return max(1, int(env_seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)))  # optuna takes whole seconds


def _database_storage(url: str, tries: int = 3):
    """optuna's storage at ``url`` (on PostgreSQL in its own schema, :func:`optuna_schema`), with optuna's
    heartbeat on: the driver records one per running trial every :func:`heartbeat_s` seconds, so another
    driver, on any host, fails a trial whose heartbeat is older than ``GRACE_BEATS`` intervals and runs
    it again (``RetryHeartbeatStaleTrialCallback`` queues its parameters). Sweep processes started
    together race to create the tables, and the losers see the tables exist on a second try."""
    import optuna

    beat = heartbeat_s()
    for attempt in range(tries):
        try:
            schema = optuna_schema(url)
            kwargs = {"connect_args": {"options": f"-csearch_path={schema}"}} if schema else None
            with warnings.catch_warnings():  # optuna calls its heartbeat experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=kwargs,
                    heartbeat_interval=beat,
                    grace_period=GRACE_BEATS * beat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(),
                )
                return _utc_sessions(storage) if url.startswith("postgresql") else storage
        except Exception:  # noqa: BLE001 - re-raised on the last try
            if attempt == tries - 1:
                raise
            time.sleep(1.0 + attempt)


def _utc_sessions(storage):
    """``storage`` with its PostgreSQL sessions in UTC. optuna stores a heartbeat as the database's
    ``now()`` in a column without a time zone, i.e. in the session's time zone, which each host's libpq
    may set (``PGTZ``; it overrides ``options``): drivers in other zones would read each other's
    heartbeats hours off (a live trial stale, a dead one fresh for hours)."""
    import sqlalchemy as sa

    def utc(dbapi_conn, _record) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.commit()  # a SET in a transaction rolled back would be undone

    sa.event.listen(storage.engine, "connect", utc)
    storage.engine.dispose()  # the connections opened to create or check the tables, in the old zone
    return storage


def _uncached(storage):
    """The storage under optuna's in-process cache (``create_study`` wraps an ``RDBStorage`` in one)."""
    return storage._backend if isinstance(storage, optuna.storages._CachedStorage) else storage


def _rdb(optuna_study):
    """The study's ``RDBStorage`` with its heartbeat on, else None (a journal file, or heartbeats off)."""
    storage = _uncached(optuna_study._storage)
    if isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval():
        return storage
    return None


def open_optuna_study(
    hyp: Hypothesis, out_dir: Path, storage: str | None, file: str, flag: str = "--storage"
):
    """The sweep's optuna study (created or loaded). A storage that cannot be opened is one line, naming
    ``flag`` (the option or variable it came from) or the file's ``sweep.storage``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    where = flag if storage and storage != hyp.sweep.storage else "sweep.storage"
    try:
        if storage is None:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            path = Path(out_dir) / "sweeps" / hyp.name / "journal.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            backend = JournalStorage(JournalFileBackend(str(path)))
        else:
            backend = _database_storage(storage)
        direction = hyp.sweep.objective.direction
        study = optuna.create_study(
            study_name=hyp.name,
            storage=backend,
            sampler=_sampler(hyp),
            direction=direction,
            load_if_exists=True,
        )
        if study.metric_names != [objective_name(hyp)]:  # optuna-dashboard's name for the objective
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([objective_name(hyp)])
        return study
    except Exception as exc:  # noqa: BLE001 - any storage failure is a user-facing input error
        raise StudyError(
            f"cannot open the optuna storage {storage!r} ({type(exc).__name__}: {exc})", file, where
        ) from None


def objective_name(hyp: Hypothesis) -> str:
    """The objective's name in optuna's study (what optuna-dashboard shows in place of "Objective 0"):
    ``"min of eed_pct"``, or ``"effect of 'claim name'"`` for a claim objective."""
    obj = hyp.sweep.objective
    return f"{obj.summary} of {obj.metric}" if obj.metric else f"effect of {obj.claim!r}"


IDENTITY = "study.sweep"  # optuna study user attribute: what the sweep's trials were asked and run under


def sweep_identity(hyp: Hypothesis) -> dict[str, object]:
    """What a sweep's trials depend on, flattened (``design.training.epochs`` -> 1): the design (the swept
    dataset without its swept knobs, which each trial replaces) and the space, sampler and objective."""
    design = hyp.design.model_dump(mode="json")
    for ds in design["datasets"]:
        if ds.get("name") == hyp.sweep.dataset:
            for knob in hyp.sweep.space:
                ds.pop(knob, None)
    sweep = hyp.sweep.model_dump(mode="json", include={"dataset", "space", "sampler", "objective", "seed"})
    return _flat("", {"design": design, "sweep": sweep}, {})


def _flat(prefix: str, obj: object, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        for i, v in enumerate(obj):
            _flat(f"{prefix}[{i}]", v, out)
    else:
        out[prefix] = obj
    return out


def check_unchanged(optuna_study, hyp: Hypothesis, file: str) -> None:
    """Refuse (one line) to continue a sweep whose file changed in what its trials depend on (levels, seeds,
    epochs, ...): its optuna study keeps its space, and old and new trials would mix designs. A sweep
    without a record (new, or begun before it was kept) records this file's."""
    now = sweep_identity(hyp)
    before = optuna_study.user_attrs.get(IDENTITY)
    if before is None:
        optuna_study.set_user_attr(IDENTITY, now)
        return
    changed = [k for k in dict.fromkeys([*before, *now]) if before.get(k) != now.get(k)]
    if not changed:
        return
    what = "; ".join(f"{k}: {before.get(k, '(unset)')} -> {now.get(k, '(unset)')}" for k in changed[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    raise StudyError(
        f"the sweep {hyp.name!r} changed since its trials in this output folder ({what}{more}): old and new "
        "trials would mix designs; start a new sweep (another name, or another --out / --storage)",
        file,
        changed[0],
    )


def _hostname() -> str:
    """This host's name, as trial owners record it (a function, so tests can pose as another host)."""
    return socket.gethostname()


def _owner() -> str:
    """This process as a trial's owner: ``"<host>:<pid>"``."""
    return f"{_hostname()}:{os.getpid()}"


def _alive(owner: str | None) -> bool:
    host, _, pid = (owner or "").rpartition(":")
    if host != _hostname() or not pid.isdigit():
        # another host's trial: alive unless its heartbeat says otherwise (:func:`fail_stale`, database
        # storages only); a journal file has no heartbeat, so it is assumed alive
        return host != "" and host != _hostname()
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _just_asked(trial, grace_s: float = 120.0) -> bool:
    """A trial asked by another sweep process that has not yet recorded its owner (ask, then set_user_attr)."""
    import datetime as dt

    start = trial.datetime_start
    return (
        OWNER not in trial.user_attrs
        and start is not None
        and (dt.datetime.now() - start).total_seconds() < grace_s
    )


def fail_stale(optuna_study, log: Log) -> int:
    """On a database storage: fail every running trial whose driver stopped beating, whatever host
    started it, and queue its parameters again. optuna's ``fail_stale_trials`` fails those whose last
    heartbeat is older than the grace period (measured by the database's clock) and its
    ``RetryHeartbeatStaleTrialCallback`` queues a WAITING copy; a trial with an owner but no heartbeat at
    all was asked by a driver from before heartbeats were recorded (``_ask`` beats before it records
    the owner) and is failed the same way. Returns how many trials were failed."""
    from optuna.trial import TrialState

    storage = _rdb(optuna_study)
    if storage is None:
        return 0
    before = {t.number: t for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(optuna_study)
        beating = _beating(storage, [t._trial_id for t in before.values()])
        for t in before.values():
            mine = (t.user_attrs.get(OWNER) or "").rpartition(":")[0] == _hostname()
            if OWNER in t.user_attrs and not mine and t._trial_id not in beating:
                try:
                    failed = optuna_study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # another driver failed it first (or it ended): as optuna's fail_stale_trials
                if failed:
                    retry = storage.get_heartbeat_stale_trial_callback()
                    retry(optuna_study, optuna_study._storage.get_trial(t._trial_id))
    state = {t.number: t.state for t in optuna_study.get_trials(deepcopy=False)}
    gone = [n for n in sorted(before) if state.get(n) == TrialState.FAIL]
    for n in gone:
        log(
            f"trial {n} ({before[n].user_attrs.get(OWNER, 'no owner')}) has no heartbeat for "
            f"{GRACE_BEATS * heartbeat_s()}s: its driver is gone; run again with {dict(before[n].params)}"
        )
    return len(gone)


def _beating(storage, trial_ids: list[int]) -> set[int]:
    """Those of ``trial_ids`` that have a heartbeat recorded (optuna's table ``trial_heartbeats``)."""
    import sqlalchemy as sa

    if not trial_ids:
        return set()
    query = sa.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    with storage.engine.connect() as conn:
        return {int(r[0]) for r in conn.execute(query, {"ids": trial_ids})}


class Heartbeat:
    """While a sweep runs on a database storage: a thread that records optuna's heartbeat for every
    running trial this process owns, every :func:`heartbeat_s` seconds (a database outage is ridden out:
    the next beat tries again). Use as a context manager; without heartbeats it does nothing."""

    def __init__(self, optuna_study):
        import threading

        self.study, self.storage = optuna_study, _rdb(optuna_study)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trial-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.storage is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _run(self) -> None:
        from optuna.trial import TrialState

        while not self.stop.wait(heartbeat_s()):
            try:
                me = _owner()
                for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    if t.user_attrs.get(OWNER) == me:
                        self.storage.record_heartbeat(t._trial_id)
            except Exception:  # noqa: BLE001 - the database is away: the next beat tries again
                continue


def recover_stale(optuna_study, hyp: Hypothesis, log: Log) -> int:
    """Fail trials left RUNNING by a driver that is gone and queue their parameters again: on a database
    storage those whose heartbeat stopped, on any host (:func:`fail_stale`); on any storage this host's
    trials whose process is dead (enqueued, so the grid sampler too runs that point again: it counts a
    failed point as visited). Returns how many."""
    from optuna.trial import TrialState

    n = fail_stale(optuna_study, log)
    for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _alive(t.user_attrs.get(OWNER)) or _just_asked(t):
            continue
        optuna_study.tell(t.number, state=TrialState.FAIL)
        optuna_study.enqueue_trial(dict(t.params), skip_if_exists=False)
        log(f"trial {t.number} was left running by a process that is gone: run again with {dict(t.params)}")
        n += 1
    return n


# ---- trials -> runs -------------------------------------------------------------------------------------
def trial_label(base: str, params: dict) -> str:
    """The trial dataset's name: the swept dataset's name and the knob values (``objects-texture_reliance0.25``)."""
    return base + "".join(f"-{k}{v:g}" for k, v in sorted(params.items()))


def trial_point(hyp: Hypothesis, number: int, params: dict, data_dir: Path) -> TrialPoint:
    """The design point of one trial: the swept dataset with the knob values, and its runs (one per seed)."""
    base = next(d for d in hyp.design.datasets if d.name == hyp.sweep.dataset)
    values = {k: int(v) if k in INTEGER_KNOBS else float(v) for k, v in params.items()}
    ds = ProceduralDataset.model_validate(
        {**base.model_dump(), **values, "name": trial_label(base.name, values)}
    )
    design = hyp.design.model_copy(update={"datasets": [ds]})
    specs = stages.plan(hyp.model_copy(update={"design": design}), data_dir)
    return TrialPoint(number, values, ds, specs)


def seed_objective(hyp: Hypothesis, table: pd.DataFrame, base_name: str) -> pd.Series:
    """Per seed, the sweep's objective on one trial's table (seed -> value; NaN where undefined).

    A claim objective is the claim's per-seed effect values (its kind's ``evaluate`` on the trial's rows,
    the trial dataset read under the swept dataset's name); a metric objective is the per-seed summary.
    """
    obj = hyp.sweep.objective
    if obj.claim is not None:
        from analysis.kinds import get_kind
        from analysis.kinds._table import TableView

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


# ---- the loop ---------------------------------------------------------------------------------------------
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


def _batch_size(hyp: Hypothesis, remaining: int, workers: int | str, asked: int = 0) -> int:
    """All remaining trials for samplers that do not learn from results. For TPE: its start-up trials
    that are still to be asked (``asked``: the trials complete or running), all together, since TPE samples
    them at random without looking at results; after them, enough trials to keep every worker busy (their
    runs execute together)."""
    if hyp.sweep.sampler != "tpe":
        return remaining
    cores = (os.cpu_count() or 1) if workers == "auto" else int(workers)
    busy = -(-cores // len(hyp.design.seeds))
    return max(1, min(remaining, max(busy, TPE_STARTUP - asked)))


def _counts(optuna_study) -> tuple[int, int]:
    from optuna.trial import TrialState

    trials = optuna_study.get_trials(deepcopy=False)
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    running = sum(t.state == TrialState.RUNNING and _alive(t.user_attrs.get(OWNER)) for t in trials)
    return done, running


def _trial_tags(hyp: Hypothesis, point: TrialPoint) -> dict:
    """A child run's tags naming its trial and knob values (and the sweep)."""
    return {"trial": point.number, **{f"knob.{k}": v for k, v in point.params.items()}, "sweep": hyp.name}


def _tags_by_key(trials: pd.DataFrame, hyp: Hypothesis) -> Callable[[RunSpec], dict]:
    """A run's child-run tags (:func:`_trial_tags`) from the trials table: the first trial that has it."""
    knobs = list(hyp.sweep.space)
    first = trials.drop_duplicates("run_key").set_index("run_key") if len(trials) else trials

    def tags(spec: RunSpec) -> dict:
        row = first.loc[spec.key]
        values = {k: int(row[k]) if k in INTEGER_KNOBS else float(row[k]) for k in knobs}  # as trial_point
        return {"trial": int(row.trial), **{f"knob.{k}": v for k, v in values.items()}, "sweep": hyp.name}

    return tags


def _run_batch(
    points: list[TrialPoint],
    hyp: Hypothesis,
    out_dir: Path,
    tracker: TrackerProtocol,
    opts: stages.RunOptions,
    log: Log,
    filled: stages.Filled,
) -> int:
    """Fill the runs of a batch of trials together (``stages.fill_runs``: each run reaches MLflow as it ends,
    tagged with its trial); each trial is told its value as soon as its own runs have ended, so optuna
    records when it completed, not when the batch did. ``filled`` gathers the batches' runs. Returns how
    many of the batch's trials completed."""
    runs_dir = out_dir / "runs"
    specs = list({s.key: s for p in points for s in p.specs}.values())
    trial_of = {s.key: p for p in reversed(points) for s in p.specs}
    waiting = {p.number: {s.key for s in p.specs} for p in points}  # each trial's runs still to end
    told: dict[int, bool] = {}

    def run_ended(key: str, failed: dict[str, str] | None = None) -> None:
        for p in points:
            if key in waiting[p.number]:
                waiting[p.number].discard(key)
                if not waiting[p.number] and p.number not in told:
                    told[p.number] = _tell_trial(p, hyp, runs_dir, log, failed)

    def triaged(_specs, tri: stages.Triage) -> None:  # runs reused or finished before: nothing to wait for
        todo = {s.key for s in tri.todo}
        for key in {s.key for s in specs} - todo:
            run_ended(key)

    got_batch = stages.fill_runs(
        specs,
        out_dir,
        hyp,
        tracker,
        opts,
        log,
        heading=f"trials {[p.number for p in points]}",
        tags_of=lambda spec: _trial_tags(hyp, trial_of[spec.key]),
        on_triaged=triaged,
        on_ended=lambda spec, result: run_ended(spec.key),
    )
    filled.merge(got_batch)
    for p in points:  # a trial none of whose runs reached its end here (a run that raised)
        if p.number not in told:
            told[p.number] = _tell_trial(p, hyp, runs_dir, log, got_batch.failed)
    return sum(told.values())


def _tell_trial(p: TrialPoint, hyp: Hypothesis, runs_dir: Path, log: Log, failed: dict | None) -> bool:
    """Collect one trial's table and tell the trial its objective (FAIL when no seed gives one); its user
    attributes: run keys, per-seed objective and test accuracy, and the span of its runs' own training
    (``runs_started_at``/``runs_finished_at``, unix seconds), which is also its start in optuna
    (:func:`restamp_start`). True when the trial completed. A trial another driver failed meanwhile (its
    heartbeat stopped during a database outage) is left to its queued copy, which reuses these runs."""
    got = stages.collect_table(p.specs, runs_dir, hyp.design.layers, failed)
    per_seed = seed_objective(hyp, got.table, hyp.sweep.dataset) if len(got.table) else pd.Series(dtype=float)
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

    p.trial.set_user_attr("run_keys", [s.key for s in p.specs])
    p.trial.set_user_attr("objective_per_seed", {str(k): float(v) for k, v in per_seed.items()})
    p.trial.set_user_attr(
        "test_acc_per_seed", {str(s.seed): last_test_accuracy(runs_dir, s) for s in p.specs}
    )
    results = [RunFolder(runs_dir / s.key).read_result() or {} for s in p.specs]
    starts = [r["started_at"] for r in results if isinstance(r.get("started_at"), (int, float))]
    ends = [r["finished_at"] for r in results if isinstance(r.get("finished_at"), (int, float))]
    if starts:  # a run from before ``started_at`` was kept has none
        p.trial.set_user_attr("runs_started_at", min(starts))
        restamp_start(p.trial, min(starts))
    if ends:
        p.trial.set_user_attr("runs_finished_at", max(ends))
    if finite.empty:
        p.trial.study.tell(p.trial, state=TrialState.FAIL)
        log(f"trial {p.number} {p.params}: FAILED (no seed finished)")
        return False
    p.trial.study.tell(p.trial, float(finite.mean()))
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
    base = next(d for d in hyp.design.datasets if d.name == hyp.sweep.dataset)
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
    knobs = list(hyp.sweep.space)
    for _, first in (trials.drop_duplicates(knobs) if len(trials) else trials).iterrows():
        point = trial_point(hyp, int(first.trial), {k: first[k] for k in knobs}, out_dir / "data")
        got = stages.collect_table(point.specs, out_dir / "runs", hyp.design.layers)
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


@dataclass(frozen=True)
class SweepOptions:
    """``sweep``'s own flags: ``--n-trials`` (default: the file's, or the grid's size) and ``--storage`` (an
    optuna storage URL; default: the file's ``sweep.storage``, else a journal file in the output folder;
    the CLI's default is ``$STUDY_STORAGE`` first). ``storage_from``: what an error calls ``storage`` (the
    flag, or the variable it came from)."""

    n_trials: int | None = None
    storage: str | None = None
    storage_from: str = "--storage"


def run_sweep(
    hyp: Hypothesis,
    hyp_path: Path,
    out_dir: Path,
    opts: stages.RunOptions | None = None,
    sweep: SweepOptions | None = None,
    log: Log = print,
) -> SweepOutcome:
    """Run (or continue) a sweep, then test its claims over knobs. See the module docstring.

    ``opts``: as for ``run`` (``stages.RunOptions``; ``log_model`` aside); with a database storage and no
    lease store given, the runs' leases live in that database, so sweep processes sharing it train each run
    once. ``sweep``: the number of trials and the optuna storage.
    """
    out_dir, opts, sweep = Path(out_dir), opts or stages.RunOptions(), sweep or SweepOptions()
    # Ctrl-C / SIGTERM stop the workers and mark the parent KILLED; a full disk stops the sweep (exit 2)
    with stopping_cleanly(store_path(out_dir) if opts.track else None):
        return _run_sweep(hyp, hyp_path, out_dir, opts, sweep, log)


def _run_sweep(hyp, hyp_path, out_dir: Path, opts: stages.RunOptions, sweep, log: Log) -> SweepOutcome:
    """:func:`run_sweep` inside :func:`study.stopping.stopping_cleanly`."""
    url = storage_url(hyp, sweep.storage)
    if opts.placement.leases is None and url and "://" in url:
        opts = replace(opts, placement=replace(opts.placement, leases=url))
    check_hypothesis(hyp, str(hyp_path), out_dir)  # what would stop the sweep later stops it now
    heartbeat_s()  # STUDY_TRIAL_HEARTBEAT: seconds > 0, checked before anything is written (any storage)
    target = trial_target(hyp, sweep.n_trials, str(hyp_path))
    optuna_study = open_optuna_study(hyp, out_dir, url, str(hyp_path), sweep.storage_from)
    check_unchanged(optuna_study, hyp, str(hyp_path))
    filled = stages.Filled()
    sweep_dir = out_dir / "sweeps" / hyp.name
    reg = registration.register(sweep_dir, hyp, data_existed=(sweep_dir / "verdicts.json").exists())
    with open_tracker(opts.track, out_dir, f"{hyp.name}.sweep", role="sweep") as tracker:
        tracker.set_tags(
            None,
            {
                "sweep.sampler": hyp.sweep.sampler,
                "sweep.space": hyp.sweep.model_dump()["space"],
                "sweep.n_trials": target,
                "spec_hash": file_digest(hyp_path),
                **({"command": opts.command} if opts.command else {}),
            },
        )
        with Heartbeat(optuna_study):  # another driver can tell these trials' driver is alive
            _optimize(optuna_study, hyp, out_dir, target, tracker, opts, log, filled)
        return _conclude(optuna_study, hyp, hyp_path, out_dir, tracker, opts, log, filled, reg)


def trial_target(hyp: Hypothesis, n_trials: int | None, file: str) -> int:
    """How many complete trials the sweep runs to: ``--n-trials``, the file's, or the grid's size. A grid
    has no more distinct points than its size: asking for more is refused (they would all be repeats)."""
    grid = hyp.sweep.grid_size()
    target = n_trials or hyp.sweep.n_trials or grid
    if hyp.sweep.sampler == "grid" and target > grid:
        where = "--n-trials" if n_trials else "sweep.n_trials"
        raise StudyError(
            f"expected at most the grid's {grid} points, got {target} trials (a grid trial beyond its size "
            "repeats a point; add values to sweep.space to sample more, under another sweep name)",
            file,
            where,
        )
    return target


def _optimize(optuna_study, hyp, out_dir, target, tracker, opts, log, filled) -> None:
    """Ask, fill and tell batches of trials until ``target`` trials are complete (here or elsewhere)."""
    recover_stale(optuna_study, hyp, log)
    while True:
        done, running = _counts(optuna_study)
        if done + running >= target and running:  # the rest runs in other sweep processes: wait for it
            log(f"waiting for {running} trial(s) running in other processes")
            time.sleep(5)
            recover_stale(optuna_study, hyp, log)
            continue
        if done + running >= target:
            return
        t0 = time.perf_counter()
        n = _batch_size(hyp, target - done - running, opts.workers, done + running)
        points = _ask(optuna_study, hyp, n, out_dir / "data")
        if not _run_batch(points, hyp, out_dir, tracker, opts, log, filled):
            log("no trial of this batch completed (see the failed runs above): stopping the sweep here")
            return
        log(
            f"{_counts(optuna_study)[0]}/{target} trials complete ({time.perf_counter() - t0:.0f}s for this batch)"
        )


def _conclude(optuna_study, hyp, hyp_path, out_dir, tracker, opts, log, filled, reg) -> SweepOutcome:
    """The trial and tidy tables, the claims over knobs, the outputs, the report and the parent run's results."""
    sweep_dir = out_dir / "sweeps" / hyp.name
    trials = trials_table(optuna_study, hyp)
    table, specs = _sweep_rows(trials, hyp, out_dir)
    # the runs of every complete trial: trained or reused in this invocation, or finished by an earlier one
    known = {s.key for s in filled.specs}
    earlier = list({s.key: s for s in specs if s.key not in known}.values())
    filled.merge(stages.Filled(earlier, stages.Triage(finished=[s.key for s in earlier])))
    # those the tracking store lacks (their invocation was killed before logging them, or the store lost
    # them) are logged now, tagged with their trial, as `run` catches up its missing runs
    stages.log_missing(
        tracker, earlier, out_dir / "runs", hyp.design.layers, tags_of=_tags_by_key(trials, hyp)
    )
    tracker.log_study(hyp, hyp_path, filled.specs, filled.tri, opts.command)
    knob_claims = [c for c in hyp.claims if c.knob() is not None]
    results = registration.evaluate_registered(reg, hyp, knob_claims, table, str(hyp_path))
    accuracy_warnings(results, knob_claims, trials)
    out = stages.Outcome(hyp_path, filled, table, results, opts.command)
    paths = stages.write_outputs(
        sweep_dir,
        out,
        {"sweep": sweep_dir.name, "trials": trials.to_dict(orient="records")},
        {"trials.csv": trials},
    )
    report_path = None
    if opts.report:
        report_path = write_sweep_report(sweep_dir, hyp, knob_claims, out, trials, optuna_study, out_dir)
        log(f"report: {report_path}")
    tracker.log_results(
        [*paths.values(), *([report_path] if report_path else [])],
        results,
        f"**{hyp.name}** (sweep)\n\n```\n{format_verdicts(results)}\n```",
    )
    return SweepOutcome(results, trials, table, sweep_dir, [s.key for s in filled.tri.todo], report_path)


def write_sweep_report(
    sweep_dir: Path,
    hyp: Hypothesis,
    claims: list,
    out: stages.Outcome,
    trials: pd.DataFrame,
    optuna_study,
    out_dir: Path,
) -> Path:
    """The report of a sweep that just ran: :func:`sweep_report` over its runs (counts, environment,
    covariance snapshots of every complete trial's runs)."""
    inp = stages.report_input(f"{hyp.name} (sweep)", hyp, out, out_dir / "runs", claims)
    return sweep_report(sweep_dir, hyp, inp, trials, optuna_study)


def sweep_report(sweep_dir: Path, hyp: Hypothesis, inp, trials: pd.DataFrame, optuna_study) -> Path:
    """The report: the objective against each knob (seeds, mean band, accuracy), optuna's contour and slice
    plots for searches over two knobs or more (when its study is at hand), then each knob claim as in a
    study's report. ``inp``: the ``analysis.report.ReportInput`` of the claims and runs."""
    from analysis.figures import optuna_figures, summary_bounds, trials_figure
    from analysis.report import write_report

    obj = hyp.sweep.objective
    label = f"{obj.summary} of {obj.metric}" if obj.metric else f"effect of {obj.claim!r}"
    bounds = summary_bounds(obj.metric, obj.summary) if obj.metric else (None, None)
    knobs = list(hyp.sweep.space)
    preface = [trials_figure(trials, knob, label, bounds, knobs) for knob in knobs]
    if len(hyp.sweep.space) >= 2 and optuna_study is not None:
        preface += optuna_figures(optuna_study)
    lines = [
        f"{len(trials.trial.unique()) if len(trials) else 0} complete trials of {hyp.sweep.sampler} sampling over "
        f"{', '.join(hyp.sweep.space)} on dataset {hyp.sweep.dataset}, {len(hyp.design.seeds)} seeds each; "
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
    from analysis.report import read_study
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
    if len(hyp.sweep.space) >= 2 and (url or (sweep_dir / "journal.log").is_file()):
        try:
            optuna_study = open_optuna_study(hyp, sweep_dir.parent.parent, url, str(sweep_dir))
        except StudyError:
            optuna_study = None  # the plots of optuna's study are listed as missing, the rest is drawn
    return sweep_report(sweep_dir, hyp, inp, trials, optuna_study)
