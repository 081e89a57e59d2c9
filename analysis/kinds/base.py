"""What every claim kind shares: the claim model's base, table access, the Outcome, and the registry.

A claim kind is one module in this package (``u_shape.py``, ``trend.py``, ...). It defines:

* its pydantic model (a :class:`ClaimBase` subclass with ``kind: Literal["<name>"]``), which the hypothesis
  schema picks up;
* its array-level test (plain functions over per-seed arrays, the seed on the first axis, shapes in the
  docstring), calibrated by ``bench/calibration.py``;
* ``evaluate(view, claim, where, excluded) -> Outcome``, the table adapter the verdicts call;
* its calibration scenarios (:class:`Scenario`: the least favourable null and alternatives, through the
  same array-level test);
* ``figures(ctx)``: what the report plots for it, and ``explain(claim, result)``: what the report says
  its test found;

and registers them with :func:`register_kind` as one :class:`ClaimKind`. Nothing outside the kind's own
module asks which kind a claim is. This module never imports torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypedDict

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from analysis.inference import TTest, tost_estimate
from analysis.observables import ALL_METRICS
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import TokenSet
from vitstudy_core.registry import Registry
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    from analysis.figures import Figure


# --------------------------------------------------------------------------------------------------
# The claim model's base
# --------------------------------------------------------------------------------------------------
# Per-run scalars a claim can be adjusted for (``adjust_for``): name -> the key of the run's training
# history (``result.json``) that records it, per epoch. ``study.run_scalars`` puts them in the table as a
# column of that name (the value at each row's epoch); a table given to ``analyze --table`` carries it.
RUN_SCALARS = {
    "test_accuracy": "test_acc",
    "train_accuracy": "train_acc",
    "knn_accuracy": "knn_acc",
    "train_loss": "loss",
}

# A condition's name (docs: CONDITIONS.md item 2): ``trained``, ``objective=dino,labels=shuffled``
CONDITION_NAME = r"^[A-Za-z0-9_.=,-]+$"


class Subset(Strict):
    """Which slice of the tidy table a claim is tested on.

    ``condition``: in a design with conditions (the table has a ``condition`` column), the condition the
    claim is tested in; required when the table holds more than one, refused when it holds none.
    """

    dataset: str | None = None  # required by u_shape and trend; the default for conditions otherwise
    token_set: TokenSet = "all"
    epoch: int | Literal["last"] = "last"
    condition: str | None = Field(None, pattern=CONDITION_NAME)


class Condition(Strict):
    """One per-seed quantity: the metric averaged over ``layers``; unset fields come from the claim's subset.

    Used by ``compare``, ``equivalence`` and ``extremum``. Seeds are paired across conditions by seed id.
    """

    dataset: str | None = None
    token_set: TokenSet | None = None
    epoch: int | Literal["last"] | None = None
    layers: list[str] = Field(min_length=1)
    condition: str | None = Field(None, pattern=CONDITION_NAME)  # default: the claim's subset.condition


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
    # conditions the claim's per-seed effect must also exceed (analysis.kinds.versus.apply_controls)
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


# --------------------------------------------------------------------------------------------------
# Outcome and table access
# --------------------------------------------------------------------------------------------------
# One-sided level of the REJECTED rule's test of the opposite of the claim: a lone contrast's 95% CI lying
# entirely on the wrong side of 0 is that test at 2.5%. With several contrasts the rule keeps this level
# for the claim as a whole (:func:`contradiction`), and a margin's TOST runs at the claim's alpha.
REJECT_LEVEL = 0.025

# How a claim combines its contrasts: ``every`` one must hold (intersection-union: u_shape, extremum, a
# trend over ``all`` layers), or ``one`` suffices (a trend over ``any`` layer).
Needs = Literal["every", "one"]


def holm_min(p: Sequence[float]) -> float:
    """The smallest Holm-adjusted p of ``p`` (= k * min p, capped at 1; NaN entries count in k, never
    as the minimum; NaN when all are NaN)."""
    finite = [v for v in p if not math.isnan(v)]
    return min(1.0, len(p) * min(finite)) if finite else float("nan")


def combined_against(p_against: Sequence[float], needs: Needs) -> float:
    """The p of the opposite of a claim from each contrast's one-sided p in the wrong direction.

    ``every``: the claim fails when any one contrast is shown to point the wrong way, a union of tests:
    Holm across the k contrasts (k * min p). ``one``: it fails only when every contrast is (an
    intersection-union test: max p, NaN if any is NaN). A single contrast: its own p.
    """
    if len(p_against) == 1:
        return float(p_against[0])
    if needs == "every":
        return holm_min(p_against)
    return float("nan") if any(math.isnan(v) for v in p_against) else max(p_against)


def contradiction(p_against: Sequence[float], needs: Needs) -> bool:
    """The REJECTED rule's evidence test: :func:`combined_against` below :data:`REJECT_LEVEL` (so its
    rate at the boundary of the claim is at most 2.5%, whatever the number of contrasts)."""
    p = combined_against(p_against, needs)
    return bool(not math.isnan(p) and p < REJECT_LEVEL)


@dataclass(frozen=True)
class Estimate:
    """One contrast's estimate for a margin's TOST: ``mean`` and its ``se`` (the units of the effect) and
    the t degrees of freedom ``df`` (S - 1)."""

    mean: float
    se: float
    df: float

    @classmethod
    def of(cls, test: TTest) -> Estimate:
        """The estimate of a one-sample t test's mean."""
        return cls(test.mean, test.se, test.n - 1)


