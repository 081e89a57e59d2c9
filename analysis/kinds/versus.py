"""Claims across conditions (a design with conditions: the tidy table's ``condition`` column).

* ``differs``: an inner claim's per-seed effect in condition ``a`` minus in condition ``b``, two-sided;
* ``exceeds``: the same, one-sided: larger in ``a`` than in ``b`` (larger = further in the inner claim's
  claimed direction: a deeper dip, a steeper claimed slope);
* ``holds_in_all``: the inner claim holds in every listed condition (intersection-union: p = max);
* ``controls: [names]`` on any claim (:func:`analysis.kinds._parts.controls.apply_controls`, called by the verdicts): the claim holds in
  its own condition and its per-seed effect exceeds the same claim's in each control (intersection-union
  with those ``exceeds`` tests).

The per-seed effect is the inner kind's own (``Outcome.seed_effects``, from its array-level statistic,
positive in the claimed direction; ``ClaimBase.seed_effect_text`` says what it is per kind). Seeds are
paired by id, with a paired t(S-1) test of the per-seed differences, when both conditions hold the same
seed ids: a condition's run with seed s shares that seed's initialisation, data order and split with the
other conditions' (an untrained condition's rows are the very networks at epoch 0), so the difference
removes the seed's own variation, and the paired test is exact for any correlation between the two.
Otherwise (different seeds per condition) the conditions are independent samples: Welch's t, which
does not assume equal seed variances across conditions.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from analysis.inference import Alternative
from analysis.kinds._parts.claim import CONDITION_NAME, ClaimBase
from analysis.kinds._parts.difference import _difference_details, _se_df, compare_effects, in_condition
from analysis.kinds._parts.difference_display import difference_lines, effects_figure
from analysis.kinds._parts.display import FigureContext, Result
from analysis.kinds._parts.outcome import Outcome
from analysis.kinds._parts.registry import KINDS, ClaimKind, get_kind, register_kind
from analysis.kinds._parts.rejection import Estimate, contradiction, holm_min
from analysis.kinds._parts.scenario import Scenario
from analysis.kinds._parts.table import TableView
from analysis.kinds._parts.versus_scenarios import (
    _boundary,
    _calibration_exceeds,
    _draw_holds,
    _test_holds,
    _value_scenarios,
)
from analysis.units import inner_images_problem
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    import pandas as pd

    from analysis.report.figures import Figure

ACROSS_KINDS = ("differs", "exceeds", "holds_in_all")
# what an inner claim takes from the claim around it; set on the outer claim only
_INHERITED = ("name", "metric", "subset")
_OUTER_ONLY = ("alpha", "confirmatory", "adjust", "controls", "sesoi")


class Cell(Strict):
    """One side of a cross-condition comparison: the condition the inner claim is evaluated in."""

    condition: str = Field(pattern=CONDITION_NAME)


def _inner_error(exc: ValidationError) -> ValueError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if str(p) not in KINDS)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key (not part of the schema)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    return ValueError(f"{loc}: {msg}" if loc else msg)


class AcrossBase(ClaimBase):
    """What the cross-condition kinds share: the inner ``claim`` (any other kind, without ``name``,
    ``metric`` and ``subset``, which it takes from this claim)."""

    claim: ClaimBase

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("claim"), dict):
            inner = dict(data["claim"])
            given = [k for k in (*_INHERITED, *_OUTER_ONLY) if k in inner]
            if given:
                raise ValueError(
                    f"claim.{given[0]}: set it on the claim itself (the inner claim takes name, metric "
                    "and subset from it)"
                )
            data = {**data, "claim": {**{k: data.get(k) for k in _INHERITED if k in data}, **inner}}
        return data

    @field_validator("claim", mode="before")
    @classmethod
    def _parse_inner(cls, v: Any) -> Any:
        if isinstance(v, ClaimBase):
            return v
        if not isinstance(v, dict):
            raise ValueError("expected a claim: a mapping with kind: and that kind's fields")
        kind = v.get("kind")
        if kind in ACROSS_KINDS:
            raise ValueError(f"kind: a {kind} claim cannot be the inner claim of another")
        if kind not in KINDS:
            inner_kinds = [k for k in KINDS if k not in ACROSS_KINDS]
            raise ValueError(f"kind: expected one of {inner_kinds}, got {kind!r}")
        try:
            return KINDS[str(kind)].model.model_validate(v)
        except ValidationError as exc:
            raise _inner_error(exc) from None

    @model_validator(mode="after")
    def _one_claim_many_conditions(self) -> AcrossBase:
        if self.subset.condition is not None:
            raise ValueError(f"subset.condition: a {self.kind} claim names its conditions in its own fields")
        if self.controls:
            raise ValueError(f"controls: a {self.kind} claim compares conditions itself; drop controls")
        if self.claim.conditions_named():
            fld, _ = self.claim.conditions_named()[0]
            raise ValueError(f"claim.{fld}: the inner claim names no condition (the {self.kind} claim does)")
        return self

    def knob(self) -> str | None:
        return self.claim.knob()

    def named(self) -> list[tuple[str, str, object]]:
        return [(f if f.startswith("subset.") else f"claim.{f}", w, v) for f, w, v in self.claim.named()]

    def token_set_of(self, fld: str) -> str:
        return self.claim.token_set_of(fld.removeprefix("claim."))


class DiffersClaim(AcrossBase):
    """The inner claim's per-seed effect in condition ``a`` differs from that in ``b`` (two-sided)."""

    kind: Literal["differs"]
    alternative: ClassVar[Alternative] = "two-sided"
    a: Cell
    b: Cell
    margin: float | None = Field(None, gt=0)  # equivalence within it REJECTS the claim

    @model_validator(mode="after")
    def _two_conditions(self) -> DiffersClaim:
        if self.a.condition == self.b.condition:
            raise ValueError("b.condition: expected a condition other than a's")
        problem = self.claim.cross_problem()
        if problem:
            raise ValueError(f"claim: {problem}")
        return self

    def conditions_named(self) -> list[tuple[str, str]]:
        return [("a.condition", self.a.condition), ("b.condition", self.b.condition)]


