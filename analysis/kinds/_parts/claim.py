"""The claim model's base: :class:`ClaimBase`, the fields every claim has, and the slices it names
(:class:`Subset`, :class:`Condition`).

A kind's pydantic model subclasses :class:`ClaimBase`; the hypothesis schema validates a file's claims
through it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from analysis.observables import ALL_METRICS
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import TokenSet
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    import pandas as pd

    from analysis.kinds._parts.outcome import Outcome


# Per-run scalars a claim can be adjusted for (``adjust_for``): name -> the key of the run's training
# history (``result.json``) that records it, per epoch. ``study.pipeline.scalars`` puts them in the table as a
# column of that name (the value at each row's epoch); a table given to ``analyze --table`` carries it.
RUN_SCALARS = {
    "test_accuracy": "test_acc",
    "train_accuracy": "train_acc",
    "knn_accuracy": "knn_acc",
    "train_loss": "loss",
}

# A condition's name (docs: CONDITIONS.md item 2): ``trained``, ``objective=dino,labels=shuffled``
CONDITION_NAME = r"^[A-Za-z0-9_.=,-]+$"


def _epoch_number_or_last(v: object) -> object:
    """An epoch field holds an epoch number or ``last``: one message for any other value (pydantic's would
    name the union's member, ``epoch.int``, and not ``last``); a bool (YAML ``true``) is no epoch number."""
    if v is None or v == "last" or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise ValueError("expected an epoch number or 'last'")


class Subset(Strict):
    """Which slice of the tidy table a claim is tested on.

    ``condition``: in a design with conditions (the table has a ``condition`` column), the condition the
    claim is tested in; required when the table holds more than one, refused when it holds none.
    """

    dataset: str | None = None  # required by u_shape and trend; the default for conditions otherwise
    token_set: TokenSet = "all"
    epoch: int | Literal["last"] = "last"
    condition: str | None = Field(None, pattern=CONDITION_NAME)

    _epoch = field_validator("epoch", mode="before")(_epoch_number_or_last)


class Condition(Strict):
    """One per-seed quantity: the metric averaged over ``layers``; unset fields come from the claim's subset.

    Used by ``compare``, ``equivalence`` and ``extremum``. Seeds are paired across conditions by seed id.
    """

    dataset: str | None = None
    token_set: TokenSet | None = None
    epoch: int | Literal["last"] | None = None
    layers: list[str] = Field(min_length=1)
    condition: str | None = Field(None, pattern=CONDITION_NAME)  # default: the claim's subset.condition

    _epoch = field_validator("epoch", mode="before")(_epoch_number_or_last)


class ClaimBase(Strict):
    """Fields every claim has. A kind's model subclasses it and adds ``kind: Literal["<name>"]``."""

    needs_subset_dataset: ClassVar[bool] = False  # the kind reads one dataset: subset.dataset is required

    name: str
    metric: str
    subset: Subset
    alpha: float = Field(0.05, gt=0, lt=0.5)
    confirmatory: bool = True  # Holm-adjusted together with the file's other confirmatory claims
    # smallest effect of interest, in the metric's units (the effect's own units, as the kind reports it):
    # what `python -m study plan` sizes the seeds for; declared before the data, like the claim itself
    sesoi: float | None = Field(None, gt=0)
    # Exploratory claims (confirmatory: false) are adjusted among themselves: holm (default) or bh (FDR).
    adjust: Literal["holm", "bh", "none"] = "holm"
    # conditions the claim's per-seed effect must also exceed (analysis.kinds._parts.controls.apply_controls)
    controls: list[str] = Field(default_factory=list)
    # a per-run scalar (RUN_SCALARS) held fixed in each seed's regression on the knob (adjusted claims)
    adjust_for: str | None = None

    @field_validator("controls")
    @classmethod
    def _control_names(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if not re.match(CONDITION_NAME, c)]
        if bad:
            raise ValueError(f"condition names match {CONDITION_NAME}, got {bad[0]!r}")
        if len(set(v)) != len(v):
            raise ValueError("controls must be distinct")
        return v

    @field_validator("adjust_for")
    @classmethod
    def _known_scalar(cls, v: str | None) -> str | None:
        if v is not None and v not in RUN_SCALARS:
            raise ValueError(f"expected a per-run scalar the runs record {sorted(RUN_SCALARS)}, got {v!r}")
        return v

    # seeds: the t interval over seeds (the probe set held fixed); seeds+probe: also resample the probe's
    # image blocks jointly with the seeds (analysis.probe; needs design.probe.blocks)
    uncertainty: Literal["seeds", "seeds+probe"] = "seeds"
    # test at a matched token count: the larger populations subsampled to the smaller (analysis.probe);
    # None: the hypothesis file's `match_tokens` (default false)
    match_tokens: bool | None = None
    # what the verdict generalises over (analysis.units): seeds of a recipe (None: the default, seeds),
    # the probe images of one fixed model, or the named published models of a family
    unit: Literal["seeds", "images", "models"] | None = None

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in ALL_METRICS:
            raise ValueError(f"unknown metric {v!r}; expected one of {list(ALL_METRICS)}")
        return v

    if TYPE_CHECKING:
        kind: str  # each kind's model declares it as Literal["<name>"] (declared here for the type checker)

    @model_validator(mode="after")
    def _adjust_only_exploratory(self) -> ClaimBase:
        if self.confirmatory and self.adjust != "holm":
            raise ValueError(
                "confirmatory claims are always Holm-adjusted; set confirmatory: false for bh/none"
            )
        if self.requires_dataset() and self.subset.dataset is None:
            raise ValueError(f"a {self.kind} claim needs subset.dataset")
        for fld, i, cond in self.operands():
            if cond.dataset is None and self.subset.dataset is None:
                raise ValueError(f"{fld}{'' if i is None else '[]'}.dataset or subset.dataset is required")
        if self.controls:
            problem = self.cross_problem()
            if problem:
                raise ValueError(f"controls: {problem}")
            if self.subset.condition in self.controls:
                raise ValueError(f"controls: {self.subset.condition!r} is the claim's own condition")
        if self.adjust_for is not None and not self.adjustable():
            raise ValueError(
                "adjust_for is for a claim over a knob or across datasets (a trend over a swept knob, or an "
                "ordering) with method: slope and one series"
            )
        return self

    def operands(self) -> list[tuple[str, int | None, Condition]]:
        """Every condition the claim compares, ``(field, index or None, condition)`` in field order: the
        fields of its model that hold a :class:`Condition` (index None) or a list of them (each with its
        index). A kind declares its operands by their type; nothing here knows their names."""
        out: list[tuple[str, int | None, Condition]] = []
        for fld in type(self).model_fields:
            value = getattr(self, fld)
            if isinstance(value, Condition):
                out.append((fld, None, value))
            elif isinstance(value, list) and value and all(isinstance(c, Condition) for c in value):
                out += [(fld, i, c) for i, c in enumerate(value)]
        return out

    def cross_problem(self) -> str | None:
        """Why this claim's per-seed effect cannot be compared across conditions (None: it can).

        A kind that can overrides this and :meth:`seed_effect`."""
        return f"a {self.kind} claim has no per-seed effect to compare across conditions"

    def seed_effect(self, outcome: Outcome) -> pd.Series:
        """Per seed (index: seed id) the claim's effect signed so that positive is the claimed direction,
        from its :class:`Outcome` (what ``differs``, ``exceeds`` and ``controls`` compare)."""
        import pandas as pd

        if not outcome.seed_effects:
            raise StudyError(self.cross_problem() or "no per-seed effect to compare", "claim")
        return pd.Series(outcome.seed_effects, dtype=np.float64).sort_index()

    def seed_effect_text(self) -> str:
        """What :meth:`seed_effect` is, in words (for the report)."""
        return "the per-seed effect"

    def adjustable(self) -> bool:
        """Whether ``adjust_for`` applies (a per-seed slope on a knob or on dataset levels)."""
        return False

    def requires_dataset(self) -> bool:
        """Whether ``subset.dataset`` must be given (the kind reads one dataset)."""
        return self.needs_subset_dataset

    def knob(self) -> str | None:
        """The data-complexity knob this claim runs over (a sweep's claim), or None."""
        return None

    def reads_subset_epoch(self) -> bool:
        """Whether the claim is tested at ``subset.epoch`` (False: it runs over epochs, e.g. a trend)."""
        return True

    def named(self) -> list[tuple[str, str, object]]:
        """Every (field, what, value) the claim names, with what in {dataset, layer, epoch}: for validation."""
        out: list[tuple[str, str, object]] = [("subset.epoch", "epoch", self.subset.epoch)]
        if self.subset.dataset is not None:
            out.append(("subset.dataset", "dataset", self.subset.dataset))
        for fld, i, cond in self.operands():
            out += _named_condition(fld if i is None else f"{fld}[{i}]", cond)
        for fld in ("layers", "datasets", "epochs"):
            values = getattr(self, fld, None)
            if isinstance(values, list):
                what = {"layers": "layer", "datasets": "dataset", "epochs": "epoch"}[fld]
                out += [(fld, what, v) for v in values]
        return out

    def token_set_of(self, fld: str) -> str:
        """The token set a field of :meth:`named` is read in: its operand's own ``token_set`` (``a.layers``
        of a compare claim), else ``subset.token_set``."""
        head = fld.split(".", 1)[0]
        for name, i, cond in self.operands():
            if head == (name if i is None else f"{name}[{i}]"):
                return cond.token_set or self.subset.token_set
        return self.subset.token_set

    def datasets_named(self) -> list[str]:
        """The datasets the claim reads, sorted."""
        return sorted({str(v) for _, what, v in self.named() if what == "dataset"})

    def conditions_named(self) -> list[tuple[str, str]]:
        """Every (field, condition name) the claim reads: for validation against the design's conditions."""
        out: list[tuple[str, str]] = []
        if self.subset.condition is not None:
            out.append(("subset.condition", self.subset.condition))
        for fld, i, cond in self.operands():
            if cond.condition is not None:
                out.append((f"{fld if i is None else f'{fld}[{i}]'}.condition", cond.condition))
        out += [(f"controls[{i}]", c) for i, c in enumerate(self.controls)]
        return out


def _named_condition(fld: str, cond: Condition) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = [(f"{fld}.layers", "layer", layer) for layer in cond.layers]
    if cond.dataset is not None:
        out.append((f"{fld}.dataset", "dataset", cond.dataset))
    if cond.epoch is not None:
        out.append((f"{fld}.epoch", "epoch", cond.epoch))
    return out
