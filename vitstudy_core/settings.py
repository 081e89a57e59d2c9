"""The base of every settings model a hypothesis file fills: unknown keys are errors, values are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A pydantic model with ``extra="forbid"`` (an unknown key is an error with its location) and
    ``frozen=True`` (a validated spec is a value: hashable, never changed in place)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
