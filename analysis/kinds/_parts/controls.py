"""The ``controls: [names]`` feature of any claim: the claim holds in its own condition and its per-seed
effect exceeds the same claim's in each control (:func:`apply_controls`, called by the verdicts), and what
the report says and draws of it (:func:`explain_controls`, :func:`controls_figures`).

Its calibration scenario (``controls_u_shape``) is in ``analysis.kinds._parts.versus_scenarios``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.difference import _difference_details, compare_effects, in_condition
from analysis.kinds._parts.difference_display import difference_lines, effects_figure
from analysis.kinds._parts.display import FigureContext
from analysis.kinds._parts.outcome import Outcome
from analysis.kinds._parts.rejection import contradiction
from analysis.kinds._parts.table import TableView
from vitstudy_core.fmt import fmt_p, unit_of

if TYPE_CHECKING:
    from analysis.report.figures import Figure


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


def explain_controls(claim: ClaimBase, details: dict[str, Any]) -> list[str]:
    """For a claim with controls: its effect beside each control's, and the exceeds test (report lines)."""
    unit = unit_of(claim.metric)
    lines = [
        f"own test p {fmt_p(details.get('own_p'))}; controls: {', '.join(claim.controls)} (p = the largest)"
    ]
    for test in (details.get("controls") or {}).values():
        lines += difference_lines(test["sides"], test["difference"], details.get("statistic", ""), unit)
    return lines


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
