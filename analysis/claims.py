"""Statistical tests of claims on the tidy table; the seed is the unit of replication.

Every test reduces each seed to one number (or a few), then tests across seeds with a t distribution on
S - 1 degrees of freedom. Layers, epochs and tokens within a seed are never treated as independent.
Each test returns a :class:`Outcome`; ``analysis.verdicts`` turns outcomes into verdicts (Holm across a
file's confirmatory claims, then the verdict rule). This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from study.errors import StudyError

CI_LEVEL = 0.95  # every reported CI is a two-sided t interval at this level


@dataclass
class Outcome:
    """What a claim's test found, before multiplicity adjustment and the verdict rule.

    Attributes:
        p_value: one-sided p-value for the claimed direction (NaN when no test was possible).
        effect: the effect in the metric's units, signed as documented per claim kind.
        ci: (low, high) two-sided 95% t interval of ``effect`` over seeds.
        contradicted: the evidence excludes the claimed effect (its CI lies on the wrong side of 0).
        seeds_used / seeds_excluded: seeds in the test / seeds dropped (with the reason).
        warnings: anything a reader must know (degenerate data, too few seeds, ...).
        details: kind-specific numbers for reports (per-contrast tests, mean profile, ...).
    """

    p_value: float
    effect: float
    ci: tuple[float, float]
    contradicted: bool = False
    seeds_used: list[int] = field(default_factory=list)
    seeds_excluded: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)


def t_test_greater(x: np.ndarray) -> dict:
    """One-sample t-test of mean(x) > 0 across seeds, with a two-sided 95% t CI of the mean.

    Args:
        x: (S,) one value per seed.

    Returns:
        dict with ``mean``, ``sd``, ``n``, ``t``, ``p`` (one-sided, greater), ``ci`` (low, high).
        ``p`` is NaN when S < 2 or the seeds do not vary (no test possible).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    mean = float(x.mean()) if n else float("nan")
    if n < 2:
        return {
            "mean": mean,
            "sd": float("nan"),
            "n": n,
            "t": float("nan"),
            "p": float("nan"),
            "ci": (float("nan"), float("nan")),
        }
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    if not se > 1e-12 * max(1.0, abs(mean)):
        return {"mean": mean, "sd": sd, "n": n, "t": float("nan"), "p": float("nan"), "ci": (mean, mean)}
    t = mean / se
    q = stats.t.ppf(0.5 + CI_LEVEL / 2, n - 1)
    return {
        "mean": mean,
        "sd": sd,
        "n": n,
        "t": float(t),
        "p": float(stats.t.sf(t, n - 1)),
        "ci": (mean - q * se, mean + q * se),
    }


def select(table: pd.DataFrame, claim, where: str) -> tuple[pd.DataFrame, int]:
    """The claim's slice of the table (dataset, token set, metric, epoch) and the epoch used.

    Raises a one-line StudyError naming the claim field when its value is not in the table.
    """
    sub = claim.subset
    for col, value, fld in (
        ("metric", claim.metric, "metric"),
        ("dataset", sub.dataset, "subset.dataset"),
        ("token_set", sub.token_set, "subset.token_set"),
    ):
        present = table[col].unique()
        if value not in present:
            raise StudyError(
                f"{value!r} is not in the table (it has {sorted(map(str, present))})", where, fld
            )
    df = table[
        (table.metric == claim.metric) & (table.dataset == sub.dataset) & (table.token_set == sub.token_set)
    ]
    epoch = int(df.epoch.max()) if sub.epoch == "last" else int(sub.epoch)
    if epoch not in set(df.epoch.unique()):
        raise StudyError(
            f"epoch {epoch} is not in the table (it has {sorted(df.epoch.unique().tolist())})",
            where,
            "subset.epoch",
        )
    return df[df.epoch == epoch], epoch


