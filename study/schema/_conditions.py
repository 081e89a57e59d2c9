"""Conditions of a design: named cells, each the base design with some of its parts overridden.

A design either lists its conditions (``design.conditions: [{name, objective?, model?, training?, labels?,
untrained?}]``) or crosses factors (``design.factors: {objective: [supervised, dino], labels: [true,
shuffled]}``: one cell per combination of levels, named ``objective=supervised,labels=true`` in the order
the factors are declared). A cell is exactly the design a single-condition file would have with the same
parts: its raw mapping is the base design's with the cell's parts put in (a string replaces a part, a
mapping of ``model`` or ``training`` updates the base's mapping key by key, ``objective`` is replaced
whole), validated as a design of its own. So its runs get the keys that file's runs get, and a cell
shared with another file is trained once.

Two built-in controls: ``labels: shuffled`` (a seeded permutation of the training labels) and
``untrained: true`` (no training: the cell reads the epoch-0 rows of its *twin*, the trained cell with
the same parts otherwise). A design without conditions or factors is today's design, untouched.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError

from vitstudy_core.errors import FieldError  # noqa: F401 - re-exported: schema errors with a field
from vitstudy_core.hashing import canonical_json
from vitstudy_core.settings import Strict

NAME_PATTERN = r"^[A-Za-z0-9_.=,-]+$"  # a cell's name: a table value, a tag, part of a run label
PARTS = ("objective", "model", "training", "labels", "untrained")  # what a condition may override
FACTORS = ("objective", "model", "labels", "untrained")  # and training.<field>
DEFAULT_MAX_RUNS = 200  # a design past this many runs is refused unless design.max_runs says otherwise


def _labels(v: object) -> object:
    """YAML's ``true`` is a boolean: it means the true labels (``"true"``); ``false`` means nothing."""
    if v is True:
        return "true"
    if v is False:
        raise ValueError("expected true or shuffled, got false")
    return v


Labels = Annotated[Literal["true", "shuffled"], BeforeValidator(_labels)]


class ConditionSpec(Strict):
    """One named condition of ``design.conditions``: the parts of the base design it overrides.

    The parts are kept as written (validated as part of the cell's own design), so an error names the
    condition's field.
    """

    name: str = Field(pattern=NAME_PATTERN)
    objective: str | dict | None = None
    model: str | dict | None = None
    training: dict | None = None
    labels: Labels | None = None
    untrained: bool | None = None

    def overrides(self) -> dict[str, Any]:
        return {p: getattr(self, p) for p in PARTS if getattr(self, p) is not None}


@dataclass(frozen=True)
class Cell:
    """One condition of a design.

    Attributes:
        name: the condition's name (None: a design without conditions, its one cell).
        design: the cell's own design (``study.schema._design.Design``, without conditions): its runs' settings.
        levels: factor -> level name (a factorial design), or part -> value as written (a list).
        twin: for an untrained cell, the name of the trained cell whose runs' epoch-0 rows it reads.
    """

    name: str | None
    design: Any
    levels: dict[str, str] = field(default_factory=dict)
    twin: str | None = None

    @property
    def untrained(self) -> bool:
        return bool(self.design.untrained)


