"""Calibration of ``unit: images``: simulated probe sets with a known population covariance per layer,
tested through the same functions as a study (``analysis.units.pseudo_values`` / ``pseudo_table``, then
the claim kind's own ``evaluate``).

A simulated probe has N images of T tokens each; at layer l a token is ``x = L_l (sqrt(rho) z_image +
sqrt(1 - rho) z_token)`` with ``L_l = diag(sqrt(lambda_l))`` and the same standard normal draws at every
layer (layers of one image are correlated, as in a network), so each layer's population covariance is
``diag(lambda_l)`` and its population metric is the metric of ``lambda_l``. The spectra come in two shapes
tuned to the same population value (:func:`tuned`): a power law ``i^-a`` and a step (D/8 eigenvalues 1,
the rest h), and layers compared in a null also differ in how much of a token's variance its image
shares (``rho`` 0.9 vs 0.1: fewer effective tokens, a larger finite-probe bias). At finite N their plug-in values read low by different amounts, so every null below is one
where a test of the sample values alone rejects too often (the ``naive`` row: the same jackknife spread,
centred on the plug-in values instead of the bias-corrected ones).

Scenarios (:data:`SCENARIOS`; the least favourable null of each kind that allows ``unit: images``):

* ``u_shape``: the early shoulder equals the bottleneck in population value (step vs power law), the late
  shoulder far above: the binding contrast is exactly 0.
* ``compare``: two layers with equal population values and different shapes (``a`` greater than ``b``).
* ``differs``: two models with equal population dip depths, each with its shoulders and bottleneck in
  opposite shapes (two-sided).
* ``compare_alt``: ``a`` above ``b`` by a known population difference: power and coverage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.kinds import get_kind
from analysis.kinds.base import TableView
from analysis.spectral import METRICS
from analysis.units import pseudo_table, pseudo_values

D = 32  # dimensions per layer
TOKENS = 4  # tokens per image
RHO = 0.5  # share of a token's variance common to its image
TIGHT, LOOSE = 0.9, 0.1  # layers whose tokens share much / little of their image's variance (other biases)
BLOCKS = 16
SIZES = (256, 1024, 4096)
LAYERS = ("pos_embed", "block_01", "block_02", "block_03", "norm")
REGIONS = {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]}


def power_law(a: float) -> np.ndarray:
    return np.arange(1, D + 1, dtype=np.float64) ** -a


def step(h: float) -> np.ndarray:
    lam = np.full(D, h)
    lam[: D // 8] = 1.0
    return lam


def tuned(shape: str, metric: str, target: float) -> np.ndarray:
    """A ``power`` or ``step`` spectrum whose population ``metric`` is ``target``."""
    from scipy.optimize import brentq

    fn = METRICS[metric]
    if shape == "power":
        a = brentq(lambda x: fn(power_law(x)) - target, 1e-6, 10.0)
        return power_law(a)
    h = brentq(lambda x: fn(step(x)) - target, 1e-6, 1.0)
    return step(h)


@dataclass(frozen=True)
class UnitScenario:
    """A simulated design: per model, layer -> spectrum; the claim; the population effect."""

    description: str
    claim: dict
    spectra: dict[str, dict[str, Any]]  # model -> layer -> population eigenvalues (or (eigenvalues, rho))
    truth: float  # the population value of the claim's effect
    null: bool = True


def _top(metric: str) -> float:
    return 70.0 if metric == "eed_pct" else 0.5 * D


def _low(metric: str) -> float:
    return 35.0 if metric == "eed_pct" else 0.22 * D


def scenarios(metric: str) -> dict[str, UnitScenario]:
    low, top = _low(metric), _top(metric)
    p, s = tuned("power", metric, low), tuned("step", metric, low)
    hi_p, hi_s = tuned("power", metric, top), tuned("step", metric, top)
    fill = {"pos_embed": hi_p, "norm": hi_p}
    u = {"kind": "u_shape", "regions": REGIONS}
    alt = 2.0 if metric == "eed_pct" else 0.04 * D
    return {
        "u_shape": UnitScenario(
            "early shoulder = bottleneck in population (step vs power law), late far above",
            {**u},
            {"m": {**fill, "block_01": (s, LOOSE), "block_02": (p, TIGHT), "block_03": hi_s}},
            0.0,
        ),
        "compare": UnitScenario(
            "two layers, equal population values, step vs power law (a > b claimed)",
            {"kind": "compare", "a": {"layers": ["block_01"]}, "b": {"layers": ["block_02"]}},
            {"m": {**fill, "block_01": (p, TIGHT), "block_02": (s, LOOSE), "block_03": hi_s}},
            0.0,
        ),
        "differs": UnitScenario(
            "two models, equal population dip depths, shoulders and bottleneck in opposite shapes",
            {"kind": "differs", "claim": u, "a": {"condition": "x"}, "b": {"condition": "y"}},
            {
                "x": {**fill, "block_01": (s, LOOSE), "block_02": (p, TIGHT), "block_03": hi_s},
                "y": {**fill, "block_01": (p, TIGHT), "block_02": (s, LOOSE), "block_03": hi_p},
            },
            0.0,
        ),
        "compare_alt": UnitScenario(
            f"a above b by {alt:g} in population (power law vs step)",
            {"kind": "compare", "a": {"layers": ["block_01"]}, "b": {"layers": ["block_02"]}},
            {"m": {**fill, "block_01": tuned("power", metric, low + alt), "block_02": s, "block_03": hi_s}},
            alt,
            null=False,
        ),
    }


def block_sums(spectra: dict[str, Any], n_images: int, rng: np.random.Generator) -> dict[str, dict]:
    """Per layer the per-block token sums (``n``, ``s``, ``q``, ``u``, ``w``, each with a leading K axis) of
    one simulated probe of ``n_images`` images (tokens of one image in one block).

    ``spectra``: layer -> eigenvalues, or (eigenvalues, rho) for a layer whose tokens share another
    fraction ``rho`` of their variance with their image (default :data:`RHO`). Every layer scales the same
    draws ``g`` (image) and ``e`` (token) by ``r = sqrt(lambda)``: ``x = r (a g + b e)``, so its Gram is
    ``r r^T * (a^2 G_gg + b^2 G_ee + ab (G_ge + G_ge^T))``, three Grams formed once per block.
    """
    g = np.repeat(rng.standard_normal((n_images, D)), TOKENS, axis=0)
    e = rng.standard_normal((n_images * TOKENS, D))
    edges = [round(n_images * k / BLOCKS) * TOKENS for k in range(BLOCKS + 1)]
    cuts = list(zip(edges[:-1], edges[1:], strict=True))
    gg = np.stack([g[a:b].T @ g[a:b] for a, b in cuts])
    ee = np.stack([e[a:b].T @ e[a:b] for a, b in cuts])
    ge = np.stack([g[a:b].T @ e[a:b] for a, b in cuts])
    n = np.array([float(b - a) for a, b in cuts])
    out = {}
    for layer, spec in spectra.items():
        lam, rho = spec if isinstance(spec, tuple) else (spec, RHO)
        r, ca, cb = np.sqrt(lam), np.sqrt(rho), np.sqrt(1 - rho)
        z = [ca * g[a:b] + cb * e[a:b] for a, b in cuts]
        sq = [(y * y) @ lam for y in z]  # |x|^2 per token
        gram = ca * ca * gg + cb * cb * ee + ca * cb * (ge + ge.transpose(0, 2, 1))
        out[layer] = {
            "n": n,
            "s": np.stack([y.sum(0) for y in z]) * r,
            "q": gram * np.outer(r, r),
            "u": np.stack([(y.T @ v) * r for y, v in zip(z, sq, strict=True)]),
            "w": np.array([float((v * v).sum()) for v in sq]),
        }
    return out


def _claim(sc: UnitScenario, metric: str) -> Any:
    doc = {"name": "c", "metric": metric, "subset": {"dataset": "d"}, "unit": "images", **sc.claim}
    if doc["kind"] == "u_shape":
        doc["subset"] = {"dataset": "d", "condition": "m"}
    if doc["kind"] == "compare":
        doc["subset"] = {"dataset": "d", "condition": "m"}
    return get_kind(doc["kind"]).model.model_validate(doc)


def simulate(sc: UnitScenario, metric: str, n_images: int, rng: np.random.Generator) -> dict[str, float]:
    """One simulated probe through the jackknife and the kind's test: ``p``, ``covered`` (the 95% CI holds
    the population effect), and the same for the naive test (``p_naive``)."""
    names = list(sc.spectra)
    rows, sums = [], []
    for m, model in enumerate(names):
        for layer, s in block_sums(sc.spectra[model], n_images, rng).items():
            rows.append({"dataset": "d", "seed": m, "epoch": 0, "layer": layer, "token_set": "all"})
            sums.append(s)
    stacked = {k: np.stack([s[k] for s in sums]) for k in ("n", "s", "q", "u", "w")}
    full, pseudo = pseudo_values(stacked, metric)
    frame = pd.DataFrame(rows).assign(
        metric=metric,
        value=full,
        n_tokens=n_images * TOKENS,
        layer_index=[LAYERS.index(r["layer"]) for r in rows],
    )
    claim = _claim(sc, metric)
    kind = get_kind(claim.kind)
    out = {}
    naive = pseudo - pseudo.mean(axis=1, keepdims=True) + full[:, None]  # the spread, not the correction
    for label, values in (("", pseudo), ("_naive", naive)):
        o = kind.evaluate(TableView.of(pseudo_table(frame, values, names)), claim, where="sim", excluded={})
        out[f"p{label}"] = float(o.p_value)
        out[f"covered{label}"] = bool(o.ci[0] <= sc.truth <= o.ci[1])
    return out


def calibrate_unit(label: str, metric: str, n_images: int, reps: int, alpha: float, seed: int = 0) -> dict:
    """Type-I error (or power), CI coverage of the population effect, and the naive test's type-I error."""
    import math

    sc = scenarios(metric)[label]
    rng = np.random.default_rng([seed, n_images, sum(map(ord, label + metric))])
    trials = [simulate(sc, metric, n_images, rng) for _ in range(reps)]
    rate = float(np.mean([t["p"] < alpha for t in trials]))
    return {
        "kind": label,
        "metric": metric,
        "N": n_images,
        "null": sc.null,
        "rate": rate,
        "bound": alpha + 2 * math.sqrt(alpha * (1 - alpha) / reps),
        "coverage": float(np.mean([t["covered"] for t in trials])),
        "naive_rate": float(np.mean([t["p_naive"] < alpha for t in trials])),
        "naive_coverage": float(np.mean([t["covered_naive"] for t in trials])),
        "reps": reps,
    }
