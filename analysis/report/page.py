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
where it would have been; the report never fails because one artifact is bad. What each claim's section
says and shows is built in :mod:`analysis.report.sections`; this module reads a study folder
(:func:`read_study`) and renders the page. This module never imports torch.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.report.sections import (
    ReportInput,
    Section,
    build_sections,
    conditions_preface,
    effect_unit,
    verdict_sentence,
)
from analysis.verdicts import ClaimResult
from vitstudy_core.errors import StudyError
from vitstudy_core.faults import fault_point
from vitstudy_core.fmt import fmt_interval, fmt_p
from vitstudy_core.io import atomic_write_bytes, atomic_write_text
from vitstudy_core.provenance import arithmetic_lines, package_versions
from vitstudy_core.runfolder import RunFolder

if TYPE_CHECKING:
    from analysis.report.figures import Figure


def read_study(
    study_dir: Path,
    title: str,
    description: str,
    claims: list | None,
    runs_dir: Path | None = None,
    conditions: list[str] | None = None,
) -> ReportInput:
    """A :class:`ReportInput` from what ``run`` left in ``study_dir`` (``verdicts.json``, ``table.parquet``).

    ``claims``: the validated claims of the study's hypothesis file (None when it could not be read);
    ``conditions``: its design's conditions in the file's order (the conditions grid's order).

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
    preface = conditions_preface(table, [c for c in claims if c is not None], conditions)
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


def _run_environment(inp: ReportInput) -> dict:
    for env in _run_environments(inp).values():
        if env:
            return env
    return {}


def _run_environments(inp: ReportInput) -> dict[str, dict | None]:
    """Run key -> its ``result.json``'s ``environment`` (None where the folder or the field is missing)."""
    return {key: (RunFolder(inp.runs_dir / key).read_result() or {}).get("environment") for key in inp.runs}


def _arithmetic_note(inp: ReportInput) -> list[str]:
    """The note that the runs' arithmetic differs (``vitstudy_core.provenance.arithmetic_lines``'s lead),
    or none when every run agrees (or none recorded it)."""
    lines = arithmetic_lines(_run_environments(inp))
    return lines[:1] if len(lines) > 1 else []


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
.ACCEPTED{color:#00613a;font-weight:bold}.REJECTED{color:#8e0038;font-weight:bold}
.INCONCLUSIVE{color:#4a4a4a;font-weight:bold}
.badge{color:#fff;padding:1px 6px;border-radius:3px}.badge.ACCEPTED{background:#00613a}
.badge.REJECTED{background:#8e0038}.badge.INCONCLUSIVE{background:#4a4a4a}
.verdict-line{font-size:1.05em}
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
            extra = _registration_why(reg)
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
    return lines + _arithmetic_note(inp)


def _registration_why(reg: dict) -> str:
    """Why a claim is post hoc, once and without nested parentheses: its reason (which runs existed
    before), less the registration time the line already gives; else when its data existed from."""
    why = str(reg.get("reason") or "")
    lead = f"registered {reg.get('registered_at')}, "
    if why:
        return f": {why.removeprefix(lead)}"
    return f"; its data existed from {reg['data_from']}" if reg.get("data_from") else ""


def _verdict_cell(r: ClaimResult) -> str:
    return r.label


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
                fmt_interval(r.effect, (r.ci_low, r.ci_high), unit, label=False),
                fmt_p(r.p_value),
                fmt_p(r.p_adjusted),
                str(r.n_seeds),
            ]
        )
    return rows


def _reproduce(inp: ReportInput, vers: dict) -> tuple[str, str]:
    command = inp.command or (f"python -m study run {inp.file}" if inp.file else "n/a")
    lines = [f"{k}: {v}" for k, v in vers.items()]
    lines += arithmetic_lines(_run_environments(inp))  # every run's, and whether they differ
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
    for sec in sections:  # the verdict in one sentence and the figures that show it, then the details
        r = sec.result
        out.append(f"<h2>{e(sec.title)}</h2>")
        label, rest = verdict_sentence(r, sec.unit).split(": ", 1)
        out.append(
            f'<p class="verdict-line"><span class="badge {e(r.verdict)}">{e(label)}</span> {e(rest)}</p>'
        )
        out += [fig_html(f) for f in sec.figures]
        out.append(
            f"<h3>Details</h3><p>kind <code>{e(r.kind)}</code>, metric <code>{e(r.metric)}</code>, subset "
            f'<code>{e(sec.subset)}</code></p><ul class="findings">'
        )
        out += [
            f'<li class="warning">{e(line)}</li>'
            if line.startswith(("warning:", "seed "))
            else f"<li>{e(line)}</li>"
            for line in sec.findings
        ]
        out.append("</ul>")
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
    for sec in sections:  # as the HTML: the verdict sentence, the figures, then the details
        label, rest = verdict_sentence(sec.result, sec.unit).split(": ", 1)
        out += ["", f"## {sec.title}", "", f"**{label}**: {rest}", ""]
        for f in sec.figures:
            out.append(
                f"![{f.caption}]({fig_paths[f.name]})"
                if f.name in fig_paths
                else f"*missing: {f.caption}: {f.missing}*"
            )
            out.append("")
        out += ["Details:", ""]
        out += [f"- {line}" for line in sec.findings]
    out += ["## Covariance snapshots", ""]
    for f in covs:
        out.append(f"![{f.caption}]({fig_paths[f.name]})" if f.name in fig_paths else f"*{f.missing}*")
    if missing:
        out += ["", "## Missing", ""] + [f"- {m}" for m in missing]
    command, vtext = _reproduce(inp, vers)
    out += ["", "## Reproduce", "", "```", command, "```", "", "```", vtext, "```", ""]
    return "\n".join(out)


def _drop_stale_claim_figures(folder: Path, written: set[str]) -> None:
    """Remove the claim figures (``claim<i>_*.png``) this report did not write: a claim removed from the
    file, or a report written before claims were numbered from 0 (its ``claim1_`` was the first claim)."""
    import re

    for path in folder.glob("claim*_*.png") if folder.is_dir() else []:
        if re.match(r"^claim\d+_", path.name) and path.stem not in written:
            path.unlink(missing_ok=True)


def write_report(study_dir: str | Path, inp: ReportInput) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (figures under ``figures/``) into ``study_dir``.

    Returns:
        (html path, markdown path).
    """
    study_dir = Path(study_dir)
    sections = build_sections(inp)
    missing = list(inp.missing)
    from analysis.report.figures import covariance_figures  # matplotlib: only when a report is drawn

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
    _drop_stale_claim_figures(study_dir / "figures", set(fig_paths))
    html_path, md_path = study_dir / "report.html", study_dir / "report.md"
    atomic_write_text(html_path, _html(inp, sections, covs, missing, vers))
    fault_point("report.write")
    atomic_write_text(md_path, _markdown(inp, sections, covs, missing, vers, fig_paths))
    return html_path, md_path
