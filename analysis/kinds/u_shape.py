"""``u_shape``: the metric dips in a bottleneck region and is higher both before and after it.

Tested as an intersection-union test of two per-seed contrasts, (early - bottleneck) and (late -
bottleneck), each one-sided t(S-1); the bottleneck region is declared in the file, or chosen per seed
leave-one-seed-out (with a sign-flip randomisation p that repeats the choice). The quadratic term of a
fit is never used: it "detects" a U in any convex decay.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from analysis.inference import TTest, t_test
from analysis.kinds._claim import ClaimBase
from analysis.kinds._curves import layer_location, no_interior_minimum
from analysis.kinds._display import FigureContext, Result
from analysis.kinds._outcome import Outcome, Statistic, few_seeds_warning, std_effect
from analysis.kinds._registry import ClaimKind, register_kind
from analysis.kinds._rejection import combined_against, contradiction
from analysis.kinds._scenario import Scenario, Trial
from analysis.kinds._selection import claim_view, complete_seeds, select
from analysis.kinds._table import TableView
from analysis.simulate import simulate_profiles
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_num, fmt_p, unit_of
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    from analysis.figures import Figure


class Regions(Strict):
    """Layer regions of a U-shape, declared before looking at the data.

    ``bottleneck: leave_one_seed_out`` chooses it per seed as the layer (strictly between the early and
    the late region) where the other seeds' mean profile is lowest: never the argmin of the same data.
    """

    early: list[str] = Field(min_length=1)
    bottleneck: list[str] | Literal["leave_one_seed_out"] = Field(min_length=1)
    late: list[str] = Field(min_length=1)

    @field_validator("bottleneck", mode="before")
    @classmethod
    def _list_or_loso(cls, v: object) -> object:
        if isinstance(v, str) and v != "leave_one_seed_out":
            raise ValueError("expected a list of layers or 'leave_one_seed_out'")
        return v


class UShapeClaim(ClaimBase):
    """The metric dips in the bottleneck region and is higher both before and after it.

    Tested as an intersection-union test of two per-seed contrasts (see :func:`evaluate`).
    """

    kind: Literal["u_shape"]
    needs_subset_dataset: ClassVar[bool] = True
    regions: Regions

    def cross_problem(self) -> str | None:
        if self.regions.bottleneck == "leave_one_seed_out":
            return (
                "a leave-one-seed-out bottleneck makes each seed's contrasts depend on the other seeds: "
                "declare the bottleneck's layers to compare the dip across conditions"
            )
        return None

    def seed_effect_text(self) -> str:
        return "the bottleneck depth: the shoulders' mean minus the bottleneck, per seed (a deeper dip is larger)"

    def named(self) -> list[tuple[str, str, object]]:
        out = super().named()
        for region in ("early", "bottleneck", "late"):
            layers = getattr(self.regions, region)
            if isinstance(layers, list):
                out += [(f"regions.{region}", "layer", layer) for layer in layers]
        return out


@dataclass(frozen=True, kw_only=True)
class UShapeStatistic(Statistic):
    """:class:`Statistic` of a U-shape, plus per contrast (``early``, ``late``: shoulder - bottleneck,
    metric units) its one-sided test (``tests``) and (S,) per-seed values (``contrasts``), the
    ``binding`` contrast (the larger p), and for a leave-one-seed-out bottleneck the (S,) chosen column
    of the candidates (``pick``) and the (S,) bottleneck values (``bottleneck``)."""

    binding: str
    tests: dict[str, TTest]
    contrasts: dict[str, np.ndarray]
    pick: np.ndarray | None = None
    bottleneck: np.ndarray | None = None


def u_shape_statistics(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> UShapeStatistic:
    """The u_shape intersection-union test on per-seed region means (each ``(S,)``, one value per seed).

    Per seed ``c_early = early - bottleneck`` and ``c_late = late - bottleneck``; each tested one-sided
    (mean > 0) with t(S-1); the IUT p-value is ``max(p_early, p_late)``. Contradicted (REJECTED) when one
    contrast is significantly below 0, Holm across the two at 2.5% (``2 min p_against < 0.025``): the
    U needs both, so either one pointing the wrong way refutes it, and the rule's rate at the boundary
    (both contrasts 0) stays at most 2.5%.

    Returns:
        A :class:`UShapeStatistic`: ``p`` (NaN if no test is possible), ``effect`` and ``ci`` (bottleneck
        minus the binding shoulder, mean and 95% t CI, metric units), ``values`` = -(binding contrast).
    """
    bottleneck = np.asarray(bottleneck, dtype=np.float64)
    contrasts = {"early": np.asarray(early) - bottleneck, "late": np.asarray(late) - bottleneck}
    tests = {k: t_test(v, "greater") for k, v in contrasts.items()}
    against = [t_test(v, "less").p for v in contrasts.values()]
    n = len(bottleneck)
    p = (
        float("nan")
        if any(math.isnan(t.p) for t in tests.values()) or n < 2
        else max(t.p for t in tests.values())
    )
    warnings = few_seeds_warning(n, p)
    binding = max(tests, key=lambda k: tests[k].p if not math.isnan(tests[k].p) else math.inf)
    bt = tests[binding]
    return UShapeStatistic(
        p=p,
        effect=-bt.mean,
        ci=(-bt.ci[1], -bt.ci[0]),
        binding=binding,
        p_against=against,
        contradicted=n >= 2 and contradiction(against, "every"),
        tests=tests,
        contrasts=contrasts,
        values=-contrasts[binding],
        std_effect=std_effect(bt),
        warnings=warnings,
    )


def dip_depth(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> np.ndarray:
    """Per seed the bottleneck depth: the shoulders' mean minus the bottleneck, (S,) from (S,) region
    means (metric units; > 0 where the bottleneck sits below the shoulders). What claims across
    conditions compare: a linear contrast, so its mean is the true depth whatever the seed noise."""
    return (np.asarray(early, float) + np.asarray(late, float)) / 2 - np.asarray(bottleneck, float)


def loso_bottleneck(profiles: np.ndarray) -> np.ndarray:
    """Leave-one-seed-out bottleneck choice: for each seed, the argmin of the *other* seeds' mean profile.

    Args:
        profiles: (S, L) per-seed values over the candidate layers (depth order).

    Returns:
        (S,) integer column index chosen for each seed (seed s never influences its own choice; with
        S = 1 the seed's own argmin, which cannot be tested anyway).
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    n = profiles.shape[0]
    if n < 2:
        return np.argmin(profiles, axis=1)
    others = (profiles.sum(axis=0, keepdims=True) - profiles) / (n - 1)
    return np.argmin(others, axis=1)


def sign_flip_loso_p(
    shoulder: np.ndarray,
    candidates: np.ndarray,
    n_flips: int = 4999,
    seed: int = 0,
    alternative: Literal["greater", "less"] = "greater",
) -> float:
    """One-sided p that ``shoulder - bottleneck > 0`` when the bottleneck is chosen leave-one-seed-out.

    The per-seed contrasts ``c_s = shoulder_s - cand_s[j(-s)]`` are dependent across seeds through the
    choice ``j(-s)`` (it is where the *other* seeds are low), so a t(S-1) test on them is anti-conservative
    (measured: 0.09 at S = 5 and 0.15 at S = 10 for a nominal 0.05 on flat profiles). This randomisation
    test flips the sign of each seed's whole relative profile ``cand_s - shoulder_s`` (exchangeable under
    the flat null when seed deviations are symmetric), repeats the leave-one-seed-out choice on each
    flipped data set and compares the t statistic of the contrasts: exact at the boundary of the null.

    Args:
        shoulder: (S,) the shoulder region mean per seed.
        candidates: (S, L) per-seed values of the candidate bottleneck layers.
        n_flips: Monte Carlo flips when 2^S exceeds it (otherwise all 2^S are enumerated).
        alternative: ``greater`` (shoulder above the bottleneck: the claim) or ``less`` (below it: the
            REJECTED rule's test, the same randomisation the other way).

    Returns:
        p = share of flips with t >= observed t (``less``: t <= observed t); NaN when S < 2 or the
        contrasts do not vary.
    """
    rel = np.asarray(candidates, float) - np.asarray(shoulder, float)[:, None]  # (S, L)
    n = rel.shape[0]
    if n < 2:
        return float("nan")
    if 2**n <= n_flips:
        flips = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)  # (F, S), row 0 = identity
    else:
        rng = np.random.default_rng(seed)
        flips = np.vstack([np.ones(n, int), rng.choice([-1, 1], size=(n_flips, n))])
    data = flips[:, :, None] * rel[None]  # (F, S, L)
    others = (data.sum(axis=1, keepdims=True) - data) / (n - 1)
    pick = np.argmin(others, axis=2)  # (F, S)
    c = -np.take_along_axis(data, pick[:, :, None], axis=2)[:, :, 0]  # shoulder - bottleneck, (F, S)
    sd = c.std(axis=1, ddof=1)
    if not sd[0] > 1e-12 * max(1.0, abs(c[0].mean())):
        return float("nan")
    t = c.mean(axis=1) / np.where(sd > 0, sd, np.inf) * math.sqrt(n)
    if alternative == "less":
        return float(np.mean(t <= t[0] + 1e-12))
    return float(np.mean(t >= t[0] - 1e-12))


