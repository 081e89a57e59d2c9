"""The sweep's optuna study and where it is stored: the sampler and its distributions, the storage (a journal
file, or a database with optuna's heartbeat on, PostgreSQL in a schema of its own), the objective's name and
the record of what a sweep's trials depend on (a changed file is refused).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna

from study.schema import Hypothesis, sweep_of
from vitstudy_core.errors import StudyError, env_seconds
from vitstudy_core.knobs import INTEGER_KNOBS


def _distributions(hyp: Hypothesis) -> dict:
    from optuna.distributions import (
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, BaseDistribution] = {}
    for knob, values in sweep_of(hyp).space.items():
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
    sw = sweep_of(hyp)
    if sw.sampler == "grid":
        # Sweep refuses a range with the grid sampler: every value is a list
        return _GridSampler({k: list(v) for k, v in sw.space.items() if isinstance(v, list)}, seed=sw.seed)
    if sw.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=sw.seed)
    if sw.sampler == "random":
        return optuna.samplers.RandomSampler(seed=sw.seed)
    return optuna.samplers.TPESampler(n_startup_trials=TPE_STARTUP, seed=sw.seed)


def storage_url(hyp: Hypothesis, override: str | None = None) -> str | None:
    """The optuna storage: ``--storage``, the file's ``sweep.storage``, else None (the embedded journal)."""
    return override or sweep_of(hyp).storage


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

    from runners.leases.sql import engine_for

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
    where = flag if storage and storage != sweep_of(hyp).storage else "sweep.storage"
    try:
        if storage is None:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            path = Path(out_dir) / "sweeps" / hyp.name / "journal.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            backend = JournalStorage(JournalFileBackend(str(path)))
        else:
            backend = _database_storage(storage)
        direction = sweep_of(hyp).objective.direction
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
    obj = sweep_of(hyp).objective
    return f"{obj.summary} of {obj.metric}" if obj.metric else f"effect of {obj.claim!r}"


IDENTITY = "study.sweep"  # optuna study user attribute: what the sweep's trials were asked and run under


def sweep_identity(hyp: Hypothesis) -> dict[str, object]:
    """What a sweep's trials depend on, flattened (``design.training.epochs`` -> 1): the design (the swept
    dataset without its swept knobs, which each trial replaces) and the space, sampler and objective."""
    design = hyp.design.model_dump(mode="json")
    for ds in design["datasets"]:
        if ds.get("name") == sweep_of(hyp).dataset:
            for knob in sweep_of(hyp).space:
                ds.pop(knob, None)
    sweep = sweep_of(hyp).model_dump(
        mode="json", include={"dataset", "space", "sampler", "objective", "seed"}
    )
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
