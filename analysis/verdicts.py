"""From test outcomes to verdicts: Holm across confirmatory claims, then the verdict rule.

Verdict rule (also in the README):

* ACCEPTED: the Holm-adjusted p-value (across the file's confirmatory claims) is below the claim's alpha
  in the claimed direction;
* REJECTED: otherwise, if the evidence excludes the claimed effect (its 95% CI lies entirely on the
  wrong side of zero for a required contrast);
* INCONCLUSIVE: otherwise (including too few seeds or data that allow no test).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd
from statsmodels.stats.multitest import multipletests

from analysis.claims import TESTS, Outcome

ACCEPTED, REJECTED, INCONCLUSIVE = "ACCEPTED", "REJECTED", "INCONCLUSIVE"


@dataclass
class ClaimResult:
    name: str
    kind: str
    metric: str
    subset: dict
    alpha: float
    verdict: str
    effect: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    n_seeds: int
    seeds_used: list[int]
    seeds_excluded: dict[int, str]
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seeds_excluded"] = {str(k): v for k, v in self.seeds_excluded.items()}
        return d


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values; NaN entries stay NaN and do not count towards the family size."""
    finite = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    out = [float("nan")] * len(pvalues)
    if finite:
        adj = multipletests([pvalues[i] for i in finite], method="holm")[1]
        for i, a in zip(finite, adj, strict=True):
            out[i] = float(a)
    return out


def decide(outcome: Outcome, p_adjusted: float, alpha: float) -> str:
    if not math.isnan(p_adjusted) and p_adjusted < alpha:
        return ACCEPTED
    if outcome.contradicted:
        return REJECTED
    return INCONCLUSIVE


def evaluate_claims(
    hyp, table: pd.DataFrame, source: str = "hypothesis", failed: dict[str, dict[int, str]] | None = None
) -> list[ClaimResult]:
    """Test every claim of a hypothesis on a tidy table and apply Holm and the verdict rule.

    Args:
        hyp: a validated ``study.schema.Hypothesis``.
        table: the tidy table (``analysis.table.COLUMNS``).
        source: the hypothesis file name, for error messages.
        failed: per dataset, the seeds whose runs failed (seed -> reason); reported as excluded.
    """
    outcomes = []
    for i, claim in enumerate(hyp.claims):
        excluded = dict((failed or {}).get(claim.subset.dataset, {}))
        outcomes.append(TESTS[claim.kind](table, claim, where=f"{source}: claims[{i}]", excluded=excluded))
    confirm = [i for i, c in enumerate(hyp.claims) if c.confirmatory]
    adjusted = {i: o.p_value for i, o in enumerate(outcomes)}
    for i, a in zip(confirm, holm([outcomes[i].p_value for i in confirm]), strict=True):
        adjusted[i] = a
    results = []
    for i, (claim, o) in enumerate(zip(hyp.claims, outcomes, strict=True)):
        results.append(
            ClaimResult(
                name=claim.name,
                kind=claim.kind,
                metric=claim.metric,
                subset=claim.subset.model_dump(),
                alpha=claim.alpha,
                verdict=decide(o, adjusted[i], claim.alpha),
                effect=o.effect,
                ci_low=o.ci[0],
                ci_high=o.ci[1],
                p_value=o.p_value,
                p_adjusted=adjusted[i],
                n_seeds=len(o.seeds_used),
                seeds_used=o.seeds_used,
                seeds_excluded=o.seeds_excluded,
                warnings=o.warnings,
                details=o.details,
            )
        )
    return results


def _fmt(x: float, digits: int = 1) -> str:
    return "nan" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _fmt_p(p: float) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def format_verdicts(results: list[ClaimResult]) -> str:
    """A plain-text verdict table (one line per claim) followed by warnings and exclusions."""
    rows = [("claim", "verdict", "effect (95% CI)", "p (Holm)", "seeds")]
    for r in results:
        unit = " pp" if r.metric.endswith("_pct") else ""
        rows.append(
            (
                r.name,
                r.verdict,
                f"{_fmt(r.effect, 2)}{unit} ({_fmt(r.ci_low, 2)}, {_fmt(r.ci_high, 2)})",
                _fmt_p(r.p_adjusted),
                str(r.n_seeds),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in results:
        for w in r.warnings:
            lines.append(f"  ! {r.name}: {w}")
        for seed, why in r.seeds_excluded.items():
            lines.append(f"  ! {r.name}: seed {seed} excluded ({why})")
    return "\n".join(lines)