class ExceedsClaim(DiffersClaim):
    """The inner claim's per-seed effect is larger in condition ``a`` than in ``b`` (one-sided)."""

    kind: Literal["exceeds"]  # type: ignore[assignment]
    alternative: ClassVar[Alternative] = "greater"


class HoldsInAllClaim(AcrossBase):
    """The inner claim holds in every listed condition (intersection-union)."""

    kind: Literal["holds_in_all"]
    conditions: list[str] = Field(min_length=2)

    @field_validator("conditions")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if not re.match(CONDITION_NAME, c)]
        if bad:
            raise ValueError(f"condition names match {CONDITION_NAME}, got {bad[0]!r}")
        if len(set(v)) != len(v):
            raise ValueError("conditions must be distinct")
        return v

    def conditions_named(self) -> list[tuple[str, str]]:
        return [(f"conditions[{i}]", c) for i, c in enumerate(self.conditions)]


def _prefixed(outs: dict[str, Outcome]) -> list[str]:
    return list(dict.fromkeys(f"{name}: {w}" for name, o in outs.items() for w in o.warnings))


def evaluate_differs(
    table: pd.DataFrame | TableView,
    claim: DiffersClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """``differs`` / ``exceeds``: the inner claim in conditions a and b, and the test of a's per-seed effects
    minus b's (:func:`compare_effects`). Effect: mean difference, in the units of the inner claim's
    per-seed effect (its ``seed_effect_text``)."""
    view = TableView.of(table)
    names = (claim.a.condition, claim.b.condition)
    outs = (
        in_condition(view, claim.claim, names[0], where, "a.condition", excluded or {}),
        in_condition(view, claim.claim, names[1], where, "b.condition", excluded or {}),
    )
    stat, paired, seeds, dropped, sides = compare_effects(claim.claim, outs, names, claim.alternative)
    se, df = _se_df(stat, paired)
    details = {
        "statistic": claim.claim.seed_effect_text(),
        "inner_kind": claim.claim.kind,
        "sides": sides,
        "difference": _difference_details(stat, paired, seeds),
    }
    return Outcome(
        p_value=stat.p,
        effect=stat.effect,
        ci=(stat.ci[0], stat.ci[1]),
        contradicted=bool(stat.contradicted) and len(seeds) >= 2,
        seeds_used=seeds,
        seeds_excluded=dropped,
        warnings=_prefixed(dict(zip(names, outs, strict=True))) + list(stat.warnings),
        details=details,
        effect_values=np.asarray(stat.values, float).tolist(),
        std_effect=stat.std_effect,
        two_sided=claim.alternative == "two-sided",
        estimates=[Estimate(stat.effect, se, df)] if math.isfinite(se) else [],
        p_against=stat.p_against[0] if stat.p_against else float("nan"),
    )


def evaluate_holds_in_all(
    table: pd.DataFrame | TableView,
    claim: HoldsInAllClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """The inner claim in every listed condition; p = the largest p (intersection-union), effect and CI of
    that (binding) condition. REJECTED when the inner claim's opposite holds in some condition (Holm
    across the conditions of the inner REJECTED rule's p, so its rate when the claim is just true in
    every condition stays at most 2.5%)."""
    view = TableView.of(table)
    outs = {
        c: in_condition(view, claim.claim, c, where, f"conditions[{i}]", excluded or {})
        for i, c in enumerate(claim.conditions)
    }
    ps = [o.p_value for o in outs.values()]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    binding = max(outs, key=lambda c: outs[c].p_value if not math.isnan(outs[c].p_value) else math.inf)
    b = outs[binding]
    against = [o.p_against for o in outs.values()]
    if all(math.isnan(v) for v in against):  # a kind without the p: any one REJECTED refutes the claim
        contradicted = any(o.contradicted for o in outs.values())
    else:
        contradicted = contradiction(against, "every")
    dropped: dict[int, str] = {}
    for c, o in outs.items():
        for s, why in o.seeds_excluded.items():
            dropped.setdefault(int(s), f"{c}: {why}")
    details = {
        "inner_kind": claim.claim.kind,
        "binding_condition": binding,
        "p_against": holm_min(against) if len(against) > 1 else against[0],
        "per_condition": {
            c: {
                "effect": o.effect,
                "ci": list(o.ci),
                "p": o.p_value,
                "contradicted": o.contradicted,
                "n_seeds": len(o.seeds_used),
                "details": o.details,
            }  # fmt: skip
            for c, o in outs.items()
        },
    }
    return Outcome(
        p_value=p,
        effect=b.effect,
        ci=b.ci,
        contradicted=contradicted and min(len(o.seeds_used) for o in outs.values()) >= 2,
        seeds_used=b.seeds_used,
        seeds_excluded=dropped,
        warnings=_prefixed(outs),
        details=details,
        effect_values=b.effect_values,
        std_effect=b.std_effect,
        two_sided=b.two_sided,
        labellings_per_seed=max(o.labellings_per_seed for o in outs.values()),
        not_testable=next((o.not_testable for o in outs.values() if o.not_testable), ""),
        estimates=[e for o in outs.values() for e in _estimates(o)],
        needs="every",
        holm_contrasts=b.holm_contrasts,
        p_against=holm_min(against),
    )


def _estimates(o: Outcome) -> list[Estimate]:
    if o.estimates:
        return list(o.estimates)
    from analysis.inference import t_test

    return [Estimate.of(t_test(np.asarray(o.effect_values)))] if len(o.effect_values) >= 2 else []


def explain_differs(claim: DiffersClaim, result: Result) -> list[str]:
    """The inner claim, each condition's effect, and the difference with its test."""
    d = result.details
    how = "two-sided" if claim.alternative == "two-sided" else f"one-sided: {claim.a.condition} larger"
    lines = [f"inner claim: {claim.claim.kind} ({how})"]
    if d.get("sides") and d.get("difference"):
        lines += difference_lines(d["sides"], d["difference"], d["statistic"], unit_of(claim.metric))
    return lines


def explain_holds(claim: HoldsInAllClaim, result: Result) -> list[str]:
    """The inner claim's effect, CI and p in each condition; which condition binds."""
    d = result.details
    unit = unit_of(claim.metric)
    lines = [f"inner claim: {claim.claim.kind}, in each of {', '.join(claim.conditions)} (p = the largest)"]
    for c, r in (d.get("per_condition") or {}).items():
        lines.append(
            f"{c}: effect {fmt_num(r['effect'])}{unit} (95% CI {fmt_num(r['ci'][0])}, {fmt_num(r['ci'][1])}), "
            f"p {fmt_p(r['p'])}" + (" (binding)" if c == d.get("binding_condition") else "")
        )
    return lines


def _inner_figures(ctx: FigureContext, inner: ClaimBase, per: dict[str, dict[str, Any]]) -> list[Figure]:
    """The inner claim's own figures, once per condition, on that condition's rows, in the condition's
    colour and on one y range for all of them (the conditions are compared by eye)."""
    figs = []
    ylim = _shared_ylim(ctx.table, inner, per)
    for c, r in per.items():
        rows = ctx.table[ctx.table["condition"].astype(str) == c] if "condition" in ctx.table else ctx.table
        res = SimpleNamespace(effect=r["effect"], ci_low=r["ci"][0], ci_high=r["ci"][1], details=r["details"])
        for f in get_kind(inner.kind).figures(FigureContext(rows, inner, res, ctx.colours, ylim)):
            f.name, f.caption = f"{f.name}_{c}", f"{f.caption}; condition {c}"
            figs.append(f)
    return figs


def _shared_ylim(
    table: pd.DataFrame, inner: ClaimBase, per: dict[str, dict[str, Any]]
) -> tuple[float, float] | None:
    """One y range for the inner claim's figures in every condition: the per-seed values of its metric
    (at each condition's tested epoch, where it has one) and their 95% t bands, clipped to the metric's
    range, with a 5% margin; None when no condition has rows."""
    from analysis.observables import metric_range
    from analysis.report.figures import clip_band, t_band

    if "condition" not in table.columns:
        return None
    sel = table[(table.metric == inner.metric) & (table.token_set == inner.subset.token_set)]
    named = inner.datasets_named() or ([inner.subset.dataset] if inner.subset.dataset else [])
    if named:
        sel = sel[sel.dataset.isin(named)]
    lows, highs = [], []
    for c, r in per.items():
        rows = sel[sel["condition"].astype(str) == c]
        epoch = (r.get("details") or {}).get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            rows = rows[rows.epoch == epoch]
        for _, part in rows.groupby(["dataset", "epoch"]):
            wide = part.pivot_table(index="seed", columns="layer", values="value").to_numpy(dtype=float)
            _, low, high = t_band(wide)
            low, high = clip_band(low, high, metric_range(inner.metric))
            lows.append(float(np.nanmin([np.nanmin(wide), np.nanmin(low)])))
            highs.append(float(np.nanmax([np.nanmax(wide), np.nanmax(high)])))
    if not lows or not all(map(math.isfinite, [*lows, *highs])):
        return None
    lo, hi = min(lows), max(highs)
    pad = 0.05 * (hi - lo) if hi > lo else 1.0
    return lo - pad, hi + pad


def _plotted(claim: ClaimBase, per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    epochs = [r["details"].get("epoch") for r in per.values() if r["details"].get("epoch") is not None]
    return {
        "datasets": claim.datasets_named() or [claim.subset.dataset],
        "epochs": epochs or [claim.subset.epoch],
    }


def figures_differs(ctx: FigureContext) -> list[Figure]:
    """The inner claim's figures in each condition, then the two conditions' per-seed effects side by side."""
    d = ctx.result.details
    sides = d.get("sides") or {}
    figs = _inner_figures(ctx, ctx.claim.claim, sides)
    return [
        *figs,
        effects_figure(sides, d.get("statistic", ""), _plotted(ctx.claim.claim, sides), ctx.colours),
    ]


def figures_holds(ctx: FigureContext) -> list[Figure]:
    """The inner claim's figures in each listed condition."""
    return _inner_figures(ctx, ctx.claim.claim, ctx.result.details.get("per_condition") or {})


def _differs_example(kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "metric": "eed_pct",
        "subset": {"dataset": "objects"},
        "claim": {
            "kind": "u_shape",
            "regions": {"early": ["block_01"], "bottleneck": ["block_04", "block_05"], "late": ["block_12"]},
        },
        "a": {"condition": "trained"},
        "b": {"condition": "untrained"},
    }


def _margin(claim: Any) -> float | None:
    return claim.margin


def _inner_margin(claim: HoldsInAllClaim) -> float | None:
    return get_kind(claim.claim.kind).rejection_margin(claim.claim)


# unit: images rows hold at 256, 1,024 and 4,096 probe images (bench/calibration.py --unit-images)
_IMAGES_CALIBRATED = frozenset({"eed_pct", "participation_ratio"})


def _images(claim: DiffersClaim) -> str | None:
    return inner_images_problem(claim.claim)


def _inner_labellings(claim: HoldsInAllClaim) -> int:
    return get_kind(claim.claim.kind).labellings_per_seed(claim.claim)


register_kind(
    ClaimKind(
        name="differs",
        model=DiffersClaim,
        evaluate=evaluate_differs,
        calibration=_value_scenarios("two-sided", "differs"),
        figures=figures_differs,
        explain=explain_differs,
        rejection_margin=_margin,
        images=_images,  # unit: images as its inner claim's kind allows it
        images_calibrated=_IMAGES_CALIBRATED,
        example=_differs_example("differs"),
    )
)
register_kind(
    ClaimKind(
        name="exceeds",
        model=ExceedsClaim,
        evaluate=evaluate_differs,
        calibration=_calibration_exceeds(),
        figures=figures_differs,
        explain=explain_differs,
        rejection_margin=_margin,
        images=_images,  # unit: images as its inner claim's kind allows it
        images_calibrated=_IMAGES_CALIBRATED,
        example=_differs_example("exceeds"),
    )
)
register_kind(
    ClaimKind(
        name="holds_in_all",
        model=HoldsInAllClaim,
        evaluate=evaluate_holds_in_all,
        calibration={
            "holds_in_all": Scenario(
                "u_shape in 2 conditions: a step-down in one, a clear U in the other; REJECTED: "
                "step-down in both",
                draw=_draw_holds(False),
                test=_test_holds,
                boundary=_boundary(_draw_holds(True)),
            )
        },
        figures=figures_holds,
        explain=explain_holds,
        rejection_margin=_inner_margin,
        labellings_per_seed=_inner_labellings,
        example={
            "kind": "holds_in_all",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "claim": {
                "kind": "u_shape",
                "regions": {
                    "early": ["block_01"],
                    "bottleneck": ["block_04", "block_05"],
                    "late": ["block_12"],
                },
            },
            "conditions": ["trained", "untrained"],
        },
    )
)
