"""A CNN as ``design.model``: validate's refusals, one line each, and a study of one trained end to end."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS
from tests.schema.test_bad_input import TINY_MODEL, _one_line

# a 4-block ResNet (timm's resnet18 with one basic block a stage), 8-64 channels: seconds to train
SMALL_RESNET = "name: resnet18, model_args: {layers: [1, 1, 1, 1], channels: [8, 16, 32, 64], stem_width: 8}"
CNN = TINY_HYPOTHESIS.replace(TINY_MODEL, SMALL_RESNET).replace("image_size: 8", "image_size: 16")


@pytest.mark.parametrize(
    "change, field, says",
    [
        # a ViT field on a CNN
        (
            lambda h: h.replace("stem_width: 8}", "stem_width: 8}, depth: 3"),
            "design.model",
            "depth: resnet18 is not a Vision Transformer",
        ),
        # timm cannot build it with these arguments
        (
            lambda h: h.replace("stem_width: 8}", "stem_width: 8, no_such_argument: 1}"),
            "design.model",
            "timm cannot build resnet18",
        ),
        # a name timm does not know (it crashed with KeyError: 'depth' while the ViT fields were resolved)
        (
            lambda h: h.replace(SMALL_RESNET, "name: resnet_nope"),
            "design.model.name",
            "expected a timm Vision Transformer or CNN",
        ),
        # no residual blocks this package reads
        (
            lambda h: h.replace(SMALL_RESNET, "name: mobilenetv3_small_050"),
            "design.model.name",
            "has no residual blocks",
        ),
        # DINO trains ViTs
        (
            lambda h: h.replace("  training:", "  objective: dino\n  training:"),
            "design.objective.kind",
            "dino trains a timm Vision Transformer",
        ),
        # a class token a CNN does not have
        (
            lambda h: h.replace("subset: {dataset: objects}", "subset: {dataset: objects, token_set: cls}"),
            "claims[0]",
            "a CNN has no class token",
        ),
        # too small for the model's downsampling
        (
            lambda h: h.replace(SMALL_RESNET, "preset: convnext_cpu"),
            "design.datasets[0].image_size",
            "convnext_atto cannot take 16 px images",
        ),
        # a layer the CNN does not have (it has 4 blocks)
        (
            lambda h: h.replace("late: [block_03]", "late: [block_06]"),
            "claims[0]",
            "unknown layer 'block_06'; expected one of ['stem', 'block_01'",
        ),
    ],
)
def test_what_a_cnn_cannot_do_is_refused_at_validate(tmp_path, capsys, change, field, says):
    path = tmp_path / "h.yaml"
    path.write_text(change(CNN))
    assert main(["validate", str(path)]) == 2
    err = _one_line(capsys)
    assert field in err and says in err, err
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    assert says in _one_line(capsys) and not out.exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_cnn_study_trains_measures_every_block_and_tests_its_claim(tmp_path, capsys, workers):
    path = tmp_path / "h.yaml"
    path.write_text(CNN)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--workers", workers]) == 0
    capsys.readouterr()
    table = pd.read_parquet(out / "studies" / "tiny" / "table.parquet")
    eed = table[(table.metric == "eed_pct") & (table.token_set == "all")]
    assert sorted(set(eed.token_set)) == ["all"] and set(table.token_set) == {"all", "patch"}
    layers = eed.drop_duplicates("layer").sort_values("layer_index")
    assert list(layers.layer) == ["stem", "block_01", "block_02", "block_03", "block_04", "pool"]
    assert list(layers.layer_index) == [0, 1, 2, 3, 4, 5]
    # 16 px: the stem leaves 4 x 4 positions, the blocks 4x4, 2x2, 1x1, 1x1; one pooled vector per image
    tokens = dict(zip(layers.layer, layers.n_tokens, strict=True))
    assert tokens == {
        "stem": 256,
        "block_01": 256,
        "block_02": 64,
        "block_03": 16,
        "block_04": 16,
        "pool": 16,
    }
    assert set(eed.seed) == {0, 1, 2} and set(eed.epoch) == {0, 2}
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    claim = verdicts["claims"][0]
    assert claim["verdict"] in ("ACCEPTED", "REJECTED", "INCONCLUSIVE") and claim["n_seeds"] == 3
    result = json.loads(next((out / "runs").glob("*/result.json")).read_text())
    assert result["run"]["model"] == {
        "name": "resnet18",
        "drop_path_rate": 0.0,
        "model_args": {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8},
    }
    # a rerun reuses every run
    assert main(["run", str(path), "--out", str(out), "--no-report"]) == 0
    assert "3 reused, 0 to train" in capsys.readouterr().out


def test_conditions_that_mix_a_vit_and_a_cnn_are_one_line(tmp_path, capsys):
    """The cells of a design share their layers (its claims name them): a ViT and a CNN do not (until
    claims can compare them on a relative-depth axis). It crashed with KeyError: 'depth'."""
    path = tmp_path / "h.yaml"
    path.write_text(
        TINY_HYPOTHESIS.replace(
            "  training:", "  factors: {model: [vit_cpu12, resnet_cpu]}\n  training:"
        ).replace("subset: {dataset: objects}", "subset: {dataset: objects, condition: model=vit_cpu12}")
    )
    assert main(["validate", str(path)]) == 2
    assert _one_line(capsys).endswith(
        "design.factors.model: condition 'model=resnet_cpu' has 8 residual blocks, 'model=vit_cpu12' 12 blocks: "
        "the cells of a design share one depth and family (its claims name one set of layers)"
    )


def test_a_sweep_over_a_dataset_knob_trains_cnns(tmp_path, capsys):
    """The sweep path: optuna's grid over texture reliance, each trial's runs a CNN, its claims tested."""
    from tests.conftest import TINY_SWEEP

    sweep = TINY_SWEEP.replace(TINY_MODEL, SMALL_RESNET).replace("image_size: 8", "image_size: 16")
    sweep = sweep.replace("[block_01, block_02, block_03]", "[block_01, block_02, block_03, block_04]")
    path = tmp_path / "s.yaml"
    path.write_text(sweep)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--no-mlflow"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "eed floor rises with texture reliance" in printed
    results = [json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")]
    assert len(results) == 6 and {r["run"]["model"]["name"] for r in results} == {"resnet18"}