def u_shape_loso_statistics(early: np.ndarray, candidates: np.ndarray, late: np.ndarray) -> UShapeStatistic:
    """:func:`u_shape_statistics` with the bottleneck chosen leave-one-seed-out among ``candidates``
    (S, L); each contrast's p, both ways, comes from :func:`sign_flip_loso_p` (the t CIs are kept for
    display): the t tests of these dependent contrasts are anti-conservative, in both directions (the
    REJECTED rule on their CIs: 0.097 at S = 10 for a nominal 0.025 at the step-down null)."""
    candidates = np.asarray(candidates, float)
    pick = loso_bottleneck(candidates)
    bottleneck = candidates[np.arange(len(candidates)), pick]
    stat = u_shape_statistics(early, bottleneck, late)
    ps = {k: sign_flip_loso_p(v, candidates) for k, v in (("early", early), ("late", late))}
    against = [sign_flip_loso_p(v, candidates, alternative="less") for v in (early, late)]
    n = len(candidates)
    warnings = list(stat.warnings)
    if n >= 2 and 2**n < 40:
        warnings.append(
            f"sign-flip p of a leave-one-seed-out bottleneck cannot go below 1/2^{n} = {1 / 2**n:.3f}"
        )
    return replace(
        stat,
        tests={k: replace(t, p=ps[k]) for k, t in stat.tests.items()},
        p=float("nan") if n < 2 or any(math.isnan(v) for v in ps.values()) else max(ps.values()),
        pick=pick,
        bottleneck=bottleneck,
        warnings=warnings,
        p_against=against,
        contradicted=n >= 2 and contradiction(against, "every"),
    )