def margin_p(estimates: Sequence[Estimate], margin: float, needs: Needs) -> float:
    """p of "the claimed effect is smaller than ``margin``" (which REJECTS a claim that declares one).

    Per contrast the TOST p of ``|effect| < margin``; ``every``: the claim fails when some contrast is
    within the margin (Holm across contrasts); ``one``: only when every contrast is (max p).
    """
    ps = [tost_estimate(e.mean, e.se, e.df, margin) for e in estimates]
    if not ps:
        return float("nan")
    if len(ps) == 1:
        return ps[0]
    if needs == "every":
        return holm_min(ps)
    return float("nan") if any(math.isnan(v) for v in ps) else max(ps)


@dataclass
class Outcome:
    """What a claim's test found, before multiplicity adjustment and the verdict rule.

    Attributes:
        p_value: p-value in the claimed direction (NaN when no test was possible).
        effect: the effect in the metric's units, signed as documented per claim kind.
        ci: (low, high) two-sided 95% t interval of ``effect`` over seeds.
        contradicted: the evidence excludes the claimed effect (its CI lies on the wrong side of 0, or
            outside the equivalence margin for an equivalence claim).
        seeds_used / seeds_excluded: seeds in the test / seeds dropped (with the reason).
        warnings: anything a reader must know (degenerate data, too few seeds, fit warnings, ...).
        details: kind-specific numbers for reports (per-contrast tests, mean profile, ...).
        effect_values: (S,) per-seed values whose mean is ``effect`` (for the bootstrap display and the
            equivalence check against ``margin``); empty when the effect is not a mean over seeds.
        std_effect: standardised effect (mean / sd of the binding test's per-seed values) in the claimed
            direction; the basis of the power and seeds-needed numbers of an inconclusive claim.
        two_sided: the binding test is two-sided (power is computed at alpha / 2 per side).
        not_testable: non-empty when the table holds nothing to test the claim on (:class:`NotTestable`):
            the verdict's whole reason (``not testable on this source: metric ... is not in the table``).
        estimates: per contrast the estimate a declared margin is tested on (:func:`margin_p`); empty:
            the one-sample t test of ``effect_values``.
        needs: how the contrasts combine (``every`` or ``one``; see :func:`contradiction`).
        holm_contrasts: the binding p is Holm-adjusted across this many contrasts (a trend over ``any``
            of k layers: k), so it cannot go below k * labellings^-S and its power is at alpha / k.
        seed_effects: per seed the effect, positive in the claimed direction, that claims across
            conditions compare (:meth:`ClaimBase.seed_effect`); empty where the kind has none.
        p_against: the p of the claim's opposite that ``contradicted`` compares with
            :data:`REJECT_LEVEL` (:func:`combined_against`; NaN where the kind records none), so claims
            built on this one (``holds_in_all``, ``controls``) can combine it with others.
    """

    p_value: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool = False
    seeds_used: list[int] = field(default_factory=list)
    seeds_excluded: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    effect_values: list[float] = field(default_factory=list)
    std_effect: float = float("nan")
    two_sided: bool = False
    labellings_per_seed: int = 0  # randomisation tests: K! (JT) or 2 (sign flips); p >= this^-S. 0 = t-based
    not_testable: str = ""  # why the table cannot test the claim at all (e.g. its metric is absent)
    estimates: list[Estimate] = field(default_factory=list)
    needs: Needs = "every"
    holm_contrasts: int = 1
    p_against: float = float("nan")
    # per seed the effect signed so that positive is the claimed direction (ClaimBase.seed_effect); empty
    # where the kind has none that is independent across seeds
    seed_effects: dict[int, float] = field(default_factory=dict)

    def margin_p(self, margin: float) -> float:
        """p of "the effect lies within +-margin" (:func:`margin_p`; NaN when it cannot be tested)."""
        if self.estimates:
            return margin_p(self.estimates, margin, self.needs)
        if len(self.effect_values) < 2:
            return float("nan")
        from analysis.inference import t_test

        return margin_p([Estimate.of(t_test(np.asarray(self.effect_values)))], margin, self.needs)


