"""Claims across conditions (a design with conditions: the tidy table's ``condition`` column).

* ``differs``: an inner claim's per-seed effect in condition ``a`` minus in condition ``b``, two-sided;
* ``exceeds``: the same, one-sided: larger in ``a`` than in ``b`` (larger = further in the inner claim's
  claimed direction: a deeper dip, a steeper claimed slope);
* ``holds_in_all``: the inner claim holds in every listed condition (intersection-union: p = max);
* ``controls: [names]`` on any claim (:func:`apply_controls`, called by the verdicts): the claim holds in
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
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, ValidationError, field_validator, model_validator
from scipy import stats

from analysis.inference import Alternative, opposite, t_p
from analysis.kinds.base import (
    CONDITION_NAME,
    KINDS,
    ClaimBase,
    ClaimKind,
    Estimate,
    FigureContext,
    Outcome,
    Result,
    Scenario,
    Statistic,
    Strict,
    TableView,
    Trial,
    contradiction,
    few_seeds_warning,
    get_kind,
    holm_min,
    register_kind,
)
from analysis.kinds.compare import compare_statistics
from analysis.kinds.u_shape import u_shape_statistics
from analysis.simulate import simulate_profiles
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of

if TYPE_CHECKING:
    from analysis.figures import Figure

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


# --------------------------------------------------------------------------------------------------
# The array-level tests
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class WelchStatistic(Statistic):
    """:class:`Statistic` of Welch's test, plus the SE of the difference and its Welch-Satterthwaite df."""

    se: float = float("nan")
    df: float = float("nan")


