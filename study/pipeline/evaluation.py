"""Evaluation: a hypothesis's claims tested on its table, after checking the table has the token metrics
the claims need.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.verdicts import ClaimResult, Families, evaluate_claims
from study.schema import Hypothesis
from vitstudy_core.errors import StudyError


def evaluate(
    hyp: Hypothesis,
    table: pd.DataFrame,
    source: str,
    failed_seeds=None,
    post_hoc: set[str] | None = None,
    runs_dir: Path | None = None,
    fams: Families | None = None,
) -> list[ClaimResult]:
    """Stage 6: every claim tested, adjusted and decided (``analysis.verdicts``); ``post_hoc`` claims
    (registered after their data existed) are adjusted as exploratory. With ``runs_dir`` the runs' probe
    files give each claim its probe-size sensitivity, ``match_tokens`` and ``uncertainty: seeds+probe``.
    ``fams``: the claims' families as the caller resolved them (``analysis.verdicts.families``)."""
    from analysis.probe import ProbeData

    check_token_metrics(hyp, table, source)
    probe = ProbeData.of_table(table, runs_dir) if runs_dir is not None else None
    return evaluate_claims(
        hyp, table, source=source, failed=failed_seeds, post_hoc=post_hoc, probe=probe, fams=fams
    )


def check_token_metrics(hyp: Hypothesis, table: pd.DataFrame, source: str) -> None:
    """A token-count metric (``participation_ratio_bc``) asked of a table that lacks it and the token counts
    (an imported metric log): one line, not an untestable claim, because no rerun of the log can give it."""
    from analysis.spectral import TOKEN_METRICS

    for i, claim in enumerate(hyp.claims):
        if claim.metric not in TOKEN_METRICS or (table.metric == claim.metric).any():
            continue
        if "n_tokens" in table and (table.n_tokens >= 0).any():
            continue
        raise StudyError(
            f"{claim.metric} needs the token counts and fourth-order token sums measured at extraction; this "
            "table (an imported metric log) records neither: import checkpoints instead, or use participation_ratio",
            f"{source}: claims[{i}]",
            "metric",
        )
