"""Probe resampling (issue 24): the bias-corrected participation ratio, streamed block sums, the seed x probe
interval, token matching and their bad-input lines. Array-level and one tiny extraction: seconds."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.probe import excludes_zero, joint_interval, resampled_values
from analysis.spectral import participation_ratio, participation_ratio_bc, sums_of
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.errors import StudyError

FIX = Path(__file__).parents[1] / "fixtures" / "dimensionality" / "package_numbers.json"


def test_participation_ratio_bc_matches_the_package():
    """The row-corrected estimator of Chun et al. (2026) from streamed sums equals the `dimensionality`
    package's own numbers on the same inputs (stored: the package is no dependency), any shift."""
    data = json.loads(FIX.read_text())
    for c in data["cases"]:
        x = (
            np.random.default_rng(c["seed"]).normal(size=(c["n"], c["d"])) * np.linspace(1, 3, c["d"])
            + c["offset"]
        )
        assert participation_ratio_bc(sums_of(x)) == pytest.approx(c["row"], rel=1e-9)
        assert participation_ratio_bc(sums_of(x, np.zeros(c["d"]))) == pytest.approx(c["row"], rel=1e-9)
        assert participation_ratio(np.linalg.eigvalsh(np.cov(x, rowvar=False))) == pytest.approx(
            c["naive"], rel=1e-9
        )


