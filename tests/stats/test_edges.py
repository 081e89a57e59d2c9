"""Statistics at its edges (issue 30): each case a tiny table and hypothesis through ``analyze`` (in process,
or ``python -m study analyze`` where the case is that it never returned), plus small seeded calibrations of
the REJECTED rule at its least favourable case. The long calibrations are ``slow``; the full table is
``bench/calibration.py``."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.calibration import scenario
from analysis.kinds._parts.rejection import REJECT_LEVEL
from analysis.power import plan_claim, seed_floor
from analysis.table import make_table, save_table
from analysis.verdicts import ACCEPTED, INCONCLUSIVE, REJECTED, evaluate_claims, format_verdicts
from study.schema import parse_hypothesis

ROOT = Path(__file__).parents[2]
BLOCKS = [f"block_{i:02d}" for i in range(1, 13)]
EPOCHS = [0, 1, 2, 4, 6, 8]


def _hyp(claim: dict, n_seeds: int = 5, epochs: list[int] = EPOCHS) -> dict:
    return {
        "name": "edges",
        "design": {"datasets": [{"name": "objects"}], "seeds": list(range(n_seeds)), "checkpoints": epochs},
        "claims": [{"name": "c", "metric": "effective_rank", **claim}],
    }


def _analyze(claim: dict, table, n_seeds: int = 5):
    return evaluate_claims(parse_hypothesis(_hyp(claim, n_seeds)), table)[0]


def _rows(values: dict[tuple[int, int, str], float]):
    """A tidy table from {(seed, epoch, layer): value} (dataset objects, all tokens, effective_rank)."""
    return make_table(
        [
            {
                "run_key": f"r{seed}",
                "dataset": "objects",
                "seed": seed,
                "epoch": epoch,
                "layer": layer,
                "layer_index": 2 + BLOCKS.index(layer),
                "token_set": "all",
                "n_tokens": 64,
                "metric": "effective_rank",
                "value": float(v),
            }
            for (seed, epoch, layer), v in values.items()
        ]
    )


def _trend_table(
    slopes: dict[str, np.ndarray], noise: float = 0.05, seed: int = 0, extra: dict | None = None
):
    """Per layer, seed s follows ``10 + s + slopes[layer][s] * epoch`` plus N(0, noise) (seeded)."""
    rng = np.random.default_rng(seed)
    values = {
        (s, e, layer): 10 + s + b * e + noise * rng.normal()
        for layer, per_seed in slopes.items()
        for s, b in enumerate(per_seed)
        for e in EPOCHS
    }
    return _rows({**values, **(extra or {})})


def _copied(layers: list[str], n_seeds: int = 5):
    """One noisy run copied ``n_seeds`` times (an increasing trend in every layer)."""
    rng = np.random.default_rng(3)
    run = {(e, layer): 10 + 0.5 * e + rng.normal(0, 1) for e in EPOCHS for layer in layers}
    return _rows({(s, e, layer): v for s in range(n_seeds) for (e, layer), v in run.items()})


# 1. u_shape with a leave-one-seed-out bottleneck: the REJECTED rule used t CIs of dependent contrasts
@pytest.mark.parametrize("n_seeds", [5, 10])
def test_u_shape_loso_rejected_rate_at_the_step_down_null(n_seeds):
    sc, rng, reps = scenario("u_shape_loso"), np.random.default_rng([30, 1, n_seeds]), 400
    rate = np.mean([sc.rejected_at_boundary(n_seeds, rng) for _ in range(reps)])
    # was 0.097 +- 0.005 at S = 10 (issue 30); the bound is the rule's 2.5% + 2 Monte Carlo SE
    assert rate <= REJECT_LEVEL + 2 * math.sqrt(REJECT_LEVEL * (1 - REJECT_LEVEL) / reps), rate


def test_u_shape_loso_table_uses_the_calibrated_rejection():
    # a step-down profile (early high, then flat): the late contrast is 0; its t CI may exclude 0 by
    # chance, the sign-flip test that also picks the bottleneck decides
    rng = np.random.default_rng(11)
    prof = 50 + rng.normal(0, 1, (10, 12)) + np.r_[20.0, 20.0, np.zeros(10)]
    table = _rows({(s, 8, b): prof[s, i] for s in range(10) for i, b in enumerate(BLOCKS)})
    claim = {
        "kind": "u_shape",
        "subset": {"dataset": "objects"},
        "regions": {
            "early": ["block_01", "block_02"],
            "bottleneck": "leave_one_seed_out",
            "late": BLOCKS[9:],
        },
    }
    r = _analyze(claim, table, 10)
    from analysis.kinds._parts.u_shape_statistics import u_shape_loso_statistics

    st = u_shape_loso_statistics(prof[:, :2].mean(1), prof[:, 2:9], prof[:, 9:].mean(1))
    assert (r.verdict == REJECTED) == st.contradicted


# 2. several contrasts: the REJECTED rule is corrected across them (Holm), as the claim combines them
def test_trend_all_over_12_layers_is_not_rejected_by_one_layer_alone():
    # 11 layers rise clearly; block_01 falls with one-sided p 0.012 against the claim: alone that would
    # REJECT (its CI lies below 0), but 12 chances to see one such layer make it no evidence (Holm: 0.15)
    rise = np.array([1.0, 1.2, 0.8, 1.1, 0.9])
    fall = -3.5 * math.sqrt(2.5) / math.sqrt(5) * 0.1 + 0.1 * np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / 1.0
    slopes = {"block_01": fall, **{b: rise for b in BLOCKS[1:]}}
    claim = {"kind": "trend", "subset": {"dataset": "objects"}, "direction": "increasing", "layers": BLOCKS}
    r = _analyze({**claim, "aggregate": "all"}, _trend_table(slopes, noise=0.0))
    assert r.verdict == INCONCLUSIVE, (r.verdict, r.reason, r.details.get("p_against"))
    single = _analyze({**claim, "layers": ["block_01"]}, _trend_table(slopes, noise=0.0))
    assert single.verdict == REJECTED  # the same layer on its own still refutes a claim about it


@pytest.mark.parametrize("label", ["trend_slope_all12", "trend_kendall_all12", "extremum"])
def test_rejected_rate_with_several_contrasts(label):
    # at the null boundary: 12 layers with zero slope each (was 0.257 slope / 0.317 kendall), or a
    # target tied with 5 competitors (was 0.080)
    sc, rng, reps = scenario(label), np.random.default_rng([30, 2, len(label)]), 300
    rate = np.mean([sc.rejected_at_boundary(5, rng) for _ in range(reps)])
    assert rate <= REJECT_LEVEL + 2 * math.sqrt(REJECT_LEVEL * (1 - REJECT_LEVEL) / reps), rate


# 3. identical seeds (one run copied): no method may find evidence across seeds
@pytest.mark.parametrize(
    "claim",
    [
        {"kind": "trend", "method": "kendall", "layers": ["block_04"]},
        {"kind": "trend", "method": "mixed", "layers": ["block_04"]},
        {"kind": "trend", "method": "slope", "layers": ["block_04"]},
    ],
    ids=["kendall", "mixed", "slope"],
)
def test_identical_seeds_are_inconclusive_in_every_trend_method(claim):
    r = _analyze(
        {**claim, "subset": {"dataset": "objects"}, "direction": "increasing"}, _copied(["block_04"])
    )
    assert r.verdict == INCONCLUSIVE, (r.verdict, r.p_value)
    assert any("zero between-seed variance" in w for w in r.warnings), r.warnings


def test_identical_seeds_are_inconclusive_for_ordering_without_levels():
    rng = np.random.default_rng(4)
    run = {
        (ds, b): 10 + 3 * k + rng.normal()
        for k, ds in enumerate(("objects", "mixed", "textures"))
        for b in BLOCKS
    }
    rows = [
        {
            "run_key": f"{ds}{s}",
            "dataset": ds,
            "seed": s,
            "epoch": 8,
            "layer": b,
            "layer_index": 2 + BLOCKS.index(b),
            "token_set": "all",
            "n_tokens": 64,
            "metric": "effective_rank",
            "value": v,
        }
        for s in range(5)
        for (ds, b), v in run.items()
    ]
    hyp = _hyp({"kind": "ordering", "subset": {}, "datasets": ["objects", "mixed", "textures"]})
    hyp["design"]["datasets"] = [{"name": "objects"}, {"name": "mixed"}, {"name": "textures"}]
    hyp["claims"][0].update(direction="increasing", layers=["block_04", "block_05"])
    r = evaluate_claims(parse_hypothesis(hyp), make_table(rows))[0]
    assert r.verdict == INCONCLUSIVE, (r.verdict, r.p_value)
    assert any("zero between-seed variance" in w for w in r.warnings), r.warnings


# 4. every seed exactly linear: the display MixedLM's refinement never stopped
def test_analyze_returns_when_every_seed_is_exactly_linear(tmp_path):
    slopes = {"block_04": np.array([0.5, 0.6, 0.55, 0.45, 0.52])}
    table = save_table(_trend_table(slopes, noise=0.0), tmp_path / "table.parquet")
    hyp = tmp_path / "h.yaml"
    claim = {
        "kind": "trend",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": ["block_04"],
    }
    hyp.write_text(yaml.safe_dump(_hyp(claim)))
    out = subprocess.run(
        [sys.executable, "-m", "study", "analyze", str(hyp), "--table", str(table)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ACCEPTED" in out.stdout  # the per-seed slopes decide; the display fit says why it is absent
    assert "zero residual variance" in out.stdout


# 5. aggregate any + margin: equivalence must hold in every layer, not the binding one alone
def test_any_with_margin_is_not_rejected_on_the_binding_layer_alone():
    flat = np.array([0.001, -0.001, 0.002, -0.0005, 0.0003])  # within +-0.05, the smaller p
    wild = np.array([3.0, -3.0, 3.0, -3.0, 2.0])  # far outside the margin
    claim = {
        "kind": "trend",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": ["block_01", "block_02"],
        "aggregate": "any",
        "margin": 0.05,
    }
    r = _analyze(claim, _trend_table({"block_01": flat, "block_02": wild}, noise=0.001))
    assert r.details["binding"] == "block_01"
    assert r.verdict == INCONCLUSIVE, (r.verdict, r.reason)
    both_flat = _analyze(claim, _trend_table({"block_01": flat, "block_02": flat * 1.3}, noise=0.001))
    assert both_flat.verdict == REJECTED and "equivalence within +-0.05" in both_flat.reason


# 6. method mixed honours a declared margin
def test_mixed_method_tests_a_declared_margin():
    tiny = np.array([0.004, -0.003, 0.002, 0.001, -0.002])
    claim = {
        "kind": "trend",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": ["block_04"],
        "margin": 0.1,
    }
    table = _trend_table({"block_04": tiny}, noise=0.05)
    slope = _analyze({**claim, "method": "slope"}, table)
    mixed = _analyze({**claim, "method": "mixed"}, table)
    assert slope.verdict == REJECTED and "equivalence within +-0.1" in slope.reason
    assert mixed.verdict == REJECTED and "equivalence within +-0.1" in mixed.reason, (
        mixed.verdict,
        mixed.reason,
    )


# 7. a seed with no rows for the claimed layer is listed as excluded, as compare lists it
def test_a_seed_missing_the_claimed_layer_is_reported_excluded():
    slopes = {"block_04": np.array([0.5, 0.6, 0.55, 0.45])}
    extra = {(4, e, "block_05"): 1.0 + e for e in EPOCHS}  # seed 4 has rows, none for block_04
    table = _trend_table(slopes, extra=extra)
    trend = {
        "kind": "trend",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": ["block_04"],
    }
    r = _analyze(trend, table)
    assert r.seeds_used == [0, 1, 2, 3] and 4 in r.seeds_excluded, r.seeds_excluded
    compare = {
        "kind": "compare",
        "subset": {"dataset": "objects"},
        "a": {"layers": ["block_04"]},
        "b": {"layers": ["block_05"]},
    }
    assert 4 in _analyze(compare, table).seeds_excluded


# 8. zero between-seed variance: the same verdict whichever way the constant difference points
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_zero_variance_verdicts_are_symmetric(sign):
    values = {
        (s, 8, b): 10.0 + s + (sign if b == "block_04" else 0.0)
        for s in range(5)
        for b in ("block_04", "block_05")
    }
    claim = {
        "kind": "compare",
        "subset": {"dataset": "objects"},
        "a": {"layers": ["block_04"]},
        "b": {"layers": ["block_05"]},
    }
    r = _analyze(claim, _rows(values))
    assert r.verdict == INCONCLUSIVE, (sign, r.verdict, r.reason)
    assert any("zero between-seed variance" in w for w in r.warnings)
    assert "points the other way" not in format_verdicts([r])


def test_zero_variance_equivalence_is_symmetric():
    for diff in (0.5, 3.0):  # inside and outside the margin 1
        values = {
            (s, 8, b): 10.0 + s + (diff if b == "block_04" else 0.0)
            for s in range(5)
            for b in ("block_04", "block_05")
        }
        claim = {
            "kind": "equivalence",
            "subset": {"dataset": "objects"},
            "a": {"layers": ["block_04"]},
            "b": {"layers": ["block_05"]},
            "margin": 1.0,
        }
        r = _analyze(claim, _rows(values))
        assert r.verdict == INCONCLUSIVE, (diff, r.verdict, r.reason)


# 9. power and seeds needed respect the Holm floor across layers
def test_power_respects_the_holm_floor_across_layers():
    rng = np.random.default_rng(9)
    slopes = {b: 0.5 + 0.1 * rng.normal(size=5) for b in BLOCKS}
    claim = {
        "kind": "trend",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": BLOCKS,
        "aggregate": "any",
        "method": "kendall",
    }
    r = _analyze(claim, _trend_table(slopes, noise=1.5, seed=2))
    # 12 layers, sign flips: the smallest Holm-adjusted p is 12 * 2^-S, below 0.05 only from S = 8
    assert 12 * 2.0**-7 >= 0.05 > 12 * 2.0**-8
    assert r.verdict == INCONCLUSIVE and r.power == 0.0 and r.seeds_needed >= 8, (r.power, r.seeds_needed)
    assert seed_floor(2, 0.05, 12) == 8 and seed_floor(2, 0.05) == 5
    assert plan_claim(1.0, np.array([0.1, 0.9, 0.5]), 0.05, 5, labellings=2, contrasts=12)["floor"] == 8


def test_the_rejected_rule_is_unchanged_for_one_contrast():
    # one clear fall: REJECTED as before (the 95% CI lies below 0); a clear rise: ACCEPTED
    claim = {"kind": "trend", "subset": {"dataset": "objects"}, "layers": ["block_04"]}
    table = _trend_table({"block_04": np.array([0.5, 0.6, 0.55, 0.45, 0.52])})
    assert _analyze({**claim, "direction": "decreasing"}, table).verdict == REJECTED
    assert _analyze({**claim, "direction": "increasing"}, table).verdict == ACCEPTED


BOUNDARY_LABELS = [
    "u_shape",
    "u_shape_loso",
    "extremum",
    "trend_slope",
    "trend_kendall",
    "trend_mixed",
    "trend_slope_all12",
    "trend_kendall_all12",
    "trend_slope_any12",
    "compare",
    "equivalence",
    "ordering_jt",
    "ordering_levels",
]
BOUNDARY_SEEDS = [3, 5, 10]
BOUNDARY_REPS = 2000
BOUNDARY_FAMILY_ALPHA = 0.01  # the chance that a rule at exactly 2.5% fails one of the rows


def boundary_bound(reps: int = BOUNDARY_REPS, rows: int = len(BOUNDARY_LABELS) * len(BOUNDARY_SEEDS)) -> int:
    """The most REJECTED studies of ``reps`` a rule at exactly :data:`REJECT_LEVEL` gives in a row, but for
    a chance of ``BOUNDARY_FAMILY_ALPHA / rows`` (Bonferroni over the rows; the binomial's exact upper
    quantile): a correct rule fails one of the ``rows`` rows with a chance of at most 1%."""
    from scipy.stats import binom

    return int(binom.ppf(1 - BOUNDARY_FAMILY_ALPHA / rows, reps, REJECT_LEVEL))


def test_the_boundary_bound_passes_a_correct_rule_and_fails_a_liberal_one():
    """What the 39-row check below can tell apart, exactly (binomial): a rule at 2.5% passes all 39 rows
    with a chance of at least 99%; a rule at 5% (a 90% CI where a 95% one is due: twice the level) fails a
    given row with a chance above 99%. A 2 SE bound per row fails one of 39 rows with a chance of 70%."""
    from scipy.stats import binom

    rows, k = len(BOUNDARY_LABELS) * len(BOUNDARY_SEEDS), boundary_bound()
    assert k == 76  # of 2,000: a rate of 0.038
    assert binom.cdf(k, BOUNDARY_REPS, REJECT_LEVEL) ** rows >= 1 - BOUNDARY_FAMILY_ALPHA
    assert binom.cdf(k, BOUNDARY_REPS, 2 * REJECT_LEVEL) < 0.01
    two_se = REJECT_LEVEL + 2 * math.sqrt(REJECT_LEVEL * (1 - REJECT_LEVEL) / BOUNDARY_REPS)
    assert 1 - binom.cdf(math.floor(two_se * BOUNDARY_REPS), BOUNDARY_REPS, REJECT_LEVEL) ** rows > 0.6


def _rejected(label: str, n_seeds: int, reps: int, rng: np.random.Generator) -> int:
    sc = scenario(label)
    return sum(sc.rejected_at_boundary(n_seeds, rng) for _ in range(reps))


@pytest.mark.slow
@pytest.mark.parametrize("n_seeds", BOUNDARY_SEEDS)
@pytest.mark.parametrize("label", BOUNDARY_LABELS)
def test_rejected_rate_at_the_boundary_slow(label, n_seeds):
    # at most 2.5% REJECTED at the claim's least favourable null, for every kind; the bound is family-wise
    # over the 39 rows (test_the_boundary_bound_...): equivalence at 5 seeds, 0.0325 here once at 2 SE per
    # row, is 0.0254 (95% CI 0.0244 to 0.0264) at 100,000 replicates (docs/statistics.md)
    rng = np.random.default_rng([30, 3, n_seeds, len(label)])
    assert _rejected(label, n_seeds, BOUNDARY_REPS, rng) <= boundary_bound()


@pytest.mark.slow
def test_the_boundary_check_fails_a_tost_that_rejects_on_its_90_percent_ci(monkeypatch):
    """The same check on a REJECTED rule that is liberal by a realistic amount: equivalence's "outside
    the margin" read off the 90% CI (TOST's usual interval) instead of the 95% one, 5% at the margin."""
    import analysis.inference

    monkeypatch.setattr(analysis.inference, "CI_LEVEL", 0.90)
    rejected = _rejected("equivalence", 5, BOUNDARY_REPS, np.random.default_rng([30, 3, 5, 11]))
    assert rejected > boundary_bound(), rejected


def test_an_effect_pointing_the_other_way_is_said_plainly():
    """Before: "80% power needs no number of seeds (effect points the other way)"."""
    from analysis.report.sections import findings

    values = {(s, 8, b): 10.0 + s + (0.3 * ((s * 7) % 3) if b == "block_05" else 0.0)
              for s in range(5) for b in ("block_04", "block_05")}  # fmt: skip
    claim = {"kind": "compare", "subset": {"dataset": "objects"}, "a": {"layers": ["block_04"]},
             "b": {"layers": ["block_05"]}}  # fmt: skip
    r = _analyze(claim, _rows(values))
    assert r.verdict == INCONCLUSIVE and r.seeds_needed is None and r.effect < 0, (r.verdict, r.effect)
    text = format_verdicts([r])
    assert "no number of seeds" not in text and "80% power needs" not in text
    assert "more seeds cannot give it power: the observed effect points the other way" in text
    assert any("more seeds cannot give it power" in line for line in findings(None, r))