def evaluate(
    table: pd.DataFrame | TableView,
    claim: UShapeClaim,
    where: str = "claim",
    excluded: dict[int, str] | None = None,
) -> Outcome:
    """U-shape over layers: intersection-union test of two per-seed contrasts.

    For each seed s, with region means over the declared layers:
    ``c_early[s] = mean(early) - mean(bottleneck)`` and ``c_late[s] = mean(late) - mean(bottleneck)``.
    Each contrast is tested one-sided (mean > 0) across seeds with t(S-1); the U is supported only if
    both are, so the intersection-union p-value is ``max(p_early, p_late)`` (no correction needed inside).
    The bottleneck region is declared in the file, or (``bottleneck: leave_one_seed_out``) chosen per
    seed as the layer between the early and late regions where the other seeds' mean is lowest.

    Effect: ``-(mean of the binding contrast)``, i.e. how far the bottleneck sits below the shoulder with
    the weaker evidence (negative = a dip, in the metric's units, percentage points for ``eed_pct``).
    Contradicted when either contrast is significantly below 0 (Holm across the two, one-sided 2.5%; the
    sign-flip test for a leave-one-seed-out bottleneck). Details also report the
    bottleneck location (per-seed argmin layer index between the shoulders) and depth (mean of the two
    shoulders minus the bottleneck), each with a 95% t CI.
    """
    view = claim_view(table, claim, where)
    df, epoch = select(view, claim, where)
    regions = claim.regions
    order, between, bott_layers = _layers(df, regions, where)
    needed = list(dict.fromkeys([*regions.early, *bott_layers, *regions.late]))
    wide = view.wide(df, list(dict.fromkeys([*needed, *between])), where, "regions")
    excluded = dict(excluded or {})
    seeds = complete_seeds([wide[needed]], excluded)  # only the layers the test uses decide exclusion
    wide = wide.loc[seeds]
    early = wide[regions.early].mean(axis=1).to_numpy()
    late = wide[regions.late].mean(axis=1).to_numpy()
    chosen = None
    if regions.bottleneck == "leave_one_seed_out":
        stat = u_shape_loso_statistics(early, wide[between].to_numpy(), late)
        assert stat.bottleneck is not None and stat.pick is not None
        bottleneck = stat.bottleneck
        chosen = {s: between[i] for s, i in zip(seeds, stat.pick, strict=True)}
    else:
        bottleneck = wide[bott_layers].mean(axis=1).to_numpy()
        stat = u_shape_statistics(early, bottleneck, late)
    details = _details(df, epoch, wide, stat, seeds, order, between, dip_depth(early, bottleneck, late))
    details["bottleneck_location"].update(_interior_minima(wide, regions, order, between))
    seed_effects = {}
    if chosen is not None:
        details["loso_bottleneck"] = chosen
    else:  # linear in the data, so equal dips give equal means whatever each condition's seed noise
        seed_effects = dict(zip(seeds, map(float, dip_depth(early, bottleneck, late)), strict=True))
    return Outcome(
        p_value=stat.p,
        effect=stat.effect,
        ci=stat.ci,
        contradicted=stat.contradicted,
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=stat.warnings,
        details=details,
        effect_values=np.asarray(stat.values, float).tolist(),
        std_effect=stat.std_effect,
        labellings_per_seed=_labellings(claim),
        p_against=combined_against(stat.p_against, "every") if stat.p_against else float("nan"),
        seed_effects=seed_effects,
    )


