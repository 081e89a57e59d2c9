"""The comparison of a claim's per-seed effect between two conditions: the claim evaluated in each
(:func:`in_condition`) and the test of their difference (:func:`compare_effects`), paired t(S-1) when both
hold the same seed ids, Welch's t otherwise (:func:`welch_statistics`, :func:`difference_statistics`).

What ``differs``, ``exceeds`` (``analysis.kinds.versus``) and ``controls`` (``analysis.kinds._parts.controls``)
test. This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.inference import Alternative, opposite, t_p
from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.outcome import Outcome, Statistic, few_seeds_warning
from analysis.kinds._parts.registry import get_kind
from analysis.kinds._parts.rejection import contradiction
from analysis.kinds._parts.table import TableView
from analysis.kinds.compare import compare_statistics


@dataclass(frozen=True, kw_only=True)
class WelchStatistic(Statistic):
    """:class:`Statistic` of Welch's test, plus the SE of the difference and its Welch-Satterthwaite df."""

    se: float = float("nan")
    df: float = float("nan")


def welch_statistics(a: np.ndarray, b: np.ndarray, alternative: Alternative = "greater") -> WelchStatistic:
    """Welch's t test of mean(a) - mean(b) on two independent samples of seeds.

    Args:
        a: (S_a,) per-seed values in condition a; b: (S_b,) in condition b (different seeds).
        alternative: ``greater`` (a > b), ``less`` or ``two-sided``.

    Returns:
        A :class:`Statistic`: ``effect`` = mean(a) - mean(b), ``ci`` (95%, Welch-Satterthwaite df),
        ``p``, ``p_against`` (one-sided: the other side), ``contradicted`` (that is below 2.5%),
        ``std_effect`` = effect / sqrt(var a + var b) (a difference of one seed from each condition, the
        scale the seeds-needed numbers use), ``values`` empty (no per-seed differences).
    """
    from scipy.special import stdtrit  # the t quantile scipy.stats.t.ppf calls

    a, b = np.asarray(a, float), np.asarray(b, float)
    na, nb = a.size, b.size
    nan = float("nan")
    diff = float(a.mean() - b.mean()) if na and nb else nan
    empty = np.empty(0)
    if na < 2 or nb < 2:
        return WelchStatistic(p=nan, effect=diff, ci=(nan, nan), contradicted=False, std_effect=nan, values=empty,
                         warnings=few_seeds_warning(min(na, nb), nan))  # fmt: skip
    va, vb = float(a.var(ddof=1)), float(b.var(ddof=1))
    se = math.sqrt(va / na + vb / nb)
    if not se > 1e-12 * max(1.0, abs(diff)):
        return WelchStatistic(p=nan, effect=diff, ci=(diff, diff), contradicted=False, std_effect=nan,
                         values=empty, warnings=few_seeds_warning(2, nan))  # fmt: skip
    df = se**4 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    t = diff / se
    q = float(stdtrit(df, 0.975))
    against = [t_p(t, df, opposite(alternative))] if alternative != "two-sided" else []
    sign = {"greater": 1.0, "less": -1.0}.get(alternative, float(np.sign(diff) or 1.0))
    return WelchStatistic(
        p=t_p(t, df, alternative),
        effect=diff,
        ci=(diff - q * se, diff + q * se),
        p_against=against,
        contradicted=bool(against) and contradiction(against, "every"),
        std_effect=sign * diff / math.sqrt(va + vb),
        values=empty,
        warnings=[],
        df=df,
        se=se,
    )


def difference_statistics(a: np.ndarray, b: np.ndarray, alternative: Alternative, paired: bool) -> Statistic:
    """Condition a's per-seed effects minus b's: paired t(S-1) (``paired``: row s of ``a`` and ``b`` is
    seed s; :func:`analysis.kinds.compare.compare_statistics`) or Welch (:func:`welch_statistics`)."""
    return compare_statistics(a, b, alternative) if paired else welch_statistics(a, b, alternative)


def _se_df(stat: Statistic, paired: bool) -> tuple[float, float]:
    """The SE and df of a difference's mean (what a margin's TOST reads)."""
    if isinstance(stat, WelchStatistic):
        return stat.se, stat.df
    d = np.asarray(stat.values, float)
    if d.size < 2:
        return float("nan"), float("nan")
    return float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1)


def in_condition(
    view: TableView, claim: ClaimBase, name: str, where: str, fld: str, excluded: dict[int, str]
) -> Outcome:
    """``claim`` (its controls dropped) evaluated in condition ``name`` by its own kind; a condition the
    table lacks is one line naming ``fld``."""
    view.in_condition(name, where, fld)
    subset = claim.subset.model_copy(update={"condition": name})
    one = claim.model_copy(update={"subset": subset, "controls": []})
    return get_kind(one.kind).evaluate(view, one, where=where, excluded=dict(excluded))


def compare_effects(
    claim: ClaimBase,
    outs: tuple[Outcome, Outcome],
    names: tuple[str, str],
    alternative: Alternative,
    with_details: bool = True,
) -> tuple[Statistic, bool, list[int], dict[int, str], dict[str, Any]]:
    """The test of condition a's per-seed effects (``outs[0]``) minus b's: paired by seed id when both
    conditions hold the same seed ids in the table (used or excluded), Welch otherwise.

    Returns (statistic, paired, seeds used, seeds excluded with the reason, details of the two sides).
    """
    ea, eb = claim.seed_effect(outs[0]), claim.seed_effect(outs[1])
    ids = [set(o.seeds_used) | set(o.seeds_excluded) for o in outs]
    paired = ids[0] == ids[1]
    excluded: dict[int, str] = {}
    for o, name in zip(outs, names, strict=True):
        for s, why in o.seeds_excluded.items():
            excluded.setdefault(int(s), f"{name}: {why}")
    if paired:
        seeds = sorted(set(ea.index) & set(eb.index))
        for s in sorted((set(ea.index) | set(eb.index)) - set(seeds)):
            missing = names[0] if s not in ea.index else names[1]
            excluded.setdefault(int(s), f"no effect in condition {missing}")
        stat = difference_statistics(ea.loc[seeds].to_numpy(), eb.loc[seeds].to_numpy(), alternative, True)
    else:
        seeds = sorted(set(ea.index) | set(eb.index))
        stat = difference_statistics(ea.to_numpy(), eb.to_numpy(), alternative, False)
    sides = {
        name: {
            "condition": name,
            "effect": o.effect,
            "ci": list(o.ci),
            "p": o.p_value,
            "seed_effect_mean": float(e.mean()) if len(e) else float("nan"),
            "per_seed": {int(str(s)): float(v) for s, v in e.items()},
            **({"details": o.details} if with_details else {}),
        }
        for name, o, e in zip(names, outs, (ea, eb), strict=True)
    }
    return stat, paired, seeds, excluded, sides


def _difference_details(stat: Statistic, paired: bool, seeds: list[int]) -> dict[str, Any]:
    return {
        "test": "paired t(S-1) over seeds shared by id" if paired else "Welch t (different seeds)",
        "paired": paired,
        "mean": stat.effect,
        "ci": list(stat.ci),
        "p": stat.p,
        "per_seed": dict(zip(seeds, map(float, stat.values), strict=True)) if paired else {},
    }
