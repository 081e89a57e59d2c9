"""Calibration scenarios of the cross-condition kinds (``differs``, ``exceeds``, ``holds_in_all``) and of
``controls``: their least favourable nulls, simulated through the same array-level tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from analysis.inference import Alternative
from analysis.kinds._parts.difference import difference_statistics
from analysis.kinds._parts.rejection import contradiction
from analysis.kinds._parts.scenario import Scenario, Trial
from analysis.kinds._parts.u_shape_statistics import u_shape_statistics
from analysis.simulate import simulate_profiles

# The least favourable null is equal effects in both conditions, with large and unequal
# seed variances (SD 3 in condition a, 0.3 in b) and, when paired, a large shared seed offset (SD 5)
SD_A, SD_B, SD_SEED = 3.0, 0.3, 5.0
SD_DIFF = math.hypot(SD_A, SD_B)  # the per-seed difference's SD: the unit of ``effect``
Arrays = tuple[np.ndarray, ...]


Draw = Callable[[int, float, np.random.Generator], tuple[Arrays, Any]]
Test = Callable[[Arrays, Any, np.random.Generator], Trial]


def _draw_values(paired: bool) -> Draw:
    """(a (S,), b (S,)) per-seed effects with a - b of mean ``effect`` * SD_DIFF (paired: a shared seed
    offset; else independent seeds)."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, float]:
        base = rng.normal(0, SD_SEED, n_seeds) if paired else np.zeros(n_seeds)
        other = base if paired else rng.normal(0, SD_SEED, n_seeds)
        a = base + 1.0 + effect * SD_DIFF + rng.normal(0, SD_A, n_seeds)
        b = other + 1.0 + rng.normal(0, SD_B, n_seeds)
        # independent seeds share no offset: each condition's seeds then vary by their offsets too
        return (a, b), effect * SD_DIFF

    return draw


def _test_values(paired: bool, alternative: Alternative) -> Test:
    def test(arrays: Arrays, truth: float, rng: np.random.Generator) -> Trial:
        st = difference_statistics(arrays[0], arrays[1], alternative, paired)
        return {"p": st.p, "covered": bool(st.ci[0] <= truth <= st.ci[1]), "warned": False,
                "contradicted": bool(st.contradicted)}  # fmt: skip

    return test


