"""The u_shape test on seeded simulations with known truth, and its degenerate cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.kinds._parts.u_shape_statistics import u_shape_statistics
from analysis.kinds.u_shape import evaluate as u_shape_test
from analysis.simulate import simulate_layer_table, simulate_profiles
from analysis.verdicts import ACCEPTED, INCONCLUSIVE, REJECTED, adjust, evaluate_claims
from study.schema import parse_hypothesis
from vitstudy_core.errors import StudyError

CLAIM = {
    "name": "u",
    "kind": "u_shape",
    "metric": "eed_pct",
    "subset": {"dataset": "objects"},
    "regions": {
        "early": ["block_01", "block_02"],
        "bottleneck": ["block_03", "block_04", "block_05"],
        "late": ["block_10", "block_11", "block_12"],
    },
}
HYP = parse_hypothesis(
    {
        "name": "sim",
        "design": {"datasets": [{"name": "objects"}], "seeds": [0, 1, 2, 3, 4]},
        "claims": [CLAIM],
    }
)


EARLY, BOTT, LATE = [0, 1], [2, 3, 4], [9, 10, 11]  # block indices of CLAIM's regions


def _verdict(prof: np.ndarray, alpha: float = 0.05) -> str:
    """The verdict a single u_shape claim gets on per-seed profiles (S, 12) (Holm of one claim = identity)."""
    st = u_shape_statistics(prof[:, EARLY].mean(1), prof[:, BOTT].mean(1), prof[:, LATE].mean(1))
    if not np.isnan(st.p) and st.p < alpha:
        return ACCEPTED
    return REJECTED if st.contradicted else INCONCLUSIVE


def _rate(shape: str, effect: float, n_seeds: int, reps: int, verdict: str, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    return float(
        np.mean([_verdict(simulate_profiles(shape, n_seeds, effect, rng)) == verdict for _ in range(reps)])
    )


def test_table_path_matches_array_path():
    rng = np.random.default_rng(11)
    for shape in ("u", "flat", "decreasing"):
        table = simulate_layer_table(shape, 5, 3.0, np.random.default_rng(rng.integers(1 << 30)))
        prof = table.pivot(index="seed", columns="layer_index", values="value").to_numpy()
        r = evaluate_claims(HYP, table)[0]
        assert r.verdict == _verdict(prof)
        st = u_shape_statistics(prof[:, EARLY].mean(1), prof[:, BOTT].mean(1), prof[:, LATE].mean(1))
        assert r.p_value == pytest.approx(st.p) and r.effect == pytest.approx(st.effect)


def test_accepts_planted_u():
    # a dip of 3 between-seed SDs at S=5 is found nearly always
    assert _rate("u", 3.0, 5, 300, ACCEPTED) >= 0.9


@pytest.mark.parametrize("n_seeds", [3, 5, 10])
@pytest.mark.parametrize(
    "shape,effect", [("flat", 0.0), ("decreasing_convex", 20.0), ("decreasing", 20.0), ("step_down", 20.0)]
)
def test_does_not_accept_non_u(shape, effect, n_seeds):
    # alpha = 0.05; 1000 reps: the rate must stay within alpha + 2 Monte Carlo SE (~0.064)
    reps = 1000
    assert _rate(shape, effect, n_seeds, reps, ACCEPTED, seed=n_seeds) <= 0.05 + 2 * np.sqrt(
        0.05 * 0.95 / reps
    )


def test_least_favourable_null_is_near_alpha():
    # step_down makes the early contrast huge and the late one exactly 0: the IUT's size is attained
    # there, so the rate must be close to alpha (far below it would mean a needlessly weak test)
    rate = _rate("step_down", 20.0, 5, 2000, ACCEPTED, seed=7)
    assert 0.02 <= rate <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 2000)


def test_monotone_profile_is_rejected():
    # late blocks far below the bottleneck: the CI of the late contrast excludes a rise
    assert _rate("decreasing", 20.0, 5, 300, REJECTED) >= 0.9


def test_effect_and_ci_on_known_dip():
    rng = np.random.default_rng(3)
    table = simulate_layer_table("u", 10, 5.0, rng, seed_sd=0.5, noise_sd=0.5)
    r = evaluate_claims(HYP, table)[0]
    assert r.verdict == ACCEPTED
    assert r.ci_low < r.effect < r.ci_high
    assert r.ci_low < -5.0 + 1.5 and r.ci_high > -5.0 - 1.5  # the CI sits around the planted -5
    assert r.details["observed_minimum_layer"] in {"block_03", "block_04", "block_05"}


def test_one_seed_is_inconclusive():
    table = simulate_layer_table("u", 1, 10.0, np.random.default_rng(0))
    r = evaluate_claims(HYP, table)[0]
    assert r.verdict == INCONCLUSIVE
    assert any("needs >= 2 seeds" in w for w in r.warnings)


def test_identical_values_are_inconclusive_not_nan_crash():
    table = simulate_layer_table("flat", 4, 0.0, np.random.default_rng(0))
    table["value"] = 42.0
    r = evaluate_claims(HYP, table)[0]
    assert r.verdict == INCONCLUSIVE
    assert r.warnings


def test_failed_seed_is_reported_excluded():
    table = simulate_layer_table("u", 5, 3.0, np.random.default_rng(0))
    table = table[table.seed != 4]
    r = evaluate_claims(HYP, table, failed={"objects": {4: "non-finite loss at epoch 3"}})[0]
    assert r.seeds_excluded == {4: "non-finite loss at epoch 3"}
    assert r.n_seeds == 4


def test_missing_metric_is_not_testable_not_an_error():
    table = simulate_layer_table("u", 3, 3.0, np.random.default_rng(0))
    table["metric"] = "stable_rank"
    r = evaluate_claims(HYP, table, source="f.yaml")[0]
    assert r.verdict == INCONCLUSIVE and math.isnan(r.p_value) and math.isnan(r.p_adjusted)
    assert r.reason == (
        "not testable on this source: metric 'eed_pct' is not in the table (it has ['stable_rank'])"
    )


def test_missing_layer_is_one_line_error():
    table = simulate_layer_table("u", 3, 3.0, np.random.default_rng(0))
    table = table[table.layer != "block_12"]
    with pytest.raises(StudyError, match="block_12"):
        u_shape_test(table, HYP.claims[0])


def test_holm_matches_definition():
    p = [0.01, 0.04, float("nan"), 0.03]
    adj = adjust(p, "holm")
    assert adj[0] == pytest.approx(0.03) and adj[3] == pytest.approx(0.06) and adj[1] == pytest.approx(0.06)
    assert np.isnan(adj[2])


def test_table_roundtrip(tmp_path):
    from analysis.table import load_table, save_table

    table = simulate_layer_table("u", 3, 3.0, np.random.default_rng(0))
    for ext in ("parquet", "csv"):
        path = save_table(table, tmp_path / f"t.{ext}")
        back = load_table(path)
        pd.testing.assert_frame_equal(back[table.columns].reset_index(drop=True), table, check_dtype=False)