def _layers(df: pd.DataFrame, regions: Regions, where: str) -> tuple[dict[str, int], list[str], list[str]]:
    """Layer -> depth index, the layers strictly between the early and late regions (depth order), and
    the bottleneck's layers (all of those for a leave-one-seed-out choice)."""
    order = {str(k): int(v) for k, v in df.drop_duplicates("layer").set_index("layer").layer_index.items()}
    missing = [layer for layer in [*regions.early, *regions.late] if layer not in order]
    if missing:
        raise StudyError(f"layers {missing} are not in the table (it has {sorted(order)})", where, "regions")
    lo, hi = max(order[x] for x in regions.early), min(order[x] for x in regions.late)
    between = sorted((layer for layer, i in order.items() if lo < i < hi), key=order.__getitem__)
    if not between:
        raise StudyError("no layer lies between the early and the late region", where, "regions")
    bottleneck = regions.bottleneck
    return order, between, between if bottleneck == "leave_one_seed_out" else list(bottleneck)


def _interior_minima(
    wide: pd.DataFrame, regions: Regions, order: dict[str, int], between: list[str]
) -> dict[str, Any]:
    """How many seeds have an interior minimum between the shoulders: their lowest layer between the
    early and late regions lies below both layers beside it (at an edge, the shoulder layer next to it).

    A profile that peaks between the shoulders has its lowest in-between layer at an edge, above the
    shoulder beside it: that layer is where the search range is cut, not a bottleneck, and its location
    (with a CI of that one layer) says nothing. Returns ``interior_seeds``, ``seeds`` (with every layer)
    and ``edges`` (the edge layers those other seeds' minima sit at)."""
    left = max(regions.early, key=order.__getitem__)
    right = min(regions.late, key=order.__getitem__)
    vals = wide[[left, *between, right]].to_numpy(dtype=float)
    vals = vals[np.isfinite(vals).all(axis=1)]
    if not len(vals):
        return {"interior_seeds": 0, "seeds": 0, "edges": []}
    k = np.argmin(vals[:, 1:-1], axis=1) + 1
    rows = np.arange(len(vals))
    interior = (vals[rows, k] < vals[rows, k - 1]) & (vals[rows, k] < vals[rows, k + 1])
    edges = sorted({between[i - 1] for i in k[~interior]}, key=order.__getitem__)
    return {"interior_seeds": int(interior.sum()), "seeds": int(len(vals)), "edges": edges}


