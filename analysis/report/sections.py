"""The report's content: its typed input (:class:`ReportInput`) and, per claim, a :class:`Section` with
what its test found (:func:`findings`: each kind's ``explain``, the verdict's reason, power, warnings),
its subset and effect unit, and the figures its kind asks for (:func:`build_sections`); and the
conditions grid a design with conditions opens with (:func:`conditions_preface`). ``analysis.report.page``
renders these as ``report.html`` and ``report.md``. This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.kinds import FigureContext, controls_figures, explain_controls, get_kind
from analysis.kinds.base import replicates
from analysis.verdicts import INCONCLUSIVE, ClaimResult
from vitstudy_core.fmt import fmt_interval, fmt_num, fmt_p, unit_of

if TYPE_CHECKING:
    from analysis.report.figures import Figure


@dataclass
class ReportInput:
    """Everything the report shows, typed.

    Attributes:
        title, description: the hypothesis's name and text.
        claims: the validated claim models (``analysis.kinds``), aligned with ``results``; None where a
            claim's model is not available (its figures are then listed as missing).
        results: one ``ClaimResult`` per claim.
        table: the tidy table (None: figures are listed as missing).
        runs_dir, runs, labels, reused, failed: the run folders, the planned run keys, key -> label, the
            reused keys and the failed keys (key -> reason).
        file, command: the hypothesis file and the command that ran the study.
        missing: what could not be read (shown under "Missing").
        preface, preface_lines: figures and lines shown before the claims (a sweep's objective curves).
        sequential: the looks of a study run ``--until-decided`` (``{spending, max_seeds, batch, looks:
            [{look, seeds, fraction, alpha_spent}], stopped_at, stopped_because}``), or None.

    Each result's ``registration`` (time and status: pre-registered or post hoc) is shown in the header.
    """

    title: str
    description: str
    claims: list
    results: list[ClaimResult]
    table: pd.DataFrame | None
    runs_dir: Path
    runs: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    file: str | None = None
    command: str | None = None
    missing: list[str] = field(default_factory=list)
    preface: list[Figure] = field(default_factory=list)  # figures before the claims (a sweep's curves)
    preface_lines: list[str] = field(default_factory=list)
    preface_title: str = "Sweep"  # the heading of the preface (a design with conditions: "Conditions")
    sequential: dict | None = None


@dataclass
class Section:
    """One claim's part of the report: its result, what its test found, and its figures."""

    title: str
    result: ClaimResult
    subset: str
    findings: list[str]
    figures: list[Figure]
    unit: str = ""  # the effect's unit suffix (``effect_unit``)


def subset_text(claim, result: ClaimResult) -> str:
    """A claim's slice of the table, led by the datasets it lists in declared order (if it lists any); a
    claim over epochs shows the epochs it was tested over instead of the ``subset.epoch`` it never reads."""
    listed = list(getattr(claim, "datasets", None) or [])
    head = f"datasets=[{', '.join(listed)}]" if listed else ""
    subset = dict(result.subset or {})
    if claim is not None and not claim.reads_subset_epoch():
        subset.pop("epoch", None)
        epochs = [int(e) for e in result.details.get("x") or []]
        subset["epochs"] = f"[{', '.join(map(str, epochs))}]" if epochs else None
    sub = ", ".join(f"{k}={v}" for k, v in subset.items() if v is not None)
    return ", ".join(t for t in (head, sub) if t)


def effect_unit(claim, result: ClaimResult) -> str:
    """The unit suffix of a claim's effect as its kind states it (`` pp per unit of clutter`` for a slope);
    the metric's own unit when the claim's definition is not at hand."""
    return get_kind(result.kind).effect_unit(claim) if claim is not None else unit_of(result.metric)


def probe_size_lines(result: ClaimResult) -> list[str]:
    """The probe-size sensitivity of a claim's effect (``details.probe_sizes``): one line per probe size,
    N/4, N/2 and N images, with the tokens behind the subset's token set."""
    rows = result.details.get("probe_sizes") or []
    if not rows:
        return []
    out = [f"probe-size sensitivity of the effect ({result.metric}):"]
    for r in rows:
        n = "/".join(map(str, r["n_tokens"])) or "?"
        out.append(
            f"  {r['probe']:>3} images ({n} tokens): effect {fmt_num(r['effect'])} "
            f"(95% CI {fmt_num(r['ci'][0])}, {fmt_num(r['ci'][1])}), p {fmt_p(r['p'])}"
        )
    return out


def verdict_sentence(result: ClaimResult, unit: str) -> str:
    """``ACCEPTED (post hoc): <the verdict's reason>; effect 1.23 pp (95% CI 0.80, 1.66), p (holm) 0.004,
    5 seeds``: what a claim's report section leads with (its label as the verdict table shows it)."""
    one, many = replicates(result.details)
    label = result.label
    return (
        f"{label}: {result.reason}; effect {fmt_interval(result.effect, (result.ci_low, result.ci_high), unit)}, "
        f"p ({result.adjustment}) {fmt_p(result.p_adjusted)}, {result.n_seeds} {one if result.n_seeds == 1 else many}"
    )


def findings(claim, result: ClaimResult) -> list[str]:
    """What the claim's test found: the kind's own lines, then the verdict's basis, power, warnings, seeds."""
    unit = effect_unit(claim, result)
    lines = list(get_kind(result.kind).explain(claim, result)) if claim is not None else []
    if claim is not None and getattr(claim, "controls", None) and result.details.get("controls"):
        lines += explain_controls(claim, result.details)  # its effect beside each control's
    if result.details.get("method_used"):
        lines.insert(0, f"test used: {result.details['method_used']}")
    adj = result.details.get("adjusted")
    if adj:  # the raw and the adjusted effect side by side (adjust_for)
        raw, fixed = adj["raw"], adj["adjusted"]
        lines.append(
            f"raw effect {fmt_num(raw['effect'])}{unit} (95% CI {fmt_num(raw['ci'][0])}, {fmt_num(raw['ci'][1])}), "
            f"p {fmt_p(raw['p'])} | at equal {adj['for']}: {fmt_num(fixed['effect'])}{unit} (95% CI "
            f"{fmt_num(fixed['ci'][0])}, {fmt_num(fixed['ci'][1])}), p {fmt_p(fixed['p'])} (the verdict's test)"
        )
    # a sequential verdict compares the stage p with the looks' nominal levels: its Holm p is the
    # fixed-sample one of the last look, shown for reference, never "group-sequential-adjusted"
    fixed = result.adjustment.split(", group-sequential")[0]
    adjusted = (
        f"fixed-sample {fixed}-adjusted {fmt_p(result.p_adjusted)} (not used by the sequential verdict)"
        if result.sequential
        else f"{result.adjustment}-adjusted {fmt_p(result.p_adjusted)} at alpha {result.alpha:g}"
    )
    lines.append(
        f"effect {fmt_num(result.effect)}{unit} (95% t CI {fmt_num(result.ci_low)}, {fmt_num(result.ci_high)}; "
        f"bootstrap {fmt_num(result.bootstrap_ci[0])}, {fmt_num(result.bootstrap_ci[1])}); p {fmt_p(result.p_value)}, "
        f"{adjusted}; {result.n_seeds} {replicates(result.details)[1]} ({', '.join(map(str, result.seeds_used))})"
    )
    joint = result.details.get("seeds_probe")
    if joint:
        lo, hi = joint["interval"]
        plo, phi = joint["percentile"]
        lines.append(
            f"seed x probe 95% interval {fmt_num(lo)}, {fmt_num(hi)} (probe SD {fmt_num(joint['sd_probe'])} over "
            f"{joint['replicates']} resamples of {joint['blocks']} image blocks; multibootstrap percentile "
            f"{fmt_num(plo)}, {fmt_num(phi)})"
        )
    lines.append(f"{result.verdict}: {result.reason}")
    population = result.details.get("population")
    if population and (result.details.get("unit") or population.startswith("models like")):
        lines.append(f"the verdict is about {population}")  # a declared unit: images or models
    lines += probe_size_lines(result)
    if result.sequential:
        seq = result.sequential
        lines += [
            f"look {lk['look']} ({lk['seeds']} seeds): stage p {fmt_p(lk['p'])}, nominal level {lk['nominal']:.3g}, "
            f"alpha spent {lk['alpha_spent']:.3g} of {seq['level']:.3g} ({seq['spending']})"
            for lk in seq["looks"]
        ]
    if result.verdict == INCONCLUSIVE and result.n_seeds >= 2:
        need = (
            f"80% power needs {result.seeds_needed} seeds"
            if result.seeds_needed
            else "more seeds cannot give it power: the observed effect points the other way"
        )
        lines.append(f"power {fmt_num(result.power)} at the observed effect; {need}")
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [f"seed {s} excluded: {why}" for s, why in result.seeds_excluded.items()]
    return lines


def build_sections(inp: ReportInput) -> list[Section]:
    """One :class:`Section` per claim: findings, the kind's figures and the effect plot."""
    from analysis.report.figures import Figure, effect_figure  # matplotlib: only when a report is drawn

    sections = []
    colours = study_colours(inp.table)  # one colour per condition in every figure of the report
    for i, (claim, result) in enumerate(zip(inp.claims, inp.results, strict=True)):
        figures: list[Figure] = []
        if inp.table is None or inp.table.empty or claim is None:
            why = "table.parquet unavailable" if claim is not None else "claim definition unavailable"
            figures.append(Figure("profile", "claim figure", missing=why))
        else:
            try:
                ctx = FigureContext(_rows_of(inp.table, claim), claim, result, colours)
                figures += get_kind(result.kind).figures(ctx)
                if getattr(claim, "controls", None):
                    figures += controls_figures(ctx)
            except Exception as exc:  # noqa: BLE001 - one bad claim must not sink the report
                figures.append(Figure("profile", "claim figure", missing=f"{type(exc).__name__}: {exc}"))
        unit = effect_unit(claim, result)
        figures.append(effect_figure(result, unit))
        for f in figures:
            f.name = f"claim{i}_{f.name}"  # numbered from 0, as claims[i] in messages and claim_i/ in MLflow
        sections.append(
            Section(
                f"Claim {i}: {result.name}",
                result,
                subset_text(claim, result),
                findings(claim, result),
                figures,
                unit,
            )
        )
    return sections


def study_colours(table: pd.DataFrame | None) -> dict[str, str]:
    """The study's condition palette (``analysis.report.palette.condition_colours`` of its table's conditions;
    {} without conditions), decided once for every figure of its report."""
    from analysis.report.palette import condition_colours
    from analysis.table import conditions_of

    return condition_colours(conditions_of(table)) if table is not None else {}


def _rows_of(table: pd.DataFrame, claim) -> pd.DataFrame:
    """The rows a claim's figures draw: its condition's, in a table with conditions (claims across
    conditions select their own)."""
    condition = claim.subset.condition
    if condition is None or "condition" not in table.columns:
        return table
    return table[table["condition"].astype(str) == condition]


def conditions_preface(
    table: pd.DataFrame | None, claims: list, order: list[str] | None = None
) -> list[Figure]:
    """A design with conditions: one condition x dataset grid (:func:`analysis.report.figures.conditions_grid`) per
    claimed (metric, token set), at most 3, shown before the claims, its conditions in ``order`` (the
    file's; None: the table's); [] for a table without conditions."""
    if table is None or "condition" not in table.columns or table["condition"].nunique() < 2:
        return []
    from analysis.report.figures import conditions_grid

    pairs = dict.fromkeys((c.metric, getattr(c.subset, "token_set", "all") or "all") for c in claims)
    colours = study_colours(table)
    return [
        conditions_grid(table, metric, token_set, colours, order) for metric, token_set in list(pairs)[:3]
    ]
