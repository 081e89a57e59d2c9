"""From test outcomes to verdicts: multiplicity adjustment, then the verdict rule.

Verdict rule (also in the README, "Read a verdict"):

* ACCEPTED: the adjusted p-value (Holm across the file's confirmatory claims) is below the claim's alpha
  in the claimed direction;
* REJECTED: otherwise, if the evidence excludes the claimed effect: its 95% CI lies entirely on the wrong
  side of zero (for an intersection-union claim: for any required contrast), i.e. the opposite is
  significant at 2.5% one-sided; for ``equivalence``, the CI lies entirely outside the margin; or, for an
  effect claim that declares a ``margin``, equivalence within that margin holds (TOST p < alpha);
* INCONCLUSIVE: otherwise (including too few seeds or data that allow no test), reported with the
  achieved power and the seeds needed for 80% power at the observed effect. A claim on fewer than 2
  seeds says so ("1 seed: a test across seeds needs >= 2"); a claim whose metric the table lacks (e.g. an
  imported metric log that does not record it) is "not testable on this source", and the other claims go
  on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from analysis.inference import bootstrap_ci, power_and_seeds_needed, tost
from analysis.kinds import get_kind
from analysis.kinds.base import NotTestable, Outcome, TableView
from core.fmt import fmt_num, fmt_p, unit_of

ACCEPTED, REJECTED, INCONCLUSIVE = "ACCEPTED", "REJECTED", "INCONCLUSIVE"


@dataclass
class ClaimResult:
    """One claim's verdict and every number behind it (``to_dict`` is JSON-safe: NaN becomes null).

    ``power`` and ``seeds_needed`` are filled for INCONCLUSIVE claims: the power a lone one-sided
    t(S-1) test at the claim's alpha has at the observed standardised effect, and the seeds that would
    give 80% (None when the observed effect points the other way or is undefined).
    """

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
    bootstrap_ci: tuple[float, float] = (float("nan"), float("nan"))
    adjustment: str = "holm"
    reason: str = ""
    power: float = float("nan")
    seeds_needed: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seeds_excluded"] = {str(k): v for k, v in self.seeds_excluded.items()}
        return _json_safe(d)

    @classmethod
    def from_dict(cls, d: dict) -> ClaimResult:
        """The inverse of :meth:`to_dict` (null numbers back to NaN, seed keys back to int)."""
        nan = float("nan")
        num = {
            k: nan if d.get(k) is None else float(d[k])
            for k in ("effect", "ci_low", "ci_high", "p_value", "p_adjusted", "power")
        }
        return cls(
            **{
                k: d[k]
                for k in ("name", "kind", "metric", "subset", "alpha", "verdict", "n_seeds", "seeds_used")
            },
            **num,
            seeds_excluded={int(k): v for k, v in (d.get("seeds_excluded") or {}).items()},
            warnings=list(d.get("warnings") or []),
            details=d.get("details") or {},
            bootstrap_ci=tuple(
                nan if v is None else float(v) for v in (d.get("bootstrap_ci") or (None, None))
            ),
            adjustment=d.get("adjustment", "holm"),
            reason=d.get("reason", ""),
            seeds_needed=d.get("seeds_needed"),
        )


def _json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def adjust(pvalues: list[float], method: str) -> list[float]:
    """Adjusted p-values (``holm``, ``bh`` = Benjamini-Hochberg, ``none``); NaN entries stay NaN."""
    finite = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    out = [float("nan")] * len(pvalues)
    if finite and method != "none":
        adj = multipletests([pvalues[i] for i in finite], method={"holm": "holm", "bh": "fdr_bh"}[method])[1]
        for i, a in zip(finite, adj, strict=True):
            out[i] = float(a)
    elif finite:
        for i in finite:
            out[i] = float(pvalues[i])
    return out


def decide(outcome: Outcome, p_adjusted: float, alpha: float, margin: float | None = None) -> tuple[str, str]:
    """The verdict rule (module docstring) and a one-phrase reason."""
    if outcome.not_testable:
        return INCONCLUSIVE, f"not testable on this source: {outcome.not_testable}"
    n = len(outcome.seeds_used)
    if n < 2:  # every claim is tested across seeds: one seed gives a description, never a verdict
        return INCONCLUSIVE, f"{n} seed{'' if n == 1 else 's'}: a test across seeds needs >= 2"
    if not math.isnan(p_adjusted) and p_adjusted < alpha:
        return ACCEPTED, f"adjusted p < {alpha:g} in the claimed direction"
    if outcome.contradicted:
        return REJECTED, "the 95% CI excludes the claimed effect"
    if margin is not None and len(outcome.effect_values) >= 2:
        eq = tost(np.asarray(outcome.effect_values), margin)
        if not math.isnan(eq["p"]) and eq["p"] < alpha:
            return REJECTED, f"equivalence within +-{margin:g} holds (TOST p = {eq['p']:.3g})"
    return INCONCLUSIVE, "neither the claim nor its negation is supported"


def _evaluate_one(view: TableView, claim, where: str, excluded: dict[int, str]) -> Outcome:
    """The claim's kind evaluates it; a metric the table lacks makes it not testable instead of an error."""
    try:
        return get_kind(claim.kind).evaluate(view, claim, where=where, excluded=excluded)
    except NotTestable as exc:
        nan = float("nan")
        return Outcome(
            p_value=nan,
            effect=nan,
            ci=(nan, nan),
            seeds_excluded=excluded,
            warnings=[f"not testable on this source: {exc.message}"],
            not_testable=exc.message,
        )


