"""Calibration scenarios of the ``trend`` kind: random-slope nulls over epochs and over a knob, the
aggregate-over-layers nulls, and the adjusted claim's confounded null, through the trend's array-level tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from analysis.kinds._parts.adjust import (
    KNOB,
)
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.trend_statistics import layers_statistics, trend_statistics
from analysis.simulate import KNOB_LEVELS, PAPER_EPOCHS, simulate_trends

Draw = Callable[[int, float, np.random.Generator], tuple[tuple[np.ndarray, ...], float]]
Test = Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial]


def _draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
    _, y = simulate_trends(n_seeds, 6, effect * 0.5, rng, slope_sd=0.5)  # 0.5 SD per epoch of slope spread
    return (y,), effect * 0.5


def _draw_at(x: np.ndarray, slope_sd: float) -> Draw:
    """Paper scale: checkpoints 0, 1, 10, ..., 100 with a slope SD of 0.03 per epoch (a slope variance of
    ~1e-3 per epoch^2) beside an intercept SD of 3; a knob 0..1 keeps the same spread of y over its range
    (3 per unit). ``effect`` is in units of the per-seed slope SD."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
        truth = effect * slope_sd
        _, y = simulate_trends(n_seeds, len(x), truth, rng, slope_sd=slope_sd, seed_sd=3.0, x=x)
        return (y,), truth

    return draw


def _test(method: str, x: np.ndarray | None = None) -> Test:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        y = arrays[0]
        xs = np.arange(y.shape[1], dtype=float) if x is None else x
        st = trend_statistics(xs, y, "increasing", method)
        covered = None if method == "kendall" else bool(st.ci[0] <= truth <= st.ci[1])
        return {
            "p": st.p,
            "covered": covered,
            "warned": bool(st.mixed and st.mixed.fit.warnings),
            "fallback": bool(st.mixed and st.mixed.fallback_reason),
            "contradicted": bool(st.contradicted),
        }

    return test


N_LAYERS = 12  # the aggregate scenarios: a claim over every block of a 12-block ViT


def _draw_layers(aggregate: str, boundary: bool) -> Draw:
    """(y (S, L, 6),) (the seed first, so a sequential look takes the first seeds) for a trend over 12 layers, each with random slopes (SD 0.5 per epoch) and AR(1)
    noise. ``all``: layer 0 at ``effect`` and the rest far up (the IUT's least favourable null); its
    REJECTED boundary: every layer at 0. ``any``: every layer at ``effect`` (Holm's least favourable
    null); its REJECTED boundary: layer 0 at 0 and the rest far down."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[tuple[np.ndarray, ...], float]:
        if aggregate == "all":
            means = np.zeros(N_LAYERS) if boundary else np.r_[effect, np.full(N_LAYERS - 1, 10.0)]
        else:
            means = np.r_[0.0, np.full(N_LAYERS - 1, -10.0)] if boundary else np.full(N_LAYERS, effect)
        ys = [simulate_trends(n_seeds, 6, 0.5 * m, rng, slope_sd=0.5)[1] for m in means]
        return (np.stack(ys, axis=1),), 0.5 * effect

    return draw


def _boundary_layers(
    aggregate: str,
) -> Callable[[int, np.random.Generator], tuple[tuple[np.ndarray, ...], float]]:
    draw = _draw_layers(aggregate, True)
    return lambda n_seeds, rng: draw(n_seeds, 0.0, rng)


def _test_layers(method: str, aggregate: str) -> Test:
    def test(arrays: tuple[np.ndarray, ...], truth: float, rng: np.random.Generator) -> Trial:
        ys = arrays[0]
        x = np.arange(ys.shape[2], dtype=float)
        layers = {f"layer{i}": ys[:, i] for i in range(ys.shape[1])}
        agg = layers_statistics(x, layers, "increasing", method, aggregate)
        return {"p": agg.p, "covered": None, "warned": False, "contradicted": agg.contradicted}

    return test


def _layer_scenarios() -> dict[str, Scenario]:
    out = {}
    for aggregate in ("all", "any"):
        for method in ("slope", "kendall"):
            rest = "far up" if aggregate == "all" else "at the same effect"
            out[f"trend_{method}_{aggregate}12"] = Scenario(
                f"aggregate {aggregate} over 12 layers: layer 1 at the effect, the rest {rest}; REJECTED at "
                + ("all 12 at 0" if aggregate == "all" else "layer 1 at 0, the rest far down"),
                draw=_draw_layers(aggregate, False),
                test=_test_layers(method, aggregate),
                boundary=_boundary_layers(aggregate),
            )
    return out


def _raw_trial(arrays: tuple[np.ndarray, ...], truth: Any, rng: np.random.Generator) -> Trial:
    """The unadjusted per-seed slope test on an adjusted claim's confounded null (a reference row)."""
    st = trend_statistics(KNOB, arrays[0], "decreasing", "slope")
    return {"p": st.p, "covered": None, "warned": False, "contradicted": bool(st.contradicted)}


_SPACINGS = {
    "paper": (
        PAPER_EPOCHS,
        0.03,
        "random slopes (mean 0, SD 0.03/epoch), intercept SD 3, AR(1); epochs 0,1,10..100",
    ),
    "knob": (KNOB_LEVELS, 3.0, "random slopes (mean 0, SD 3/unit), intercept SD 3, AR(1); knob 0,.25,..,1"),
}