def welch_statistics(a: np.ndarray, b: np.ndarray, alternative: Alternative = "greater") -> WelchStatistic:
    """Welch's t test of mean(a) - mean(b) on two independent samples of seeds.

    Args:
        a: (S_a,) per-seed values in condition a; b: (S_b,) in condition b (different seeds).
        alternative: ``greater`` (a > b), ``less`` or ``two-sided``.

    Returns:
        A :class:`Statistic`: ``effect`` = mean(a) - mean(b), ``ci`` (95%, Welch-Satterthwaite df),
        ``p``, ``p_against`` (one-sided: the other side), ``contradicted`` (that is below 2.5%),
        ``std_effect`` = effect / sqrt(var a + var b) (a difference of one seed from each condition, the
        scale the seeds-needed numbers use), ``values`` empty (no per-seed differences).
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    na, nb = a.size, b.size
    nan = float("nan")
    diff = float(a.mean() - b.mean()) if na and nb else nan
    empty = np.empty(0)
    if na < 2 or nb < 2:
        return WelchStatistic(p=nan, effect=diff, ci=(nan, nan), contradicted=False, std_effect=nan, values=empty,
                         warnings=few_seeds_warning(min(na, nb), nan))  # fmt: skip
    va, vb = float(a.var(ddof=1)), float(b.var(ddof=1))
    se = math.sqrt(va / na + vb / nb)
    if not se > 1e-12 * max(1.0, abs(diff)):
        return WelchStatistic(p=nan, effect=diff, ci=(diff, diff), contradicted=False, std_effect=nan,
                         values=empty, warnings=few_seeds_warning(2, nan))  # fmt: skip
    df = se**4 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    t = diff / se
    q = float(stats.t.ppf(0.975, df))
    against = [t_p(t, df, opposite(alternative))] if alternative != "two-sided" else []
    sign = {"greater": 1.0, "less": -1.0}.get(alternative, float(np.sign(diff) or 1.0))
    return WelchStatistic(
        p=t_p(t, df, alternative),
        effect=diff,
        ci=(diff - q * se, diff + q * se),
        p_against=against,
        contradicted=bool(against) and contradiction(against, "every"),
        std_effect=sign * diff / math.sqrt(va + vb),
        values=empty,
        warnings=[],
        df=df,
        se=se,
    )


def difference_statistics(a: np.ndarray, b: np.ndarray, alternative: Alternative, paired: bool) -> Statistic:
    """Condition a's per-seed effects minus b's: paired t(S-1) (``paired``: row s of ``a`` and ``b`` is
    seed s; :func:`analysis.kinds.compare.compare_statistics`) or Welch (:func:`welch_statistics`)."""
    return compare_statistics(a, b, alternative) if paired else welch_statistics(a, b, alternative)


def _se_df(stat: Statistic, paired: bool) -> tuple[float, float]:
    """The SE and df of a difference's mean (what a margin's TOST reads)."""
    if isinstance(stat, WelchStatistic):
        return stat.se, stat.df
    d = np.asarray(stat.values, float)
    if d.size < 2:
        return float("nan"), float("nan")
    return float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1)


# --------------------------------------------------------------------------------------------------
# Table adapters
# --------------------------------------------------------------------------------------------------
def in_condition(
    view: TableView, claim: ClaimBase, name: str, where: str, fld: str, excluded: dict[int, str]
) -> Outcome:
    """``claim`` (its controls dropped) evaluated in condition ``name`` by its own kind; a condition the
    table lacks is one line naming ``fld``."""
    view.in_condition(name, where, fld)
    subset = claim.subset.model_copy(update={"condition": name})
    one = claim.model_copy(update={"subset": subset, "controls": []})
    return get_kind(one.kind).evaluate(view, one, where=where, excluded=dict(excluded))


def compare_effects(
    claim: ClaimBase,
    outs: tuple[Outcome, Outcome],
    names: tuple[str, str],
    alternative: Alternative,
    with_details: bool = True,
) -> tuple[Statistic, bool, list[int], dict[int, str], dict[str, Any]]:
    """The test of condition a's per-seed effects (``outs[0]``) minus b's: paired by seed id when both
    conditions hold the same seed ids in the table (used or excluded), Welch otherwise.

    Returns (statistic, paired, seeds used, seeds excluded with the reason, details of the two sides).
    """
    ea, eb = claim.seed_effect(outs[0]), claim.seed_effect(outs[1])
    ids = [set(o.seeds_used) | set(o.seeds_excluded) for o in outs]
    paired = ids[0] == ids[1]
    excluded: dict[int, str] = {}
    for o, name in zip(outs, names, strict=True):
        for s, why in o.seeds_excluded.items():
            excluded.setdefault(int(s), f"{name}: {why}")
    if paired:
        seeds = sorted(set(ea.index) & set(eb.index))
        for s in sorted((set(ea.index) | set(eb.index)) - set(seeds)):
            missing = names[0] if s not in ea.index else names[1]
            excluded.setdefault(int(s), f"no effect in condition {missing}")
        stat = difference_statistics(ea.loc[seeds].to_numpy(), eb.loc[seeds].to_numpy(), alternative, True)
    else:
        seeds = sorted(set(ea.index) | set(eb.index))
        stat = difference_statistics(ea.to_numpy(), eb.to_numpy(), alternative, False)
    sides = {
        name: {
            "condition": name,
            "effect": o.effect,
            "ci": list(o.ci),
            "p": o.p_value,
            "seed_effect_mean": float(e.mean()) if len(e) else float("nan"),
            "per_seed": {int(str(s)): float(v) for s, v in e.items()},
            **({"details": o.details} if with_details else {}),
        }
        for name, o, e in zip(names, outs, (ea, eb), strict=True)
    }
    return stat, paired, seeds, excluded, sides


def _difference_details(stat: Statistic, paired: bool, seeds: list[int]) -> dict[str, Any]:
    return {
        "test": "paired t(S-1) over seeds shared by id" if paired else "Welch t (different seeds)",
        "paired": paired,
        "mean": stat.effect,
        "ci": list(stat.ci),
        "p": stat.p,
        "per_seed": dict(zip(seeds, map(float, stat.values), strict=True)) if paired else {},
    }


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


def apply_controls(
    view: TableView, claim: ClaimBase, out: Outcome, where: str, excluded: dict[int, str]
) -> Outcome:
    """A claim with ``controls``: ACCEPTED only if it holds and its per-seed effect exceeds the same
    claim's in each control (intersection-union: p = max of its own p and each ``exceeds`` p). REJECTED
    when its own REJECTED rule's p or some control's "less than the control" p is below 2.5% after Holm
    across them. The effect and CI stay the claim's own; ``details.controls`` holds each control's."""
    if not claim.controls or out.not_testable:
        return out
    own = claim.subset.condition or "(the claim's condition)"
    tests: dict[str, dict[str, Any]] = {}
    against: list[float] = []
    ps = [out.p_value]
    for i, c in enumerate(claim.controls):
        oc = in_condition(view, claim, c, where, f"controls[{i}]", excluded)
        stat, paired, seeds, _, sides = compare_effects(claim, (out, oc), (own, c), "greater", False)
        tests[c] = {"sides": sides, "difference": _difference_details(stat, paired, seeds),
                    "std_effect": stat.std_effect}  # fmt: skip
        ps.append(stat.p)
        against.append(stat.p_against[0] if stat.p_against else float("nan"))
        out.warnings += [f"control {c}: {w}" for w in [*oc.warnings, *stat.warnings]]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    if math.isnan(out.p_against):
        contradicted = out.contradicted or contradiction(against, "every")
    else:
        contradicted = contradiction([out.p_against, *against], "every")
    binding = int(np.argmax([v if not math.isnan(v) else math.inf for v in ps]))
    out.details["controls"] = tests
    out.details["controls_binding"] = "own" if binding == 0 else claim.controls[binding - 1]
    out.details["statistic"] = claim.seed_effect_text()
    out.details["own_p"] = out.p_value
    out.p_value = p
    out.contradicted = contradicted and len(out.seeds_used) >= 2
    if binding:
        out.std_effect, out.two_sided = float(tests[claim.controls[binding - 1]]["std_effect"]), False
    return out


# --------------------------------------------------------------------------------------------------
# Report: explanation and figures
# --------------------------------------------------------------------------------------------------
def _side_line(side: dict[str, Any], unit: str) -> str:
    return (
        f"{side['condition']}: claim effect {fmt_num(side['effect'])}{unit} (95% CI {fmt_num(side['ci'][0])}, "
        f"{fmt_num(side['ci'][1])}), p {fmt_p(side['p'])}; per-seed effect mean {fmt_num(side['seed_effect_mean'])}"
    )


def difference_lines(sides: dict[str, Any], diff: dict[str, Any], statistic: str, unit: str) -> list[str]:
    """The two conditions' effects side by side and their difference (report lines)."""
    a, b = list(sides)
    lines = [f"per-seed effect compared: {statistic}"]
    lines += [_side_line(sides[n], unit) for n in (a, b)]
    lines.append(
        f"{a} - {b}: {fmt_num(diff['mean'])}{unit} (95% CI {fmt_num(diff['ci'][0])}, {fmt_num(diff['ci'][1])}), "
        f"p {fmt_p(diff['p'])}; {diff['test']}"
    )
    return lines


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


