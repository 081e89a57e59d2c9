"""Claims that ``validate`` passed but ``run`` refused after training, or that could never be tested (issue 66
item 5): each is refused (or, where it can still run, warned about) before anything is trained."""

from __future__ import annotations

import copy
import warnings

import pytest
import yaml

from study.schema import parse_claims, parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.errors import StudyError

BASE = yaml.safe_load(TINY_HYPOTHESIS)


def _data(**claim) -> dict:
    data = copy.deepcopy(BASE)
    if claim:
        data["claims"].append({"name": "second", "metric": "eed_pct", **claim})
    return data


def _refused(data: dict) -> str:
    with pytest.raises(StudyError) as err:
        parse_hypothesis(data, "h.yaml")
    return str(err.value)


def test_a_cls_compare_of_patch_embed_is_refused_naming_the_field():
    """Before: ``validate`` said ok; ``run`` trained, then said ``a.layers: layers ['patch_embed'] are not in
    the table``, never that the cls token set has no patch_embed."""
    got = _refused(
        _data(
            kind="compare",
            subset={"dataset": "objects", "token_set": "cls"},
            a={"layers": ["patch_embed"]},
            b={"layers": ["block_01"]},
        )
    )
    assert got.startswith("h.yaml: claims[1].a.layers: the cls token set has no patch_embed"), got
    # an operand's own token set decides: a cls operand in an all-token claim, and a patch one in a cls claim
    got = _refused(
        _data(
            kind="compare",
            subset={"dataset": "objects"},
            a={"layers": ["block_01"]},
            b={"layers": ["patch_embed"], "token_set": "cls"},
        )
    )
    assert got.startswith("h.yaml: claims[1].b.layers: the cls token set has no patch_embed"), got
    parse_hypothesis(
        _data(
            kind="compare",
            subset={"dataset": "objects", "token_set": "cls"},
            a={"layers": ["block_01"]},
            b={"layers": ["patch_embed"], "token_set": "patch"},
        )
    )


def test_a_cls_u_shape_with_patch_embed_in_a_region_is_refused():
    data = _data()
    data["claims"][0]["subset"]["token_set"] = "cls"
    data["claims"][0]["regions"]["early"] = ["patch_embed"]
    assert _refused(data).startswith("h.yaml: claims[0].regions.early: the cls token set has no patch_embed")


@pytest.mark.parametrize(
    "regions, layer, first, second",
    [
        ({"early": ["block_01"], "bottleneck": ["block_02", "block_01"]}, "block_01", "early", "bottleneck"),
        ({"early": ["block_01", "block_02"], "bottleneck": ["block_02"]}, "block_02", "early", "bottleneck"),
        ({"bottleneck": ["block_02", "block_03"]}, "block_03", "bottleneck", "late"),
    ],
)
def test_overlapping_u_shape_regions_are_refused_with_one_message(regions, layer, first, second):
    """Before: the first overlap passed and got a verdict; the second was refused as "no layer lies between
    the early and the late region"."""
    data = _data()
    data["claims"][0]["regions"].update(regions)
    assert _refused(data) == (
        f"h.yaml: claims[0].regions: the regions overlap: {layer} is in {first} and in {second} (each layer "
        "belongs to one region; the bottleneck lies strictly between early and late)"
    )


def test_two_claims_with_one_name_are_refused():
    """Before: both passed, and ``analyze`` printed two rows that could not be told apart."""
    data = _data()
    data["claims"].append(copy.deepcopy(data["claims"][0]))
    assert _refused(data) == (
        "h.yaml: claims[1].name: claim name 'u' is used twice (also claims[0]): give each claim its own name"
    )
    with pytest.raises(StudyError) as err:
        parse_claims(data["claims"], "claims.yaml")
    assert str(err.value).startswith("claims.yaml: claims[1].name: claim name 'u' is used twice")


TREND = {"kind": "trend", "direction": "increasing", "layers": ["block_01"]}


