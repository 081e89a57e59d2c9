"""The plug-in API of a claim kind: every name a kind's module builds on, importable from one place.

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

The names live in the package's private modules, one job each: ``_claim`` (the claim model's base),
``_rejection`` (the REJECTED rule's tests), ``_outcome`` (what a test found), ``_table`` (the table view),
``_selection`` (a claim's slices of it), ``_curves`` (per-seed curves summarised), ``_scenario``
(calibration scenarios), ``_display`` (what the report reads) and ``_registry`` (the kind registry).
"""

from __future__ import annotations

from analysis.kinds._parts.claim import RUN_SCALARS, ClaimBase, Condition, Subset
from analysis.kinds._parts.curves import (
    crossing,
    crossing_lines,
    layer_location,
    no_interior_minimum,
    summarise_layers,
)
from analysis.kinds._parts.display import (
    FigureContext,
    Result,
    condition_figures,
    describe_condition,
    metric_unit,
    per_seed_text,
)
from analysis.kinds._parts.location import bottleneck_text, depth_text, replicates
from analysis.kinds._parts.outcome import (
    Outcome,
    Statistic,
    few_seeds_warning,
    outcome_from_stats,
    paired_outcome,
    std_effect,
    token_count_warnings,
)
from analysis.kinds._parts.registry import KINDS, ClaimKind, get_kind, register_kind
from analysis.kinds._parts.rejection import (
    REJECT_LEVEL,
    Estimate,
    Needs,
    combined_against,
    contradiction,
    holm_min,
    margin_p,
)
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.selection import (
    claim_view,
    complete_seeds,
    condition_values,
    knob_levels_of,
    knob_rows,
    paired,
    select,
    token_counts,
)
from analysis.kinds._parts.table import NotTestable, OneLevel, TableView

__all__ = [
    "KINDS",
    "REJECT_LEVEL",
    "RUN_SCALARS",
    "ClaimBase",
    "ClaimKind",
    "Condition",
    "Estimate",
    "FigureContext",
    "Needs",
    "NotTestable",
    "OneLevel",
    "Outcome",
    "Result",
    "Scenario",
    "Statistic",
    "Subset",
    "TableView",
    "Trial",
    "bottleneck_text",
    "claim_view",
    "combined_against",
    "complete_seeds",
    "condition_figures",
    "condition_values",
    "contradiction",
    "crossing",
    "crossing_lines",
    "depth_text",
    "describe_condition",
    "few_seeds_warning",
    "get_kind",
    "holm_min",
    "knob_levels_of",
    "knob_rows",
    "layer_location",
    "no_interior_minimum",
    "margin_p",
    "metric_unit",
    "outcome_from_stats",
    "paired",
    "paired_outcome",
    "per_seed_text",
    "register_kind",
    "replicates",
    "select",
    "std_effect",
    "summarise_layers",
    "token_count_warnings",
    "token_counts",
]
