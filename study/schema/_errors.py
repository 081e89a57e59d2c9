"""pydantic's validation errors as the one-line :class:`~vitstudy_core.errors.StudyError`: the file, the
field (as a hypothesis file spells it, without the union tags pydantic inserts) and what was expected.
"""

from __future__ import annotations

import re

from pydantic import (
    ValidationError,
)

from runners.objectives import (
    OBJECTIVES,
)
from study.schema._conditions import FieldError as _FieldError
from study.schema._unions import CLAIM_KINDS, DATASET_KINDS, SOURCE_TAGS
from vitstudy_core.errors import StudyError

# the members' names pydantic inserts into the location of an error in a plain union (``epoch.int``,
# ``bottleneck.list[str]``, ``over.literal['epoch','layer']``): never a field of a hypothesis file
_MEMBER = re.compile(
    r"^(int|str|float|bool|none|(literal|list|dict|tuple|set|function-\w+|lax-or-strict)\[.*\])$"
)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in (
            *DATASET_KINDS,
            *CLAIM_KINDS,
            *SOURCE_TAGS,
            *OBJECTIVES,
        ) or _MEMBER.match(str(part)):  # discriminator tags and union members pydantic inserts
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _kinds_of(loc: tuple) -> tuple[str, tuple[str, ...]]:
    """What a discriminated union's ``kind`` chooses at ``loc`` (claim, dataset, objective or source) and
    the registered kinds, from the nearest named part of the location (none: a list of claims)."""
    named = [str(p) for p in loc if isinstance(p, str)]
    part = named[-1] if named else "claims"
    if part == "datasets":
        return "dataset", DATASET_KINDS
    if part == "objective":
        return "objective", tuple(OBJECTIVES)
    if part == "source":
        return "source", tuple(t.removesuffix("_source") for t in SOURCE_TAGS)
    return "claim", CLAIM_KINDS


def _tag_error(err: dict) -> tuple[str, str] | None:
    """A ``kind`` that picks no member of a union: ``(field ending in .kind, the known kinds)``, not
    pydantic's "Input tag ... does not match any of the expected tags"."""
    if err["type"] not in ("union_tag_invalid", "union_tag_not_found"):
        return None
    what, kinds = _kinds_of(err["loc"])
    where = _loc(err["loc"])
    field = f"{where}.kind" if where != "(top level)" else "kind"
    tag = (err.get("ctx") or {}).get("tag")
    if what == "source" and isinstance(tag, str):
        tag = tag.removesuffix("_source")
    known = ", ".join(kinds)
    if err["type"] == "union_tag_not_found" or tag in (None, "None"):
        return field, f"required field is missing: the {what} kind, one of {known}"
    return field, f"unknown {what} kind {tag!r}; expected one of {known}"


def _error_of(exc: ValidationError) -> tuple[str, str]:
    """``(field, message)`` of a validation error's first error, as the one-line error gives them."""
    err = exc.errors()[0]
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _FieldError):
        return ctx_err.field, ctx_err.message
    tagged = _tag_error(dict(err))
    if tagged is not None:
        return tagged
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key (not part of the schema)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict | list):
        msg = f"{msg}, got {err['input']!r}"
    return _loc(err["loc"]), msg


def _study_error(exc: ValidationError, file: str) -> StudyError:
    """pydantic's first error as the one-line StudyError: file, field, expectation."""
    field, msg = _error_of(exc)
    return StudyError(msg, file, field)