def level_name(value: object) -> str:
    """A level as it appears in a cell's name: YAML booleans lower case (``labels=true``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def signature(design: Any) -> str:
    """What makes two cells the same cell: the resolved parts a condition can override."""
    from runners.objectives import objective_payload

    return canonical_json(
        {
            "objective": objective_payload(design.objective),
            "model": design.model.resolved(),
            "training": design.training.model_dump(),
            "labels": design.labels,
            "untrained": design.untrained,
        }
    )


def merged(raw: dict, overrides: dict[str, Any]) -> dict:
    """The raw design of a cell: ``raw`` (the base design as written) with ``overrides`` put in."""
    out = {k: v for k, v in raw.items() if k not in ("conditions", "factors")}
    for part, value in overrides.items():
        if part == "model" and isinstance(value, str):
            value = {"preset": value}  # a model level is a preset name: the whole model
        if part in ("model", "training") and isinstance(value, dict) and isinstance(out.get(part), dict):
            if not (part == "model" and "preset" in value):
                value = {**out[part], **value}
        out[part] = value
    return out


def factor_cells(factors: dict) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """``(name, levels, overrides)`` of every combination of the factors' levels, first factor slowest.

    Raises:
        FieldError: an unknown factor, or a level that is not one of the factor's.
    """
    from runners.models import MODEL_PRESETS
    from runners.objectives import TrainingSpec, objective_names, preset_names

    allowed = {
        "objective": [*objective_names(), *preset_names()],
        "model": list(MODEL_PRESETS),
        "labels": ["true", "shuffled"],
        "untrained": ["false", "true"],
    }
    training = [f for f in TrainingSpec.model_fields if f != "compile"]
    for factor, levels in factors.items():
        where = f"design.factors.{factor}"
        part, _, sub = str(factor).partition(".")
        if not ((factor in FACTORS) or (part == "training" and sub in training)):
            expected = ", ".join([*FACTORS, "training.<field>"])
            raise FieldError(where, f"unknown factor; expected one of {expected}")
        if not isinstance(levels, list) or not levels:
            raise FieldError(where, f"expected a list of levels, got {levels!r}")
        for j, level in enumerate(levels):
            if isinstance(level, dict | list) or level is None:
                raise FieldError(f"{where}[{j}]", f"expected a level name or number, got {level!r}")
            name = level_name(level)
            if (
                factor in allowed
                and name not in allowed[factor]
                and not (factor == "labels" and level is True)
            ):
                raise FieldError(
                    f"{where}[{j}]", f"unknown level {name!r}; expected one of {allowed[factor]}"
                )
            if factor == "untrained" and not isinstance(level, bool):
                raise FieldError(f"{where}[{j}]", f"expected true or false, got {level!r}")
    out = []
    for combo in itertools.product(*factors.values()):
        levels = {f: level_name(v) for f, v in zip(factors, combo, strict=True)}
        overrides: dict[str, Any] = {}
        for factor, value in zip(factors, combo, strict=True):
            part, _, sub = factor.partition(".")
            if sub:
                overrides.setdefault("training", {})[sub] = value
            else:
                overrides[part] = value
        out.append((",".join(f"{f}={v}" for f, v in levels.items()), levels, overrides))
    return out


def validate_cell(
    validate: Callable[[dict], Any], data: dict, where: str, prefix: str, error_of: Callable
) -> Any:
    """``validate(data)`` (the cell's own design); an error names ``where`` and the field inside it."""
    try:
        return validate(data)
    except ValidationError as exc:
        fld, msg = error_of(exc)
        inner = fld.removeprefix("design").lstrip(".") if fld.startswith("design") else fld
        inner = "" if inner == "(top level)" else inner
        raise FieldError(f"{where}.{inner}" if inner else where, prefix + msg) from None


def expand(
    raw: dict,
    conditions: list[ConditionSpec] | None,
    factors: dict | None,
    validate: Callable[[dict], Any],
    error_of: Callable,
) -> list[Cell]:
    """The cells of a design with conditions (each validated as a design of its own), twins found.

    Args:
        raw: the base design as written (a mapping).
        validate: validates a raw design mapping as a cell (``study.schema._design.Design``).
        error_of: ``ValidationError`` -> ``(field, message)`` (``study.schema``).

    Raises:
        FieldError: a bad part in a cell, two conditions that resolve to the same cell, an untrained cell
            without its trained twin, or cells whose models differ in depth.
    """
    if conditions is not None:
        specs = [
            (
                c.name,
                {
                    k: level_name(v) if not isinstance(v, dict) else canonical_json(v)
                    for k, v in c.overrides().items()
                },
                c.overrides(),
                f"design.conditions[{i}]",
                "",
            )
            for i, c in enumerate(conditions)
        ]
    else:
        specs = [(n, lv, ov, "design.factors", f"cell {n!r}: ") for n, lv, ov in factor_cells(factors or {})]
    cells, seen = [], dict[str, str]()
    for name, levels, overrides, where, prefix in specs:
        design = validate_cell(validate, merged(raw, overrides), where, prefix, error_of)
        sig = signature(design)
        if sig in seen:
            raise FieldError(
                where,
                f"{prefix}condition {name!r} resolves to the same cell (the same runs) as {seen[sig]!r}",
            )
        seen[sig] = name
        cells.append(Cell(name, design, levels))
    return _with_twins(cells, [s[3] for s in specs])


def _blocks(cell: Cell) -> str:
    """``12 blocks`` (a ViT's), ``8 residual blocks`` (a CNN's): what names a design's layers."""
    n = sum(name.startswith("block_") for name in cell.design.layers)
    return f"{n} residual blocks" if "stem" in cell.design.layers else f"{n} blocks"


def _with_twins(cells: list[Cell], wheres: list[str]) -> list[Cell]:
    """Each untrained cell with the name of its trained twin; the cells' models of one depth."""
    trained = {
        signature(c.design.model_copy(update={"untrained": True})): c.name for c in cells if not c.untrained
    }
    layers = cells[0].design.layers
    out = []
    for cell, where in zip(cells, wheres, strict=True):
        if cell.design.layers != layers:
            raise FieldError(
                f"{where}.model",
                f"condition {cell.name!r} has {_blocks(cell)}, {cells[0].name!r} {_blocks(cells[0])}: the "
                "cells of a design share one depth and family (its claims name one set of layers)",
            )
        if not cell.untrained:
            out.append(cell)
            continue
        if 0 not in cell.design.checkpoint_epochs:
            raise FieldError(
                f"{where}.untrained",
                f"condition {cell.name!r} reads the epoch-0 rows of its trained twin: add 0 to design.checkpoints",
            )
        twin = trained.get(signature(cell.design))
        if twin is None:
            raise FieldError(
                f"{where}.untrained",
                f"condition {cell.name!r} needs its trained twin in the design (the same parts with untrained: "
                "false), whose runs' epoch-0 rows it reads",
            )
        out.append(Cell(cell.name, cell.design, cell.levels, twin))
    return out


def check_size(cells: list[Cell], n_datasets: int, n_seeds: int, limit: int, where: str) -> int:
    """The design's number of runs (trained cells x datasets x seeds); refused past ``limit``."""
    trained = sum(1 for c in cells if not c.untrained)
    n = trained * n_datasets * n_seeds
    if n > limit:
        raise FieldError(
            where,
            f"{trained} trained cell(s) x {n_datasets} dataset(s) x {n_seeds} seed(s) = {n} runs, over the "
            f"limit of {limit} (set design.max_runs to allow more)",
        )
    return n
