"""What the Python API returns: :class:`Verdicts` (tested claims) and :class:`StudyResult` (a finished study
or sweep folder), both as pandas DataFrames and matplotlib figures, with a rich view in Jupyter.

The numbers are the study's own: ``verdicts.json``'s claims (``analysis.verdicts.ClaimResult``), the tidy
table (``analysis.table``), the report's figures (``analysis.report.sections.build_sections``, which asks each claim's
kind for its figures) and the t interval of ``analysis.inference``. Nothing here recomputes a verdict.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.verdicts import ClaimResult, format_verdicts
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of

if TYPE_CHECKING:
    import matplotlib.figure

    from analysis.report.figures import Figure, ReportFigure
    from analysis.report.sections import ReportInput
    from study.pipeline.orchestrate import StudyOutcome
    from study.schema import Hypothesis

# the report's verdict colours (analysis/report/page.py's CSS), so a notebook reads like the report
_COLOURS = {"ACCEPTED": "#2e7d32", "REJECTED": "#c62828", "INCONCLUSIVE": "#6d6d6d"}


def verdict_frame(results: list[ClaimResult]) -> pd.DataFrame:
    """One row per claim (index: its name) and every number of its ``verdicts.json`` entry as a column.

    Nested mappings are flattened with dots (``subset.dataset``, ``details.bottleneck_depth.mean``,
    ``registration.status``); ``bootstrap_ci`` becomes ``bootstrap_ci_low`` / ``bootstrap_ci_high``; lists
    (``seeds_used``, ``warnings``, per-seed values) stay lists in their cell. JSON null is NaN.
    """
    rows = []
    for r in results:
        d = r.to_dict()
        lo, hi = d.pop("bootstrap_ci") or (None, None)
        d["bootstrap_ci_low"], d["bootstrap_ci_high"] = lo, hi
        rows.append(d)
    if not rows:
        return pd.DataFrame()
    frame = pd.json_normalize(rows, sep=".")
    numeric = ["effect", "ci_low", "ci_high", "p_value", "p_adjusted", "power"]
    numeric += ["bootstrap_ci_low", "bootstrap_ci_high"]
    frame[numeric] = frame[numeric].astype(float)  # null -> NaN, so the columns compare as numbers
    return frame.set_index("name")


def _verdict_table_html(results: list[ClaimResult]) -> str:
    """The verdict table as HTML, each verdict cell in the report's colour."""
    e = html.escape
    head = ["claim", "kind", "metric", "verdict", "effect (95% CI)", "p", "p (adjusted)", "seeds"]
    out = ['<table class="study-verdicts"><thead><tr>']
    out += [f'<th style="text-align:left">{e(h)}</th>' for h in head]
    out.append("</tr></thead><tbody>")
    for r in results:
        unit = unit_of(r.metric)
        verdict = f"{r.verdict} (post hoc)" if r.post_hoc else r.verdict
        cells = [
            e(r.name),
            e(r.kind),
            e(r.metric),
            f'<b style="color:{_COLOURS.get(r.verdict, "#222")}">{e(verdict)}</b>',
            e(f"{fmt_num(r.effect)}{unit} ({fmt_num(r.ci_low)}, {fmt_num(r.ci_high)})"),
            e(fmt_p(r.p_value)),
            e(fmt_p(r.p_adjusted)),
            str(r.n_seeds),
        ]
        out.append("<tr>" + "".join(f'<td style="text-align:left">{c}</td>' for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


@dataclass
class Verdicts:
    """Tested claims (:func:`study.api.analyze`): iterable over ``analysis.verdicts.ClaimResult``.

    Attributes:
        results: one result per claim, in the claims' order.
        note: a line about the registration (``analyze`` on a table file without ``registration.json``
            beside it), or None.
    """

    results: list[ClaimResult]
    note: str | None = None

    @property
    def frame(self) -> pd.DataFrame:
        """:func:`verdict_frame`: one row per claim, every number in a column."""
        return verdict_frame(self.results)

    def __iter__(self) -> Iterator[ClaimResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, key: int | str) -> ClaimResult:
        """A result by position or by claim name."""
        return self.results[_claim_index(self.results, key)]

    def __str__(self) -> str:
        """The CLI's plain-text table (``analysis.verdicts.format_verdicts``)."""
        return format_verdicts(self.results)

    def to_dicts(self) -> list[dict[str, Any]]:
        """JSON-safe dicts, as ``python -m study analyze --json`` prints them."""
        return [r.to_dict() for r in self.results]

    def _repr_html_(self) -> str:
        return _verdict_table_html(self.results)


def _claim_index(results: list[ClaimResult], key: int | str) -> int:
    names = [r.name for r in results]
    if isinstance(key, int) and not isinstance(key, bool):
        if -len(results) <= key < len(results):
            return key % len(results)
    elif key in names:
        return names.index(key)
    raise StudyError(
        f"expected a claim name {names} or an index below {len(names)}, got {key!r}", None, "claim"
    )


def _show_as_png(cls: type[ReportFigure]) -> None:
    """In IPython, display ``cls`` (a Figure subclass) by its own ``_repr_png_``: the inline backend's
    printer for every matplotlib Figure, which IPython tries before ``_repr_png_``, would redraw the image
    with margins and resampled. Nothing outside IPython (it is never imported here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(cls, cls._repr_png_)


def figure_to_matplotlib(fig: Figure) -> matplotlib.figure.Figure:
    """A report figure (rendered PNG) as a matplotlib Figure showing it at its size (no axes drawn).

    The report's figure functions render their figures (``analysis.report.figures``); this holds the exact image
    the report shows, for display or saving from a notebook. It is made without pyplot (no backend, no
    pyplot state) and shows itself inline in Jupyter as the cell's value (``_repr_png_``: the report's
    PNG), whatever the notebook's backend.
    """
    import matplotlib.image

    from analysis.report.figures import ReportFigure

    if fig.png is None:
        raise StudyError(f"figure {fig.name!r} was not drawn: {fig.missing}", None, "claim")
    _show_as_png(ReportFigure)
    image = matplotlib.image.imread(io.BytesIO(fig.png), format="png")
    dpi = 90
    out = ReportFigure(fig.png, figsize=(image.shape[1] / dpi, image.shape[0] / dpi), dpi=dpi)
    ax = out.add_axes((0, 0, 1, 1))
    ax.imshow(image)
    ax.set_axis_off()
    return out


@dataclass
class StudyResult:
    """A finished study or sweep (:func:`study.api.run` / :func:`study.api.load`).

    Attributes:
        folder: ``<out>/studies/<name>`` or ``<out>/sweeps/<name>``.
        hypothesis: its validated ``hypothesis.yaml`` (None when that copy cannot be read).
        results: one ``ClaimResult`` per claim (a sweep's: its claims over knobs).
        inp: what its report shows (``analysis.report.sections.ReportInput``: table, runs, labels, ...).
        payload: ``verdicts.json`` as read.
        trials: a sweep's ``trials.csv`` (one row per trial x seed), else None.
        outcome: what :func:`study.api.run` trained, reused and failed (None after :func:`load`).
        report_path: the ``report.html`` the run wrote, if any.
    """

    folder: Path
    hypothesis: Hypothesis | None
    results: list[ClaimResult]
    inp: ReportInput
    payload: dict = field(default_factory=dict)
    trials: pd.DataFrame | None = None
    outcome: StudyOutcome | None = None
    report_path: Path | None = None

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def is_sweep(self) -> bool:
        return self.trials is not None

    @property
    def verdicts(self) -> pd.DataFrame:
        """One row per claim (index: claim name), every number of ``verdicts.json`` in columns
        (:func:`verdict_frame`)."""
        return verdict_frame(self.results)

    @property
    def table(self) -> pd.DataFrame:
        """The tidy table (``analysis.table.COLUMNS``; a sweep's also has a column per knob)."""
        if self.inp.table is None:
            raise StudyError("table.parquet is missing or unreadable", str(self.folder / "table.parquet"))
        return self.inp.table

    @property
    def sequential(self) -> dict | None:
        """The looks of a study run until decided (``verdicts.json`` ``sequential``), else None."""
        return self.payload.get("sequential")

    @property
    def conditions(self) -> list[str]:
        """The design's conditions (cells) in the table, in order; [] for a design without conditions."""
        from analysis.table import conditions_of

        return conditions_of(self.table)

    def profile(
        self,
        metric: str,
        dataset: str | None = None,
        epoch: int | str = "last",
        token_set: str = "all",
        condition: str | None = None,
    ) -> pd.DataFrame:
        """The metric by layer: one row per seed, then ``mean``, ``ci_low``, ``ci_high`` (the two-sided 95% t
        interval of the mean across seeds, ``analysis.inference.t_test``) and ``n`` (seeds with a value).

        Args:
            metric: a metric of the table (``eed_pct``, ``spectral_entropy``, an observable, ...).
            dataset: the dataset (default: the table's only one; with several, required).
            epoch: a checkpoint epoch or ``last`` (the largest of the slice; 0 in an untrained cell).
            token_set: ``all``, ``cls`` or ``patch``.
            condition: the design's condition (:attr:`conditions`; with several, required: a profile never
                averages the runs of different conditions).

        Returns:
            (S + 4, L) DataFrame: index ``seed`` (the seeds, then the four summary rows), columns the
            layers in depth order; NaN where a seed has no value (and the CI where fewer than 2 seeds do).
        """
        from analysis.table import seed_profile

        return seed_profile(self.table, metric, dataset, epoch, token_set, str(self.folder), condition)

    def figures(self, claim: int | str) -> list[Figure]:
        """The report's figures of one claim (``analysis.report.sections.build_sections``), rendered PNGs with what
        each drew (``analysis.report.figures.Figure``)."""
        from analysis.report.sections import build_sections

        i = _claim_index(self.results, claim)
        one = replace(self.inp, claims=[self.inp.claims[i]], results=[self.results[i]])
        return build_sections(one)[0].figures

    def figure(self, claim: int | str, which: int = 0) -> matplotlib.figure.Figure:
        """The report's figure ``which`` (0: the kind's key figure, e.g. the profile) of a claim (name or
        index), as a matplotlib Figure (:func:`figure_to_matplotlib`)."""
        figs = self.figures(claim)
        if not -len(figs) <= which < len(figs):
            raise StudyError(f"expected a figure index below {len(figs)}, got {which}", None, "which")
        return figure_to_matplotlib(figs[which])

    def report(self, path: str | Path | None = None) -> Path:
        """Write ``report.html`` and ``report.md`` (figures under ``figures/``) into the folder ``path``
        (default: the study's own folder); returns the HTML path."""
        from analysis.report.page import write_report

        target = Path(path) if path is not None else self.folder
        if self.trials is not None and self.hypothesis is not None:
            from study.sweep.report import sweep_report

            return sweep_report(target, self.hypothesis, self.inp, self.trials, None)
        return write_report(target, self.inp)[0]

    def __str__(self) -> str:
        return f"{'sweep' if self.is_sweep else 'study'} {self.name} ({self.folder})\n" + format_verdicts(
            self.results
        )

    def _repr_html_(self) -> str:
        """The verdict table in the report's colours and the first claim's key figure (inline PNG)."""
        e = html.escape
        out = [f"<h3>{'sweep' if self.is_sweep else 'study'} {e(self.name)}</h3>"]
        out.append(f"<p><code>{e(str(self.folder))}</code>; {len(self.inp.runs)} runs</p>")
        out.append(_verdict_table_html(self.results))
        try:
            key = next((f for f in self.figures(0) if f.png is not None), None) if self.results else None
        except StudyError:
            key = None
        if key is not None:
            data = base64.b64encode(key.png or b"").decode("ascii")
            out.append(
                f'<figure><img alt="{e(key.caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(key.caption)}</figcaption></figure>"
            )
        return "".join(out)


def read_result(folder: Path, outcome: StudyOutcome | None = None) -> StudyResult:
    """The :class:`StudyResult` of a study or sweep folder (``verdicts.json``, ``table.parquet``,
    ``hypothesis.yaml``; a sweep's ``trials.csv``), as ``python -m study report`` reads it.

    Raises:
        StudyError: no ``verdicts.json`` (the study has not finished), or it cannot be read.
    """
    from analysis.report.page import read_study
    from study.schema import load_hypothesis

    folder = Path(folder)
    if not (folder / "verdicts.json").is_file():
        raise StudyError("expected a study folder with verdicts.json (run the study first)", str(folder))
    try:  # the study's own copy of its file gives the typed claims; the rest goes on without it
        hyp: Hypothesis | None = load_hypothesis(folder / "hypothesis.yaml")
    except StudyError:
        hyp = None
    trials = None
    if (folder / "trials.csv").is_file():
        try:
            trials = pd.read_csv(folder / "trials.csv")
        except (OSError, ValueError) as exc:
            raise StudyError(f"cannot read trials.csv ({type(exc).__name__}: {exc})", str(folder)) from None
    claims = None if hyp is None else list(hyp.claims)
    if hyp is not None and trials is not None:
        claims = [c for c in hyp.claims if c.knob() is not None]
    title, description = (hyp.name, hyp.description.strip()) if hyp else (folder.name, "")
    order = hyp.design.condition_names() if hyp else None  # the conditions grid in the file's order
    inp = read_study(folder, title, description, claims, conditions=order)
    payload = json.loads((folder / "verdicts.json").read_text())
    if outcome is not None and outcome.unchanged:  # an unchanged rerun (study.rerun): the folder's own
        outcome.results, outcome.table = inp.results, inp.table if inp.table is not None else outcome.table
    results = outcome.results if outcome is not None else inp.results
    report = outcome.report if outcome is not None else None
    return StudyResult(folder, hyp, results, inp, payload, trials, outcome, report)
