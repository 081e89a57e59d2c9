"""Statistical tests of claims on the tidy table; the seed is the unit of replication.

Every test reduces each seed to one number (or a few), then tests across seeds with a t distribution on
S - 1 degrees of freedom (or a permutation / mixed-model test with the same unit). Layers, epochs and
tokens within a seed are never treated as independent. Each kind has an array-level core (plain
function over per-seed arrays, used by ``bench/calibration.py``) and a thin table adapter; the adapters
are registered in :data:`TESTS` and return an :class:`Outcome`. ``analysis.verdicts`` turns outcomes
into verdicts (multiplicity adjustment, then the verdict rule). This module never imports torch.

Kinds here: ``u_shape``, ``extremum``, ``compare``, ``equivalence``; ``trend`` and ``ordering`` live in
``analysis.trends``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.inference import CI_LEVEL, t_test, t_test_greater, tost
from core.errors import StudyError

__all__ = [
    "CI_LEVEL",
    "TESTS",
    "Outcome",
    "TableView",
    "compare_statistics",
    "equivalence_statistics",
    "extremum_statistics",
    "loso_bottleneck",
    "sign_flip_loso_p",
    "t_test_greater",
    "u_shape_loso_statistics",
    "u_shape_statistics",
]


@dataclass
class Outcome:
    """What a claim's test found, before multiplicity adjustment and the verdict rule.

    Attributes:
        p_value: p-value in the claimed direction (NaN when no test was possible).
        effect: the effect in the metric's units, signed as documented per claim kind.
        ci: (low, high) two-sided 95% t interval of ``effect`` over seeds.
        contradicted: the evidence excludes the claimed effect (its CI lies on the wrong side of 0, or
            outside the equivalence margin for an equivalence claim).
        seeds_used / seeds_excluded: seeds in the test / seeds dropped (with the reason).
        warnings: anything a reader must know (degenerate data, too few seeds, fit warnings, ...).
        details: kind-specific numbers for reports (per-contrast tests, mean profile, ...).
        effect_values: (S,) per-seed values whose mean is ``effect`` (for the bootstrap display and the
            equivalence check against ``margin``); empty when the effect is not a mean over seeds.
        std_effect: standardised effect (mean / sd of the binding test's per-seed values) in the claimed
            direction; the basis of the power and seeds-needed numbers of an inconclusive claim.
        two_sided: the binding test is two-sided (power is computed at alpha / 2 per side).
    """

    p_value: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool = False
    seeds_used: list[int] = field(default_factory=list)
    seeds_excluded: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    effect_values: list[float] = field(default_factory=list)
    std_effect: float = float("nan")
    two_sided: bool = False
    labellings_per_seed: int = 0  # randomisation tests: K! (JT) or 2 (sign flips); p >= this^-S. 0 = t-based


def _std(test: dict, sign: float = 1.0) -> float:
    """mean / sd of a t_test result, signed towards the claim (NaN when sd is 0 or undefined)."""
    sd = test["sd"]
    return sign * test["mean"] / sd if sd and math.isfinite(sd) and sd > 0 else float("nan")


def _few_seeds_warning(n: int, p: float) -> list[str]:
    if n < 2:
        return [f"needs >= 2 seeds (has {n}): no test across seeds is possible"]
    if math.isnan(p):
        return ["zero between-seed variance: no test across seeds is possible"]
    return []


# --------------------------------------------------------------------------------------------------
# Table access
# --------------------------------------------------------------------------------------------------
class TableView:
    """The tidy table grouped once by (metric, dataset, token_set), so many claims slice it cheaply.

    Every lookup of a value the table lacks raises a one-line StudyError naming the claim field.
    """

    def __init__(self, table: pd.DataFrame):
        self.table = table
        self._groups = {k: g for k, g in table.groupby(["metric", "dataset", "token_set"], sort=False)}
        self._present = {
            col: sorted(map(str, table[col].unique())) for col in ("metric", "dataset", "token_set")
        }

    @classmethod
    def of(cls, table: pd.DataFrame | TableView) -> TableView:
        return table if isinstance(table, TableView) else cls(table)

    def slice(self, metric: str, dataset: str, token_set: str, where: str, fld: str = "") -> pd.DataFrame:
        """Rows of one (metric, dataset, token_set); ``fld`` prefixes the field named in errors."""
        for col, value, name in (
            ("metric", metric, "metric"),
            ("dataset", dataset, f"{fld}dataset" if fld else "subset.dataset"),
            ("token_set", token_set, f"{fld}token_set" if fld else "subset.token_set"),
        ):
            if value not in self._present[col]:
                raise StudyError(f"{value!r} is not in the table (it has {self._present[col]})", where, name)
        df = self._groups.get((metric, dataset, token_set))
        if df is None:
            raise StudyError(
                f"no rows for metric {metric!r}, dataset {dataset!r}, token set {token_set!r}",
                where,
                fld or "subset",
            )
        return df

    @staticmethod
    def at_epoch(df: pd.DataFrame, epoch: int | str, where: str, fld: str) -> tuple[pd.DataFrame, int]:
        """Rows at one epoch (``last`` = the largest epoch in the slice) and that epoch."""
        epochs = sorted(int(e) for e in df.epoch.unique())
        ep = epochs[-1] if epoch == "last" else int(epoch)
        if ep not in epochs:
            raise StudyError(f"epoch {ep} is not in the table (it has {epochs})", where, fld)
        return df[df.epoch == ep], ep

    @staticmethod
    def wide(df: pd.DataFrame, layers: list[str], where: str, fld: str) -> pd.DataFrame:
        """(seeds x layers) means of ``value``; every listed layer must be in the table."""
        have = set(df.layer.unique())
        missing = [layer for layer in layers if layer not in have]
        if missing:
            raise StudyError(f"layers {missing} are not in the table (it has {sorted(have)})", where, fld)
        wide = df[df.layer.isin(layers)].pivot_table(
            index="seed", columns="layer", values="value", aggfunc="mean", dropna=False
        )
        # a seed whose values are all NaN in these layers must stay visible, so it is reported as excluded
        return wide.reindex(index=sorted(df.seed.unique()), columns=layers)


def select(table: pd.DataFrame | TableView, claim, where: str) -> tuple[pd.DataFrame, int]:
    """The claim's slice of the table (subset dataset, token set, metric, epoch) and the epoch used."""
    view = TableView.of(table)
    df = view.slice(claim.metric, claim.subset.dataset, claim.subset.token_set, where)
    return view.at_epoch(df, claim.subset.epoch, where, "subset.epoch")


def condition_values(view: TableView, claim, cond, where: str, fld: str) -> tuple[pd.Series, dict]:
    """Per-seed value of a Condition: the metric averaged over ``cond.layers`` at its epoch.

    Unset fields of ``cond`` come from ``claim.subset``. Returns (seed -> value, resolved condition).
    """
    dataset = cond.dataset or claim.subset.dataset
    token_set = cond.token_set or claim.subset.token_set
    epoch = cond.epoch if cond.epoch is not None else claim.subset.epoch
    df = view.slice(claim.metric, dataset, token_set, where, f"{fld}.")
    df, ep = view.at_epoch(df, epoch, where, f"{fld}.epoch")
    wide = view.wide(df, list(cond.layers), where, f"{fld}.layers")
    values = wide.mean(axis=1, skipna=False)
    resolved = {"dataset": dataset, "token_set": token_set, "epoch": ep, "layers": list(cond.layers)}
    resolved["n_tokens"] = token_counts(df[df.layer.isin(cond.layers)])
    return values, resolved


def token_counts(rows: pd.DataFrame) -> list[int]:
    """The distinct token counts behind a slice's covariances (``n_tokens`` column; -1 = unknown)."""
    if "n_tokens" not in rows:
        return []
    return sorted({int(n) for n in rows.n_tokens.unique() if pd.notna(n) and n >= 0})


def token_count_warnings(counts: dict[str, list[int]]) -> list[str]:
    """A warning when compared conditions rest on different numbers of tokens.

    Effective rank, participation ratio and similar estimates are biased downward at smaller N, so a
    difference between conditions of unequal token counts mixes the effect with that bias.
    """
    known = {name: tuple(c) for name, c in counts.items() if c}
    if len(set(known.values())) <= 1:
        return []
    listed = ", ".join(f"{name}: {'/'.join(map(str, c))}" for name, c in known.items())
    return [
        f"compared conditions rest on different token counts ({listed}); finite-sample bias differs between them"
    ]


def complete_seeds(frames: list[pd.Series | pd.DataFrame], excluded: dict[int, str]) -> list[int]:
    """Seeds with finite values in every frame; the others are added to ``excluded`` with a reason."""
    seeds = sorted(set().union(*(set(int(s) for s in f.index) for f in frames)))
    keep = []
    for s in seeds:
        ok = all(s in f.index and np.isfinite(np.asarray(f.loc[s], dtype=np.float64)).all() for f in frames)
        if ok:
            keep.append(s)
        elif s not in excluded:
            excluded[s] = "missing or non-finite values in the claimed cells"
    return keep


# --------------------------------------------------------------------------------------------------
# u_shape
# --------------------------------------------------------------------------------------------------
def u_shape_statistics(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> dict:
    """The u_shape intersection-union test on per-seed region means (each ``(S,)``, one value per seed).

    Per seed ``c_early = early - bottleneck`` and ``c_late = late - bottleneck``; each tested one-sided
    (mean > 0) with t(S-1); the IUT p-value is ``max(p_early, p_late)``.

    Returns:
        dict with ``p`` (NaN if no test is possible), ``effect`` and ``ci`` (bottleneck minus the binding
        shoulder, mean and 95% t CI), ``contradicted``, ``binding`` (``early`` or ``late``), ``tests``
        and ``contrasts`` (per contrast), ``std_effect``, ``warnings``.
    """
    bottleneck = np.asarray(bottleneck, dtype=np.float64)
    contrasts = {"early": np.asarray(early) - bottleneck, "late": np.asarray(late) - bottleneck}
    tests = {k: t_test(v, "greater") for k, v in contrasts.items()}
    n = len(bottleneck)
    p = (
        float("nan")
        if any(math.isnan(t["p"]) for t in tests.values()) or n < 2
        else max(t["p"] for t in tests.values())
    )
    warnings = _few_seeds_warning(n, p)
    binding = max(tests, key=lambda k: tests[k]["p"] if not math.isnan(tests[k]["p"]) else math.inf)
    bt = tests[binding]
    return {
        "p": p,
        "effect": -bt["mean"],
        "ci": (-bt["ci"][1], -bt["ci"][0]),
        "binding": binding,
        "contradicted": n >= 2 and any(t["ci"][1] < 0 for t in tests.values()),
        "tests": tests,
        "contrasts": contrasts,
        "std_effect": _std(bt),
        "warnings": warnings,
    }


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
    shoulder: np.ndarray, candidates: np.ndarray, n_flips: int = 4999, seed: int = 0
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

    Returns:
        p = share of flips with t >= observed t (NaN when S < 2 or the contrasts do not vary).
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
    return float(np.mean(t >= t[0] - 1e-12))


def u_shape_loso_statistics(early: np.ndarray, candidates: np.ndarray, late: np.ndarray) -> dict:
    """:func:`u_shape_statistics` with the bottleneck chosen leave-one-seed-out among ``candidates``
    (S, L); each contrast's p comes from :func:`sign_flip_loso_p` (the t CIs are kept for display)."""
    candidates = np.asarray(candidates, float)
    pick = loso_bottleneck(candidates)
    bottleneck = candidates[np.arange(len(candidates)), pick]
    stat = u_shape_statistics(early, bottleneck, late)
    ps = {k: sign_flip_loso_p(v, candidates) for k, v in (("early", early), ("late", late))}
    for k, v in ps.items():
        stat["tests"][k]["p"] = v
    n = len(candidates)
    stat["p"] = float("nan") if n < 2 or any(math.isnan(v) for v in ps.values()) else max(ps.values())
    stat["pick"] = pick
    stat["bottleneck"] = bottleneck
    if n >= 2 and 2**n < 40:
        stat["warnings"].append(
            f"sign-flip p of a leave-one-seed-out bottleneck cannot go below 1/2^{n} = {1 / 2**n:.3f}"
        )
    return stat


def test_u_shape(
    table: pd.DataFrame | TableView, claim, where: str = "claim", excluded: dict[int, str] | None = None
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
    Contradicted when the 95% CI of either contrast lies entirely below 0. Details also report the
    bottleneck location (per-seed argmin layer index between the shoulders) and depth (mean of the two
    shoulders minus the bottleneck), each with a 95% t CI.
    """
    view = TableView.of(table)
    df, epoch = select(view, claim, where)
    regions = claim.regions
    loso = regions.bottleneck == "leave_one_seed_out"
    order = df.drop_duplicates("layer").set_index("layer").layer_index.to_dict()
    missing = [layer for layer in [*regions.early, *regions.late] if layer not in order]
    if missing:
        raise StudyError(f"layers {missing} are not in the table (it has {sorted(order)})", where, "regions")
    lo, hi = max(order[x] for x in regions.early), min(order[x] for x in regions.late)
    between = sorted((layer for layer, i in order.items() if lo < i < hi), key=order.get)
    if not between:
        raise StudyError("no layer lies between the early and the late region", where, "regions")
    bott_layers = between if loso else list(regions.bottleneck)
    needed = list(dict.fromkeys([*regions.early, *bott_layers, *regions.late]))
    wide = view.wide(df, list(dict.fromkeys([*needed, *between])), where, "regions")
    excluded = dict(excluded or {})
    seeds = complete_seeds([wide[needed]], excluded)  # only the layers the test uses decide exclusion
    wide = wide.loc[seeds]
    early = wide[regions.early].mean(axis=1).to_numpy()
    late = wide[regions.late].mean(axis=1).to_numpy()
    if loso:
        cand = wide[between].to_numpy()
        stat = u_shape_loso_statistics(early, cand, late)
        bottleneck = stat["bottleneck"]
        chosen = {s: between[i] for s, i in zip(seeds, stat["pick"], strict=True)}
    else:
        bottleneck = wide[bott_layers].mean(axis=1).to_numpy()
        stat = u_shape_statistics(early, bottleneck, late)
        chosen = None
    mid = wide[between].to_numpy()
    mid = mid[np.isfinite(mid).all(axis=1)]  # location only from seeds with every in-between layer
    location = t_test(np.array([order[between[i]] for i in np.argmin(mid, axis=1)], float), "two-sided")
    depth = t_test((early + late) / 2 - bottleneck, "two-sided")
    profile = (
        df[df.seed.isin(seeds)].groupby(["layer_index", "layer"]).value.agg(["mean", "std"]).reset_index()
    )
    details = {
        "epoch": epoch,
        "contrasts": {
            k: {"mean": t["mean"], "ci": list(t["ci"]), "p": t["p"], "t": t["t"]}
            for k, t in stat["tests"].items()
        },
        "per_seed": {k: dict(zip(seeds, map(float, v), strict=True)) for k, v in stat["contrasts"].items()},
        "binding_contrast": stat["binding"],
        "bottleneck_location": {"mean_layer_index": location["mean"], "ci": list(location["ci"])},
        "bottleneck_depth": {"mean": depth["mean"], "ci": list(depth["ci"])},
        "profile": profile.to_dict(orient="records"),
        "observed_minimum_layer": str(profile.loc[profile["mean"].idxmin(), "layer"])
        if len(profile)
        else None,
    }
    if chosen is not None:
        details["loso_bottleneck"] = chosen
    return Outcome(
        p_value=stat["p"],
        effect=stat["effect"],
        ci=stat["ci"],
        contradicted=stat["contradicted"],
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=stat["warnings"],
        details=details,
        effect_values=(-stat["contrasts"][stat["binding"]]).tolist(),
        std_effect=stat["std_effect"],
        labellings_per_seed=2 if loso else 0,
    )


# --------------------------------------------------------------------------------------------------
# extremum, compare, equivalence
# --------------------------------------------------------------------------------------------------
def extremum_statistics(target: np.ndarray, competitors: np.ndarray, direction: str = "highest") -> dict:
    """Intersection-union test that ``target`` beats every competitor, on paired per-seed differences.

    Args:
        target: (S,) per-seed value of the target.
        competitors: (S, C) per-seed values of the C competitors.
        direction: ``highest`` (d = target - competitor > 0) or ``lowest`` (d = competitor - target > 0).

    Returns:
        dict with ``p`` = max over competitors of the one-sided t(S-1) p of mean(d_c) > 0 (NaN if any
        test is impossible), ``effect`` / ``ci`` (mean d and 95% t CI of the binding competitor, the one
        with the largest p), ``binding`` (its column), ``tests``, ``contradicted`` (some competitor's
        d has a 95% CI entirely below 0), ``std_effect``, ``warnings``.
    """
    sign = 1.0 if direction == "highest" else -1.0
    d = sign * (np.asarray(target, float)[:, None] - np.asarray(competitors, float))
    tests = [t_test(d[:, c], "greater") for c in range(d.shape[1])]
    n = d.shape[0]
    p = float("nan") if n < 2 or any(math.isnan(t["p"]) for t in tests) else max(t["p"] for t in tests)
    binding = int(np.argmax([t["p"] if not math.isnan(t["p"]) else math.inf for t in tests]))
    bt = tests[binding]
    return {
        "p": p,
        "effect": bt["mean"],
        "ci": bt["ci"],
        "binding": binding,
        "tests": tests,
        "values": d[:, binding],
        "contradicted": n >= 2 and any(t["ci"][1] < 0 for t in tests),
        "std_effect": _std(bt),
        "warnings": _few_seeds_warning(n, p),
    }


def compare_statistics(a: np.ndarray, b: np.ndarray, alternative: str = "greater") -> dict:
    """Paired per-seed difference ``d = a - b`` tested with t(S-1).

    Args:
        a, b: (S,) per-seed values of the two conditions (paired by seed).
        alternative: ``greater`` (a > b), ``less`` or ``two-sided``.

    Returns:
        dict with ``p``, ``effect`` = mean(d), ``ci`` (95% t), ``contradicted`` (the CI lies entirely on
        the side opposite to a one-sided claim; never for two-sided), ``std_effect``, ``values`` = d,
        ``warnings``.
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    t = t_test(d, alternative)
    n = d.size
    if alternative == "greater":
        contradicted, sign = n >= 2 and t["ci"][1] < 0, 1.0
    elif alternative == "less":
        contradicted, sign = n >= 2 and t["ci"][0] > 0, -1.0
    else:
        contradicted, sign = False, float(np.sign(t["mean"]) or 1.0)
    return {
        "p": t["p"],
        "effect": t["mean"],
        "ci": t["ci"],
        "contradicted": bool(contradicted),
        "std_effect": _std(t, sign),
        "values": d,
        "warnings": _few_seeds_warning(n, t["p"]),
    }


def equivalence_statistics(a: np.ndarray, b: np.ndarray, margin: float) -> dict:
    """TOST on the paired per-seed difference ``d = a - b``: equivalent when |mean d| < margin.

    Returns:
        dict with ``p`` = max of the two one-sided t(S-1) p-values, ``effect`` = mean(d), ``ci`` (95% t),
        ``contradicted`` (the 95% CI lies entirely outside [-margin, margin]), ``std_effect`` =
        (margin - |mean d|) / sd (the binding one-sided test's shift), ``values`` = d, ``warnings``.
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    r = tost(d, margin)
    sd = r["sd"]
    std = (margin - abs(r["mean"])) / sd if sd and math.isfinite(sd) and sd > 0 else float("nan")
    warnings = _few_seeds_warning(d.size, r["p"])
    if d.size >= 2 and math.isnan(r["p"]) and abs(r["mean"]) < margin:
        warnings.append("identical per-seed differences inside the margin: equivalence cannot be tested")
    return {
        "p": r["p"],
        "effect": r["mean"],
        "ci": r["ci"],
        "contradicted": r["outside"],
        "std_effect": std,
        "values": d,
        "warnings": warnings,
    }


def _paired(view: TableView, claim, conds: list[tuple[str, object]], where: str, excluded: dict[int, str]):
    series, resolved = [], {}
    for fld, cond in conds:
        s, r = condition_values(view, claim, cond, where, fld)
        series.append(s)
        resolved[fld] = r
    seeds = complete_seeds(series, excluded)
    return [s.loc[seeds].to_numpy(dtype=np.float64) for s in series], seeds, resolved


def outcome_from_stats(
    stat: dict, seeds: list[int], excluded: dict[int, str], details: dict, **extra
) -> Outcome:
    """An Outcome from an array core's result dict (``p``, ``effect``, ``ci``, ``contradicted``,
    ``warnings``, ``values``, ``std_effect``); ``extra`` sets further Outcome fields."""
    return Outcome(
        p_value=stat["p"],
        effect=stat["effect"],
        ci=tuple(stat["ci"]),
        contradicted=bool(stat["contradicted"]),
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=list(stat["warnings"]),
        details=details,
        effect_values=np.asarray(stat["values"], float).tolist(),
        std_effect=stat["std_effect"],
        **extra,
    )


def _paired_outcome(stat: dict, seeds, excluded, details: dict, resolved: dict, **extra) -> Outcome:
    """``outcome_from_stats`` for claims over paired conditions, plus the unequal-token-count warning."""
    out = outcome_from_stats(stat, seeds, excluded, details, **extra)
    out.warnings += token_count_warnings({k: r["n_tokens"] for k, r in resolved.items()})
    return out


def test_extremum(table, claim, where: str = "claim", excluded: dict[int, str] | None = None) -> Outcome:
    """``target`` is the highest (lowest) of itself and every competitor: IUT over paired per-seed
    differences (see :func:`extremum_statistics`). Effect: mean target - binding competitor (sign
    flipped for ``lowest``), metric units."""
    view = TableView.of(table)
    excluded = dict(excluded or {})
    conds = [("target", claim.target)] + [(f"competitors[{i}]", c) for i, c in enumerate(claim.competitors)]
    arrays, seeds, resolved = _paired(view, claim, conds, where, excluded)
    stat = extremum_statistics(
        arrays[0], np.column_stack(arrays[1:]) if seeds else np.empty((0, len(arrays) - 1)), claim.direction
    )
    details = {
        "conditions": resolved,
        "per_competitor": [
            {
                "competitor": resolved[f"competitors[{i}]"],
                "mean_diff": t["mean"],
                "ci": list(t["ci"]),
                "p": t["p"],
            }
            for i, t in enumerate(stat["tests"])
        ],
        "binding_competitor": resolved[f"competitors[{stat['binding']}]"],
    }
    return _paired_outcome(stat, seeds, excluded, details, resolved)


def test_compare(table, claim, where: str = "claim", excluded: dict[int, str] | None = None) -> Outcome:
    """Condition ``a`` vs ``b``, paired by seed, t(S-1) (see :func:`compare_statistics`). Effect: mean a - b."""
    view = TableView.of(table)
    excluded = dict(excluded or {})
    (a, b), seeds, resolved = _paired(view, claim, [("a", claim.a), ("b", claim.b)], where, excluded)
    stat = compare_statistics(a, b, claim.alternative)
    details = {
        "conditions": resolved,
        "per_seed_diff": dict(zip(seeds, map(float, stat["values"]), strict=True)),
    }
    return _paired_outcome(
        stat, seeds, excluded, details, resolved, two_sided=claim.alternative == "two-sided"
    )


def test_equivalence(table, claim, where: str = "claim", excluded: dict[int, str] | None = None) -> Outcome:
    """TOST of ``a - b`` within +-margin (see :func:`equivalence_statistics`). Effect: mean a - b."""
    view = TableView.of(table)
    excluded = dict(excluded or {})
    (a, b), seeds, resolved = _paired(view, claim, [("a", claim.a), ("b", claim.b)], where, excluded)
    stat = equivalence_statistics(a, b, claim.margin)
    details = {
        "conditions": resolved,
        "margin": claim.margin,
        "per_seed_diff": dict(zip(seeds, map(float, stat["values"]), strict=True)),
    }
    return _paired_outcome(stat, seeds, excluded, details, resolved)


from analysis.trends import test_ordering, test_trend  # noqa: E402 - trends builds on the helpers above

TESTS = {
    "u_shape": test_u_shape,
    "trend": test_trend,
    "ordering": test_ordering,
    "extremum": test_extremum,
    "equivalence": test_equivalence,
    "compare": test_compare,
}
