"""Simulated studies with known truth, as tidy tables: for validating the statistical tests.

Each seed's layer profile is ``mean_profile + seed offset + seed slope * depth + AR(1) layer noise``,
so layers within a seed are correlated, as in real runs. Used by tests and ``bench/calibration.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vitstudy_core.layers import layer_names

if TYPE_CHECKING:
    import pandas as pd

PAPER_EPOCHS = np.array([0.0, 1.0, *range(10, 101, 10)])  # the papers' checkpoint epochs
KNOB_LEVELS = np.linspace(0.0, 1.0, 5)  # a complexity knob's levels


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
    **kw: float,
) -> pd.DataFrame:
    """A tidy table (analysis.table columns) of ``n_seeds`` simulated block profiles (see simulate_profiles)."""
    import pandas as pd

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
    x: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed series with random slopes and AR(1) noise: the least favourable null of ``trend`` at 0.

    ``x`` (n_points,): the points (e.g. checkpoint epochs or knob levels); default ``0..n_points-1``.

    ``y[s, t] = offset_s + (mean_slope + u_s) * x_t + eps[s, t]``, ``u_s ~ N(0, slope_sd)``, eps stationary
    AR(1) (coefficient ``ar``, marginal SD ``noise_sd``), ``x_t = 0..n_points-1``.

    Returns:
        x (n_points,), y (n_seeds, n_points).
    """
    x = np.arange(n_points, dtype=float) if x is None else np.asarray(x, dtype=float)
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
    import pandas as pd

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
