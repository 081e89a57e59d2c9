"""A study's results as a page people can look at: ``report.html`` (self-contained) and ``report.md``.

    python -m study report study_results/studies/u_shape

:func:`write_report` takes typed input (:class:`ReportInput`: the validated claims and their
``ClaimResult``s, the tidy table, the runs) and writes:

* ``report.html``: one file, images embedded as base64 PNG, inline CSS, no script and no external URL,
  so it opens from disk anywhere;
* ``report.md``: the same summary in Markdown, its figures saved as ``figures/*.png`` next to it.

Content: the hypothesis text; the verdict table; per claim what its test found (each kind's
``explain``: contrasts with per-seed values, CIs and p; the bottleneck; ...), the verdict's reason, the
power and seeds needed, warnings and excluded seeds, the figures its kind asks for (``analysis.kinds``)
and its effect with the 95% CI; covariance heatmaps at the first and last checkpoint; the command and
package versions that reproduce it. Anything missing or unreadable is listed under "Missing" and marked
where it would have been; the report never fails because one artifact is bad. This module never imports
torch.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.figures import Figure, covariance_figures, effect_figure
from analysis.kinds import FigureContext, get_kind
from analysis.kinds._controls import controls_figures, explain_controls
from analysis.verdicts import INCONCLUSIVE, ClaimResult
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.io import atomic_write_bytes, atomic_write_text
from vitstudy_core.provenance import package_versions
from vitstudy_core.runfolder import RunFolder


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


def read_study(
    study_dir: Path, title: str, description: str, claims: list | None, runs_dir: Path | None = None
) -> ReportInput:
    """A :class:`ReportInput` from what ``run`` left in ``study_dir`` (``verdicts.json``, ``table.parquet``).

    ``claims``: the validated claims of the study's hypothesis file (None when it could not be read).

    Raises:
        StudyError: ``study_dir`` has no readable ``verdicts.json`` (nothing to report on).
    """
    study_dir = Path(study_dir)
    vpath = study_dir / "verdicts.json"
    if not vpath.is_file():
        raise StudyError("no verdicts.json here (expected a study folder written by `run`)", str(study_dir))
    try:
        verdicts = json.loads(vpath.read_text())
        if not isinstance(verdicts, dict):
            raise TypeError(f"expected a JSON object, got {type(verdicts).__name__}")
        results = [ClaimResult.from_dict(c) for c in verdicts.get("claims", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StudyError(f"cannot read verdicts ({type(exc).__name__}: {exc})", str(vpath)) from None
    missing = []
    if claims is None:
        missing.append("hypothesis.yaml unreadable; claim figures not shown")
        claims = [None] * len(results)
    for claim, result in zip(claims, results, strict=False):
        result.unit = effect_unit(claim, result)  # verdicts.json does not keep it (ClaimResult.unit)
    table = None
    try:
        table = pd.read_parquet(study_dir / "table.parquet")
    except Exception as exc:  # noqa: BLE001 - missing or corrupt: report what we have
        missing.append(f"table.parquet unreadable ({type(exc).__name__}); claim figures not shown")
    preface = conditions_preface(table, [c for c in claims if c is not None])
    return ReportInput(
        preface=preface,
        preface_title="Conditions" if preface else "Sweep",
        title=verdicts.get("hypothesis", title),
        description=description,
        claims=list(claims) + [None] * (len(results) - len(claims)),
        results=results,
        table=table,
        runs_dir=Path(runs_dir) if runs_dir else study_dir.parent.parent / "runs",
        runs=verdicts.get("runs", []),
        labels=verdicts.get("labels", {}),
        reused=verdicts.get("reused", []),
        failed=verdicts.get("failed", {}),
        file=verdicts.get("file"),
        command=verdicts.get("command"),
        missing=missing,
        sequential=verdicts.get("sequential"),
    )


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
        f"{adjusted}; {result.n_seeds} seeds ({', '.join(map(str, result.seeds_used))})"
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
            f"{result.seeds_needed} seeds"
            if result.seeds_needed
            else "no number of seeds (the effect points the other way)"
        )
        lines.append(f"power {fmt_num(result.power)} at the observed effect; 80% power needs {need}")
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [f"seed {s} excluded: {why}" for s, why in result.seeds_excluded.items()]
    return lines


def build_sections(inp: ReportInput) -> list[Section]:
    """One :class:`Section` per claim: findings, the kind's figures and the effect plot."""
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
            f.name = f"claim{i + 1}_{f.name}"
        sections.append(
            Section(
                f"Claim {i + 1}: {result.name}",
                result,
                subset_text(claim, result),
                findings(claim, result),
                figures,
                unit,
            )
        )
    return sections


