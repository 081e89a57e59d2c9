"""``python -m study plan``: seeds for 80%/90% power checked against statsmodels and against simulation,
the SD's chi-square bound, seed floors of randomisation tests, and the run-hours basis."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats
from statsmodels.stats.power import TTestPower

from analysis.kinds.compare import compare_statistics
from analysis.power import plan_claim, power, sd_upper_bound, seed_floor, seeds_needed
from analysis.simulate import simulate_study_table
from analysis.table import save_table
from study.cli import main
from study.schema import parse_hypothesis
from study.seed_plan import format_plan, plan_study
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.fmt import fmt_num
from vitstudy_core.runfolder import RunFolder


@pytest.mark.parametrize("d, alpha, two_sided", [(0.8, 0.05, False), (0.5, 0.01, False), (1.2, 0.05, True)])
def test_seeds_and_power_agree_with_statsmodels(d, alpha, two_sided):
    alt = "two-sided" if two_sided else "larger"
    solved = TTestPower().solve_power(effect_size=d, alpha=alpha, power=0.8, alternative=alt)
    assert seeds_needed(d, alpha, 0.8, two_sided) == math.ceil(float(np.ravel(solved)[0]))
    assert power(d, 7, alpha, two_sided) == pytest.approx(TTestPower().power(d, 7, alpha, alternative=alt))
    assert seeds_needed(-d, alpha, 0.8) is None and seeds_needed(1e-4, alpha, 0.8) is None


@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.05 / 3, 0.001])
def test_power_is_statsmodels_ttest_power_at_every_seed_count(alpha, two_sided):
    """``analysis.power`` computes statsmodels' power from the scipy.special functions statsmodels calls
    (without its import): equal to TTestPower's at every seed count a plan counts, effects of both signs,
    wherever statsmodels' is a number; where it is NaN (scipy's noncentral t CDF in a far tail), ours is a
    probability."""
    from analysis.power import MAX_SEEDS, t_power

    alt = "two-sided" if two_sided else "larger"
    n = np.arange(2, MAX_SEEDS + 1)
    for d in (-0.5, 1e-4, 0.05, 0.3, 0.8, 1.7, 4.0):
        ours = t_power(d, n, alpha, two_sided)
        theirs = TTestPower().power(effect_size=d, nobs=n, alpha=alpha, alternative=alt)
        known = np.isfinite(theirs)
        np.testing.assert_allclose(ours[known], theirs[known], rtol=1e-12, atol=1e-15)
        assert np.all((ours >= 0) & (ours <= 1 + 1e-12))
        assert power(d, 5, alpha, two_sided) == float(t_power(d, np.asarray(5), alpha, two_sided))


def _nct_cdf_30_digits(df: float, nc: float, x: float) -> float:
    """P(T <= x) of the noncentral t by its definition, T = (Z + nc) / sqrt(U / df) with U ~ chi2(df):
    the normal CDF of x * sqrt(u / df) - nc integrated over U's density, by mpmath at 30 digits."""
    import mpmath as mp

    mp.mp.dps = 30
    k = mp.mpf(df) / 2

    def density(u):
        return mp.exp((k - 1) * mp.log(u) - u / 2 - k * mp.log(2) - mp.loggamma(k))

    spread = 12 * mp.sqrt(2 * df)
    cuts = [0, max(df - spread, df / 8), df, df + spread, mp.inf]
    return float(mp.quad(lambda u: mp.ncdf(x * mp.sqrt(u / df) - nc) * density(u), cuts))


def test_power_where_scipy_gives_nan_is_the_noncentral_t_integrated():
    """scipy's nctdtr is NaN at these points of a plan's grid (both tails, both its fallbacks): the mended
    CDF is the one integrated from the definition, and the plan counts the seed that statsmodels' NaN
    skipped (two-sided, alpha 0.001, d = 1.7: power 0.871 at 12 seeds, statsmodels NaN there)."""
    from scipy.special import nctdtr, stdtrit

    from analysis.power import nct_cdf, t_power

    points = [  # (df, nc, x)
        (10.0, 1.7 * math.sqrt(11), float(stdtrit(10, 0.0005))),  # lower tail of the two-sided test
        (489.0, 1.7 * math.sqrt(490), float(-stdtrit(489, 0.05))),  # one-sided, power about 1
        (960.0, -0.1373823795883263 * math.sqrt(961), 3.907002523676615),  # mirrored NaN too: about 1
        (3.0, 4.0 * 2.0, float(stdtrit(3, 0.025))),
    ]
    for df, nc, x in points:
        assert math.isnan(float(nctdtr(df, nc, x)))
        assert float(nct_cdf(df, nc, x)) == pytest.approx(_nct_cdf_30_digits(df, nc, x), abs=1e-12)
    assert float(t_power(1.7, np.asarray(12), 0.001, True)) == pytest.approx(0.8707255454858897, abs=1e-12)
    assert seeds_needed(1.7, 0.001, 0.8, two_sided=True) == 12
    theirs = TTestPower().power(effect_size=1.7, nobs=np.arange(2, 14), alpha=0.001, alternative="two-sided")
    assert math.isnan(theirs[10]) and np.flatnonzero(theirs >= 0.8)[0] + 2 == 13


