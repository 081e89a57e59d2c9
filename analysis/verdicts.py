"""From test outcomes to verdicts: multiplicity adjustment, then the verdict rule.

Verdict rule (also in the README, "Read a verdict"):

* ACCEPTED: the adjusted p-value (Holm across the file's confirmatory claims) is below the claim's alpha
  in the claimed direction;
* REJECTED: otherwise, if the evidence excludes the claimed effect: the opposite is significant at 2.5%
  one-sided, by the same test as the claim (for a t test: the 95% CI lies entirely on the wrong side of
  zero; sign flips for Kendall taus and a leave-one-seed-out bottleneck). A claim that needs every one of
  k contrasts (u_shape, extremum, a trend over ``all`` layers) is refuted by any one of them, Holm across
  the k (k * min p < 0.025); a trend over ``any`` layer only by every layer (max p < 0.025). Either way
  the rule's rate when the claim is just true is at most 2.5% (``bench/calibration.py`` measures it).
  For ``equivalence``, the CI lies entirely outside the margin; for an effect claim that declares a
  ``margin``, equivalence within it holds (TOST p < alpha; combined across contrasts as above: some
  contrast for ``every``, each for ``any``). Zero between-seed variance allows neither (INCONCLUSIVE);
* INCONCLUSIVE: otherwise (including too few seeds or data that allow no test), reported with the
  achieved power and the seeds needed for 80% power at the observed effect. A claim on fewer than 2
  seeds says so ("1 seed: a test across seeds needs >= 2"); a claim whose metric the table lacks (e.g. an
  imported metric log that does not record it) is "not testable on this source", and the other claims go
  on.

A claim registered only after some of its runs had finished (``post_hoc``, see ``study.registration``) is
adjusted with the exploratory claims, never the confirmatory ones. With seeds added until the claims are
decided (``analysis.sequential_verdicts.decide_sequential``), ACCEPTED needs the stage p below the look's
nominal level of a group-sequential boundary (``analysis.sequential``) instead of ``alpha``. One claim's
outcome, probe-size checks included, is computed in ``analysis.claim_outcome``.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from analysis.claim_outcome import _probe_outcome
from analysis.inference import bootstrap_ci, power_and_seeds_needed
from analysis.kinds import get_kind
from analysis.kinds.base import Outcome, TableView, bottleneck_text, depth_text
from analysis.power import seed_floor
from analysis.probe import ProbeData, excludes_zero
from analysis.table import NOT_LEARNED
from vitstudy_core.fmt import fmt_interval, fmt_num, fmt_p, unit_of

ACCEPTED, REJECTED, INCONCLUSIVE = "ACCEPTED", "REJECTED", "INCONCLUSIVE"


class Claims(Protocol):
    """What the verdicts read of a hypothesis (``study.schema.Hypothesis``): its validated claims."""

    @property
    def claims(self) -> Sequence[Any]: ...


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
    subset: dict[str, Any]
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
    details: dict[str, Any] = field(default_factory=dict)
    bootstrap_ci: tuple[float, float] = (float("nan"), float("nan"))
    adjustment: str = "holm"
    reason: str = ""
    power: float = float("nan")
    seeds_needed: int | None = None
    # {hash, registered_at, status: "pre-registered" | "post hoc"} when the study recorded its claims
    registration: dict[str, Any] = field(default_factory=dict)
    # {spending, max_seeds, looks: [{look, seeds, fraction, p, nominal, alpha_spent}], decided_at_look}
    sequential: dict[str, Any] = field(default_factory=dict)
    # the effect's unit suffix as its kind states it (" pp per unit of clutter"); for the text table only,
    # so not in ``to_dict`` (verdicts.json keeps its keys); empty: the metric's own unit
    unit: str = field(default="", compare=False)
    # "<dataset> seed <s>" -> why that run did not learn (runners.objectives.learning_status), for the runs
    # this claim read; empty when every run learned (then verdicts.json has no such key)
    not_learned: dict[str, str] = field(default_factory=dict)

    @property
    def post_hoc(self) -> bool:
        """The claim was registered after some of its runs had finished."""
        return self.registration.get("status") == "post hoc"

    @property
    def label(self) -> str:
        """The verdict as every table shows it: ``ACCEPTED``, ``ACCEPTED (post hoc)``, ``INCONCLUSIVE (runs
        did not learn)``, ..."""
        marks = [
            m for m, on in (("post hoc", self.post_hoc), ("runs did not learn", bool(self.not_learned))) if on
        ]
        return f"{self.verdict} ({', '.join(marks)})" if marks else self.verdict

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-safe data (NaN -> null, seed keys as strings)."""
        d = asdict(self)
        del d["unit"]
        d["seeds_excluded"] = {str(k): v for k, v in self.seeds_excluded.items()}
        for key in ("registration", "sequential", "not_learned"):  # only where a study recorded them
            if not d[key]:
                del d[key]
        return _json_safe(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimResult:
        """The inverse of :meth:`to_dict` (null numbers back to NaN, seed keys back to int)."""

        def num(k: str) -> float:
            return float("nan") if d.get(k) is None else float(d[k])

        lo, hi = d.get("bootstrap_ci") or (None, None)
        return cls(
            name=d["name"],
            kind=d["kind"],
            metric=d["metric"],
            subset=d["subset"],
            alpha=d["alpha"],
            verdict=d["verdict"],
            n_seeds=d["n_seeds"],
            seeds_used=d["seeds_used"],
            effect=num("effect"),
            ci_low=num("ci_low"),
            ci_high=num("ci_high"),
            p_value=num("p_value"),
            p_adjusted=num("p_adjusted"),
            power=num("power"),
            seeds_excluded={int(k): v for k, v in (d.get("seeds_excluded") or {}).items()},
            warnings=list(d.get("warnings") or []),
            details=d.get("details") or {},
            bootstrap_ci=(
                float("nan") if lo is None else float(lo),
                float("nan") if hi is None else float(hi),
            ),
            adjustment=d.get("adjustment", "holm"),
            reason=d.get("reason", ""),
            seeds_needed=d.get("seeds_needed"),
            registration=d.get("registration") or {},
            sequential=d.get("sequential") or {},
            not_learned=dict(d.get("not_learned") or {}),
        )


def _json_safe(obj: Any) -> Any:
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
        from statsmodels.stats.multitest import multipletests  # statsmodels: only when p-values are adjusted

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
        return INCONCLUSIVE, outcome.not_testable
    n = len(outcome.seeds_used)
    if n < 2:  # every claim is tested across seeds: one seed gives a description, never a verdict
        return INCONCLUSIVE, f"{n} seed{'' if n == 1 else 's'}: a test across seeds needs >= 2"
    if not math.isnan(p_adjusted) and p_adjusted < alpha:
        return ACCEPTED, f"adjusted p < {alpha:g} in the claimed direction"
    if outcome.contradicted:
        return REJECTED, "the 95% CI excludes the claimed effect"
    if margin is not None:
        eq = outcome.margin_p(margin)
        if not math.isnan(eq) and eq < alpha:
            return REJECTED, f"equivalence within +-{margin:g} holds (TOST p = {eq:.3g})"
    return INCONCLUSIVE, "neither the claim nor its negation is supported"


def _seeds_probe_rule(claim: Any, o: Outcome, verdict: str, reason: str) -> tuple[str, str]:
    """``uncertainty: seeds+probe``: ACCEPTED also needs the seed x probe interval on the claimed side of 0
    (for an equivalence: inside +-margin); otherwise INCONCLUSIVE. REJECTED is the seeds rule's."""
    if verdict == ACCEPTED and o.details.get("probe_unavailable"):
        return INCONCLUSIVE, f"{reason} over seeds, but {o.details['probe_unavailable']} could not be applied"
    joint = o.details.get("seeds_probe")
    if verdict != ACCEPTED or not joint:
        return verdict, reason
    lo, hi = joint["interval"]
    margin = get_kind(claim.kind).holds_within(claim)
    ok = (-margin < lo and hi < margin) if margin else excludes_zero((lo, hi), o.effect)
    if ok:
        return verdict, f"{reason}; the seed x probe 95% interval ({fmt_num(lo, 3)}, {fmt_num(hi, 3)}) agrees"
    return INCONCLUSIVE, (
        f"{reason} over seeds, but the seed x probe 95% interval ({fmt_num(lo, 3)}, {fmt_num(hi, 3)}) does not: "
        "the effect is not shown beyond this probe set"
    )


@dataclass(frozen=True)
class Families:
    """A hypothesis's claims in their multiplicity families, with each claim's alpha and level: resolved
    once (:func:`families`) and handed to everything that adjusts, decides or plans by family (the
    fixed-sample verdicts, the group-sequential rule, its looks' spending, the stopping check and seed
    planning), so no reader recomputes it.

    ``groups``: family -> claim indices, ``confirmatory`` and ``exploratory/<adjust>`` in the claims'
    order of first appearance; ``alphas``: each claim's own alpha, by index.
    """

    groups: dict[str, list[int]]
    alphas: tuple[float, ...]

    def items(self) -> ItemsView[str, list[int]]:
        return self.groups.items()

    @staticmethod
    def method(family: str) -> str:
        """The family's adjustment: ``holm`` for the confirmatory family, else its ``adjust``."""
        return "holm" if family == "confirmatory" else family.split("/")[1]

    @property
    def deciding(self) -> Sequence[int]:
        """The claims a study waits for: the confirmatory ones (every claim, if none is confirmatory)."""
        return self.groups.get("confirmatory") or range(len(self.alphas))

    @property
    def first_step_levels(self) -> dict[int, float]:
        """Each claim's level at the first step of its family's multiplicity rule: ``alpha / m`` in a
        family of m claims (Holm, and BH's first step), ``alpha`` in an ``exploratory/none`` family. The
        one place a claim's alpha is divided: seed planning and the sequential summary read it.

        Returns:
            claim index -> level.
        """
        level: dict[int, float] = {}
        for fam, idx in self.groups.items():
            m = 1 if fam.endswith("/none") else len(idx)
            level.update({i: self.alphas[i] / m for i in idx})
        return level


def families(hyp: Claims, post_hoc: set[str] | None = None) -> Families:
    """The claims' multiplicity families (:class:`Families`): confirmatory claims form one Holm family,
    exploratory ones one family per ``adjust``. A confirmatory claim named in ``post_hoc`` (registered after
    its data existed) joins ``exploratory/holm``.
    """
    out: dict[str, list[int]] = {}
    for i, c in enumerate(hyp.claims):
        confirmatory = c.confirmatory and c.name not in (post_hoc or set())
        out.setdefault("confirmatory" if confirmatory else f"exploratory/{c.adjust}", []).append(i)
    return Families(out, tuple(float(c.alpha) for c in hyp.claims))


def evaluate_claims(
    hyp: Claims,
    table: pd.DataFrame,
    source: str = "hypothesis",
    failed: dict[str, dict[int, str]] | None = None,
    post_hoc: set[str] | None = None,
    probe: ProbeData | None = None,
    fams: Families | None = None,
) -> list[ClaimResult]:
    """Test every claim of a hypothesis on a tidy table, adjust for multiplicity, apply the verdict rule.

    Confirmatory claims form one Holm family; exploratory claims (``confirmatory: false``) are adjusted
    among themselves with their ``adjust`` method (holm, bh or none).

    Args:
        hyp: a validated ``study.schema.Hypothesis``.
        table: the tidy table (``analysis.table.COLUMNS``).
        source: the hypothesis file name, for error messages.
        failed: per dataset, the seeds whose runs failed (seed -> reason); reported as excluded.
        post_hoc: names of claims registered after their data existed: adjusted as exploratory.
        probe: the runs' probe files (``analysis.probe``): each claim then also gets its probe-size
            sensitivity (``details.probe_sizes``), a matched-count note on an unequal-count warning,
            ``match_tokens`` and ``uncertainty: seeds+probe``; None (a table alone): none of these.
        fams: the claims' families as the caller resolved them (:func:`families`, with ``post_hoc``
            already applied: then ``post_hoc`` is not read); None: resolved here from ``post_hoc``.
    """
    outcomes = claim_outcomes(hyp, table, source, failed, probe)
    adjusted: dict[int, float] = {}
    method_of: dict[int, str] = {}
    for fam, idx in (fams or families(hyp, post_hoc)).items():
        method = Families.method(fam)
        for i, a in zip(idx, adjust([outcomes[i].p_value for i in idx], method), strict=True):
            adjusted[i], method_of[i] = a, method
    results = [
        _result(claim, o, adjusted[i], method_of[i])
        for i, (claim, o) in enumerate(zip(hyp.claims, outcomes, strict=True))
    ]
    for claim, r in zip(hyp.claims, results, strict=True):
        mark_not_learned(r, claim, table)
    return results


def mark_not_learned(result: ClaimResult, claim: Any, table: pd.DataFrame) -> None:
    """Name, in ``result.not_learned`` and its warnings, every run the claim read that did not learn (the
    table's :data:`analysis.table.NOT_LEARNED` column: absent when every run learned)."""
    if NOT_LEARNED not in table.columns:
        return
    flagged = table[(table[NOT_LEARNED] != "") & table.seed.isin(result.seeds_used)]
    named = claim.datasets_named()
    if named:
        flagged = flagged[flagged.dataset.isin(named)]
    runs = flagged[["dataset", "seed", NOT_LEARNED]].drop_duplicates(["dataset", "seed"])
    for ds, seed, why in runs.itertuples(index=False):
        result.not_learned[f"{ds} seed {int(seed)}"] = str(why)
    if result.not_learned:
        result.warnings.append(
            f"{len(result.not_learned)} of the runs it reads did not learn, so this verdict may be about "
            "networks that never learned: " + "; ".join(f"{k}: {v}" for k, v in result.not_learned.items())
        )


def claim_outcomes(
    hyp: Claims,
    table: pd.DataFrame,
    source: str = "hypothesis",
    failed: dict[str, dict[int, str]] | None = None,
    probe: ProbeData | None = None,
) -> list[Outcome]:
    """Every claim's outcome on ``table`` before multiplicity and the verdict rule (the part of
    :func:`evaluate_claims` that reads the table, and so the part that can find a claim wrong for it:
    ``validate`` runs just this on a synthetic table). Arguments as :func:`evaluate_claims`'s."""
    from analysis.units import model_names, population

    view = TableView.of(table)
    study_match = bool(getattr(hyp, "match_tokens", False))
    design = getattr(hyp, "design", None)
    src = getattr(design, "source", None)
    names = model_names(src.model_dump() if src is not None else None) or None
    outcomes = [
        _probe_outcome(
            view, claim, f"{source}: claims[{i}]", _failed_seeds(claim, failed), probe, study_match, names
        )
        for i, claim in enumerate(hyp.claims)
    ]
    n_images = getattr(getattr(design, "probe", None), "size", None)
    for claim, o in zip(hyp.claims, outcomes, strict=True):
        blocks = int(o.details.get("unit", {}).get("blocks", 0))
        o.details["population"] = population(claim, names, list(o.seeds_used), n_images, blocks)
        if o.details.get("bottleneck_location"):  # verdicts.json holds the words every output prints
            o.details["bottleneck_location"]["text"] = bottleneck_text(o.details)
    return outcomes


def _failed_seeds(claim: Any, failed: dict[str, dict[int, str]] | None) -> dict[int, str]:
    """Seed -> why its run failed, over the datasets the claim reads (one reason, or one per dataset)."""
    reasons: dict[int, dict[str, str]] = {}
    for ds in claim.datasets_named():
        for seed, why in (failed or {}).get(ds, {}).items():
            reasons.setdefault(int(seed), {})[ds] = why
    return {
        seed: next(iter(set(r.values())))
        if len(set(r.values())) == 1
        else "; ".join(f"{d}: {w}" for d, w in r.items())
        for seed, r in reasons.items()
    }


def _power(o: Outcome, alpha: float) -> tuple[float, int | None]:
    """Power at the observed effect and seeds for 80% (an INCONCLUSIVE claim), with a randomisation
    test's floor: its p cannot go below labellings^-S (times the Holm factor across contrasts), so below
    that many seeds nothing is accepted. A p Holm-adjusted across k contrasts is powered at alpha / k."""
    level = alpha / max(1, o.holm_contrasts)
    power, needed = power_and_seeds_needed(
        o.std_effect, len(o.seeds_used), level / 2 if o.two_sided else level
    )
    if o.labellings_per_seed > 1:
        s_min = seed_floor(o.labellings_per_seed, alpha, o.holm_contrasts)
        if len(o.seeds_used) < s_min:
            power = 0.0
        if needed is not None:
            needed = max(needed, s_min)
    return power, needed


def _result(claim: Any, o: Outcome, p_adjusted: float, adjustment: str) -> ClaimResult:
    """A claim's result from its outcome and adjusted p: the verdict rule, and power when INCONCLUSIVE."""
    margin = get_kind(claim.kind).rejection_margin(claim)
    verdict, reason = decide(o, p_adjusted, claim.alpha, margin)
    verdict, reason = _seeds_probe_rule(claim, o, verdict, reason)
    power, needed = _power(o, claim.alpha) if verdict == INCONCLUSIVE else (float("nan"), None)
    if getattr(claim, "unit", None) == "images":  # more seeds cannot help a claim about one checkpoint
        power, needed = float("nan"), None
    return ClaimResult(
        name=claim.name,
        kind=claim.kind,
        metric=claim.metric,
        # a claim without a condition reports its subset as before conditions existed
        subset=claim.subset.model_dump(exclude={"condition"} if claim.subset.condition is None else None),
        alpha=claim.alpha,
        verdict=verdict,
        effect=o.effect,
        ci_low=o.ci[0],
        ci_high=o.ci[1],
        p_value=o.p_value,
        p_adjusted=p_adjusted,
        n_seeds=len(o.seeds_used),
        seeds_used=o.seeds_used,
        seeds_excluded=o.seeds_excluded,
        warnings=o.warnings,
        details=o.details,
        bootstrap_ci=bootstrap_ci(np.asarray(o.effect_values))
        if o.effect_values
        else (float("nan"), float("nan")),
        adjustment=adjustment,
        reason=reason,
        power=power,
        seeds_needed=needed,
        unit=get_kind(claim.kind).effect_unit(claim),
    )


def format_verdicts(results: list[ClaimResult]) -> str:
    """A plain-text verdict table (one line per claim) followed by warnings and exclusions."""
    rows = [("claim", "verdict", "effect (95% CI)", "p (Holm)", "seeds")]
    for r in results:
        unit = r.unit or unit_of(r.metric)
        rows.append(
            (
                r.name,
                r.label,
                fmt_interval(r.effect, (r.ci_low, r.ci_high), unit, label=False),
                fmt_p(r.p_adjusted),
                str(r.n_seeds),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in results:
        where, depth = bottleneck_text(r.details), depth_text(r.details, r.metric)
        if where and depth and r.n_seeds >= 2:  # the report's words (analysis.kinds._parts.location)
            lines.append(f"  - {r.name}: {where}, {depth}")
        if r.verdict == INCONCLUSIVE and r.n_seeds >= 2 and math.isnan(r.power):
            # no standardised effect (the seeds do not vary): no power to speak of, whatever the sign
            lines.append(f"  ? {r.name}: power n/a: no test across seeds was possible (see the warnings)")
        elif r.verdict == INCONCLUSIVE and r.n_seeds >= 2:
            need = (
                f"80% power needs {r.seeds_needed} seeds"
                if r.seeds_needed
                else "more seeds cannot give it power: the observed effect points the other way"
            )
            lines.append(f"  ? {r.name}: power {fmt_num(r.power, 2)} at the observed effect; {need}")
        if r.post_hoc:
            why = r.registration.get("reason") or (
                f"registered {r.registration.get('registered_at')}, after some of its runs had finished"
            )
            lines.append(f"  ! {r.name}: post hoc: {why}; adjusted with the exploratory claims")
        if r.sequential:
            seq = r.sequential
            looks = ", ".join(
                f"{lk['seeds']} seeds: p {fmt_p(lk['p'])} vs {lk['nominal']:.3g}" for lk in seq["looks"]
            )
            lines.append(f"  ~ {r.name}: {len(seq['looks'])} looks ({seq['spending']}): {looks}")
        if r.details.get("unit"):
            lines.append(
                f"  = {r.name}: about {r.details.get('population')}; its 'seeds' are the "
                f"{r.details['unit']['blocks']} probe blocks"
            )
        elif r.details.get("population", "").startswith("models like"):
            lines.append(f"  = {r.name}: about {r.details['population']}")
        for w in r.warnings:
            lines.append(f"  ! {r.name}: {w}")
        for seed, why in r.seeds_excluded.items():
            lines.append(f"  ! {r.name}: seed {seed} excluded ({why})")
    return "\n".join(lines)