@pytest.mark.parametrize("n", [1_000, 10_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_participation_ratio_bc_removes_the_finite_sample_bias(n):
    """Planted spectrum lam_i = i^-0.5, D = 64 (true PR 31.6): over 20 draws the naive PR reads low by
    ~PR^2/n, the corrected one is unbiased within 3 SE."""
    d = 64
    lam = np.arange(1, d + 1) ** -0.5
    true = lam.sum() ** 2 / (lam**2).sum()
    rng = np.random.default_rng(n)
    naive, bc = [], []
    for _ in range({1_000: 20, 10_000: 6}.get(n, 4)):
        x = rng.normal(size=(n, d)) * np.sqrt(lam)
        naive.append(participation_ratio(np.linalg.eigvalsh(np.cov(x, rowvar=False))))
        bc.append(participation_ratio_bc(sums_of(x)))
    se = np.std(bc, ddof=1) / np.sqrt(len(bc))
    assert abs(np.mean(bc) - true) < 3 * se + 1e-3 * true
    assert 1 / np.mean(naive) == pytest.approx(1 / true + 1 / n, rel=0.2)  # 1/PR_naive ~ 1/PR + 1/n


def test_block_sums_rebuild_the_covariance_and_its_resamples():
    """Unit weights give the full covariance's metric; weights (2, 0, 1, 1) give that of the blocks
    stacked with block 0 twice and block 1 left out."""
    rng = np.random.default_rng(0)
    blocks = [rng.normal(size=(30, 5)) + 4 for _ in range(4)]
    shift = blocks[0][0]
    sums = [sums_of(b, shift) for b in blocks]
    stacked = {k: np.stack([s[k] for s in sums])[None] for k in sums[0]}
    full = np.concatenate(blocks)
    pr = resampled_values(stacked, np.ones(4), "participation_ratio")[0]
    assert pr == pytest.approx(participation_ratio(np.linalg.eigvalsh(np.cov(full, rowvar=False))), rel=1e-10)
    w = np.array([2.0, 0.0, 1.0, 1.0])
    again = np.concatenate([blocks[0], blocks[0], blocks[2], blocks[3]])
    got = resampled_values(stacked, w, "participation_ratio_bc")[0]
    assert got == pytest.approx(participation_ratio_bc(sums_of(again)), rel=1e-9)


def test_resampled_spectra_run_on_one_blas_thread(monkeypatch):
    """Every eigendecomposition of a resample sees one BLAS thread (with one per core, two of them spin
    against each other on a busy 2-core machine: 33x slower), and the thread count is restored after."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    seen: list[set[int]] = []
    eigvalsh = np.linalg.eigvalsh

    def spy(a):
        seen.append(blas_threads())
        return eigvalsh(a)

    rng = np.random.default_rng(1)
    sums = [sums_of(rng.normal(size=(40, 6)), np.zeros(6)) for _ in range(3)]
    stacked = {k: np.stack([s[k] for s in sums])[None] for k in sums[0]}
    monkeypatch.setattr(np.linalg, "eigvalsh", spy)
    with threadpool_limits(limits=2, user_api="blas"):  # as on a 2-core machine, whatever this one has
        resampled_values(stacked, np.ones(3), "participation_ratio")
        assert blas_threads() == {2}
    assert seen == [{1}]


def test_joint_interval_widens_the_seed_interval_and_decides():
    assert joint_interval(1.0, (0.5, 1.5), 0.0) == pytest.approx((0.5, 1.5))
    lo, hi = joint_interval(1.0, (0.5, 1.5), 0.5)
    assert lo < 0.5 and hi > 1.5 and excludes_zero((lo, hi), 1.0) is False
    assert excludes_zero((0.1, 2.0), 1.0) and excludes_zero((-2.0, -0.1), -1.0)
    # with K blocks the probe's half-width uses t on K - 1 df and the bootstrap's (K - 1) / K variance bias
    lo, hi = joint_interval(1.0, (1.0, 1.0), 0.5, blocks=16)
    assert hi - 1.0 == pytest.approx(0.5 * 2.131449545559323 * (16 / 15) ** 0.5, rel=1e-9)
    assert 1.0 - lo == pytest.approx(hi - 1.0)


def test_extraction_blocks_sum_to_the_full_covariance():
    """The K block sums of one streamed pass add up to the full probe's sums, and the probe-size spectra
    come out beside them."""
    import timm
    import torch

    from runners.extract import extract_spectra

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        img_size=8,
        patch_size=4,
        num_classes=0,
        embed_dim=16,
        depth=1,
        num_heads=2,
    )
    x = torch.randn(24, 3, 8, 8)
    sp = extract_spectra(model, x, batch_size=10, blocks=4)
    plain = extract_spectra(model, x, batch_size=10, probe_sizes=False)
    for key, lam in plain.eigenvalues.items():
        np.testing.assert_allclose(sp.eigenvalues[key], lam, rtol=1e-9, atol=1e-12)
    b = sp.blocks[("block_01", "patch")]
    assert b["n"].tolist() == [24.0] * 4 and b["q"].shape == (4, 16, 16)
    n, s, q = b["n"].sum(), b["s"].sum(0), b["q"].sum(0)
    lam = np.sort(np.linalg.eigvalsh((q - np.outer(s, s) / n) / (n - 1)))[::-1]
    np.testing.assert_allclose(lam, sp.eigenvalues[("block_01", "patch")], rtol=1e-8, atol=1e-10)
    assert sp.probe_sizes[("block_01", "all", "tokens_matched")][1] == 24
    assert sp.probe_sizes[("block_01", "all", "images_1_4")][1] == 6 * 5


def _mutated(fn) -> dict:
    data = yaml.safe_load(TINY_HYPOTHESIS)
    out = copy.deepcopy(data)
    fn(out)
    return out


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (
            lambda d: d["claims"][0].update(uncertainty="bogus"),
            "claims[0].uncertainty: Input should be 'seeds' or 'seeds+probe'",
        ),
        (lambda d: d["claims"][0].update(uncertainty="seeds+probe"), "needs design.probe.blocks >= 2"),
        (lambda d: d["design"]["probe"].update(size=16, blocks=16), "too small for 16 blocks"),
        (
            lambda d: (
                d["design"]["probe"].update(blocks=4),
                d["claims"][0].update(uncertainty="seeds+probe", metric="twonn_id"),
            ),
            "measured on a token subsample",
        ),
    ],
)
def test_bad_probe_input_is_one_line(mutate, expect):
    with pytest.raises(StudyError, match=None) as err:
        parse_hypothesis(_mutated(mutate), "f.yaml")
    assert expect in str(err.value) and "\n" not in str(err.value)


def test_token_metric_of_a_metric_log_is_refused():
    """participation_ratio_bc asked of a table without it or token counts (an imported metric log)."""
    import pandas as pd

    from study.pipeline.evaluation import check_token_metrics

    hyp = parse_hypothesis(
        _mutated(lambda d: d["claims"][0].update(metric="participation_ratio_bc")), "f.yaml"
    )
    table = pd.DataFrame({"metric": ["participation_ratio"], "n_tokens": [-1]})
    with pytest.raises(StudyError, match="records neither"):
        check_token_metrics(hyp, table, "f.yaml")
    check_token_metrics(hyp, table.assign(n_tokens=100), "f.yaml")  # measured runs: the claim is tested


# ---- conditions: each claim's probe-size rows come from its own condition's runs (issue 39) ---------------
def _condition_study(tmp_path):
    """Two trained cells (trained, shuffled) x 3 seeds, one run folder each with a ``probe.npz`` whose
    smaller probes differ by cell, and the tidy table (conditions' rows share dataset and seed)."""
    from analysis.table import make_table, rows_from_spectra

    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["conditions"] = [{"name": "trained"}, {"name": "shuffled", "labels": "shuffled"}]
    regions = {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]}
    u = {"kind": "u_shape", "metric": "eed_pct", "subset": {"dataset": "objects"}, "regions": regions}
    data["claims"] = [
        {**u, "name": "u trained", "subset": {"dataset": "objects", "condition": "trained"}},
        {**u, "name": "u shuffled", "subset": {"dataset": "objects", "condition": "shuffled"}},
        {
            "name": "deeper trained",
            "kind": "exceeds",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "claim": {"kind": "u_shape", "regions": regions},
            "a": {"condition": "trained"},
            "b": {"condition": "shuffled"},
        },
    ]
    layers = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]
    rng = np.random.default_rng(3)
    rows = []
    for cond, dip in (("trained", 0.9), ("shuffled", 0.3)):
        for seed in (0, 1, 2):
            key = f"{cond}{seed}"
            spectra, probe = {}, {}
            for layer in layers:
                decay = (dip if layer == "block_02" else 0.2) + 0.02 * rng.random()
                spectra[f"2/{layer}/all"] = np.exp(-decay * np.arange(16))
                for label, shrink in (("images_1_4", 1.5), ("images_1_2", 1.2)):
                    lam = np.exp(-decay * shrink * np.arange(16)) * (1 + 0.01 * rng.random(16))
                    probe[f"2/{layer}/all/{label}/lam"] = lam
                    probe[f"2/{layer}/all/{label}/n"] = np.asarray(80 // (4 if label == "images_1_4" else 2))
            run = tmp_path / "runs" / key
            run.mkdir(parents=True)
            np.savez(run / "probe.npz", **probe)
            n_tokens = {f"{layer}/all": 80 for layer in layers}
            for r in rows_from_spectra(key, "objects", seed, spectra, layers, n_tokens, metrics=["eed_pct"]):
                rows.append(r | {"condition": cond})
    return data, make_table(rows)


def test_probe_size_rows_are_each_conditions_own(tmp_path):
    """Before: probe.npz was read by (dataset, seed), so the shuffled claim's N/4 and N/2 rows were the
    trained claim's to every digit and trained-vs-shuffled read 0.0 (CI 0, 0) there."""
    from analysis.probe import ProbeData
    from analysis.verdicts import evaluate_claims

    data, table = _condition_study(tmp_path)
    results = evaluate_claims(
        parse_hypothesis(data, "f.yaml"), table, probe=ProbeData.of_table(table, tmp_path / "runs")
    )
    sizes = {r.name: {p["probe"]: p for p in r.details["probe_sizes"]} for r in results}
    assert [list(s) for s in sizes.values()] == [["N/4", "N/2", "N"]] * 3
    for i, cond in enumerate(("trained", "shuffled")):
        # the same claim on its condition's runs alone: the same rows to the digit
        alone = table[table.condition == cond]
        one = parse_hypothesis({**data, "claims": [data["claims"][i]]}, "f.yaml")
        (own,) = evaluate_claims(one, alone, probe=ProbeData.of_table(alone, tmp_path / "runs"))
        assert sizes[own.name] == {p["probe"]: p for p in own.details["probe_sizes"]}
    for label in ("N/4", "N/2", "N"):
        assert sizes["u trained"][label]["effect"] != pytest.approx(sizes["u shuffled"][label]["effect"])
        deeper = sizes["deeper trained"][label]  # the trained dip is planted deeper at every probe size
        assert deeper["effect"] > 1 and 0 < deeper["ci"][0] < deeper["ci"][1] and deeper["p"] < 0.05


def test_probe_size_rows_quote_the_tokens_of_the_layers_the_claim_reads(tmp_path):
    """Before: the rows quoted every layer's count, patch_embed's (no class token) first, a layer no region
    reads: "N/4 images (2048/2176 tokens)" where the claim's layers have 2,176."""
    from analysis.probe import ProbeData
    from analysis.verdicts import evaluate_claims

    data, table = _condition_study(tmp_path)
    table.loc[table.layer == "patch_embed", "n_tokens"] = 64  # patch tokens only
    (r,) = evaluate_claims(
        parse_hypothesis({**data, "claims": data["claims"][:1]}, "f.yaml"),
        table,
        probe=ProbeData.of_table(table, tmp_path / "runs"),
    )
    assert {p["probe"]: p["n_tokens"] for p in r.details["probe_sizes"]}["N"] == [80]