def test_sd_upper_bound_is_scipy_s_chi_square_quantile():
    n = np.arange(2, 200)
    for level in (0.8, 0.9, 0.5):
        ours = [sd_upper_bound(1.0, int(k), level) for k in n]
        np.testing.assert_allclose(ours, np.sqrt((n - 1) / stats.chi2.ppf(1 - level, n - 1)), rtol=1e-12)


def test_sd_upper_bound_is_the_chi_square_bound():
    """P(sd_hat * sqrt((n-1)/chi2_0.2) >= sigma) = 0.8 for normal data."""
    assert sd_upper_bound(2.0, 4) == pytest.approx(2.0 * math.sqrt(3 / stats.chi2.ppf(0.2, 3)))
    rng = np.random.default_rng(0)
    sds = rng.normal(0, 1, (20_000, 4)).std(axis=1, ddof=1)
    cover = np.mean([sd_upper_bound(s, 4) >= 1.0 for s in sds])
    assert abs(cover - 0.8) < 0.01


def test_plan_claim_gives_more_seeds_at_the_bound():
    values = np.array([1.0, 1.5, 0.4, 1.2])
    row = plan_claim(0.5, values, 0.05, 3)
    sd = values.std(ddof=1)
    assert row["sd"] == pytest.approx(sd) and row["d"] == pytest.approx(0.5 / sd)
    assert row["seeds_80"] == seeds_needed(0.5 / sd, 0.05, 0.8)
    assert row["seeds_80_upper"] > row["seeds_80"] and row["seeds_90"] > row["seeds_80"]
    assert row["power_file"] == pytest.approx(power(0.5 / sd, 3, 0.05))


def test_planned_seeds_reach_the_power_in_simulation():
    """compare: a pilot's SD known, effect = sesoi; the kind's own test at the planned S has 80% power."""
    sd_diff, sesoi = 1.0, 0.6
    n = seeds_needed(sesoi / sd_diff, 0.05, 0.8)
    rng = np.random.default_rng(1)
    hits = []
    for _ in range(3000):
        base = rng.normal(0, 3, n)  # seed offsets shared by both conditions: they cancel in the pairs
        a = base + sesoi + rng.normal(0, sd_diff / math.sqrt(2), n)
        b = base + rng.normal(0, sd_diff / math.sqrt(2), n)
        hits.append(compare_statistics(a, b, "greater").p < 0.05)
    assert abs(np.mean(hits) - power(sesoi / sd_diff, n, 0.05)) < 3 * math.sqrt(0.8 * 0.2 / 3000)
    assert power(sesoi / sd_diff, n, 0.05) >= 0.8 > power(sesoi / sd_diff, n - 1, 0.05)


def test_seed_floors_of_randomisation_tests():
    assert seed_floor(2, 0.05) == 5 and 0.5**5 < 0.05 <= 0.5**4  # sign flips: p >= 2^-S
    assert seed_floor(6, 0.05) == 2  # JT over 3 conditions: (3!)^-S
    assert seed_floor(0, 0.05) == 0
    row = plan_claim(1.0, np.array([0.1, 0.9, 0.5]), 0.05, 3, labellings=2)
    assert row["floor"] == 5 and row["power_file"] == 0.0 and row["seeds_80"] >= 5


def test_plan_says_why_a_claim_has_no_seeds_for_80_percent_power():
    """A tiny positive effect needs more seeds than the plan counts (the verdict's "80% power needs 30039
    seeds"): the cell says ``>1000`` and a line gives d; an effect against the claim or a constant pilot
    says so, rather than a bare ``-``."""

    def row(name, effect, values):
        out = plan_claim(effect, np.array(values), 0.05, 3)
        hours = {f"run_hours_{k}": None for k in ("80", "90", "80_upper", "90_upper")}
        head = {"claim": name, "kind": "compare", "effect": effect, "effect_from": "pilot", "alpha": 0.05}
        return head | out | hours

    claims = [
        row("tiny", 0.01, [1.0, 1.5, 0.4, 1.2]),
        row("against", -0.5, [1.0, 1.5, 0.4, 1.2]),
        row("flat", 0.5, [1.0, 1.0, 1.0]),
    ]
    text = format_plan({"file_seeds": 3, "pilot": "p.parquet", "per_run": {}, "claims": claims})
    table = {line.split()[0]: line for line in text.splitlines()[1:4]}
    assert ">1000 (>1000)" in table["tiny"] and "n/a (n/a)" in table["against"] and "n/a" in table["flat"]
    assert " - " not in "".join(table.values())
    d = 0.01 / np.std([1.0, 1.5, 0.4, 1.2], ddof=1)
    assert f"! tiny: 80% power needs more than 1000 seeds at d = {fmt_num(d, 3)}" in text
    assert "! against: seeds n/a: the effect points away from the claim" in text
    assert "! flat: seeds n/a: the pilot's per-seed values do not vary (SD 0)" in text


