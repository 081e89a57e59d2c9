"""One claim's outcome on the table: its kind's test (controls applied; a metric the table lacks makes it
not testable instead of an error) and, where the claim asks, the same test on smaller probes and at a
matched token count (the probe-size sensitivity and the seed x probe interval).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from analysis.kinds import apply_controls, get_kind
from analysis.kinds.base import NotTestable, Outcome, TableView
from analysis.probe import ProbeData, claim_rows, matched_table, multibootstrap, sensitivity
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_num, fmt_p
from vitstudy_core.runfolder import BLOCKS

if TYPE_CHECKING:
    import pandas as pd


def _evaluate_one(view: TableView, claim: Any, where: str, excluded: dict[int, str]) -> Outcome:
    """The claim's kind evaluates it; a metric the table lacks makes it not testable instead of an error."""
    try:
        out = get_kind(claim.kind).evaluate(view, claim, where=where, excluded=excluded)
        return apply_controls(view, claim, out, where, excluded) if claim.controls else out
    except NotTestable as exc:
        nan, why = float("nan"), f"{exc.why}: {exc.message}"
        return Outcome(
            p_value=nan, effect=nan, ci=(nan, nan), seeds_excluded=excluded, warnings=[why], not_testable=why
        )


def _probe_outcome(
    view: TableView,
    claim: Any,
    where: str,
    excluded: dict[int, str],
    probe: ProbeData | None,
    study_match: bool,
    names: list[str] | None = None,
) -> Outcome:
    """A claim's outcome, at a matched token count if it asks, with the probe's numbers in its details
    (``analysis.probe``): the effect at N/4, N/2 and N probe images, the matched comparison behind an
    unequal-count warning, and the seed x probe intervals of ``uncertainty: seeds+probe``."""
    if getattr(claim, "unit", None) == "images":
        return images_outcome(view, claim, where, excluded, probe, names)
    match = claim.match_tokens if claim.match_tokens is not None else study_match
    if (match or claim.uncertainty != "seeds") and probe is None:
        # a table alone (python -m study analyze, the preflight): tested over seeds, never ACCEPTED
        o = _evaluate_one(view, claim, where, excluded)
        what = "match_tokens" if match else "uncertainty: seeds+probe"
        o.details["probe_unavailable"] = what
        o.warnings.append(
            f"{what} needs the runs' probe files; a table alone has none: tested over seeds only"
        )
        return o
    table, matched = view.table, None
    assert probe is not None or not match  # a table alone returned above
    if match and probe is not None:
        table, matched = matched_table(view.table, claim, probe, where)
    o = _evaluate_one(TableView.of(table) if match else view, claim, where, excluded)
    if probe is None or o.not_testable:
        return o
    kind = get_kind(claim.kind)

    def evaluate(rows: pd.DataFrame) -> Outcome:
        return kind.evaluate(TableView(rows), claim, where=where, excluded={})

    if match:
        plain = _evaluate_one(view, claim, where, dict(excluded))
        o.details["matched_tokens"] = {"n_tokens": matched, "unmatched": _summary(plain)}
        o.warnings.append(
            f"tested at a matched token count of {matched} (seeded subsample of the larger populations); "
            f"unmatched: {_summary_text(plain)}"
        )
    else:
        o.warnings = [_with_matched(w, view.table, claim, probe, where, evaluate) for w in o.warnings]
    # the probe sizes are the unmatched populations' (the N row is the claim's own table unmatched)
    o.details["probe_sizes"] = sensitivity(view.table, claim, probe, evaluate)
    if claim.uncertainty == "seeds+probe" and math.isfinite(o.effect):
        o.details["seeds_probe"] = multibootstrap(table, claim, probe, evaluate, o.effect, o.ci, where)
    return o


def images_outcome(
    view: TableView,
    claim: Any,
    where: str,
    excluded: dict[int, str],
    probe: ProbeData | None,
    names: list[str] | None,
) -> Outcome:
    """A ``unit: images`` claim: its kind's test on jackknife pseudo-values over probe blocks
    (``analysis.units``); without the runs' probe files (a table alone) it is not testable."""
    from analysis.units import images_table

    if probe is None or not probe.has(BLOCKS):
        why = "unit: images needs the runs' probe blocks (blocks.npz; set design.probe.blocks and rerun the runs)"
        nan = float("nan")
        return Outcome(
            p_value=nan, effect=nan, ci=(nan, nan), seeds_excluded=excluded, warnings=[why], not_testable=why
        )
    pseudo = images_table(view.table, claim, probe, where, names)
    o = _evaluate_one(TableView.of(pseudo), claim, where, {})
    o.details["unit"] = {
        "unit": "images",
        "blocks": int(pseudo.seed.nunique()),
        "test": "jackknife over probe blocks",
    }
    return o


def _summary(o: Outcome) -> dict[str, Any]:
    return {"effect": o.effect, "ci": list(o.ci), "p": o.p_value}


def _summary_text(o: Outcome) -> str:
    return f"effect {fmt_num(o.effect, 3)} (95% CI {fmt_num(o.ci[0], 3)}, {fmt_num(o.ci[1], 3)}), p {fmt_p(o.p_value)}"


def _with_matched(
    warning: str,
    table: pd.DataFrame,
    claim: Any,
    probe: ProbeData,
    where: str,
    evaluate: Callable[[pd.DataFrame], Outcome],
) -> str:
    """An unequal-token-count warning with what the comparison at a matched count gives, where the runs
    allow it (else the warning says why not)."""
    if "different token counts" not in warning:
        return warning
    try:
        matched, n = matched_table(table, claim, probe, where)
        o = evaluate(claim_rows(matched, claim))
    except StudyError as exc:
        return f"{warning}; no matched comparison: {exc.message}"
    return f"{warning}; at a matched count of {n} tokens: {_summary_text(o)} (match_tokens: true tests it)"
