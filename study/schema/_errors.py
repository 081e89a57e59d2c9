"""pydantic's validation errors as the one-line :class:`~vitstudy_core.errors.StudyError`: the file, the
field (as a hypothesis file spells it, without the union tags pydantic inserts) and what was expected.
"""

from __future__ import annotations

from pydantic import (
    ValidationError,
)

from runners.objectives import (
    OBJECTIVES,
)
from study.schema._conditions import FieldError as _FieldError
from study.schema._unions import CLAIM_KINDS, DATASET_KINDS, SOURCE_TAGS
from vitstudy_core.errors import StudyError


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
        ):  # discriminator tags pydantic inserts
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _error_of(exc: ValidationError) -> tuple[str, str]:
    """``(field, message)`` of a validation error's first error, as the one-line error gives them."""
    err = exc.errors()[0]
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _FieldError):
        return ctx_err.field, ctx_err.message
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
