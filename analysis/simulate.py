"""Simulated studies with known truth, as tidy tables: for validating the statistical tests.

Each seed's layer profile is ``mean_profile + seed offset + seed slope * depth + AR(1) layer noise``,
so layers within a seed are correlated, as in real runs. Used by tests and ``bench/calibration.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from study.schema import layer_names


def mean_profile(shape: str, n_blocks: int, effect: float, base: float = 50.0) -> np.ndarray:
    """Mean metric over blocks 1..n_blocks (shape ``(n_blocks,)``).

    Shapes: ``flat``; ``u`` (dip of ``effect`` over blocks 3-5, early and late at ``base``);
    ``decreasing_convex`` (``base + effect * exp(-(b - 1) / 2)``: falls steeply then flattens); ``decreasing`` (linear).
    ``step_down`` (``base + effect`` on blocks 1-2, ``base`` after: monotone, early contrast large, late
    contrast exactly 0 — the least favourable null of the u_shape test for the paper's regions).
    """
    b = np.arange(1, n_blocks + 1, dtype=float)
    if shape == "flat":
        return np.full(n_blocks, base)
    if shape == "u":
        prof = np.full(n_blocks, base)
        prof[2:5] -= effect
        return prof
    if shape == "decreasing_convex":
        return base + effect * np.exp(-(b - 1) / 2.0)
    if shape == "step_down":
        prof = np.full(n_blocks, base)
        prof[:2] += effect
        return prof
    if shape == "decreasing":
        return base + effect * (1 - (b - 1) / (n_blocks - 1))
    raise ValueError(f"unknown shape {shape!r}")


def ar1_noise(rng: np.random.Generator, n_seeds: int, n: int, noise_sd: float, ar: float) -> np.ndarray:
    """Stationary AR(1) noise, shape ``(n_seeds, n)``: coefficient ``ar``, marginal SD ``noise_sd``."""
    eps = np.empty((n_seeds, n))
    eps[:, 0] = rng.normal(0, noise_sd, n_seeds)
    innov = rng.normal(0, noise_sd * np.sqrt(1 - ar**2), (n_seeds, n))
    for i in range(1, n):
        eps[:, i] = ar * eps[:, i - 1] + innov[:, i]
    return eps


def simulate_profiles(
    shape: str,
    n_seeds: int,
    effect: float,
    rng: np.random.Generator,
    n_blocks: int = 12,
    seed_sd: float = 1.0,
    slope_sd: float = 0.1,
    noise_sd: float = 1.0,
    ar: float = 0.5,
) -> np.ndarray:
    """Per-seed block profiles, shape ``(n_seeds, n_blocks)``: mean profile + seed offset + seed slope
    x depth + stationary AR(1) noise over depth (coefficient ``ar``, marginal SD ``noise_sd``)."""
    mu = mean_profile(shape, n_blocks, effect)
    eps = ar1_noise(rng, n_seeds, n_blocks, noise_sd, ar)
    depth = np.arange(n_blocks) - (n_blocks - 1) / 2
    offset = rng.normal(0, seed_sd, (n_seeds, 1))
    slope = rng.normal(0, slope_sd, (n_seeds, 1))
    return mu + offset + slope * depth + eps


def simulate_layer_table(
    shape: str,
    n_seeds: int,
    effect: float,
    rng: np.random.Generator,
    n_blocks: int = 12,
    dataset: str = "objects",
    metric: str = "eed_pct",
    epoch: int = 1,
    **kw,
) -> pd.DataFrame:
    """A tidy table (analysis.table columns) of ``n_seeds`` simulated block profiles (see simulate_profiles)."""
    prof = simulate_profiles(shape, n_seeds, effect, rng, n_blocks, **kw)
    layers = layer_names(n_blocks)[2 : 2 + n_blocks]
    seeds = np.repeat(np.arange(n_seeds), n_blocks)
    return pd.DataFrame(
        {
            "run_key": [f"sim{s}" for s in seeds],
            "dataset": dataset,
            "seed": seeds,
            "epoch": epoch,
            "layer": np.tile(layers, n_seeds),
            "layer_index": np.tile(np.arange(2, 2 + n_blocks), n_seeds),
            "token_set": "all",
            "n_tokens": -1,
            "metric": metric,
            "value": prof.ravel(),
        }
    )


def simulate_trends(
    n_seeds: int,
    n_points: int,
    mean_slope: float,
    rng: np.random.Generator,
    slope_sd: float = 1.0,
    seed_sd: float = 1.0,
    noise_sd: float = 1.0,
    ar: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed series with random slopes and AR(1) noise: the least favourable null of ``trend`` at 0.

    ``y[s, t] = offset_s + (mean_slope + u_s) * x_t + eps[s, t]``, ``u_s ~ N(0, slope_sd)``, eps stationary
    AR(1) (coefficient ``ar``, marginal SD ``noise_sd``), ``x_t = 0..n_points-1``.

    Returns:
        x (n_points,), y (n_seeds, n_points).
    """
    x = np.arange(n_points, dtype=float)
    eps = ar1_noise(rng, n_seeds, n_points, noise_sd, ar)
    slope = mean_slope + rng.normal(0, slope_sd, (n_seeds, 1))
    offset = rng.normal(0, seed_sd, (n_seeds, 1))
    return x, offset + slope * x + eps


def simulate_study_table(
    n_seeds: int = 5,
    datasets: tuple[str, ...] = ("objects", "cue_mix", "textures"),
    n_blocks: int = 12,
    epochs: tuple[int, ...] = tuple(range(11)),
    metrics: tuple[str, ...] = (
        "eed_pct",
        "effective_rank",
        "spectral_entropy",
        "spectral_entropy_norm",
        "stable_rank",
        "participation_ratio",
        "spectral_anisotropy",
        "spectral_flatness",
    ),
    token_sets: tuple[str, ...] = ("all", "cls"),
    seed: int = 0,
) -> pd.DataFrame:
    """A synthetic study in the tidy-table format: seeds x datasets x (n_blocks + 3) layers x epochs x metrics.

    Values follow a U over depth whose dip shrinks with the dataset's position in ``datasets`` (texture
    reliance), grow over epochs (anisotropy falls), put the final-norm CLS token highest, plus seed
    offsets and noise. Sized by default like a full CPU study (5 x 3 x 15 x 11 x 8, two token sets); used
    by ``bench/analyze.py`` and the end-to-end claim tests.
    """
    rng = np.random.default_rng(seed)
    layers = layer_names(n_blocks)
    n_l, n_e = len(layers), len(epochs)
    depth = np.linspace(0, 1, n_l)
    frames = []
    for d_i, ds in enumerate(datasets):
        dip = 10.0 * (1 - d_i / max(len(datasets) - 1, 1))
        shape = 50 - dip * np.exp(-(((depth - 0.35) / 0.15) ** 2))
        for tset in token_sets:
            bonus = np.where(np.array(layers) == "norm", 8.0, 0.0) if tset == "cls" else np.zeros(n_l)
            for metric in metrics:
                sign = -1.0 if metric == "spectral_anisotropy" else 1.0
                growth = sign * 0.8 * np.asarray(epochs, float)[:, None]  # (E, 1)
                base = (shape + bonus)[None, :] + growth  # (E, L)
                vals = (
                    base[None] + rng.normal(0, 1.0, (n_seeds, 1, 1)) + rng.normal(0, 0.7, (n_seeds, n_e, n_l))
                )
                s, e, l_ = np.meshgrid(np.arange(n_seeds), np.arange(n_e), np.arange(n_l), indexing="ij")
                frames.append(
                    pd.DataFrame(
                        {
                            "run_key": [f"{ds}-s{x}" for x in s.ravel()],
                            "dataset": ds,
                            "seed": s.ravel(),
                            "epoch": np.asarray(epochs)[e.ravel()],
                            "layer": np.asarray(layers)[l_.ravel()],
                            "layer_index": l_.ravel(),
                            "token_set": tset,
                            "n_tokens": -1,
                            "metric": metric,
                            "value": vals.ravel(),
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------------------------
# Calibration studies: one simulated study per call, under each claim kind's least favourable null
# (effect = 0) or an alternative (effect > 0, in units of the per-seed noise SD).
# --------------------------------------------------------------------------------------------------
CALIBRATION_KINDS = {
    # kind label: (claim kind, description of the least favourable null)
    "u_shape": ("u_shape", "monotone step-down (early >> bottleneck = late)"),
    "u_shape_convex": ("u_shape", "monotone convex decay"),
    "u_shape_loso": ("u_shape", "monotone step-down; bottleneck chosen leave-one-seed-out"),
    "trend_slope": ("trend", "per-seed random slopes (mean 0) + AR(1) noise, 6 epochs"),
    "trend_kendall": ("trend", "per-seed random slopes (mean 0) + AR(1) noise, 6 epochs"),
    "trend_mixed": ("trend", "per-seed random slopes (mean 0) + AR(1) noise, 6 epochs"),
    "ordering_jt": ("ordering", "3 datasets with equal means, seed offsets"),
    "ordering_levels": ("ordering", "3 knob levels with equal means, seed offsets"),
    "extremum": ("extremum", "target ties one competitor, 3 others far below"),
    "equivalence": ("equivalence", "true difference exactly at the margin (1 SD)"),
    "compare": ("compare", "no difference (one-sided greater)"),
    "compare_two_sided": ("compare", "no difference (two-sided)"),
}


def simulate_claim_study(label: str, n_seeds: int, effect: float, rng: np.random.Generator) -> dict:
    """One simulated study for ``label`` (a key of CALIBRATION_KINDS) through the kind's array core.

    ``effect`` = 0 is the least favourable null; > 0 an alternative of that size (per-seed noise SD
    units: dip depth, mean slope per epoch, shift per ordered step, lead over the closest competitor,
    distance inside the margin of 1 (capped at 1), difference). Returns ``p`` (one-sided in the claimed direction; NaN if
    no test was possible), ``covered`` (whether the 95% CI of the kind's effect covers the truth; None
    where the effect has no known true value) and ``warned`` (the fit recorded a warning).
    """
    from analysis.claims import (
        compare_statistics,
        equivalence_statistics,
        extremum_statistics,
        u_shape_loso_statistics,
        u_shape_statistics,
    )
    from analysis.trends import ordering_statistics, trend_statistics

    s = n_seeds
    if label == "u_shape_loso":
        prof = simulate_profiles("u" if effect > 0 else "step_down", s, effect if effect > 0 else 20.0, rng)
        cand = prof[:, 2:9]  # blocks 3-9: strictly between the early (1-2) and late (10-12) regions
        st = u_shape_loso_statistics(prof[:, [0, 1]].mean(1), cand, prof[:, [9, 10, 11]].mean(1))
        return {"p": st["p"], "covered": None, "warned": False}
    if label in ("u_shape", "u_shape_convex"):
        shape = "u" if effect > 0 else ("step_down" if label == "u_shape" else "decreasing_convex")
        prof = simulate_profiles(shape, s, effect if effect > 0 else 20.0, rng)
        st = u_shape_statistics(
            prof[:, [0, 1]].mean(1), prof[:, [2, 3, 4]].mean(1), prof[:, [9, 10, 11]].mean(1)
        )
        truth = effect if effect > 0 else None
        ci = st["tests"]["early"]["ci"]  # the early contrast (not selected by the data): truth = dip depth
        return {
            "p": st["p"],
            "covered": None if truth is None else bool(ci[0] <= truth <= ci[1]),
            "warned": False,
        }
    if label.startswith("trend"):
        method = label.split("_")[1]
        x, y = simulate_trends(s, 6, effect * 0.5, rng, slope_sd=0.5)  # 0.5 SD per epoch of slope spread
        st = trend_statistics(x, y, "increasing", method)
        truth = effect * 0.5
        covered = None if method == "kendall" else bool(st["ci"][0] <= truth <= st["ci"][1])
        warned = bool(st["mixed"] and st["mixed"]["warnings"])
        return {"p": st["p"], "covered": covered, "warned": warned}
    if label.startswith("ordering"):
        y = rng.normal(0, 1, (s, 1)) + effect * np.arange(3)[None, :] + rng.normal(0, 1, (s, 3))
        levels = None if label == "ordering_jt" else np.array([0.0, 1.0, 2.0])
        st = ordering_statistics(y, "increasing", levels, n_permutations=999, seed=int(rng.integers(1 << 30)))
        return {"p": st["p"], "covered": bool(st["ci"][0] <= effect <= st["ci"][1]), "warned": False}
    if label == "extremum":
        base = rng.normal(0, 1, (s, 1))
        target = base[:, 0] + effect + rng.normal(0, 1, s)
        comps = base + np.array([0.0, -10.0, -10.0, -10.0]) + rng.normal(0, 1, (s, 4))
        st = extremum_statistics(target, comps, "highest")
        ci = st["tests"][0]["ci"]
        return {"p": st["p"], "covered": bool(ci[0] <= effect <= ci[1]), "warned": False}
    if label == "equivalence":
        truth = 1.0 - min(effect, 1.0)  # margin 1: effect = how far inside the margin (capped at the centre)
        a = rng.normal(0, 1, s) + truth
        st = equivalence_statistics(a, np.zeros(s), 1.0)
        return {"p": st["p"], "covered": bool(st["ci"][0] <= truth <= st["ci"][1]), "warned": False}
    if label.startswith("compare"):
        alt = "two-sided" if label.endswith("two_sided") else "greater"
        base = rng.normal(0, 1, s)
        st = compare_statistics(base + effect + rng.normal(0, 1, s), base + rng.normal(0, 1, s), alt)
        return {"p": st["p"], "covered": bool(st["ci"][0] <= effect <= st["ci"][1]), "warned": False}
    raise ValueError(f"unknown calibration label {label!r}")