def _seed_by_layer(df: pd.DataFrame, layers: list[str], where: str, fld: str) -> pd.DataFrame:
    missing = sorted(set(layers) - set(df.layer.unique()))
    if missing:
        raise StudyError(
            f"layers {missing} are not in the table (it has {sorted(df.layer.unique())})", where, fld
        )
    wide = df.pivot_table(index="seed", columns="layer", values="value", aggfunc="mean")
    return wide


def test_u_shape(
    table: pd.DataFrame, claim, where: str = "claim", excluded: dict[int, str] | None = None
) -> Outcome:
    """U-shape over layers: intersection-union test of two per-seed contrasts.

    For each seed s, with region means over the declared layers:
    ``c_early[s] = mean(early) - mean(bottleneck)`` and ``c_late[s] = mean(late) - mean(bottleneck)``.
    Each contrast is tested one-sided (mean > 0) across seeds with t(S-1); the U is supported only if
    both are, so the intersection-union p-value is ``max(p_early, p_late)`` (no correction needed inside).
    The bottleneck region is declared in the file, never chosen as the argmin of the same data.

    Effect: ``-(mean of the binding contrast)``, i.e. how far the bottleneck sits below the shoulder with
    the weaker evidence (negative = a dip, in the metric's units, percentage points for ``eed_pct``).
    Contradicted when the 95% CI of either contrast lies entirely below 0 (that shoulder is lower
    than the bottleneck).
    """
    df, epoch = select(table, claim, where)
    regions = claim.regions
    layers_needed = [*regions.early, *regions.bottleneck, *regions.late]
    wide = _seed_by_layer(df, layers_needed, where, "regions")
    excluded = dict(excluded or {})
    complete = wide[layers_needed].notna().all(axis=1) & np.isfinite(wide[layers_needed]).all(axis=1)
    for seed in wide.index[~complete]:
        excluded[int(seed)] = "missing or non-finite values in the claimed layers"
    wide = wide[complete]
    seeds = [int(s) for s in wide.index]
    stat = u_shape_statistics(
        wide[regions.early].mean(axis=1).to_numpy(),
        wide[regions.bottleneck].mean(axis=1).to_numpy(),
        wide[regions.late].mean(axis=1).to_numpy(),
    )
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
        "profile": profile.to_dict(orient="records"),
        "observed_minimum_layer": str(profile.loc[profile["mean"].idxmin(), "layer"])
        if len(profile)
        else None,
    }
    return Outcome(
        p_value=stat["p"],
        effect=stat["effect"],
        ci=stat["ci"],
        contradicted=stat["contradicted"],
        seeds_used=seeds,
        seeds_excluded=excluded,
        warnings=stat["warnings"],
        details=details,
    )


def u_shape_statistics(early: np.ndarray, bottleneck: np.ndarray, late: np.ndarray) -> dict:
    """The u_shape intersection-union test on per-seed region means (each ``(S,)``, one value per seed).

    Returns:
        dict with ``p`` (max of the two one-sided p-values; NaN if no test is possible), ``effect`` and
        ``ci`` (bottleneck minus the binding shoulder, mean and 95% t CI), ``contradicted``, ``binding``
        (``early`` or ``late``), ``tests`` and ``contrasts`` (per contrast), ``warnings``.
    """
    contrasts = {"early": np.asarray(early) - bottleneck, "late": np.asarray(late) - bottleneck}
    tests = {k: t_test_greater(v) for k, v in contrasts.items()}
    n = len(bottleneck)
    warnings = []
    if n < 2:
        warnings.append(f"needs >= 2 seeds (has {n}): no test across seeds is possible")
        p = float("nan")
    elif any(math.isnan(t["p"]) for t in tests.values()):
        warnings.append("zero between-seed variance in a contrast: no test across seeds is possible")
        p = float("nan")
    else:
        p = max(t["p"] for t in tests.values())
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
        "warnings": warnings,
    }


TESTS = {"u_shape": test_u_shape}
