"""Claims across conditions (issue 23): ``differs``, ``exceeds``, ``holds_in_all``, ``controls`` and
``adjust_for``, end to end on small synthetic tables with a ``condition`` column (fast: no training)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.kinds._parts.difference import difference_statistics, welch_statistics
from analysis.kinds._parts.table import TableView
from analysis.simulate import simulate_study_table
from analysis.verdicts import ACCEPTED, INCONCLUSIVE, REJECTED, evaluate_claims
from study.schema import parse_hypothesis
from vitstudy_core.errors import StudyError

DESIGN = {"datasets": [{"name": "objects"}, {"name": "textures", "variant": "textures"}],
          "seeds": [0, 1, 2, 3, 4], "checkpoints": [0, 2],
          "conditions": [{"name": "trained"}, {"name": "shuffled", "labels": "shuffled"},
                         {"name": "untrained", "untrained": True},
                         {"name": "copy", "training": {"lr": 0.002}}]}  # fmt: skip
REGIONS = {"early": ["block_01"], "bottleneck": ["block_04", "block_05"], "late": ["block_12"]}
U = {"kind": "u_shape", "metric": "eed_pct", "subset": {"dataset": "objects"}, "regions": REGIONS}


def _flat(table: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """The same seeds with no dip: each row's value replaced by its seed's mean plus noise (untrained)."""
    seed_mean = table.groupby(["seed", "metric", "token_set"]).value.transform("mean")
    return table.assign(value=seed_mean + rng.normal(0, 0.7, len(table)))


def _half_dip(table: pd.DataFrame) -> pd.DataFrame:
    """Half the dip of ``table`` (the profile pulled halfway to each seed's mean)."""
    seed_mean = table.groupby(["seed", "metric", "token_set", "dataset", "epoch"]).value.transform("mean")
    return table.assign(value=(table.value + seed_mean) / 2)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    """trained: a dip on objects; shuffled: half that dip; untrained: none. Same seed ids everywhere."""
    rng = np.random.default_rng(7)
    base = simulate_study_table(n_seeds=5, datasets=("objects", "textures"), epochs=(0, 2),
                                metrics=("eed_pct",), token_sets=("all",), seed=1)  # fmt: skip
    parts = {"trained": base, "shuffled": _half_dip(base), "untrained": _flat(base, rng)}
    return pd.concat([t.assign(condition=c) for c, t in parts.items()], ignore_index=True)


def _hyp(*claims: dict):
    return parse_hypothesis(
        {"name": "t", "design": DESIGN, "claims": [{"name": f"c{i}", **c} for i, c in enumerate(claims)]},
        "f.yaml",
    )


def _one(table: pd.DataFrame, claim: dict):
    return evaluate_claims(_hyp(claim), table, source="f.yaml")[0]


# ---- item 1: conditions in subsets, TableView, errors ----------------------------------------------------
def test_a_claim_in_one_condition(table):
    trained = _one(table, {**U, "subset": {"dataset": "objects", "condition": "trained"}})
    untrained = _one(table, {**U, "subset": {"dataset": "objects", "condition": "untrained"}})
    assert trained.verdict == ACCEPTED and untrained.verdict != ACCEPTED
    alone = _one(table[table.condition == "trained"].drop(columns="condition"), U)
    assert alone.p_value == trained.p_value and alone.effect == trained.effect
    assert trained.subset["condition"] == "trained" and "condition" not in alone.subset


@pytest.mark.parametrize(
    "claim,field,words",
    [
        (U, "subset.condition", "holds conditions ['shuffled', 'trained', 'untrained']"),
        (
            {**U, "subset": {"dataset": "objects", "condition": "nope"}},
            "subset.condition",
            "'nope' is not in",
        ),
        (
            {
                "kind": "compare",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "a": {"layers": ["block_04"], "condition": "trained"},
                "b": {"layers": ["block_04"]},
            },
            "b.condition",
            "holds conditions",
        ),  # fmt: skip
    ],
)
def test_condition_errors_are_one_line(table, claim, field, words):
    with pytest.raises(StudyError) as err:
        _one(table, claim)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("f.yaml: claims[0]") and field in msg and words in msg


def test_naming_a_condition_without_conditions_is_one_line(table):
    plain = table[table.condition == "trained"].drop(columns="condition")
    with pytest.raises(StudyError) as err:
        _one(plain, {**U, "subset": {"dataset": "objects", "condition": "trained"}})
    assert "the design has no conditions" in str(err.value) and "subset.condition" in str(err.value)


def test_compare_across_conditions_by_operand(table):
    r = _one(table, {"kind": "compare", "metric": "eed_pct", "subset": {"dataset": "objects"},
                     "a": {"layers": ["block_01"], "condition": "untrained"},
                     "b": {"layers": ["block_04"], "condition": "untrained"}, "alternative": "two-sided"})  # fmt: skip
    assert r.details["conditions"]["a"]["condition"] == "untrained" and r.verdict != ACCEPTED


def test_conditions_named():
    hyp = _hyp(
        {**U, "subset": {"dataset": "objects", "condition": "trained"}, "controls": ["untrained"]},
        {
            "kind": "exceeds",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "claim": {"kind": "u_shape", "regions": REGIONS},
            "a": {"condition": "trained"},
            "b": {"condition": "untrained"},
        },  # fmt: skip
    )
    assert hyp.claims[0].conditions_named() == [("subset.condition", "trained"), ("controls[0]", "untrained")]
    assert hyp.claims[1].conditions_named() == [("a.condition", "trained"), ("b.condition", "untrained")]


def test_view_of_one_condition_is_cached(table):
    view = TableView(table)
    assert view.in_condition("trained", "w", "f") is view.in_condition("trained", "w", "f")
    assert set(view.in_condition("trained", "w", "f").table.condition) == {"trained"}


def test_claim_hashes_of_todays_claims_are_unchanged():
    """A claim without the new fields hashes as before (its registration still counts): hashes computed
    on the main branch before conditions existed."""
    import yaml

    from study.registration import claim_hash

    want = {"u_shape.yaml": "9f6b2deeebef5b1d68104c497f732e1ed72f2ea797e833e66a7da8c07e3f46ac",
            "cls_highest.yaml": "b0f64bf79fec7353e07040cf9fe1263bc5048e92ee08a11c7cdef57c4665d752"}  # fmt: skip
    for name, h in want.items():
        hyp = parse_hypothesis(yaml.safe_load(open(f"hypotheses/{name}")), name)
        assert claim_hash(hyp.claims[0]) == h


# ---- item 2: differs / exceeds / holds_in_all / controls ----------------------------------------------------
EXCEEDS = {"kind": "exceeds", "metric": "eed_pct", "subset": {"dataset": "objects"},
           "claim": {"kind": "u_shape", "regions": REGIONS}, "a": {"condition": "trained"},
           "b": {"condition": "untrained"}}  # fmt: skip


def test_exceeds_the_dip_is_deeper_trained_than_untrained(table):
    r = _one(table, EXCEEDS)
    assert r.verdict == ACCEPTED and r.effect > 0 and r.details["difference"]["paired"]
    sides = r.details["sides"]
    assert list(sides) == ["trained", "untrained"]
    # the difference is of the u_shape's own per-seed bottleneck depth in each condition
    a, b = (pd.Series(sides[c]["per_seed"]) for c in ("trained", "untrained"))
    assert math.isclose(r.effect, float((a - b).mean()))
    depth = _one(table, {**U, "subset": {"dataset": "objects", "condition": "trained"}}).details
    assert math.isclose(a.mean(), depth["bottleneck_depth"]["mean"])
    backwards = _one(table, {**EXCEEDS, "a": {"condition": "untrained"}, "b": {"condition": "trained"}})
    assert backwards.verdict == REJECTED


def test_differs_is_two_sided_and_welch_without_shared_seeds(table):
    r = _one(table, {**EXCEEDS, "kind": "differs"})
    assert r.verdict == ACCEPTED and "paired" in r.details["difference"]["test"]
    moved = table.assign(seed=np.where(table.condition == "untrained", table.seed + 10, table.seed))
    w = _one(moved, {**EXCEEDS, "kind": "differs"})
    assert not w.details["difference"]["paired"] and "Welch" in w.details["difference"]["test"]
    assert w.n_seeds == 10 and w.verdict == ACCEPTED


HOLDS = {k: v for k, v in EXCEEDS.items() if k not in ("a", "b")} | {"kind": "holds_in_all"}


def test_holds_in_all(table):
    both = _one(table, {**HOLDS, "conditions": ["trained", "shuffled"]})
    assert both.verdict == ACCEPTED and set(both.details["per_condition"]) == {"trained", "shuffled"}
    with_flat = _one(table, {**HOLDS, "conditions": ["trained", "untrained"]})
    assert with_flat.verdict != ACCEPTED and with_flat.details["binding_condition"] == "untrained"
    per = with_flat.details["per_condition"]
    assert with_flat.p_value == max(per[c]["p"] for c in per)


def test_controls(table):
    own = {**U, "subset": {"dataset": "objects", "condition": "trained"}}
    r = _one(table, {**own, "controls": ["untrained", "shuffled"]})
    assert r.verdict == ACCEPTED and set(r.details["controls"]) == {"untrained", "shuffled"}
    plain = _one(table, own)
    assert r.effect == plain.effect and r.p_value >= plain.p_value
    assert r.p_value == max(plain.p_value, *(t["difference"]["p"] for t in r.details["controls"].values()))
    # a control with the same dip as the claim's own condition: the claim holds, but not beyond it
    same = table[table.condition != "shuffled"]
    same = pd.concat([same, same[same.condition == "trained"].assign(condition="copy")], ignore_index=True)
    r2 = _one(same, {**own, "controls": ["copy"]})
    assert r2.verdict == INCONCLUSIVE and math.isnan(r2.p_value)  # identical per-seed effects: no test


def test_report_puts_the_two_effects_side_by_side(table, tmp_path):
    from analysis.kinds import FigureContext, get_kind
    from analysis.report.sections import findings

    hyp = _hyp(EXCEEDS)
    (r,) = evaluate_claims(hyp, table)
    lines = findings(hyp.claims[0], r)
    assert any(x.startswith("trained: claim effect") for x in lines)
    assert any(x.startswith("trained - untrained:") for x in lines)
    figs = get_kind("exceeds").figures(FigureContext(table, hyp.claims[0], r))
    assert [f.name for f in figs][-1] == "effects_by_condition" and all(f.png for f in figs)
    assert [f.plotted["datasets"] for f in figs[:-1]] == [["objects"], ["objects"]]


@pytest.mark.parametrize(
    "claim,field,words",
    [
        ({**EXCEEDS, "b": {"condition": "trained"}}, "b.condition", "other than a's"),
        (
            {
                **EXCEEDS,
                "claim": {"kind": "u_shape", "regions": {**REGIONS, "bottleneck": "leave_one_seed_out"}},
            },
            "claims[0]: claim:",
            "leave-one-seed-out",
        ),  # fmt: skip
        (
            {**EXCEEDS, "claim": {"kind": "u_shape", "regions": REGIONS, "metric": "eed_pct"}},
            "claims[0]",
            "claim.metric: set it on the claim itself",
        ),  # fmt: skip
        ({**EXCEEDS, "claim": {"kind": "exceeds"}}, "claims[0].claim", "cannot be the inner claim"),
        ({**EXCEEDS, "claim": {"kind": "u_shape"}}, "claims[0].claim", "regions: required field is missing"),
        ({**U, "controls": ["x", "x"]}, "claims[0].controls", "distinct"),
        (
            {
                "kind": "equivalence",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "margin": 1.0,
                "a": {"layers": ["block_01"]},
                "b": {"layers": ["block_04"]},
                "controls": ["untrained"],
            },
            "claims[0]",
            "no per-seed effect",
        ),  # fmt: skip
        ({**U, "adjust_for": "val_loss"}, "claims[0].adjust_for", "per-run scalar"),
        ({**U, "adjust_for": "test_accuracy"}, "claims[0]", "adjust_for is for a claim over a knob"),
    ],
)
def test_bad_cross_claims_are_one_line(claim, field, words):
    with pytest.raises(StudyError) as err:
        _hyp(claim)
    msg = str(err.value)
    assert "\n" not in msg and field in msg and words in msg, msg


def test_a_control_the_table_lacks_is_one_line(table):
    with pytest.raises(StudyError) as err:
        _one(table, {**U, "subset": {"dataset": "objects", "condition": "trained"}, "controls": ["dino"]})
    assert "controls[0]" in str(err.value) and "'dino' is not in the design" in str(err.value)


# ---- the array-level tests ----------------------------------------------------------------------------------
def test_welch_matches_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 3, 4), rng.normal(0, 0.3, 6)
    st = welch_statistics(a, b, "two-sided")
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert math.isclose(st.p, ref.pvalue, rel_tol=1e-10)
    lo, hi = ref.confidence_interval()
    assert math.isclose(st.ci[0], lo, rel_tol=1e-10) and math.isclose(st.ci[1], hi, rel_tol=1e-10)
    one = welch_statistics(a, b, "greater")
    assert math.isclose(one.p, stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    paired = difference_statistics(a[:4], b[:4], "greater", True)
    assert math.isclose(paired.p, stats.ttest_rel(a[:4], b[:4], alternative="greater").pvalue)


# ---- item 4: adjust_for ---------------------------------------------------------------------------------
BLOCKS = [f"block_{i:02d}" for i in range(1, 13)]


def _sweep_table(follows: str, seed: int = 0) -> pd.DataFrame:
    """A sweep's table over texture_reliance 0..1 (5 trials x 5 seeds x 12 blocks), test accuracy falling
    with the knob; eed_pct follows ``accuracy`` only, or the ``knob`` at equal accuracy."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(5):
        acc0, drop = rng.normal(0.7, 0.05), rng.normal(0.3, 0.05)
        for t in np.linspace(0, 1, 5):
            acc = acc0 - drop * t + rng.normal(0, 0.03)
            level = 40 * acc if follows == "accuracy" else 40 * acc + 8 * t
            for i, layer in enumerate(BLOCKS):
                rows.append({"run_key": f"k{t:g}-{s}", "dataset": f"cue_mix-texture_reliance{t:g}", "seed": s,
                             "epoch": 8, "layer": layer, "layer_index": i + 2, "token_set": "all", "n_tokens": 64,
                             "metric": "eed_pct", "value": level + rng.normal(0, 1.0), "texture_reliance": t,
                             "test_accuracy": acc})  # fmt: skip
    return pd.DataFrame(rows)


def _sweep_hyp(kind: str = "ordering", **claim):
    import yaml

    doc = yaml.safe_load(open("hypotheses/complexity_sweep.yaml"))
    base = {"name": "floor", "kind": kind, "metric": "eed_pct", "subset": {"epoch": "last"},
            "over": "texture_reliance", "layers": BLOCKS}  # fmt: skip
    base.update({"summary": "mean"} if kind == "ordering" else {"aggregate": "pooled"})
    doc["claims"] = [{**base, **claim}]
    return parse_hypothesis(doc, "sweep.yaml")


@pytest.mark.parametrize("kind", ["ordering", "trend"])
def test_adjusted_claim_removes_a_confound_through_accuracy(kind):
    confounded = _sweep_table("accuracy")
    raw = evaluate_claims(_sweep_hyp(kind, direction="decreasing"), confounded)[0]
    assert raw.verdict == ACCEPTED  # the raw slope is all accuracy
    adj = evaluate_claims(_sweep_hyp(kind, direction="decreasing", adjust_for="test_accuracy"), confounded)[0]
    assert adj.verdict != ACCEPTED and adj.details["adjusted"]["for"] == "test_accuracy"
    assert math.isclose(adj.details["adjusted"]["raw"]["p"], raw.p_value)
    assert adj.details["adjusted"]["adjusted"]["p"] == adj.p_value
    up = _sweep_hyp(kind, direction="increasing", adjust_for="test_accuracy")
    rises = evaluate_claims(up, _sweep_table("knob"))[0]
    assert rises.verdict == ACCEPTED and 4 < rises.effect < 12  # the planted 8 per unit at equal accuracy
    from analysis.report.sections import findings

    lines = findings(None, adj)
    assert any("with test_accuracy in the same regression" in x for x in lines)
    assert any(x.startswith("raw effect") and "at equal test_accuracy" in x for x in lines)


def test_adjust_for_a_scalar_the_table_lacks_is_one_line():
    hyp = _sweep_hyp(direction="decreasing", adjust_for="train_loss")
    with pytest.raises(StudyError) as err:
        evaluate_claims(hyp, _sweep_table("accuracy"), source="sweep.yaml")
    msg = str(err.value)
    assert "\n" not in msg and "adjust_for" in msg and "'train_loss'" in msg
    nan = _sweep_table("accuracy").assign(train_loss=np.nan)
    with pytest.raises(StudyError, match="no run records 'train_loss'"):
        evaluate_claims(hyp, nan, source="sweep.yaml")


def test_run_scalars_come_from_the_run_history(tmp_path):
    import json

    from study.pipeline.scalars import with_run_scalars

    hyp = _sweep_hyp(direction="decreasing", adjust_for="test_accuracy")
    table = _sweep_table("accuracy").drop(columns="test_accuracy")
    for key in table.run_key.unique():
        (tmp_path / key).mkdir()
        history = [{"epoch": e, "test_acc": 0.1 * e} for e in range(1, 9)]
        (tmp_path / key / "result.json").write_text(json.dumps({"history": history}))
    got = with_run_scalars(table, hyp.claims, tmp_path)
    assert np.allclose(got.test_accuracy, 0.8) and list(got.columns[:-1]) == list(table.columns)
    assert with_run_scalars(table, _sweep_hyp(direction="decreasing").claims, tmp_path) is table


# ---- item 6: the claims written for the shipped files with conditions ----------------------------------------
def _fixture_claims(name: str) -> list[dict]:
    import yaml

    return yaml.safe_load(open(f"tests/fixtures/conditions/{name}"))


def test_the_controls_claims(table):
    design = {**DESIGN, "datasets": [{"name": "objects"}]}
    hyp = parse_hypothesis(
        {"name": "controls", "design": design, "claims": _fixture_claims("claims_controls.yaml")}
    )
    results = evaluate_claims(hyp, table[table.dataset == "objects"])
    assert [r.verdict for r in results] == [ACCEPTED, ACCEPTED, ACCEPTED]
    assert set(results[0].details["controls"]) == {"untrained", "shuffled"}


def test_the_paper_claims():
    rng = np.random.default_rng(3)
    datasets = ("cifar100", "tiny_imagenet", "ucmerced")  # the dip shrinks to none on ucmerced
    cells = {}
    for objective in ("dino_paper", "supervised"):
        trained = simulate_study_table(n_seeds=5, datasets=datasets, epochs=(0, 8), metrics=("eed_pct",),
                                       token_sets=("all",), seed=len(cells))  # fmt: skip
        cells[f"objective={objective},untrained=false"] = trained
        cells[f"objective={objective},untrained=true"] = _flat(trained, rng)
    table = pd.concat([t.assign(condition=c) for c, t in cells.items()], ignore_index=True)
    # 32 px: dino_paper's 5% local crops hold a 4 px patch there (validate refuses them at 16 px)
    design = {"datasets": [{"name": d, "image_size": 32} for d in datasets], "seeds": [0, 1, 2, 3, 4], "checkpoints": [0, 8],
              "factors": {"objective": ["dino_paper", "supervised"], "untrained": [False, True]}}  # fmt: skip
    hyp = parse_hypothesis(
        {"name": "ib", "design": design, "claims": _fixture_claims("claims_inductive_bottleneck.yaml")}
    )
    verdicts = [r.verdict for r in evaluate_claims(hyp, table)]
    assert verdicts == [ACCEPTED, ACCEPTED, ACCEPTED, ACCEPTED], verdicts


def test_adjust_for_a_scalar_the_objective_does_not_record_is_refused_before_training():
    """DINO records no test accuracy (its runs keep a k-NN accuracy): ``adjust_for: test_accuracy`` is one
    line naming the claim's field at validation, before anything trains; ``knn_accuracy`` is accepted."""
    import yaml

    doc = yaml.safe_load(open("hypotheses/complexity_sweep.yaml"))
    doc["design"]["objective"] = {
        "kind": "dino",
        "local_crop_scale": [0.1, 0.4],
    }  # 16 px: crops of a patch or more
    doc["claims"] = [c for c in doc["claims"] if c.get("adjust_for")]
    with pytest.raises(StudyError) as err:
        parse_hypothesis(doc, "sweep.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("sweep.yaml: claims[0].adjust_for: objective dino")
    assert "does not record 'test_accuracy'" in msg and "knn_accuracy" in msg
    doc["claims"][0]["adjust_for"] = "knn_accuracy"
    assert parse_hypothesis(doc, "sweep.yaml").claims[0].adjust_for == "knn_accuracy"