@dataclass(frozen=True, kw_only=True)
class Statistic:
    """What a kind's array-level test (its ``*_statistics`` function) found on per-seed arrays.

    Attributes:
        p: p-value in the claimed direction (NaN when no test was possible).
        effect: the effect, in the units the kind documents (metric units, per unit of x for a slope).
        ci: (low, high) 95% interval of ``effect``.
        contradicted: the REJECTED rule's test: the evidence excludes the claimed effect
            (:func:`contradiction` of ``p_against``).
        std_effect: standardised effect of the binding test in the claimed direction (mean / sd).
        values: (S,) per-seed values whose mean is ``effect`` (empty when it is no mean over seeds).
        warnings: what a reader must know (degenerate data, too few seeds, ...).
    """

    p: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool
    std_effect: float
    values: np.ndarray
    warnings: list[str]
    p_against: list[float] = field(default_factory=list)  # per contrast, one-sided p the wrong way


class Trial(TypedDict, total=False):
    """One simulated study of a calibration :class:`Scenario` (what ``bench/calibration.py`` counts).

    ``p``: one-sided p in the claimed direction (NaN: no test); ``covered``: the 95% CI of the effect
    covers the truth (None: no known truth); ``warned``: the fit recorded a warning; ``contradicted``: the
    verdict rule would REJECT; ``fallback``: a mixed-model trend fell back to the per-seed slopes.
    """

    p: float
    covered: bool | None
    warned: bool
    contradicted: bool
    fallback: bool


class Result(Protocol):
    """What a kind's ``explain`` and ``figures`` read of a claim's result (``analysis.verdicts.ClaimResult``,
    which imports the kinds: so a protocol, not the class)."""

    effect: float
    ci_low: float
    ci_high: float
    details: dict[str, Any]


def std_effect(test: TTest, sign: float = 1.0) -> float:
    """mean / sd of a t_test result, signed towards the claim (NaN when sd is 0 or undefined)."""
    sd = test.sd
    return sign * test.mean / sd if sd and math.isfinite(sd) and sd > 0 else float("nan")


def few_seeds_warning(n: int, p: float) -> list[str]:
    """The warning of a test that could not run: too few seeds, or no variation between them."""
    if n < 2:
        return [f"needs >= 2 seeds (has {n}): no test across seeds is possible"]
    if math.isnan(p):
        return ["zero between-seed variance: no test across seeds is possible"]
    return []


# --------------------------------------------------------------------------------------------------
# Table access
# --------------------------------------------------------------------------------------------------
class NotTestable(StudyError):
    """The table has no rows of the claim's metric: a source that does not measure it (an imported metric
    log, a metric undefined everywhere). The claim is reported as not testable; the others go on.
    ``why`` leads the verdict's reason."""

    why = "not testable on this source"


class OneLevel(NotTestable):
    """A claim over a knob whose table holds one value of it (a one-level sweep, or one complete trial):
    no curve, so no slope to test; reported as not testable, never as a test that found nothing."""

    why = "not testable"


def knob_levels_of(df: pd.DataFrame, knob: str, where: str) -> list[float]:
    """The knob's distinct values in a sweep's rows, ascending; fewer than 2 raise :class:`OneLevel`."""
    levels = sorted(float(v) for v in df[knob].dropna().unique())
    if len(levels) < 2:
        got = f"one level of {knob} ({levels[0]:g})" if levels else f"no level of {knob}"
        raise OneLevel(f"{got}: a slope needs at least 2", where, "over")
    return levels


