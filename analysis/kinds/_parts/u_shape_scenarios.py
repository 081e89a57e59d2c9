"""The u_shape's calibration scenarios: step-down and convex-decay profiles under the null, a U of a given
depth otherwise (``analysis.simulate.simulate_profiles``), tested with the regions declared or the
bottleneck chosen leave-one-seed-out. This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from analysis.kinds._parts.scenario import Trial
from analysis.kinds._parts.u_shape_statistics import u_shape_loso_statistics, u_shape_statistics
from analysis.simulate import simulate_profiles


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