def _details(
    df: pd.DataFrame,
    epoch: int,
    wide: pd.DataFrame,
    stat: UShapeStatistic,
    seeds: list[int],
    order: dict[str, int],
    between: list[str],
    depth_values: np.ndarray,
) -> dict[str, Any]:
    """The report's numbers: each contrast, the bottleneck's location and depth (95% t CIs over seeds)
    and the mean profile."""
    mid = wide[between].to_numpy()
    mid = mid[np.isfinite(mid).all(axis=1)]  # location only from seeds with every in-between layer
    location = t_test(np.array([order[between[i]] for i in np.argmin(mid, axis=1)], float), "two-sided")
    depth = t_test(depth_values, "two-sided")
    profile = (
        df[df.seed.isin(seeds)].groupby(["layer_index", "layer"]).value.agg(["mean", "std"]).reset_index()
    )
    return {
        "epoch": epoch,
        "contrasts": {
            k: {"mean": t.mean, "ci": list(t.ci), "p": t.p, "t": t.t} for k, t in stat.tests.items()
        },
        "per_seed": {k: dict(zip(seeds, map(float, v), strict=True)) for k, v in stat.contrasts.items()},
        "binding_contrast": stat.binding,
        "bottleneck_location": {"mean_layer_index": location.mean, "ci": list(location.ci)},
        "bottleneck_depth": {"mean": depth.mean, "ci": list(depth.ci)},
        "profile": profile.to_dict(orient="records"),
        "observed_minimum_layer": str(profile.loc[profile["mean"].idxmin(), "layer"])
        if len(profile)
        else None,
    }


def _draw(null_shape: str) -> Callable[[int, float, np.random.Generator], tuple[tuple[np.ndarray, ...], Any]]:
    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], Any]:
        shape = "u" if effect > 0 else null_shape
        prof = simulate_profiles(shape, n_seeds, effect if effect > 0 else 20.0, rng)
        return (prof,), (effect if effect > 0 else None)

    return draw


def _step_down(n_seeds: int, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], Any]:
    """The REJECTED rule's boundary for the declared regions: a step-down profile (late contrast 0)."""
    return _draw("step_down")(n_seeds, 0.0, rng)


def _test_declared(arrays: tuple[np.ndarray, ...], truth: float | None, rng: np.random.Generator) -> Trial:
    prof = arrays[0]
    st = u_shape_statistics(prof[:, [0, 1]].mean(1), prof[:, [2, 3, 4]].mean(1), prof[:, [9, 10, 11]].mean(1))
    ci = st.tests["early"].ci  # the early contrast (not selected by the data): truth = dip depth
    return {
        "p": st.p,
        "covered": None if truth is None else bool(ci[0] <= truth <= ci[1]),
        "warned": False,
        "contradicted": bool(st.contradicted),
    }


def _test_loso(arrays: tuple[np.ndarray, ...], truth: float | None, rng: np.random.Generator) -> Trial:
    prof = arrays[0]
    cand = prof[:, 2:9]  # blocks 3-9: strictly between the early (1-2) and late (10-12) regions
    st = u_shape_loso_statistics(prof[:, [0, 1]].mean(1), cand, prof[:, [9, 10, 11]].mean(1))
    return {"p": st.p, "covered": None, "warned": False, "contradicted": bool(st.contradicted)}


def _labellings(claim: UShapeClaim) -> int:
    return 2 if claim.regions.bottleneck == "leave_one_seed_out" else 0