def _regions(prof: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The declared regions of the u_shape scenarios: blocks 1-2, 3-5 and 10-12 (region means, (S,))."""
    return prof[:, [0, 1]].mean(1), prof[:, [2, 3, 4]].mean(1), prof[:, [9, 10, 11]].mean(1)


def _dip(prof: np.ndarray) -> np.ndarray:
    from analysis.kinds._parts.u_shape_statistics import dip_depth

    return dip_depth(*_regions(prof))


DIP = 6.0  # the null's dip in both conditions (metric units; noise SD 3 in a, 0.5 in b)


def _draw_u(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, float]:
    """Profiles (S, 12) in conditions a and b sharing each seed's offset and slope: a U of depth DIP in
    both, a's deeper by ``effect`` * 3 (a's noise SD); the truth, the difference of the bottleneck
    depths of the mean profiles, is that 3 * ``effect``."""
    shared = rng.normal(0, SD_SEED, (n_seeds, 1)) + rng.normal(0, 0.3, (n_seeds, 1)) * np.arange(12)
    a = simulate_profiles("u", n_seeds, DIP + 3.0 * effect, rng, noise_sd=3.0) + shared
    b = simulate_profiles("u", n_seeds, DIP, rng, noise_sd=0.5) + shared
    return (a, b), 3.0 * effect


def _test_u(arrays: Arrays, truth: float, rng: np.random.Generator) -> Trial:
    """``exceeds`` of the bottleneck depth, a minus b, paired by seed."""
    st = difference_statistics(_dip(arrays[0]), _dip(arrays[1]), "greater", True)
    return {"p": st.p, "covered": bool(st.ci[0] <= truth <= st.ci[1]), "warned": False,
            "contradicted": bool(st.contradicted)}  # fmt: skip


def _draw_holds(boundary: bool) -> Draw:
    """Profiles in two conditions: a step-down (the u_shape null: late contrast 0) in a and a clear U in
    b (the IUT's least favourable null: one condition at its boundary, the other true); at ``effect`` > 0
    both are U's of that depth. REJECTED boundary: a step-down in both."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, Any]:
        if effect > 0:
            return tuple(simulate_profiles("u", n_seeds, effect, rng) for _ in range(2)), None
        shapes = ("step_down", "step_down") if boundary else ("step_down", "u")
        return tuple(simulate_profiles(s, n_seeds, 20.0, rng) for s in shapes), None

    return draw


def _test_holds(arrays: Arrays, truth: Any, rng: np.random.Generator) -> Trial:
    stats_ = [u_shape_statistics(*_regions(prof)) for prof in arrays]
    ps = [s.p for s in stats_]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    from analysis.kinds._parts.rejection import combined_against

    against = [combined_against(s.p_against, "every") for s in stats_]
    return {"p": p, "covered": None, "warned": False, "contradicted": contradiction(against, "every")}


def _draw_controls(boundary: bool) -> Draw:
    """Own condition: a U of depth 20 (clearly true); control: the same U (the exceeds null), sharing
    each seed's offset. At ``effect`` > 0 the own dip is deeper by ``effect`` * 3. REJECTED boundary:
    the own claim just true (a step-down) and the control's depth equal to it."""

    def draw(n_seeds: int, effect: float, rng: np.random.Generator) -> tuple[Arrays, Any]:
        shared = rng.normal(0, SD_SEED, (n_seeds, 1))
        shape = "step_down" if boundary else "u"
        own = simulate_profiles(shape, n_seeds, 20.0 + 3.0 * effect, rng, noise_sd=3.0) + shared
        ctrl = simulate_profiles(shape, n_seeds, 20.0, rng, noise_sd=0.5) + shared
        return (own, ctrl), None

    return draw


def _test_controls(arrays: Arrays, truth: Any, rng: np.random.Generator) -> Trial:
    from analysis.kinds._parts.rejection import combined_against

    own = u_shape_statistics(*_regions(arrays[0]))
    ex = difference_statistics(_dip(arrays[0]), _dip(arrays[1]), "greater", True)
    ps = [own.p, ex.p]
    p = float("nan") if any(math.isnan(v) for v in ps) else max(ps)
    against = [combined_against(own.p_against, "every"), *ex.p_against]
    return {"p": p, "covered": None, "warned": False, "contradicted": contradiction(against, "every")}


def _boundary(draw: Draw) -> Callable[[int, np.random.Generator], tuple[Arrays, Any]]:
    return lambda n_seeds, rng: draw(n_seeds, 0.0, rng)


def _value_scenarios(alternative: Alternative, name: str) -> dict[str, Scenario]:
    sides = "one-sided a > b" if alternative == "greater" else "two-sided"
    return {
        f"{name}_paired": Scenario(
            f"equal effects ({sides}), seed SD 3 vs 0.3, shared seed offset SD 5; paired t",
            draw=_draw_values(True),
            test=_test_values(True, alternative),
        ),
        f"{name}_welch": Scenario(
            f"equal effects ({sides}), seed SD 3 vs 0.3, different seeds; Welch t",
            draw=_draw_values(False),
            test=_test_values(False, alternative),
        ),
    }


def _calibration_exceeds() -> dict[str, Scenario]:
    return {
        **_value_scenarios("greater", "exceeds"),
        "exceeds_u_shape": Scenario(
            "equal dips (depth 6) in a and b, noise SD 3 vs 0.5, shared seed offset and slope; bottleneck "
            "depth, paired t",
            draw=_draw_u,
            test=_test_u,
        ),
        "controls_u_shape": Scenario(
            "u_shape with a control: own U clearly true, the control's dip equal (noise SD 3 vs 0.5); "
            "REJECTED: own step-down, control equal",
            draw=_draw_controls(False),
            test=_test_controls,
            boundary=_boundary(_draw_controls(True)),
        ),
    }
