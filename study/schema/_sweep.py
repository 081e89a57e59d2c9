"""The ``sweep`` of a hypothesis file (``python -m study sweep``): a design dataset's knobs varied over
optuna trials, with the knob ranges, the objective each trial is scored by, and their checks.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Protocol

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from study.schema._conditions import FieldError as _FieldError
from vitstudy_core.errors import StudyError
from vitstudy_core.knobs import Knob
from vitstudy_core.layers import TokenSet
from vitstudy_core.settings import Strict


class _WithSweep(Protocol):
    """A hypothesis (``study.schema.Hypothesis``, which imports this module) as :func:`sweep_of` reads it."""

    @property
    def sweep(self) -> Sweep | None: ...


def _number(v: object) -> float:
    """A knob's value as written: an int or a float. YAML's ``true`` and a quoted ``"0.5"`` would be taken
    as 1 and 0.5 by pydantic's lax mode; here they are errors."""
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()} (a boolean)")
    if not isinstance(v, int | float):
        kind = {"str": "a string, quoted"}.get(type(v).__name__, f"a {type(v).__name__}")
        raise ValueError(f"expected a number, got {v!r} ({kind})")
    return float(v)


KnobNumber = Annotated[float, BeforeValidator(_number)]


def _grid(values: list) -> list:
    """A list of levels: numbers, each once (``0`` and ``0.0`` are one level: two trials of the same runs)."""
    seen: dict[float, int] = {}
    for i, v in enumerate(values):
        try:
            x = _number(v)
        except ValueError as exc:
            raise _FieldError(f"[{i}]", str(exc)) from None
        if x in seen:
            j = seen[x]
            raise _FieldError(
                f"[{i}]", f"expected each level once; {v!r} is the level of [{j}] ({values[j]!r}) again"
            )
        seen[x] = i
    return values


class KnobRange(Strict):
    """A range of a knob for the ``qmc``, ``random`` and ``tpe`` samplers (integers for integer knobs)."""

    low: KnobNumber
    high: KnobNumber
    step: KnobNumber | None = Field(None, gt=0)  # a discrete grid inside the range
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> KnobRange:
        if not self.low < self.high:
            raise ValueError(f"expected low < high, got low {self.low} and high {self.high} (an empty range)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got low {self.low:g}")
        if self.log and self.step is not None:
            raise ValueError("a log range takes no step (give log or step, not both)")
        if self.step is not None:
            n = (self.high - self.low) / self.step
            if abs(n - round(n)) > 1e-9 * max(1.0, abs(n)):  # optuna would warn and move high
                last = self.low + math.floor(n + 1e-9) * self.step
                raise ValueError(
                    f"expected a step that divides high - low; step {self.step:g} from {self.low:g} ends at "
                    f"{last:g}, not high {self.high:g}"
                )
        return self


class SweepObjective(Strict):
    """Each trial's objective: a per-seed number, averaged over seeds; optuna maximises or minimises it.

    Either a per-seed summary of ``metric`` over ``layers`` at ``epoch`` (``min``, ``mean``, ``range`` =
    max - min, ``argmin`` = the depth index of the minimum), or the effect of the claim named ``claim``
    (a claim of the file that is not over a knob; its per-seed values on the trial's runs).
    """

    metric: str | None = None
    summary: Literal["min", "mean", "range", "argmin"] = "min"
    layers: list[str] | None = None  # default: every block
    epoch: int | Literal["last"] = "last"
    token_set: TokenSet = "all"
    claim: str | None = None
    direction: Literal["maximize", "minimize"] = "maximize"

    @model_validator(mode="after")
    def _one_of(self) -> SweepObjective:
        if (self.metric is None) == (self.claim is None):
            raise ValueError("give either metric (a per-seed summary) or claim (a claim's effect)")
        return self


class Sweep(Strict):
    """Which dataset's knobs vary, over what, with which optuna sampler, for how many trials.

    ``space`` maps a knob to a list of values (any sampler; ``grid`` needs lists) or a range
    (``{low, high, step?, log?}``; ``qmc``, ``random``, ``tpe``). ``storage``: any optuna storage URL
    (e.g. a database shared by many workers); default an embedded journal file in the output folder.
    """

    dataset: str
    space: dict[Knob, list[float] | KnobRange] = Field(min_length=1)
    sampler: Literal["grid", "qmc", "random", "tpe"] = "grid"
    n_trials: int | None = Field(None, ge=1)  # default: the grid's size (grid), else required
    objective: SweepObjective
    storage: str | None = None
    seed: int = 0  # the sampler's seed

    @field_validator("space", mode="before")
    @classmethod
    def _ranges(cls, space: object) -> object:
        """A mapping value is a range: validated here so an error names the knob and the problem."""
        if not isinstance(space, dict):
            return space
        out = {}
        for knob, values in space.items():
            if isinstance(values, dict):
                try:
                    values = KnobRange.model_validate(values)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    what = (
                        "unknown key"
                        if err["type"] == "extra_forbidden"
                        else err["msg"].removeprefix("Value error, ")
                    )
                    loc = ".".join(map(str, err["loc"]))
                    raise _FieldError(f"sweep.space.{knob}" + (f".{loc}" if loc else ""), what) from None
            elif not isinstance(values, list):
                raise _FieldError(
                    f"sweep.space.{knob}",
                    f"expected a list of values or a range {{low, high}}, got {values!r}",
                )
            else:
                try:
                    _grid(values)
                except _FieldError as exc:
                    raise _FieldError(f"sweep.space.{knob}{exc.field}", exc.message) from None
            out[knob] = values
        return out

    @model_validator(mode="after")
    def _space(self) -> Sweep:
        for knob, values in self.space.items():
            if isinstance(values, list) and not values:
                raise _FieldError(f"sweep.space.{knob}", "expected at least one value, got an empty list")
            if self.sampler == "grid" and not isinstance(values, list):
                raise _FieldError(
                    f"sweep.space.{knob}", "the grid sampler needs a list of values, got a range"
                )
        if self.sampler != "grid" and self.n_trials is None:
            raise _FieldError("sweep.n_trials", f"the {self.sampler} sampler needs n_trials")
        return self

    def grid_size(self) -> int:
        size = 1
        for values in self.space.values():
            size *= len(values) if isinstance(values, list) else 1
        return size


def sweep_of(hyp: _WithSweep) -> Sweep:
    """A hypothesis file's ``sweep`` section, which the sweep's code reads (``python -m study sweep``
    refuses a file without one; a sweep folder's ``hypothesis.yaml`` edited to drop it is refused here).

    Raises:
        StudyError: the file has no ``sweep`` section.
    """
    if hyp.sweep is None:
        raise StudyError(
            "no sweep section (expected sweep: {dataset, space, sampler, objective})", None, "sweep"
        )
    return hyp.sweep