def test_a_trend_over_epochs_that_fixes_the_epoch_is_refused():
    """Before: ``subset.epoch: 1`` passed and the trend silently used every epoch."""
    got = _refused(_data(**TREND, subset={"dataset": "objects", "epoch": 2}))
    assert got.startswith("h.yaml: claims[1].subset.epoch: a trend over epochs runs over the checkpoint epochs and "
                          "cannot fix the epoch"), got  # fmt: skip
    parse_hypothesis(
        _data(**TREND, subset={"dataset": "objects", "epoch": "last"})
    )  # the default, written out
    over_layers = {**TREND, "over": "layer", "layers": ["block_01", "block_02"]}
    parse_hypothesis(
        _data(**over_layers, subset={"dataset": "objects", "epoch": 2})
    )  # over layers: it reads it


def test_a_trend_with_one_x_value_is_refused():
    """Before: it passed; ``analyze`` printed numpy's and scipy's warnings and said "zero between-seed
    variance" with 3 seeds, never that the trend had one epoch."""
    data = _data(**TREND, subset={"dataset": "objects"})
    data["design"]["checkpoints"] = [2]
    assert _refused(data) == (
        "h.yaml: claims[1]: a trend over epochs needs >= 2 epochs (its x values), got [2] (the design's "
        "checkpoint epochs: add some to design.checkpoints)"
    )
    assert _refused(_data(**TREND, epochs=[2, 2], subset={"dataset": "objects"})) == (
        "h.yaml: claims[1].epochs: a trend over epochs needs >= 2 epochs (its x values), got [2]"
    )
    assert _refused(_data(**{**TREND, "over": "layer"}, subset={"dataset": "objects"})) == (
        "h.yaml: claims[1].layers: a trend over layers needs >= 2 layers (x values), got ['block_01']"
    )


def test_analyze_says_a_trend_has_one_epoch_without_raw_warnings():
    """A table with one epoch (``analyze --table`` of any table): the reason names the cause, and numpy's
    and scipy's warnings are not printed."""
    import study
    from study.preflight import synthetic_table

    data = _data(**TREND, subset={"dataset": "objects"})
    table = synthetic_table(parse_hypothesis(data))
    claims = [data["claims"][1], {**TREND, "name": "layers", "metric": "eed_pct", "over": "layer",
                                  "subset": {"dataset": "objects"}}]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verdicts = study.analyze(claims, table[table.epoch == 2])
    reasons = list(verdicts.frame.reason)
    assert reasons[0] == "not testable: the table holds one epoch (2): a trend over epochs needs at least 2"
    assert reasons[1] == "not testable: one layer (block_01): a trend over layers needs at least 2"
    assert "zero between-seed variance" not in str(verdicts)


def test_validate_warns_of_one_seed_and_of_a_layer_compared_with_itself(tmp_path, capsys):
    """Before: both passed silently; ``run`` then said "needs >= 2 seeds", and the compare gave
    ``0.00 pp (0.00, 0.00) n/a``."""
    from study.cli import main

    data = _data(
        kind="compare", subset={"dataset": "objects"}, a={"layers": ["block_02"]}, b={"layers": ["block_02"]}
    )
    data["design"]["seeds"] = [0]
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"ok: {path}: 2 claim(s)")
    assert captured.err.splitlines() == [
        f"warning: {path}: design.seeds: 1 seed: a claim over seeds ('u') needs >= 2 to be tested (use >= 3, "
        "ideally 5+); run will report it INCONCLUSIVE (needs >= 2 seeds)",
        f"warning: {path}: claims[1].b: reads the same values as a (dataset, token set, epoch, layers and "
        "condition): their difference is 0 in every seed, so the claim tests nothing",
    ]
    data["design"]["seeds"] = [0, 1, 2]
    data["claims"][1]["b"] = {"layers": ["block_02"], "epoch": 0}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""