class TableView:
    """The tidy table grouped once by (metric, dataset, token_set), so many claims slice it cheaply.

    Every lookup of a value the table lacks raises a one-line StudyError naming the claim field; a metric it
    lacks raises :class:`NotTestable` (the claim cannot be tested on this table, which is no input error).

    A table with a ``condition`` column (a design with conditions) holding more than one condition is
    read one condition at a time: :meth:`in_condition` gives the view of one (built once, cached), and
    slicing the whole table's view instead is a one-line error asking the claim to name one. A table with
    one condition reads as today's.
    """

    def __init__(
        self, table: pd.DataFrame, condition: str | None = None, root: TableView | None = None
    ) -> None:
        self.table = table
        self.condition = condition
        self.root: TableView = root or self
        has = "condition" in table.columns
        self.conditions: list[str] = sorted(map(str, table["condition"].unique())) if has else []
        self.has_conditions = has if root is None else True
        self._views: dict[str, TableView] = {}
        # several conditions in one view: slices must come from one condition's view
        self._mixed = len(self.conditions) > 1
        self._groups = (
            {}
            if self._mixed
            else {k: g for k, g in table.groupby(["metric", "dataset", "token_set"], sort=False)}
        )
        self._present = {
            col: sorted(map(str, table[col].unique())) for col in ("metric", "dataset", "token_set")
        }

    @classmethod
    def of(cls, table: pd.DataFrame | TableView) -> TableView:
        """``table`` itself if it is a view, else a view of it."""
        return table if isinstance(table, TableView) else cls(table)

    def in_condition(self, name: str | None, where: str, fld: str) -> TableView:
        """The view of condition ``name`` (None: this view, which must then hold at most one condition
        when it is sliced); a name the table lacks, or any name when it has no conditions, is one line."""
        if name is None:
            return self
        root = self.root
        if not root.has_conditions:
            raise StudyError(
                f"condition {name!r} is named, but the design has no conditions (the table has no "
                "condition column)",
                where,
                fld,
            )
        if name not in root.conditions:
            raise StudyError(f"condition {name!r} is not in the table (it has {root.conditions})", where, fld)
        if len(root.conditions) == 1:
            return root
        if name not in root._views:
            rows = root.table[root.table["condition"].astype(str) == name]
            root._views[name] = TableView(rows, name, root)
        return root._views[name]

    def check_one_condition(self, where: str, fld: str) -> None:
        """One-line error when this view mixes conditions (the claim must name one in ``fld``)."""
        if self._mixed:
            raise StudyError(
                f"the table holds conditions {self.conditions}: name the one this claim is tested in",
                where,
                fld,
            )

    def slice(self, metric: str, dataset: str, token_set: str, where: str, fld: str = "") -> pd.DataFrame:
        """Rows of one (metric, dataset, token_set); ``fld`` prefixes the field named in errors."""
        self.check_one_condition(where, "subset.condition")
        for col, value, name in (
            ("metric", metric, "metric"),
            ("dataset", dataset, f"{fld}dataset" if fld else "subset.dataset"),
            ("token_set", token_set, f"{fld}token_set" if fld else "subset.token_set"),
        ):
            if value not in self._present[col]:
                if col == "metric":
                    raise NotTestable(
                        f"metric {value!r} is not in the table (it has {self._present[col]})", where, name
                    )
                raise StudyError(f"{value!r} is not in the table (it has {self._present[col]})", where, name)
        df = self._groups.get((metric, dataset, token_set))
        if df is None:
            raise StudyError(
                f"no rows for metric {metric!r}, dataset {dataset!r}, token set {token_set!r}",
                where,
                fld or "subset",
            )
        return df

    @staticmethod
    def at_epoch(df: pd.DataFrame, epoch: int | str, where: str, fld: str) -> tuple[pd.DataFrame, int]:
        """Rows at one epoch (``last`` = the largest epoch in the slice) and that epoch."""
        epochs = sorted(int(e) for e in df.epoch.unique())
        ep = epochs[-1] if epoch == "last" else int(epoch)
        if ep not in epochs:
            raise StudyError(f"epoch {ep} is not in the table (it has {epochs})", where, fld)
        return df[df.epoch == ep], ep

    @staticmethod
    def wide(df: pd.DataFrame, layers: list[str], where: str, fld: str) -> pd.DataFrame:
        """(seeds x layers) means of ``value``; every listed layer must be in the table."""
        have = set(df.layer.unique())
        missing = [layer for layer in layers if layer not in have]
        if missing:
            raise StudyError(f"layers {missing} are not in the table (it has {sorted(have)})", where, fld)
        wide = df[df.layer.isin(layers)].pivot_table(
            index="seed", columns="layer", values="value", aggfunc="mean", dropna=False
        )
        # a seed whose values are all NaN in these layers must stay visible, so it is reported as excluded
        return wide.reindex(index=sorted(df.seed.unique()), columns=layers)


def knob_rows(view: TableView, claim: Any, knob: str, where: str) -> tuple[pd.DataFrame, int]:
    """The rows of a claim over a knob: its metric and token set at its epoch, across every trial dataset.

    The table must carry the knob as a column (a sweep's table: one value per trial dataset).
    """
    view.check_one_condition(where, "subset.condition")
    table = view.table
    if knob not in table.columns:
        raise StudyError(
            f"a claim over {knob!r} needs a sweep's table, whose rows carry the knob's value "
            "(python -m study sweep FILE); this table has no such column",
            where,
            "over",
        )
    for col, value, name in (
        ("metric", claim.metric, "metric"),
        ("token_set", claim.subset.token_set, "subset.token_set"),
    ):
        if value not in view._present[col]:
            raise StudyError(f"{value!r} is not in the table (it has {view._present[col]})", where, name)
    df = table[(table.metric == claim.metric) & (table.token_set == claim.subset.token_set)]
    return view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")


def crossing(x: np.ndarray, y: np.ndarray, level: float) -> dict[str, Any]:
    """Where curves first reach ``level``, by linear interpolation between neighbouring points.

    Args:
        x: (T,) ascending knob values; y: (S, T) per-seed curves.

    Returns:
        dict with ``per_seed`` (S,) crossing x (NaN where a curve never reaches the level), ``mean_curve``
        (the crossing of the seed-mean curve, NaN if none), and ``mean``/``ci`` (95% t over the seeds that
        cross), ``n_crossing`` and ``x_range`` (the swept [min, max] of x).
    """
    from analysis.inference import t_test

    def first(curve: np.ndarray) -> float:
        d = curve - level
        if d[0] == 0:
            return float(x[0])
        for i in range(len(d) - 1):
            if d[i] == 0 or d[i] * d[i + 1] < 0 or d[i + 1] == 0:
                if d[i + 1] == d[i]:
                    return float(x[i])
                return float(x[i] + (x[i + 1] - x[i]) * (-d[i]) / (d[i + 1] - d[i]))
        return float("nan")

    x, y = np.asarray(x, float), np.asarray(y, float)
    per_seed = np.array([first(row) for row in y])
    ok = per_seed[np.isfinite(per_seed)]
    if len(ok) >= 2:
        t = t_test(ok, "two-sided")
        mean, ci = t.mean, t.ci
    else:
        mean, ci = (float(ok.mean()) if len(ok) else float("nan")), (float("nan"), float("nan"))
    return {
        "level": float(level),
        "per_seed": per_seed.tolist(),
        "mean_curve": first(y.mean(axis=0)) if len(y) else float("nan"),
        "mean": float(mean),
        "ci": list(ci),
        "n_crossing": int(len(ok)),
        "x_range": [float(x.min()), float(x.max())] if len(x) else [float("nan")] * 2,
    }