def study_colours(table: pd.DataFrame | None) -> dict[str, str]:
    """The study's condition palette (``analysis.palette.condition_colours`` of its table's conditions;
    {} without conditions), decided once for every figure of its report."""
    from analysis.palette import condition_colours
    from analysis.table import conditions_of

    return condition_colours(conditions_of(table)) if table is not None else {}


def _rows_of(table: pd.DataFrame, claim) -> pd.DataFrame:
    """The rows a claim's figures draw: its condition's, in a table with conditions (claims across
    conditions select their own)."""
    condition = claim.subset.condition
    if condition is None or "condition" not in table.columns:
        return table
    return table[table["condition"].astype(str) == condition]


def _run_environment(inp: ReportInput) -> dict:
    for key in inp.runs:
        env = (RunFolder(inp.runs_dir / key).read_result() or {}).get("environment") or {}
        if env:
            return env
    return {}


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
.ACCEPTED{color:#2e7d32;font-weight:bold}.REJECTED{color:#c62828;font-weight:bold}
.INCONCLUSIVE{color:#6d6d6d;font-weight:bold}
figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}img{max-width:100%;height:auto}
.missing{background:#fff3e0;border-left:4px solid #ef6c00;padding:6px 10px}
pre{background:#f6f6f6;padding:8px;overflow-x:auto}
.findings li{margin:2px 0}.findings li.warning{color:#8a4b00}
"""


_HEADERS = ["claim", "kind", "metric", "subset", "verdict", "effect (95% CI)", "p", "p (Holm)", "seeds"]


def header_lines(inp: ReportInput) -> list[str]:
    """Registration time and status of each claim, and where a sequential study stopped."""
    lines = []
    for r in inp.results:
        reg = r.registration
        if reg:
            extra = f" (its data existed from {reg['data_from']})" if reg.get("data_from") else ""
            extra += f" ({reg['reason']})" if reg.get("reason") else ""  # why: which runs existed before
            extra += (
                f"; a new registration was started {reg['new_registration']}"
                if reg.get("new_registration")
                else ""
            )
            family = "; adjusted with the exploratory claims" if r.post_hoc else ""
            lines.append(f"claim {r.name}: registered {reg['registered_at']}, {reg['status']}{extra}{family}")
    seq = inp.sequential
    if seq:
        looks = "; ".join(
            f"look {lk['look']}: {lk['seeds']} seeds, alpha spent {lk['alpha_spent']:.3g}"
            for lk in seq["looks"]
        )
        lines.append(
            f"sequential seeds ({seq['spending']} spending over at most {seq['max_seeds']} seeds, "
            f"batches of {seq['batch']}): {len(seq['looks'])} looks ({looks}); stopped at {seq['stopped_at']} "
            f"seeds: {seq['stopped_because']}"
        )
    return lines


def _verdict_cell(r: ClaimResult) -> str:
    return f"{r.verdict} (post hoc)" if r.post_hoc else r.verdict


def _verdict_rows(sections: list[Section]) -> list[list[str]]:
    rows = []
    for s in sections:
        r, unit = s.result, s.unit
        rows.append(
            [
                r.name,
                r.kind,
                r.metric,
                s.subset,
                _verdict_cell(r),
                f"{fmt_num(r.effect)}{unit} ({fmt_num(r.ci_low)}, {fmt_num(r.ci_high)})",
                fmt_p(r.p_value),
                fmt_p(r.p_adjusted),
                str(r.n_seeds),
            ]
        )
    return rows


def _reproduce(inp: ReportInput, vers: dict) -> tuple[str, str]:
    command = inp.command or (f"python -m study run {inp.file}" if inp.file else "n/a")
    lines = [f"{k}: {v}" for k, v in vers.items()]
    lines += [f"run environment {k}: {v}" for k, v in _run_environment(inp).items()]
    return command, "\n".join(lines)


def _html(
    inp: ReportInput, sections: list[Section], covs: list[Figure], missing: list[str], vers: dict
) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>study report: {e(inp.title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Study report: {e(inp.title)}</h1>",
    ]
    if inp.description:
        out.append(f'<p class="description">{e(inp.description)}</p>')
    out.append(
        f"<p>{len(inp.runs)} runs ({len(inp.reused)} reused from earlier invocations, {len(inp.failed)} failed).</p>"
    )
    head = header_lines(inp)
    if head:
        out.append('<ul class="registration">' + "".join(f"<li>{e(line)}</li>" for line in head) + "</ul>")
    out.append('<h2>Verdicts</h2><table id="verdicts" class="verdicts"><thead><tr>')
    out += [f"<th>{e(h)}</th>" for h in _HEADERS]
    out.append("</tr></thead><tbody>")
    for sec, row in zip(sections, _verdict_rows(sections), strict=True):
        cls = e(sec.result.verdict)
        cells = [
            f'<td class="{cls}">{e(v)}</td>' if j == 4 else f"<td>{e(v)}</td>" for j, v in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")

    def fig_html(f: Figure) -> str:
        if f.png is None:
            return f'<p class="missing">missing: {e(f.caption)}: {e(f.missing or "")}</p>'
        data = base64.b64encode(f.png).decode("ascii")
        return (
            f'<figure><img alt="{e(f.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(f.caption)}</figcaption></figure>"
        )

    if inp.preface or inp.preface_lines:
        out.append(f"<h2>{e(inp.preface_title)}</h2>")
        out += [f"<p>{e(line)}</p>" for line in inp.preface_lines]
        out += [fig_html(f) for f in inp.preface]
    for sec in sections:
        r = sec.result
        out.append(f"<h2>{e(sec.title)}</h2>")
        out.append(
            f'<p>Verdict <span class="{e(r.verdict)}">{e(r.verdict)}</span>; kind <code>{e(r.kind)}</code>, '
            f"metric <code>{e(r.metric)}</code>, subset <code>{e(sec.subset)}</code>.</p>"
        )
        out.append('<h3>What the test found</h3><ul class="findings">')
        out += [
            f'<li class="warning">{e(line)}</li>'
            if line.startswith(("warning:", "seed "))
            else f"<li>{e(line)}</li>"
            for line in sec.findings
        ]
        out.append("</ul>")
        out += [fig_html(f) for f in sec.figures]
    out.append("<h2>Covariance snapshots</h2>")
    for f in covs:
        if f.png is None and f.missing == "covariance snapshots not recorded":
            out.append('<p class="note">covariance snapshots not recorded</p>')
        else:
            out.append(fig_html(f))
    if missing:
        out.append('<h2>Missing</h2><ul class="missing">')
        out += [f"<li>{e(m)}</li>" for m in missing]
        out.append("</ul>")
    command, vtext = _reproduce(inp, vers)
    out.append(f"<h2>Reproduce</h2><pre>{e(command)}</pre><pre>{e(vtext)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


def _markdown(
    inp: ReportInput,
    sections: list[Section],
    covs: list[Figure],
    missing: list[str],
    vers: dict,
    fig_paths: dict,
) -> str:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    out = [f"# Study report: {inp.title}", ""]
    if inp.description:
        out += [inp.description, ""]
    out += [f"{len(inp.runs)} runs ({len(inp.reused)} reused, {len(inp.failed)} failed).", ""]
    out += [f"- {line}" for line in header_lines(inp)] + ([""] if header_lines(inp) else [])
    out += [
        "## Verdicts",
        "",
        "| " + " | ".join(_HEADERS) + " |",
        "|" + "---|" * len(_HEADERS),
    ]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in _verdict_rows(sections)]
    if inp.preface or inp.preface_lines:
        out += ["", f"## {inp.preface_title}", ""] + inp.preface_lines + [""]
        out += [
            f"![{f.caption}]({fig_paths[f.name]})"
            if f.name in fig_paths
            else f"*missing: {f.caption}: {f.missing}*"
            for f in inp.preface
        ]
    for sec in sections:
        out += ["", f"## {sec.title}", "", "What the test found:", ""]
        out += [f"- {line}" for line in sec.findings]
        out.append("")
        for f in sec.figures:
            out.append(
                f"![{f.caption}]({fig_paths[f.name]})"
                if f.name in fig_paths
                else f"*missing: {f.caption}: {f.missing}*"
            )
            out.append("")
    out += ["## Covariance snapshots", ""]
    for f in covs:
        out.append(f"![{f.caption}]({fig_paths[f.name]})" if f.name in fig_paths else f"*{f.missing}*")
    if missing:
        out += ["", "## Missing", ""] + [f"- {m}" for m in missing]
    command, vtext = _reproduce(inp, vers)
    out += ["", "## Reproduce", "", "```", command, "```", "", "```", vtext, "```", ""]
    return "\n".join(out)


def write_report(study_dir: str | Path, inp: ReportInput) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (figures under ``figures/``) into ``study_dir``.

    Returns:
        (html path, markdown path).
    """
    study_dir = Path(study_dir)
    sections = build_sections(inp)
    missing = list(inp.missing)
    covs = covariance_figures(inp.runs_dir, inp.runs, inp.labels, missing)
    for sec in sections:
        missing += [f"{sec.title}: {f.caption}: {f.missing}" for f in sec.figures if f.missing]
    missing += [
        f"{f.caption}: {f.missing}"
        for f in covs
        if f.missing and f.missing != "covariance snapshots not recorded"
    ]
    vers = package_versions()
    fig_paths: dict[str, str] = {}
    missing += [f"{inp.preface_title.lower()}: {f.caption}: {f.missing}" for f in inp.preface if f.missing]
    for f in [f for s in sections for f in s.figures] + covs + inp.preface:
        if f.png is not None:
            atomic_write_bytes(study_dir / "figures" / f"{f.name}.png", f.png)
            fig_paths[f.name] = f"figures/{f.name}.png"
    html_path, md_path = study_dir / "report.html", study_dir / "report.md"
    atomic_write_text(html_path, _html(inp, sections, covs, missing, vers))
    fault_point("report.write")
    atomic_write_text(md_path, _markdown(inp, sections, covs, missing, vers, fig_paths))
    return html_path, md_path


def conditions_preface(table: pd.DataFrame | None, claims: list) -> list[Figure]:
    """A design with conditions: one condition x dataset grid (:func:`analysis.figures.conditions_grid`) per
    claimed (metric, token set), at most 3, shown before the claims; [] for a table without conditions."""
    if table is None or "condition" not in table.columns or table["condition"].nunique() < 2:
        return []
    from analysis.figures import conditions_grid

    pairs = dict.fromkeys((c.metric, getattr(c.subset, "token_set", "all") or "all") for c in claims)
    colours = study_colours(table)
    return [conditions_grid(table, metric, token_set, colours) for metric, token_set in list(pairs)[:3]]