def _hyp(tmp_path, claims: list[dict], seeds=(0, 1, 2)) -> tuple:
    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["seeds"] = list(seeds)
    data["design"]["model"]["depth"] = 12
    data["design"]["datasets"] = [
        {"name": n, "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 8}
        for n in ("objects", "cue_mix", "textures")
    ]
    data["claims"] = claims
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, parse_hypothesis(data)


CLAIMS = [
    {
        "name": "dip",
        "kind": "u_shape",
        "metric": "eed_pct",
        "subset": {"dataset": "objects"},
        "regions": {"early": ["block_01"], "bottleneck": ["block_04"], "late": ["block_12"]},
        "sesoi": 1.0,
    },
    {
        "name": "kendall",
        "kind": "trend",
        "metric": "eed_pct",
        "subset": {"dataset": "objects"},
        "direction": "increasing",
        "layers": ["block_06"],
        "method": "kendall",
        "confirmatory": False,
    },
]


def test_plan_verb_table_and_json(tmp_path, capsys, monkeypatch):
    import study.seed_plan

    monkeypatch.setattr(study.seed_plan, "_timed_step", lambda run: 1.0)
    path, hyp = _hyp(tmp_path, CLAIMS)
    pilot = tmp_path / "pilot.parquet"
    table = simulate_study_table(n_seeds=3, epochs=(0, 2), metrics=("eed_pct",), token_sets=("all",))
    save_table(table, pilot)
    out = tmp_path / "out"
    # a finished run of this design (another seed) gives the per-run time; nothing is timed or trained
    from study.runspecs import plan_runs

    spec = plan_runs(hyp)[0].model_copy(update={"seed": 99, "key": "other"})
    RunFolder(out / "runs" / "other").write_result(
        {"status": "finished", "run": spec.model_dump(), "history": [{"epoch": 1, "epoch_s": 36.0}] * 2}
    )
    plan = plan_study(hyp, out, pilot, time_step=lambda run: 1.0)
    dip, kendall = plan["claims"]
    assert dip["effect"] == 1.0 and dip["effect_from"] == "declared" and dip["n_pilot"] == 3
    assert dip["alpha"] == 0.05 and dip["floor"] == 0
    assert kendall["effect_from"] == "pilot" and kendall["floor"] == 5  # sign-flip p >= 2^-S
    assert plan["per_run"]["objects"] == {
        "hours": 72.0 / 3600,
        "source": "finished runs (epoch_s); extraction not included",
    }
    # extraction, timed (here a stand-in of 3 s per checkpoint), is added once per checkpoint
    n_ckpt = len(spec.checkpoints)
    timed = plan_study(hyp, out, pilot, time_step=lambda run: 1.0, time_extract=lambda run: 3.0)
    assert timed["per_run"]["objects"]["hours"] == pytest.approx((72 + 3 * n_ckpt) / 3600)
    assert f"extraction timed here (3.00 s x {n_ckpt} checkpoints)" in timed["per_run"]["objects"]["source"]
    assert timed["run_hours_per_seed"] == pytest.approx((72 + 8 + 3 * 3 * n_ckpt) / 3600)
    # the other two datasets were timed: 1 s per step x 2 steps per epoch x 2 epochs
    assert plan["per_run"]["textures"]["hours"] == pytest.approx(4 / 3600)
    assert plan["run_hours_per_seed"] == pytest.approx((72 + 8) / 3600)
    assert dip["run_hours_80"] == pytest.approx(dip["seeds_80"] * plan["run_hours_per_seed"])
    # a finished run that recorded its measurements' seconds gives the extraction time: nothing is timed
    RunFolder(out / "runs" / "other").write_result(
        {
            "status": "finished",
            "run": spec.model_dump(),
            "history": [{"epoch": 1, "epoch_s": 36.0}] * 2,
            "measure_s": {"0": 2.0, "2": 4.0},
        }
    )

    def untimed(run: dict) -> float:  # the other datasets have no finished run: timed (here 0 s)
        assert run["dataset"]["name"] != "objects", "extraction of objects timed"
        return 0.0

    recorded = plan_study(hyp, out, pilot, lambda run: 1.0, untimed)
    assert recorded["per_run"]["objects"]["hours"] == pytest.approx((72 + 3 * n_ckpt) / 3600)
    assert (
        f"extraction from finished runs (3.00 s x {n_ckpt} checkpoints)"
        in (recorded["per_run"]["objects"]["source"])
    )
    assert main(["plan", str(path), "--pilot", str(pilot), "--out", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [c["claim"] for c in got["claims"]] == ["dip", "kendall"]
    assert main(["plan", str(path), "--pilot", str(pilot), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kendall: its randomisation test cannot accept at any effect with fewer than 5 seeds" in text


def test_plan_without_pilot_and_bad_pilot(tmp_path, capsys, tiny_yaml):
    path = tiny_yaml
    assert main(["plan", str(path), "--out", str(tmp_path / "out"), "--json"]) == 0  # times a real step
    got = json.loads(capsys.readouterr().out)
    assert (
        got["pilot"] is None and got["claims"][0]["seeds_80"] is None and got["claims"][0]["effect"] is None
    )
    assert got["per_run"]["objects"]["hours"] > 0 and "timed step" in got["per_run"]["objects"]["source"]
    # the verb times one real extraction too: it is part of the hours
    assert "extraction timed here" in got["per_run"]["objects"]["source"]
    assert 0 < got["per_run"]["objects"]["extract_hours"] < got["per_run"]["objects"]["hours"]
    assert main(["plan", str(path), "--pilot", str(tmp_path / "none.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pilot" in err


def test_plan_prints_the_gpu_estimate_of_the_paper_files(tmp_path, capsys):
    """``plan`` of the two paper files prints the estimated H200 time, equal to runs x epochs x training
    images / measured images/s plus checkpoints x probe images / the supervised rate, computed here from
    the designs' own numbers and bench/README.md's measured figures."""
    from study.cli import main

    readme = (Path(__file__).parents[2] / "bench" / "README.md").read_text()
    assert "1,527 compiled" in readme and "868 compiled" in readme
    sup, dino = 1527.0, 868.0
    ib_train = 50_000 + 100_000 + 21 * 80  # CIFAR-100, Tiny ImageNet, UC Merced less its 20% test split
    ib = 5 * 100 * ib_train * (1 / dino + 1 / sup) + 30 * 6 * 1000 / sup  # 5 seeds, 2 trained objectives
    tgo = 5 * 100 * 126_689 / sup + 5 * 12 * 1000 / sup
    for name, seconds in (("inductive_bottleneck", ib), ("tgo_i", tgo)):
        assert (
            main(
                [
                    "plan",
                    str(Path(__file__).parents[2] / "hypotheses" / "paper" / f"{name}.yaml"),
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("estimated GPU time"))
        assert "on one H200" in line and "1,527 img/s" in line
        assert f": {seconds / 3600:.1f} h for" in line, (line, seconds / 3600)
    assert round(ib / 3600, 1) == 38.1 and round(tgo / 3600, 1) == 11.5


def test_plan_prints_a_u_shape_effect_with_the_verdict_s_sign():
    """Before: ``plan`` printed the u_shape's binding contrast (0.039) where the verdict said -0.04 (the
    verdict's effect is minus the contrast: a dip is negative); the power still uses the contrast."""
    import pandas as pd

    from analysis.verdicts import evaluate_claims
    from study.schema import load_hypothesis
    from study.seed_plan import plan_claims
    from tests.conftest import BEHAVIOUR, REPO

    hyp = load_hypothesis(REPO / "hypotheses" / "u_shape.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_u_shape_weak.parquet")
    (verdict,) = evaluate_claims(hyp, table)
    (row,) = plan_claims(hyp, table)
    assert row["effect_from"] == "pilot" and row["effect"] * verdict.effect < 0  # the contrast, for power
    assert row["effect_shown"] == pytest.approx(verdict.effect, rel=0.05)
    plan = {"claims": [row], "file_seeds": 5, "pilot": "p", "per_run": {}}
    for k in ("80", "90", "80_upper", "90_upper"):
        row[f"run_hours_{k}"] = None
    assert f" {fmt_num(verdict.effect, 3)} (pilot)" in format_plan(plan)


def test_run_times_under_an_hour_are_shown_in_minutes_or_seconds():
    """Before: ``run time objects: 0.000 h`` for a tiny design."""
    from vitstudy_core.fmt import fmt_hours

    assert [fmt_hours(h) for h in (2.5, 72.0 / 3600, 4 / 3600, None)] == ["2.50 h", "1.2 min", "4.0 s", "?"]
    plan = {
        "claims": [],
        "pilot": None,
        "file_seeds": 3,
        "per_run": {"objects": {"hours": 4 / 3600, "source": "timed"}},
    }
    assert "run time objects: 4.0 s (timed)" in format_plan(plan).splitlines()