def crossing_lines(cross: dict[str, Any] | None, knob: str | None) -> list[str]:
    """The report's line for a :func:`crossing` result (none without one): where the seed-mean curve and
    the seeds' curves reach the level, or that they never do within the swept range."""
    if not cross:
        return []
    from vitstudy_core.fmt import fmt_num

    level, n = fmt_num(cross["level"]), len(cross["per_seed"])
    lo, hi = cross.get("x_range") or (None, None)
    swept = (
        f"the swept range ({knob} {lo:g} to {hi:g})"
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
        else "the swept range"
    )
    mean_curve = cross.get("mean_curve")
    if mean_curve is None or not math.isfinite(mean_curve):
        head = f"the seed-mean curve never reaches {level} within {swept}"
    else:
        head = f"the seed-mean curve reaches {level} at {knob} = {fmt_num(mean_curve, 3)}"
    k = int(cross.get("n_crossing", 0))
    if k == 0:
        return [f"{head}; no seed's curve reaches it"]
    ci = cross["ci"]
    where = (
        f"at {fmt_num(cross['mean'], 3)} (95% CI {fmt_num(ci[0], 3)}, {fmt_num(ci[1], 3)})"
        if k >= 2
        else f"at {fmt_num(cross['mean'], 3)} (one seed: no CI)"
    )
    return [f"{head}; {k} of {n} seeds' curves reach it, {where}"]


def layer_location(
    mean_index: float, ci: Sequence[float], layers: dict[str, int], within: str = "the observed layers"
) -> str:
    """A location along depth (a mean layer index over seeds and its 95% CI) in layer names.

    Args:
        mean_index: the mean over seeds of a per-seed layer index.
        ci: its (low, high) interval (NaN: none).
        layers: the layers it can be at, name -> layer index.
        within: what ``layers`` are, in words (said when the CI is clipped to them).

    Returns:
        ``block_05 (95% CI block_03 to block_07)``, or ``between block_05 and block_06 (...)`` for a mean
        between two layers: the CI's bounds rounded outwards to layers and clipped to the first and last of
        ``layers`` (said so), never shown as indices no layer has.
    """
    from vitstudy_core.fmt import fmt_num

    if not layers or not math.isfinite(mean_index):
        return f"mean layer index {fmt_num(mean_index, 1)}"
    order = sorted(layers.items(), key=lambda kv: kv[1])
    below = [n for n, i in order if i <= mean_index] or [order[0][0]]
    above = [n for n, i in order if i >= mean_index] or [order[-1][0]]
    text = below[-1] if below[-1] == above[0] else f"between {below[-1]} and {above[0]}"
    low, high = (float(v) for v in ci)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{text} (95% CI n/a)"
    first = ([n for n, i in order if i <= low] or [order[0][0]])[-1]
    last = ([n for n, i in order if i >= high] or [order[-1][0]])[0]
    clipped = low < order[0][1] or high > order[-1][1]
    note = f", clipped to {within}, {order[0][0]}..{order[-1][0]}" if clipped else ""
    return f"{text} (95% CI {first} to {last}{note})"


def summarise_layers(wide: pd.DataFrame, summary: str, order: dict[str, int]) -> pd.Series:
    """Per seed, one number from a (seed x layer) frame: ``mean``, ``min``, ``range`` (max - min) or
    ``argmin`` (the depth index ``order[layer]`` of the minimum); NaN where a seed misses a layer."""
    if summary == "mean":
        return wide.mean(axis=1, skipna=False)
    if summary == "min":
        return wide.min(axis=1, skipna=False)
    if summary == "range":
        return wide.max(axis=1, skipna=False) - wide.min(axis=1, skipna=False)
    idx = np.array([order[c] for c in wide.columns], dtype=np.float64)
    out = pd.Series(idx[np.argmin(wide.to_numpy(), axis=1)], index=wide.index)
    return out.where(wide.notna().all(axis=1))


def claim_view(table: pd.DataFrame | TableView, claim: Any, where: str) -> TableView:
    """The view a claim reads: the table's, or its condition's (``subset.condition``) in a design with
    conditions. Every kind's ``evaluate`` starts here."""
    return TableView.of(table).in_condition(claim.subset.condition, where, "subset.condition")


