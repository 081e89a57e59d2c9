"""Passwords out of everything a study records: one helper for URLs and for text that holds them.

    redact_url("postgresql://study:s3cret@db:5432/study")   # 'postgresql://study:***@db:5432/study'
    redact("python -m study run h.yaml --leases postgresql://study:s3cret@db/study")

A database or tracking URL given on the command line (``--leases``, ``--storage``, ``MLFLOW_TRACKING_URI``)
may carry a password (``scheme://user:password@host``). What a study writes or prints (the MLflow
``command`` tag, ``report.md``, ``verdicts.json``, a Ray job's entrypoint, error lines, logs) goes through
:func:`redact` first, which replaces every such password with ``***``; the URL itself stays readable.
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@ : the password is everything between the user's colon and the last "@" before
# the host (a password may itself hold "@" or ":"); no whitespace or quote ends it early in a command line
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<pw>[^\s'\"/]*)(?P<at>@)")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL in it replaced by ``***``."""
    if "://" not in text:
        return text
    return _USERINFO.sub(lambda m: m["head"] + MASK + m["at"], text)


def redact_url(url: str | None) -> str | None:
    """One URL with its password replaced by ``***`` (None and URLs without a password unchanged)."""
    return None if url is None else redact(str(url))
