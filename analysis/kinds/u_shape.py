"""``u_shape``: the metric dips in a bottleneck region and is higher both before and after it.

Tested as an intersection-union test of two per-seed contrasts, (early - bottleneck) and (late -
bottleneck), each one-sided t(S-1); the bottleneck region is declared in the file, or chosen per seed
leave-one-seed-out (with a sign-flip randomisation p that repeats the choice). The quadratic term of a
fit is never used: it "detects" a U in any convex decay.

This module holds the claim model, its evaluation over the table, the figures, the explanation and the
registration; the array-level tests are ``analysis.kinds._parts.u_shape_statistics``, the calibration scenarios
``analysis.kinds._parts.u_shape_scenarios``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from analysis.inference import t_test
from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.display import FigureContext, Result
from analysis.kinds._parts.location import bottleneck_text, depth_text, replicates
from analysis.kinds._parts.outcome import Outcome
from analysis.kinds._parts.registry import ClaimKind, register_kind
from analysis.kinds._parts.rejection import combined_against
from analysis.kinds._parts.scenario import Scenario
from analysis.kinds._parts.selection import claim_view, complete_seeds, select
from analysis.kinds._parts.table import TableView
from analysis.kinds._parts.u_shape_scenarios import _draw, _step_down, _test_declared, _test_loso
from analysis.kinds._parts.u_shape_statistics import (
    UShapeStatistic,
    dip_depth,
    u_shape_loso_statistics,
    u_shape_statistics,
)
from vitstudy_core.errors import StudyError
from vitstudy_core.fmt import fmt_interval, fmt_num, fmt_p, unit_of
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    import pandas as pd

    from analysis.report.figures import Figure


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

    @model_validator(mode="after")
    def _disjoint(self) -> Regions:
        """A layer belongs to one region: an overlap tests a contrast of a layer with itself."""
        seen: dict[str, str] = {}
        for region in ("early", "bottleneck", "late"):
            layers = getattr(self, region)
            for layer in layers if isinstance(layers, list) else []:
                other = seen.setdefault(layer, region)
                if other != region:
                    raise ValueError(
                        f"the regions overlap: {layer} is in {other} and in {region} (each layer belongs "
                        "to one region; the bottleneck lies strictly between early and late)"
                    )
        return self


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
    details["bottleneck_location"]["layers"] = {layer: order[layer] for layer in between}
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


def _labellings(claim: UShapeClaim) -> int:
    return 2 if claim.regions.bottleneck == "leave_one_seed_out" else 0


def figures(ctx: FigureContext) -> list[Figure]:
    """The metric by layer at the tested epoch, declared regions shaded (a LOSO bottleneck: the layers
    chosen for some seed)."""
    from analysis.report.figures import profile_figure

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
    one, many = replicates(d)  # seeds, or probe blocks (unit: images)
    for name, c in (d.get("contrasts") or {}).items():
        per_seed = ", ".join(
            f"{one.split()[-1]} {s}: {fmt_num(v)}" for s, v in (d.get("per_seed", {}).get(name) or {}).items()
        )
        lines.append(
            f"{name} - bottleneck: mean {fmt_interval(c['mean'], c['ci'], unit)}, one-sided p {fmt_p(c['p'])}"
            + (" (binding: the weaker shoulder)" if name == d.get("binding_contrast") else "")
            + (f"; per {one} {per_seed}" if per_seed else "")
        )
    where, depth = bottleneck_text(d), depth_text(d, claim.metric)
    if where and depth:
        between = d["bottleneck_location"].get("layers") or _between(claim, d.get("profile") or [])
        mean = {str(p["layer"]): p["mean"] for p in d.get("profile") or [] if str(p["layer"]) in between}
        lowest = (
            f"; lowest layer of the mean profile between them: {min(mean, key=mean.__getitem__)}"
            if mean
            else ""
        )
        lines.append(
            f"{where} (the mean over {many} of each {one}'s lowest layer between the shoulders); {depth} "
            f"(the shoulders' mean minus the bottleneck){lowest}"
        )
    if d.get("loso_bottleneck"):
        chosen = ", ".join(f"seed {s}: {layer}" for s, layer in d["loso_bottleneck"].items())
        lines.append(f"bottleneck chosen leave-one-seed-out: {chosen}")
    return lines


def _images(claim: UShapeClaim) -> str | None:
    """``unit: images`` fits a declared bottleneck (the layer values enter linearly)."""
    if claim.regions.bottleneck == "leave_one_seed_out":
        return "a leave-one-seed-out bottleneck is chosen per replicate (not linear in the layer values): declare it"
    return None


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
        # unit: images rows hold at 256, 1,024 and 4,096 probe images (bench/calibration.py --unit-images)
        images=_images,
        images_calibrated=frozenset({"eed_pct", "participation_ratio"}),
        example={
            "kind": "u_shape",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "regions": {"early": ["block_01"], "bottleneck": ["block_04", "block_05"], "late": ["block_12"]},
        },
    )
)