def select(table: pd.DataFrame | TableView, claim: Any, where: str) -> tuple[pd.DataFrame, int]:
    """The claim's slice of the table (subset dataset, token set, metric, epoch) and the epoch used."""
    view = TableView.of(table)
    df = view.slice(claim.metric, claim.subset.dataset, claim.subset.token_set, where)
    return view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")


def condition_values(
    view: TableView, claim: Any, cond: Condition, where: str, fld: str
) -> tuple[pd.Series, dict[str, Any]]:
    """Per-seed value of a Condition: the metric averaged over ``cond.layers`` at its epoch.

    Unset fields of ``cond`` come from ``claim.subset``. Returns (seed -> value, resolved condition).
    """
    dataset = cond.dataset or claim.subset.dataset
    token_set = cond.token_set or claim.subset.token_set
    epoch = cond.epoch if cond.epoch is not None else claim.subset.epoch
    if cond.condition is not None:  # an operand in another condition than the claim's
        view = view.in_condition(cond.condition, where, f"{fld}.condition")
    view.check_one_condition(where, f"{fld}.condition or subset.condition")
    df = view.slice(claim.metric, dataset, token_set, where, f"{fld}.")
    df, ep = view.at_epoch(df, epoch, where, f"{fld}.epoch")
    wide = view.wide(df, list(cond.layers), where, f"{fld}.layers")
    values = wide.mean(axis=1, skipna=False)
    resolved: dict[str, Any] = {
        "dataset": dataset,
        "token_set": token_set,
        "epoch": ep,
        "layers": list(cond.layers),
    }
    if view.condition is not None:
        resolved["condition"] = view.condition
    resolved["n_tokens"] = token_counts(df[df.layer.isin(cond.layers)])
    return values, resolved


def token_counts(rows: pd.DataFrame) -> list[int]:
    """The distinct token counts behind a slice's covariances (``n_tokens`` column; -1 = unknown)."""
    if "n_tokens" not in rows:
        return []
    return sorted({int(n) for n in rows.n_tokens.unique() if pd.notna(n) and n >= 0})


def token_count_warnings(counts: dict[str, list[int]]) -> list[str]:
    """A warning when compared conditions rest on different numbers of tokens.

    Effective rank, participation ratio and similar estimates are biased downward at smaller N, so a
    difference between conditions of unequal token counts mixes the effect with that bias.
    """
    known = {name: tuple(c) for name, c in counts.items() if c}
    if len(set(known.values())) <= 1:
        return []
    listed = ", ".join(f"{name}: {'/'.join(map(str, c))}" for name, c in known.items())
    return [
        f"compared conditions rest on different token counts ({listed}); finite-sample bias differs between them"
    ]


def complete_seeds(frames: Sequence[pd.Series | pd.DataFrame], excluded: dict[int, str]) -> list[int]:
    """Seeds with finite values in every frame; the others are added to ``excluded`` with a reason."""
    seeds = sorted(set().union(*(set(int(s) for s in f.index) for f in frames)))
    keep = []
    for s in seeds:
        ok = all(s in f.index and np.isfinite(np.asarray(f.loc[s], dtype=np.float64)).all() for f in frames)
        if ok:
            keep.append(s)
        elif s not in excluded:
            excluded[s] = "missing or non-finite values in the claimed cells"
    return keep


def paired(
    view: TableView, claim: Any, conds: list[tuple[str, Condition]], where: str, excluded: dict[int, str]
) -> tuple[list[np.ndarray], list[int], dict[str, dict[str, Any]]]:
    """Per condition the (S,) values of the seeds complete in every condition, those seeds, and each
    resolved condition (:func:`condition_values`); incomplete seeds are added to ``excluded``."""
    series, resolved = [], {}
    for fld, cond in conds:
        s, r = condition_values(view, claim, cond, where, fld)
        series.append(s)
        resolved[fld] = r
    seeds = complete_seeds(series, excluded)
    return [s.loc[seeds].to_numpy(dtype=np.float64) for s in series], seeds, resolved


def outcome_from_stats(
    stat: Statistic, seeds: list[int], excluded: dict[int, str], details: dict[str, Any], **extra: Any
) -> Outcome:
    """An Outcome from an array core's :class:`Statistic`; ``extra`` sets further Outcome fields."""
    needs = extra.get("needs", "every")
    extra.setdefault("p_against", combined_against(stat.p_against, needs) if stat.p_against else float("nan"))
    return Outcome(
        p_value=stat.p,
        effect=stat.effect,
        ci=(stat.ci[0], stat.ci[1]),
        contradicted=bool(stat.contradicted),
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=list(stat.warnings),
        details=details,
        effect_values=np.asarray(stat.values, float).tolist(),
        std_effect=stat.std_effect,
        **extra,
    )