def evaluate_claims(
    hyp, table: pd.DataFrame, source: str = "hypothesis", failed: dict[str, dict[int, str]] | None = None
) -> list[ClaimResult]:
    """Test every claim of a hypothesis on a tidy table, adjust for multiplicity, apply the verdict rule.

    Confirmatory claims form one Holm family; exploratory claims (``confirmatory: false``) are adjusted
    among themselves with their ``adjust`` method (holm, bh or none).

    Args:
        hyp: a validated ``study.schema.Hypothesis``.
        table: the tidy table (``analysis.table.COLUMNS``).
        source: the hypothesis file name, for error messages.
        failed: per dataset, the seeds whose runs failed (seed -> reason); reported as excluded.
    """
    view = TableView.of(table)
    outcomes = []
    for i, claim in enumerate(hyp.claims):
        reasons: dict[int, dict[str, str]] = {}
        for ds in claim.datasets_named():
            for seed, why in (failed or {}).get(ds, {}).items():
                reasons.setdefault(int(seed), {})[ds] = why
        excluded = {
            seed: next(iter(set(r.values())))
            if len(set(r.values())) == 1
            else "; ".join(f"{d}: {w}" for d, w in r.items())
            for seed, r in reasons.items()
        }
        outcomes.append(_evaluate_one(view, claim, f"{source}: claims[{i}]", excluded))
    families: dict[str, list[int]] = {}
    for i, c in enumerate(hyp.claims):
        families.setdefault("confirmatory" if c.confirmatory else f"exploratory/{c.adjust}", []).append(i)
    adjusted, method_of = {}, {}
    for fam, idx in families.items():
        method = "holm" if fam == "confirmatory" else fam.split("/")[1]
        for i, a in zip(idx, adjust([outcomes[i].p_value for i in idx], method), strict=True):
            adjusted[i], method_of[i] = a, method
    results = []
    for i, (claim, o) in enumerate(zip(hyp.claims, outcomes, strict=True)):
        margin = get_kind(claim.kind).rejection_margin(claim)
        verdict, reason = decide(o, adjusted[i], claim.alpha, margin)
        power, needed = float("nan"), None
        if verdict == INCONCLUSIVE:
            power, needed = power_and_seeds_needed(
                o.std_effect, len(o.seeds_used), claim.alpha / 2 if o.two_sided else claim.alpha
            )
            if o.labellings_per_seed > 1:
                # a randomisation p cannot go below labellings^-S: below that many seeds nothing is accepted
                s_min = int(math.floor(math.log(1 / claim.alpha) / math.log(o.labellings_per_seed))) + 1
                if len(o.seeds_used) < s_min:
                    power = 0.0
                if needed is not None:
                    needed = max(needed, s_min)
        results.append(
            ClaimResult(
                name=claim.name,
                kind=claim.kind,
                metric=claim.metric,
                subset=claim.subset.model_dump(),
                alpha=claim.alpha,
                verdict=verdict,
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
                bootstrap_ci=bootstrap_ci(np.asarray(o.effect_values))
                if o.effect_values
                else (float("nan"),) * 2,
                adjustment=method_of[i],
                reason=reason,
                power=power,
                seeds_needed=needed,
            )
        )
    return results


def format_verdicts(results: list[ClaimResult]) -> str:
    """A plain-text verdict table (one line per claim) followed by warnings and exclusions."""
    rows = [("claim", "verdict", "effect (95% CI)", "p (Holm)", "seeds")]
    for r in results:
        unit = unit_of(r.metric)
        rows.append(
            (
                r.name,
                r.verdict,
                f"{fmt_num(r.effect, 2)}{unit} ({fmt_num(r.ci_low, 2)}, {fmt_num(r.ci_high, 2)})",
                fmt_p(r.p_adjusted),
                str(r.n_seeds),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in results:
        loc, depth = r.details.get("bottleneck_location"), r.details.get("bottleneck_depth")
        if loc and depth and r.n_seeds >= 2:
            lines.append(
                f"  - {r.name}: bottleneck at layer index {fmt_num(loc['mean_layer_index'], 1)} "
                f"({fmt_num(loc['ci'][0], 1)}, {fmt_num(loc['ci'][1], 1)}), depth {fmt_num(depth['mean'], 2)} "
                f"({fmt_num(depth['ci'][0], 2)}, {fmt_num(depth['ci'][1], 2)})"
            )
        if r.verdict == INCONCLUSIVE and r.n_seeds >= 2:
            need = (
                f"{r.seeds_needed} seeds"
                if r.seeds_needed
                else "no number of seeds (effect points the other way)"
            )
            lines.append(
                f"  ? {r.name}: power {fmt_num(r.power, 2)} at the observed effect; 80% power needs {need}"
            )
        for w in r.warnings:
            lines.append(f"  ! {r.name}: {w}")
        for seed, why in r.seeds_excluded.items():
            lines.append(f"  ! {r.name}: seed {seed} excluded ({why})")
    return "\n".join(lines)