def explain_controls(claim: ClaimBase, details: dict[str, Any]) -> list[str]:
    """For a claim with controls: its effect beside each control's, and the exceeds test (report lines)."""
    unit = unit_of(claim.metric)
    lines = [
        f"own test p {fmt_p(details.get('own_p'))}; controls: {', '.join(claim.controls)} (p = the largest)"
    ]
    for test in (details.get("controls") or {}).values():
        lines += difference_lines(test["sides"], test["difference"], details.get("statistic", ""), unit)
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
    from analysis.figures import clip_band, t_band
    from analysis.observables import metric_range

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


def effects_figure(
    sides: dict[str, dict[str, Any]],
    statistic: str,
    plotted: dict[str, Any],
    colours: dict[str, str] | None = None,
) -> Figure:
    """Two (or more) conditions' per-seed effects side by side: one dot per seed (joined across conditions
    by seed id), the mean with its 95% t CI per condition, each in its colour of the study's palette
    (``colours``; default: the palette of these conditions alone)."""

    from analysis.figures import Figure, _png, new_figure, t_band
    from analysis.palette import condition_colours

    names = list(sides)
    colours = colours or condition_colours(names)
    fig, ax = new_figure(figsize=(1.6 + 1.4 * len(names), 3.4))
    per = pd.DataFrame({n: pd.Series(sides[n]["per_seed"], dtype=float) for n in names})
    for _, row in per.iterrows():
        ax.plot(range(len(names)), row.to_numpy(), color="0.6", lw=0.8, marker="o", ms=3, alpha=0.7)
    for j, n in enumerate(names):
        mean, low, high = t_band(per[[n]].dropna().to_numpy())
        colour = colours.get(n, f"C{j}")
        ax.errorbar([j + 0.15], mean, yerr=[mean - low, high - mean], fmt="s", color=colour, capsize=4)
    ax.axhline(0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    for tick, n in zip(ax.get_xticklabels(), names, strict=True):
        tick.set_color(colours.get(n, "black"))
    ax.set_ylabel(_wrapped(statistic), fontsize=7)
    ax.grid(alpha=0.3)
    caption = f"per-seed effect by condition ({statistic}); lines join a seed across conditions"
    drawn = {**plotted, "conditions": names, "colours": {n: colours.get(n, "") for n in names}}
    return Figure("effects_by_condition", caption, png=_png(fig), plotted=drawn)


def _wrapped(text: str, width: int = 40, lines: int = 3) -> str:
    """An axis label over at most ``lines`` lines of ``width`` characters, broken between words only
    (never inside one: "mean" stays "mean"); what does not fit ends in "...", the caption has it whole."""
    import textwrap

    return "\n".join(
        textwrap.wrap(
            text, width, break_long_words=False, break_on_hyphens=False, max_lines=lines, placeholder=" ..."
        )
    )


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


def controls_figures(ctx: FigureContext) -> list[Figure]:
    """For a claim with controls: its per-seed effect beside each control's."""
    tests = ctx.result.details.get("controls") or {}
    sides: dict[str, dict[str, Any]] = {}
    for t in tests.values():
        sides.update(t["sides"])
    if not sides:
        return []
    plotted = {
        "datasets": ctx.claim.datasets_named() or [ctx.claim.subset.dataset],
        "epochs": [ctx.claim.subset.epoch],
    }
    return [effects_figure(sides, ctx.result.details.get("statistic", ""), plotted, ctx.colours)]


# --------------------------------------------------------------------------------------------------
# Calibration: the least favourable null is equal effects in both conditions, with large and unequal
# seed variances (SD 3 in condition a, 0.3 in b) and, when paired, a large shared seed offset (SD 5)
# --------------------------------------------------------------------------------------------------
SD_A, SD_B, SD_SEED = 3.0, 0.3, 5.0
SD_DIFF = math.hypot(SD_A, SD_B)  # the per-seed difference's SD: the unit of ``effect``
Arrays = tuple[np.ndarray, ...]


Draw = Callable[[int, float, np.random.Generator], tuple[Arrays, Any]]
Test = Callable[[Arrays, Any, np.random.Generator], Trial]


def _draw_values(paired: bool) -> Draw:
    """(a (S,), b (S,)) per-seed effects with a - b of mean ``effect`` * SD_DIFF (paired: a shared seed
    offset; else independent seeds)."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, float]:
        base = rng.normal(0, SD_SEED, n_seeds) if paired else np.zeros(n_seeds)
        other = base if paired else rng.normal(0, SD_SEED, n_seeds)
        a = base + 1.0 + effect * SD_DIFF + rng.normal(0, SD_A, n_seeds)
        b = other + 1.0 + rng.normal(0, SD_B, n_seeds)
        # independent seeds share no offset: each condition's seeds then vary by their offsets too
        return (a, b), effect * SD_DIFF

    return draw


def _test_values(paired: bool, alternative: Alternative) -> Test:
    def test(arrays: Arrays, truth: float, rng: np.random.Generator) -> Trial:
        st = difference_statistics(arrays[0], arrays[1], alternative, paired)
        return {"p": st.p, "covered": bool(st.ci[0] <= truth <= st.ci[1]), "warned": False,
                "contradicted": bool(st.contradicted)}  # fmt: skip

    return test


def _regions(prof: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The declared regions of the u_shape scenarios: blocks 1-2, 3-5 and 10-12 (region means, (S,))."""
    return prof[:, [0, 1]].mean(1), prof[:, [2, 3, 4]].mean(1), prof[:, [9, 10, 11]].mean(1)


def _dip(prof: np.ndarray) -> np.ndarray:
    from analysis.kinds.u_shape import dip_depth

    return dip_depth(*_regions(prof))


DIP = 6.0  # the null's dip in both conditions (metric units; noise SD 3 in a, 0.5 in b)


def _draw_u(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, float]:
    """Profiles (S, 12) in conditions a and b sharing each seed's offset and slope: a U of depth DIP in
    both, a's deeper by ``effect`` * 3 (a's noise SD); the truth, the difference of the bottleneck
    depths of the mean profiles, is that 3 * ``effect``."""
    shared = rng.normal(0, SD_SEED, (n_seeds, 1)) + rng.normal(0, 0.3, (n_seeds, 1)) * np.arange(12)
    a = simulate_profiles("u", n_seeds, DIP + 3.0 * effect, rng, noise_sd=3.0) + shared
    b = simulate_profiles("u", n_seeds, DIP, rng, noise_sd=0.5) + shared
    return (a, b), 3.0 * effect


def _test_u(arrays: Arrays, truth: float, rng: np.random.Generator) -> Trial:
    """``exceeds`` of the bottleneck depth, a minus b, paired by seed."""
    st = difference_statistics(_dip(arrays[0]), _dip(arrays[1]), "greater", True)
    return {"p": st.p, "covered": bool(st.ci[0] <= truth <= st.ci[1]), "warned": False,
            "contradicted": bool(st.contradicted)}  # fmt: skip


def _draw_holds(boundary: bool) -> Draw:
    """Profiles in two conditions: a step-down (the u_shape null: late contrast 0) in a and a clear U in
    b (the IUT's least favourable null: one condition at its boundary, the other true); at ``effect`` > 0
    both are U's of that depth. REJECTED boundary: a step-down in both."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, Any]:
        if effect > 0:
            return tuple(simulate_profiles("u", n_seeds, effect, rng) for _ in range(2)), None
        shapes = ("step_down", "step_down") if boundary else ("step_down", "u")
        return tuple(simulate_profiles(s, n_seeds, 20.0, rng) for s in shapes), None

    return draw


def _test_holds(arrays: Arrays, truth: Any, rng: np.random.Generator) -> Trial:
    stats_ = [u_shape_statistics(*_regions(prof)) for prof in arrays]
    ps = [s.p for s in stats_]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    from analysis.kinds.base import combined_against

    against = [combined_against(s.p_against, "every") for s in stats_]
    return {"p": p, "covered": None, "warned": False, "contradicted": contradiction(against, "every")}


def _draw_controls(boundary: bool) -> Draw:
    """Own condition: a U of depth 20 (clearly true); control: the same U (the exceeds null), sharing
    each seed's offset. At ``effect`` > 0 the own dip is deeper by ``effect`` * 3. REJECTED boundary:
    the own claim just true (a step-down) and the control's depth equal to it."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, Any]:
        shared = rng.normal(0, SD_SEED, (n_seeds, 1))
        shape = "step_down" if boundary else "u"
        own = simulate_profiles(shape, n_seeds, 20.0 + 3.0 * effect, rng, noise_sd=3.0) + shared
        ctrl = simulate_profiles(shape, n_seeds, 20.0, rng, noise_sd=0.5) + shared
        return (own, ctrl), None

    return draw


def _test_controls(arrays: Arrays, truth: Any, rng: np.random.Generator) -> Trial:
    from analysis.kinds.base import combined_against

    own = u_shape_statistics(*_regions(arrays[0]))
    ex = difference_statistics(_dip(arrays[0]), _dip(arrays[1]), "greater", True)
    ps = [own.p, ex.p]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    against = [combined_against(own.p_against, "every"), *ex.p_against]
    return {"p": p, "covered": None, "warned": False, "contradicted": contradiction(against, "every")}


def _boundary(draw: Draw) -> Callable[[int, np.random.Generator], tuple[Arrays, Any]]:
    return lambda n_seeds, rng: draw(n_seeds, 0.0, rng)


def _value_scenarios(alternative: Alternative, name: str) -> dict[str, Scenario]:
    sides = "one-sided a > b" if alternative == "greater" else "two-sided"
    return {
        f"{name}_paired": Scenario(
            f"equal effects ({sides}), seed SD 3 vs 0.3, shared seed offset SD 5; paired t",
            draw=_draw_values(True),
            test=_test_values(True, alternative),
        ),
        f"{name}_welch": Scenario(
            f"equal effects ({sides}), seed SD 3 vs 0.3, different seeds; Welch t",
            draw=_draw_values(False),
            test=_test_values(False, alternative),
        ),
    }


def _calibration_exceeds() -> dict[str, Scenario]:
    return {
        **_value_scenarios("greater", "exceeds"),
        "exceeds_u_shape": Scenario(
            "equal dips (depth 6) in a and b, noise SD 3 vs 0.5, shared seed offset and slope; bottleneck "
            "depth, paired t",
            draw=_draw_u,
            test=_test_u,
        ),
        "controls_u_shape": Scenario(
            "u_shape with a control: own U clearly true, the control's dip equal (noise SD 3 vs 0.5); "
            "REJECTED: own step-down, control equal",
            draw=_draw_controls(False),
            test=_test_controls,
            boundary=_boundary(_draw_controls(True)),
        ),
    }


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