def paired_outcome(
    stat: Statistic,
    seeds: list[int],
    excluded: dict[int, str],
    details: dict[str, Any],
    resolved: dict[str, dict[str, Any]],
    **extra: Any,
) -> Outcome:
    """``outcome_from_stats`` for claims over paired conditions, plus the unequal-token-count warning."""
    out = outcome_from_stats(stat, seeds, excluded, details, **extra)
    out.warnings += token_count_warnings({k: r["n_tokens"] for k, r in resolved.items()})
    return out


# --------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """One calibration scenario of a kind: its least favourable null at ``effect = 0`` and alternatives.

    ``simulate(n_seeds, effect, rng)`` runs one simulated study through the kind's array-level test and
    returns a :class:`Trial` (``p``, ``covered``, ``warned``). ``effect`` is in per-seed noise SDs.

    A scenario may instead give the two halves, so a sequential design can test the first ``n`` seeds of
    one simulated study at each look (:meth:`at_looks`): ``draw(n_seeds, effect, rng) -> (arrays, truth)``
    (a tuple of arrays, the seed on the first axis of each, and the true effect or None) and
    ``test(arrays, truth, rng) -> Trial`` (also ``contradicted``, and for a mixed-model trend
    ``fallback``). ``simulate`` is then ``test(*draw(...))``.

    ``reference``: the row shows another test on this null for comparison (bench/calibration.py prints it
    and does not require its bound).

    ``boundary(n_seeds, rng) -> (arrays, truth)``: the least favourable case of the REJECTED rule, a
    claim that is just true (every contrast it needs at 0, the others where they can do most harm);
    its rate of ``contradicted`` is the rule's error rate, at most 2.5% (:data:`REJECT_LEVEL`). None:
    ``draw(n_seeds, 0.0, rng)``, which is that case for a claim of one contrast.
    """

    description: str
    simulate: Callable[[int, float, np.random.Generator], Trial] | None = None
    draw: Callable[[int, float, np.random.Generator], tuple[tuple[np.ndarray, ...], Any]] | None = None
    test: Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial] | None = None
    boundary: Callable[[int, np.random.Generator], tuple[tuple[np.ndarray, ...], Any]] | None = None
    # a reference row: a test shown beside a kind's own on the same null, whose level it is not meant to
    # hold (the unadjusted slope on an adjusted claim's confounded null); its bound is not checked
    reference: bool = False

    def __post_init__(self) -> None:
        if self.simulate is None:
            draw, test = self.draw, self.test
            if draw is None or test is None:
                raise ValueError(f"scenario {self.description!r}: give simulate, or draw and test")
            object.__setattr__(self, "simulate", lambda n, effect, rng: test(*draw(n, effect, rng), rng))

    def run(self, n_seeds: int, effect: float, rng: np.random.Generator) -> Trial:
        """One simulated study of ``n_seeds`` seeds at ``effect`` (per-seed noise SDs)."""
        assert self.simulate is not None  # set by __post_init__
        return self.simulate(n_seeds, effect, rng)

    def rejected_at_boundary(self, n_seeds: int, rng: np.random.Generator) -> bool:
        """One simulated study at the REJECTED rule's least favourable case: would the rule REJECT?"""
        if self.test is None or self.draw is None:
            raise ValueError(f"scenario {self.description!r} has no draw and test")
        arrays, truth = self.boundary(n_seeds, rng) if self.boundary else self.draw(n_seeds, 0.0, rng)
        return bool(self.test(arrays, truth, rng).get("contradicted", False))

    @property
    def sequential(self) -> bool:
        """The scenario can be tested at several looks of one study."""
        return self.draw is not None and self.test is not None

    def at_looks(self, looks: list[int], effect: float, rng: np.random.Generator) -> list[Trial]:
        """One study of ``max(looks)`` seeds, tested on its first ``n`` seeds for each ``n`` in ``looks``."""
        if self.draw is None or self.test is None:
            raise ValueError(f"scenario {self.description!r} is not sequential (it has no draw and test)")
        arrays, truth = self.draw(max(looks), effect, rng)
        return [self.test(tuple(a[:n] for a in arrays), truth, rng) for n in looks]


@dataclass(frozen=True)
class FigureContext:
    """What a kind's ``figures`` may draw from: the tidy table, the validated claim and its result."""

    table: pd.DataFrame
    claim: Any  # the kind's ClaimBase subclass
    result: Result  # analysis.verdicts.ClaimResult


def condition_figures(ctx: FigureContext) -> list[Figure]:
    """For claims over conditions: the metric by layer at the claim's epoch for every dataset they name."""
    from analysis.figures import profile_figure

    conds = ctx.result.details.get("conditions") or {}
    datasets = list(dict.fromkeys(c["dataset"] for c in conds.values())) or [ctx.claim.subset.dataset]
    return [
        profile_figure(
            ctx.table, ctx.claim.metric, ctx.claim.subset.token_set, datasets, ctx.claim.subset.epoch
        )
    ]


def describe_condition(cond: dict[str, Any]) -> str:
    """A resolved condition (``condition_values``) in words: ``dataset/token_set/epoch N: layers``."""
    layers = cond["layers"]
    where = layers[0] if len(layers) == 1 else f"mean of {', '.join(layers)}"
    head = f"{cond['condition']}/" if cond.get("condition") else ""
    return f"{head}{cond['dataset']}/{cond['token_set']}/epoch {cond['epoch']}: {where}"