def figures(ctx: FigureContext) -> list[Figure]:
    """The metric by layer at the tested epoch, declared regions shaded (a LOSO bottleneck: the layers
    chosen for some seed)."""
    from analysis.figures import profile_figure

    claim, details = ctx.claim, ctx.result.details
    bottleneck = claim.regions.bottleneck
    if bottleneck == "leave_one_seed_out":
        bottleneck = sorted(set((details.get("loso_bottleneck") or {}).values()))
    regions = {"early": claim.regions.early, "bottleneck": bottleneck, "late": claim.regions.late}
    return [
        profile_figure(
            ctx.table,
            claim.metric,
            claim.subset.token_set,
            [claim.subset.dataset],
            details.get("epoch", claim.subset.epoch),
            regions=regions,
            colours=ctx.colours,
            ylim=ctx.ylim,
        )
    ]


def _between(claim: UShapeClaim, profile: list[dict[str, Any]]) -> dict[str, int]:
    """The layers of the mean profile strictly between the early and the late region (name -> index):
    where a seed's bottleneck can be, so the bounds its location is reported within."""
    order = {str(p["layer"]): int(p["layer_index"]) for p in profile}
    early = [order[x] for x in claim.regions.early if x in order]
    late = [order[x] for x in claim.regions.late if x in order]
    if not early or not late:
        return order
    return {name: i for name, i in order.items() if max(early) < i < min(late)}


def explain(claim: UShapeClaim, result: Result) -> list[str]:
    """Each contrast with its per-seed values, CI and p; where the bottleneck sits and how deep it is."""
    d = result.details
    unit = unit_of(claim.metric)
    lines = []
    for name, c in (d.get("contrasts") or {}).items():
        per_seed = ", ".join(
            f"seed {s}: {fmt_num(v)}" for s, v in (d.get("per_seed", {}).get(name) or {}).items()
        )
        lines.append(
            f"{name} - bottleneck: mean {fmt_num(c['mean'])}{unit} (95% CI {fmt_num(c['ci'][0])}, "
            f"{fmt_num(c['ci'][1])}), one-sided p {fmt_p(c['p'])}"
            + (" (binding: the weaker shoulder)" if name == d.get("binding_contrast") else "")
            + (f"; per seed {per_seed}" if per_seed else "")
        )
    loc, depth = d.get("bottleneck_location"), d.get("bottleneck_depth")
    if loc and depth:
        between = _between(claim, d.get("profile") or [])
        where = no_interior_minimum(loc) or layer_location(
            loc["mean_layer_index"], loc["ci"], between, "the layers between the shoulders"
        )
        lines.append(
            f"bottleneck location (each seed's lowest layer between the shoulders, mean over seeds): {where}; "
            f"depth below the shoulders' mean {fmt_num(depth['mean'])}{unit} (95% CI {fmt_num(depth['ci'][0])}, "
            f"{fmt_num(depth['ci'][1])}); lowest layer of the mean profile: {d.get('observed_minimum_layer')}"
        )
    if d.get("loso_bottleneck"):
        chosen = ", ".join(f"seed {s}: {layer}" for s, layer in d["loso_bottleneck"].items())
        lines.append(f"bottleneck chosen leave-one-seed-out: {chosen}")
    return lines


register_kind(
    ClaimKind(
        name="u_shape",
        model=UShapeClaim,
        evaluate=evaluate,
        calibration={
            "u_shape": Scenario(
                "monotone step-down (early >> bottleneck = late)",
                draw=_draw("step_down"),
                test=_test_declared,
            ),
            # a convex decay refutes the U (late below the bottleneck): REJECTING it is right, so the
            # rule's boundary is the step-down's (late contrast exactly 0)
            "u_shape_convex": Scenario(
                "monotone convex decay (REJECTED: step-down)",
                draw=_draw("decreasing_convex"),
                test=_test_declared,
                boundary=_step_down,
            ),
            "u_shape_loso": Scenario(
                "monotone step-down; bottleneck chosen leave-one-seed-out",
                draw=_draw("step_down"),
                test=_test_loso,
            ),
        },
        labellings_per_seed=_labellings,
        figures=figures,
        explain=explain,
        example={
            "kind": "u_shape",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "regions": {"early": ["block_01"], "bottleneck": ["block_04", "block_05"], "late": ["block_12"]},
        },
    )
)
