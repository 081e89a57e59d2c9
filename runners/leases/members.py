"""Which runs each study plans, kept beside the lease store, so ``python -m study status`` counts a study
by its own runs.

A run's lease records one study: the first to announce or claim it (``runners.leases.store``). A run shared by
files belongs to each study that plans it (``controls.yaml``'s trained cell is the default study's runs,
keyed the same), so counting leases by their ``study`` gave ``controls`` only the runs it trained itself.
Each study that announces its runs also records them here, by lease key:

* a file store: ``<folder>/studies/<study>.json``, a sorted list of lease keys, merged under
  ``<folder>/studies/.lock``;
* a database: the table ``study_run_members (study, run_key)``, both columns the primary key.

A store from before this record has none: its studies are counted by their leases' ``study`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from vitstudy_core.io import atomic_write_json
from vitstudy_core.locks import file_lock

TABLE = "study_run_members"
CHUNK = 400  # rows per INSERT: 2 parameters each, well under SQLite's limit of 32,766 (999 before 3.32)


def record_planned(where: str, runs_dir: Path, study: str, run_keys: list[str], training: bool) -> None:
    """Record the runs a study plans (``run_keys``: all of them, reused ones too) in the lease store
    ``where`` of the output folder ``runs_dir/..``, scoped as its leases are (``runners.shared_out``).

    When nothing is to train and the folder's store does not exist, nothing is written (no lease store is
    made for a study that uses none). Bookkeeping only: a store that cannot be written is passed over
    (filling the runs reports it)."""
    from runners.leases.store import open_lease_store
    from runners.shared_out import lease_key, read_token, write_token

    if not training and "://" not in where and not Path(where).is_dir():
        return
    out = Path(runs_dir).resolve().parent
    token = write_token(out) if training else read_token(out)
    try:
        record(open_lease_store(where), study, [lease_key(k, token) for k in run_keys])
    except Exception:  # noqa: BLE001 - bookkeeping only: the runs' own leases report an unusable store
        pass


def record(store: object, study: str, lease_keys: list[str]) -> None:
    """Add ``lease_keys`` to the runs ``study`` plans (keys already recorded are kept; none is removed)."""
    if not study or not lease_keys:
        return
    if hasattr(store, "engine"):
        _record_sql(store, study, lease_keys)
        return
    folder = Path(store.folder) / "studies"  # type: ignore[attr-defined]
    with file_lock(folder / ".lock"):
        path = folder / f"{_file_name(study)}.json"
        known = set(_read(path).get("run_keys", []))
        atomic_write_json(path, {"study": study, "run_keys": sorted(known | set(lease_keys))}, indent=1)


def members(store: object) -> dict[str, set[str]]:
    """Study -> the lease keys it recorded ({} for a store without the record)."""
    if hasattr(store, "engine"):
        return _members_sql(store)
    out: dict[str, set[str]] = {}
    for path in sorted((Path(store.folder) / "studies").glob("*.json")):  # type: ignore[attr-defined]
        data = _read(path)
        if isinstance(data.get("study"), str):
            out.setdefault(data["study"], set()).update(map(str, data.get("run_keys", [])))
    return out


def _file_name(study: str) -> str:
    """A study's name as a file name: names are folder names already (``study.schema``); ``/`` is kept out."""
    return study.replace("/", "_")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _table(store: object):
    import sqlalchemy as sa

    meta = sa.MetaData()
    table = sa.Table(
        TABLE,
        meta,
        sa.Column("study", sa.String(256), primary_key=True),
        sa.Column("run_key", sa.String(128), primary_key=True),
    )
    try:
        meta.create_all(store.engine)  # type: ignore[attr-defined]
    except sa.exc.IntegrityError:  # two workers created the table at once: it exists now
        pass
    except sa.exc.ProgrammingError as exc:  # PostgreSQL: the same race, reported as a duplicate type
        if "already exists" not in str(exc):
            raise
    return table


def _record_sql(store: object, study: str, lease_keys: list[str]) -> None:
    import sqlalchemy as sa

    table, engine = _table(store), store.engine  # type: ignore[attr-defined]
    rows = [{"study": study, "run_key": k} for k in sorted(set(lease_keys))]
    dialect = engine.dialect.name
    if dialect in ("postgresql", "sqlite"):  # one statement; a row already there is no error (no log line)
        from sqlalchemy.dialects import postgresql, sqlite

        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        with engine.begin() as conn:
            for i in range(0, len(rows), CHUNK):
                conn.execute(insert(table).values(rows[i : i + CHUNK]).on_conflict_do_nothing())
        return
    with engine.connect() as conn:
        have = {r[0] for r in conn.execute(sa.select(table.c.run_key).where(table.c.study == study))}
    for row in rows:
        if row["run_key"] in have:
            continue
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(table).values(**row))
        except sa.exc.IntegrityError:  # inserted meanwhile by another invocation
            pass


def _members_sql(store: object) -> dict[str, set[str]]:
    import sqlalchemy as sa

    table, out = _table(store), dict[str, set[str]]()
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        for study, key in conn.execute(sa.select(table.c.study, table.c.run_key)):
            out.setdefault(study, set()).add(key)
    return out