def per_seed_text(values: dict[Any, float] | None, digits: int = 2) -> str:
    """``{seed: value}`` as ``seed 0: 1.23, seed 1: ...``."""
    from vitstudy_core.fmt import fmt_num

    return ", ".join(f"seed {s}: {fmt_num(v, digits)}" for s, v in (values or {}).items())


def _no_figures(ctx: FigureContext) -> list[Figure]:
    return []


def _no_explanation(claim: Any, result: Result) -> list[str]:
    return []


def _declared_margin(claim: Any) -> float | None:
    return getattr(claim, "margin", None)


def _t_based(claim: Any) -> int:
    return 0


def _asserts_an_effect(claim: Any) -> float | None:
    return None


def _declared_sesoi(claim: Any) -> float | None:
    return claim.sesoi


def _one_test(claim: Any) -> int:
    return 1


def metric_unit(claim: Any) -> str:
    """The unit suffix of an effect in the metric's own units (`` pp`` for a ``*_pct`` metric, else none)."""
    from vitstudy_core.fmt import unit_of

    return unit_of(claim.metric)


@dataclass(frozen=True)
class ClaimKind:
    """A registered claim kind (see the module docstring).

    Attributes:
        name: the ``kind:`` value in a hypothesis file.
        model: the pydantic claim model.
        evaluate: ``(TableView, claim, where, excluded) -> Outcome``.
        calibration: scenario label -> :class:`Scenario` (labels are unique across kinds).
        figures: ``FigureContext -> list[analysis.figures.Figure]`` for the report (the effect plot is
            added for every kind).
        explain: ``(claim, result) -> list[str]``: report lines saying what the test found (the verdict's
            reason, power, warnings and excluded seeds are added for every kind).
        rejection_margin: ``claim -> margin or None``: a margin within which equivalence REJECTS the
            claim (default: the claim's ``margin`` field, if any).
        holds_within: ``claim -> margin or None``: the claim says the effect lies within +-margin (an
            equivalence), so a second interval (the seed x probe one) agrees when it lies inside; None
            (the default): the claim says there is an effect, and an interval agrees when it excludes 0.
        labellings_per_seed: ``claim -> int``: for a randomisation test, the equally likely labellings
            of one seed's data under the null (2 for sign flips, K! for a permutation of K conditions), so
            its p cannot go below ``labellings^-S``; 0 for a t-based test (the default). What
            ``python -m study plan`` reads to say how many seeds a claim needs at the least.
        planning_effect: ``claim -> effect or None``: the effect ``plan`` sizes the seeds for when no
            pilot gives one (default: the claim's ``sesoi``).
        holm_contrasts: ``claim -> k``: the claim's p is Holm-adjusted across k contrasts (a trend over
            ``any`` of k layers), so ``plan`` sizes it at alpha / k and its floor is k * labellings^-S
            (default 1).
        effect_unit: ``claim -> str``: the unit suffix of the claim's effect as the report prints it
            (`` pp per unit of clutter`` for a slope over a knob; default the metric's, :func:`metric_unit`).
        example: a valid claim of this kind as a hypothesis file writes it (without ``name``), over a
            design of datasets ``objects``, ``mixed``, ``textures`` and a 12-block ViT: the contract test
            (tests/test_kind_contract.py) evaluates it and draws its figures.
    """

    name: str
    model: type[ClaimBase]
    evaluate: Callable[..., Outcome]
    calibration: dict[str, Scenario] = field(default_factory=dict)
    figures: Callable[[FigureContext], list[Figure]] = _no_figures
    explain: Callable[[Any, Result], list[str]] = _no_explanation
    rejection_margin: Callable[[Any], float | None] = _declared_margin
    holds_within: Callable[[Any], float | None] = _asserts_an_effect
    labellings_per_seed: Callable[[Any], int] = _t_based
    planning_effect: Callable[[Any], float | None] = _declared_sesoi
    holm_contrasts: Callable[[Any], int] = _one_test
    effect_unit: Callable[[Any], str] = metric_unit
    example: dict[str, Any] = field(default_factory=dict)


def _new_labels(name: str, kind: ClaimKind) -> None:
    labels = {label for k in KINDS.values() for label in k.calibration}
    if labels & set(kind.calibration):
        raise ValueError(f"calibration labels {sorted(labels & set(kind.calibration))} are taken")


KINDS: Registry[ClaimKind] = Registry("claim kind", check=_new_labels, group="vitstudy.kinds")


def register_kind(kind: ClaimKind) -> ClaimKind:
    """Add a kind to :data:`KINDS` (its name and its calibration labels must be new)."""
    return KINDS.register(kind.name, kind)


def get_kind(name: str) -> ClaimKind:
    """The registered kind ``name`` (unknown: a one-line StudyError listing the kinds)."""
    return KINDS.get(name)
