"""A sweep's optuna storage checked before anything is written, by ``validate`` and ``sweep`` alike: a
URL of a database SQLAlchemy knows (an unknown scheme or a path is refused), an SQLite file in a folder
that exists (not created by the check), any other database reachable. The error names where the URL came
from: ``--storage`` or ``STUDY_STORAGE`` when given, else the file's ``sweep.storage``.
"""

from __future__ import annotations

from pathlib import Path

from vitstudy_core.errors import StudyError
from vitstudy_core.redact import redact

EXPECTED = "a database URL optuna can open (sqlite:///PATH, postgresql://USER@HOST/DB, ...)"


def check_storage(url: str | None, file: str | None, flag: str | None = None) -> None:
    """One line (``StudyError``) when the storage at ``url`` cannot be used; None (the journal) passes.

    Args:
        url: the storage URL (``study.sweep.storage.storage_url``).
        file: the hypothesis file, named with its ``sweep.storage`` field when ``flag`` is None.
        flag: the option or variable ``url`` came from (``--storage``, ``STUDY_STORAGE``), if any.
    """
    if url is None:
        return

    def fail(why: str) -> StudyError:
        if flag:
            return StudyError(f"{flag}: {why}")
        return StudyError(why, file, "sweep.storage")

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        scheme = url.split("://", 1)[0] if "://" in url else None
        got = f"an unknown scheme {scheme!r}" if scheme else f"{redact(url)!r}, not a URL"
        raise fail(f"expected {EXPECTED}, got {got}") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not Path(db).expanduser().parent.is_dir():
            raise fail(
                f"the SQLite file's folder {Path(db).parent} does not exist (create it, or another URL)"
            )
        return
    from study.cluster.jobs import _check_database

    try:
        _check_database(flag or "sweep.storage", url)
    except StudyError as exc:
        raise fail(exc.message.split(": ", 1)[1]) from None
