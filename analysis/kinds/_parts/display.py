"""What the report shows of a claim: the :class:`Result` and :class:`FigureContext` a kind's ``explain`` and
``figures`` read, and the helpers they share (figures over conditions, a condition in words, units).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd

    from analysis.report.figures import Figure


class Result(Protocol):
    """What a kind's ``explain`` and ``figures`` read of a claim's result (``analysis.verdicts.ClaimResult``,
    which imports the kinds: so a protocol, not the class)."""

    effect: float
    ci_low: float
    ci_high: float
    details: dict[str, Any]


@dataclass(frozen=True)
class FigureContext:
    """What a kind's ``figures`` may draw from: the tidy table, the validated claim and its result; the
    study's condition palette (``colours``: condition -> colour, ``analysis.report.palette``, decided once per
    study so a condition has one colour in every figure) and, for a claim whose figures compare
    conditions, the y range they all share (``ylim``)."""

    table: pd.DataFrame
    claim: Any  # the kind's ClaimBase subclass
    result: Result  # analysis.verdicts.ClaimResult
    colours: dict[str, str] = field(default_factory=dict)
    ylim: tuple[float, float] | None = None


def condition_figures(ctx: FigureContext) -> list[Figure]:
    """For claims over conditions: the metric by layer at the claim's epoch for every dataset they name,
    the layers each operand reads marked and named (``a``, ``b``; ``a, b`` where both read the same)."""
    from analysis.report.figures import profile_figure

    conds = ctx.result.details.get("conditions") or {}
    datasets = list(dict.fromkeys(c["dataset"] for c in conds.values())) or [ctx.claim.subset.dataset]
    marks: dict[tuple[str, ...], list[str]] = {}
    for name, cond in conds.items():
        marks.setdefault(tuple(cond.get("layers") or ()), []).append(name)
    regions = {", ".join(names): list(layers) for layers, names in marks.items() if layers}
    return [
        profile_figure(
            ctx.table,
            ctx.claim.metric,
            ctx.claim.subset.token_set,
            datasets,
            ctx.claim.subset.epoch,
            regions=regions or None,
            colours=ctx.colours,
            ylim=ctx.ylim,
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


def metric_unit(claim: Any) -> str:
    """The unit suffix of an effect in the metric's own units (`` pp`` for a ``*_pct`` metric, else none)."""
    from vitstudy_core.fmt import unit_of

    return unit_of(claim.metric)
