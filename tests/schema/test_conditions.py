"""Conditions of a design (``study.schema._conditions``): cells, their run keys, the built-in controls (shuffled
labels, untrained), the ``condition`` column of the tidy table, and the one-line errors of bad designs.

A cell is keyed exactly as the single-condition file with the same parts, so a cell shared between files is
trained once (the done-when test: :func:`test_a_cell_shared_with_a_single_condition_file_is_not_retrained`).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from study.cli import main
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS, write_runs
from vitstudy_core.errors import StudyError

BASE = yaml.safe_load(TINY_HYPOTHESIS)
CLAIM = BASE["claims"][0]
# DINO's crops need at least a 4 px patch of image: 32 px images (5% of 8 px is 1.8 px, refused)
AT32 = {"datasets": [{**BASE["design"]["datasets"][0], "image_size": 32}]}


def _data(claim_condition: str | None = None, **design) -> dict:
    data = copy.deepcopy(BASE)
    data["design"].update(design)
    if claim_condition is not None:
        data["claims"][0]["subset"]["condition"] = claim_condition
    return data


def _keys(data: dict, condition: str | None = None) -> list[str]:
    return [s.key for s in plan_runs(parse_hypothesis(data)) if s.condition == condition]


CONTROLS = [
    {"name": "trained"},
    {"name": "shuffled", "labels": "shuffled"},
    {"name": "untrained", "untrained": True},
]


# ---- schema and planning ----------------------------------------------------------------------------
def test_a_design_without_conditions_is_unchanged():
    hyp = parse_hypothesis(_data())
    dump = hyp.design.model_dump(mode="json")
    assert not {"labels", "untrained", "conditions", "factors", "max_runs"} & set(dump)  # same design hash
    assert [c.name for c in hyp.design.cells()] == [None] and hyp.design.condition_names() == []
    specs = plan_runs(hyp)
    assert all(s.condition is None and "labels" not in s.model_dump() for s in specs)
    assert [s.label for s in specs] == ["objects/seed0", "objects/seed1", "objects/seed2"]


def test_explicit_conditions_key_each_cell_as_its_single_condition_file():
    data = _data("trained", conditions=CONTROLS)
    hyp = parse_hypothesis(data)
    cells = hyp.design.cells()
    assert [(c.name, c.untrained, c.twin) for c in cells] == [
        ("trained", False, None),
        ("shuffled", False, None),
        ("untrained", True, "trained"),
    ]
    specs = plan_runs(hyp)
    assert len(specs) == 6  # the untrained cell trains nothing
    assert _keys(data, "trained") == _keys(_data())  # the single-condition file's runs: reused
    assert _keys(data, "shuffled") == _keys(_data(labels="shuffled"))
    assert not set(_keys(data, "shuffled")) & set(_keys(_data()))  # shuffled labels are in the key
    trained = [s for s in specs if s.condition == "trained"]
    assert all(s.epoch0_conditions == ("untrained",) for s in trained)
    assert [s.label for s in trained][0] == "trained/objects/seed0"
    assert all(s.model_dump()["labels"] == "shuffled" for s in specs if s.condition == "shuffled")


def test_factorial_cells_are_named_in_declared_order_and_keyed_as_single_files():
    factors = {
        "objective": ["supervised", "dino"],
        "labels": [True, "shuffled"],
        "training.lr": [0.001, 0.002],
    }
    # shuffled labels under DINO are refused (it trains without labels), so cross objective with training
    data = _data(
        "objective=supervised,training.lr=0.001",
        factors={"objective": ["supervised", "dino"], "training.lr": [0.001, 0.002]},
        **AT32,
    )
    names = parse_hypothesis(data).design.condition_names()
    assert names == [
        "objective=supervised,training.lr=0.001",
        "objective=supervised,training.lr=0.002",
        "objective=dino,training.lr=0.001",
        "objective=dino,training.lr=0.002",
    ]
    single = _data(objective="dino", training={**BASE["design"]["training"], "lr": 0.002}, **AT32)
    assert _keys(data, "objective=dino,training.lr=0.002") == _keys(single)
    assert _keys(data, "objective=supervised,training.lr=0.001") == _keys(_data(**AT32))
    with pytest.raises(
        StudyError,
        match=r"design.factors.labels: cell 'objective=dino,labels=shuffled,training.lr=0.001': objective dino",
    ):
        parse_hypothesis(
            _data("objective=supervised,labels=true,training.lr=0.001", factors=factors, **AT32), "h.yaml"
        )


def test_a_preset_cell_is_the_single_file_with_that_preset():
    """The cell reads the base design as written: a preset level fills what the file leaves unset, and the
    other level gets none of it (as its own single-condition file would)."""
    tr = {"epochs": 2, "batch_size": 32}
    data = _data(
        "objective=supervised",
        objective="dino",
        factors={"objective": ["tgo_supervised", "supervised"]},
        **AT32,
    )
    data["claims"][0]["subset"]["condition"] = "objective=supervised"
    hyp = parse_hypothesis(data)
    tgo = hyp.design.cells()[0].design
    assert tgo.training.label_smoothing == 0.1 and tgo.model.drop_path_rate == 0.1  # the preset's
    assert hyp.design.cells()[1].design.training.label_smoothing == 0.0
    assert _keys(data, "objective=tgo_supervised") == _keys(
        _data(objective="tgo_supervised", training=tr, **AT32)
    )
    assert _keys(data, "objective=supervised") == _keys(_data(**AT32))


def test_shipped_files_with_conditions_validate_and_share_the_default_study_runs():
    from study.schema import load_hypothesis

    controls = plan_runs(load_hypothesis("hypotheses/controls.yaml"))
    default = [s.key for s in plan_runs(load_hypothesis("hypotheses/u_shape.yaml"))]
    assert [s.key for s in controls if s.condition == "trained"] == default
    assert len(controls) == 10 and {s.condition for s in controls} == {"trained", "shuffled"}
    paper = load_hypothesis("hypotheses/paper/inductive_bottleneck.yaml")
    assert len(paper.design.cells()) == 4 and len(plan_runs(paper)) == 30


def test_shuffled_labels_are_a_seeded_permutation():
    from runners.datasets import shuffled_labels

    y = np.repeat(np.arange(10), 50)
    a, b, c = shuffled_labels(y, 0), shuffled_labels(y, 0), shuffled_labels(y, 1)
    assert np.array_equal(np.bincount(a), np.bincount(y))  # class frequencies kept
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert (a == y).mean() < 0.2  # labels no longer follow the images (chance: 0.1)


# ---- bad input: one line naming the file and the field, exit 2 ---------------------------------------
BAD = [
    ({"factors": {"width": [1, 2]}}, "design.factors.width: unknown factor"),
    (
        {"factors": {"model": ["vit_cpu12", "vit_huge"]}},
        r"design.factors.model\[1\]: unknown level 'vit_huge'",
    ),
    ({"factors": {"labels": [True, "random"]}}, r"design.factors.labels\[1\]: unknown level 'random'"),
    (
        {"conditions": [{"name": "a"}, {"name": "b", "training": {"epochs": 2}}]},
        r"design.conditions\[1\]: condition 'b' resolves to the same cell \(the same runs\) as 'a'",
    ),
    (
        {"conditions": [{"name": "a"}, {"name": "a", "labels": "shuffled"}]},
        r"conditions\[1\].name: .* used twice",
    ),
    (
        {"conditions": [{"name": "u", "untrained": True}]},
        r"design.conditions\[0\].untrained: .* trained twin",
    ),
    (
        {"conditions": [{"name": "t"}, {"name": "u", "untrained": True}], "checkpoints": [2]},
        r"design.conditions\[1\].untrained: .* add 0 to design.checkpoints",
    ),
    (
        {"conditions": [{"name": "t"}, {"name": "d", "labels": "shuffled", "objective": "dino"}]},
        r"conditions\[1\].labels: objective dino",
    ),
    (
        {"conditions": [{"name": "t"}, {"name": "s", "model": {"depth": 2}}]},
        r"conditions\[1\].model: .* share one depth",
    ),
    (
        {"conditions": [{"name": "t"}, {"name": "s", "training": {"lr": -1}}]},
        r"design.conditions\[1\].training.lr: ",
    ),
    ({"conditions": [{"name": "bad name"}]}, r"design.conditions\[0\].name: "),
    (
        {"conditions": [{"name": "t"}], "factors": {"labels": [True]}},
        "design.factors: give conditions or factors, not both",
    ),
    ({"untrained": True}, "design.untrained: untrained: true goes in a condition"),
    ({"labels": "shuffled", "objective": "dino"}, "design.labels: objective dino trains without labels"),
    (
        {
            "factors": {"labels": [True, "shuffled"], "training.lr": [1e-3, 2e-3, 3e-3]},
            "seeds": list(range(40)),
        },
        r"design.factors: 6 trained cell\(s\) x 1 dataset\(s\) x 40 seed\(s\) = 240 runs, over the limit of 200",
    ),
    ({"seeds": list(range(201))}, "design.seeds: 1 trained cell.* = 201 runs, over the limit of 200"),
]


@pytest.mark.parametrize("design, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_designs_are_one_line_errors(tmp_path, capsys, design, message):
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(_data(**design)))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_max_runs_raises_the_limit_and_claims_must_name_known_conditions(tmp_path, capsys):
    assert plan_runs(parse_hypothesis(_data(seeds=list(range(201)), max_runs=201)))
    with pytest.raises(
        StudyError,
        match=r"claims\[0\].subset.condition: condition 'trainedd' is not in the design "
        r"\(it has \['trained', 'shuffled', 'untrained'\]\)",
    ):
        parse_hypothesis(_data("trainedd", conditions=CONTROLS), "h.yaml")
    with pytest.raises(
        StudyError, match=r"condition 'trained' is not in the design \(it has no conditions\)"
    ):
        parse_hypothesis(_data("trained"), "h.yaml")
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(_data("trained", conditions=CONTROLS)))
    assert main(["validate", str(path)]) == 0
    assert "3 cell(s) (2 trained) x 1 dataset(s) x 3 seed(s) = 6 run(s) planned" in capsys.readouterr().out


def test_max_runs_bounds_training_only_not_analyze_on_a_saved_table(tmp_path, capsys):
    """``analyze`` trains nothing: a design over ``max_runs`` is tested on a saved table (``run`` and
    ``validate`` still refuse it)."""
    from analysis.simulate import simulate_study_table
    from analysis.table import save_table

    table = tmp_path / "table.parquet"
    sim = simulate_study_table(n_seeds=3, datasets=("objects",), epochs=(0, 2), metrics=("eed_pct",))
    save_table(sim, table)
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(_data(seeds=list(range(201)))))
    assert main(["validate", str(path)]) == 2
    assert "over the limit of 200" in capsys.readouterr().err
    assert main(["analyze", str(path), "--table", str(table), "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == [CLAIM["name"]]


# ---- the table: a condition column; an untrained cell reads its twin's epoch-0 rows -------------------
def test_table_keeps_the_condition_column(tmp_path):
    from analysis.table import COLUMNS, load_table, make_table, save_table

    rows = [
        {
            c: v
            for c, v in zip(
                COLUMNS, ["k", "objects", 0, ep, "block_01", 2, "all", 16, "eed_pct", 1.0], strict=True
            )
        }
        | {"condition": cond}
        for cond in ("b", "a")
        for ep in (0, 2)
    ]
    table = make_table(rows)
    assert list(table.columns) == [*COLUMNS, "condition"] and list(table.condition) == ["a", "a", "b", "b"]
    assert (
        list(make_table([{k: v for k, v in r.items() if k != "condition"} for r in rows]).columns) == COLUMNS
    )
    back = load_table(save_table(table, tmp_path / "t.parquet"))
    pd.testing.assert_frame_equal(back, table)
    save_table(
        table.assign(condition="a"), tmp_path / "dup.parquet"
    )  # same rows in one condition: duplicates
    with pytest.raises(StudyError, match="duplicated row"):
        load_table(tmp_path / "dup.parquet")


def test_a_cell_shared_with_a_single_condition_file_is_not_retrained(tmp_path, capsys):
    """The done-when test: the tiny single-condition file's runs are finished; the factorial file crossing
    it with its untrained control trains nothing, and its table holds both cells (untrained: epoch 0)."""
    single, out = write_runs(tmp_path)
    before = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    data = _data("untrained=false", factors={"untrained": [False, True]})
    factorial = tmp_path / "factorial.yaml"
    factorial.write_text(yaml.safe_dump(data))
    assert (
        main(["run", str(factorial), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
    )
    log = capsys.readouterr().out
    assert "3 runs planned, 3 reused, 0 to train" in log, log
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == before
    table = pd.read_parquet(out / "studies" / "tiny" / "table.parquet")
    trained, untrained = (table[table.condition == c] for c in ("untrained=false", "untrained=true"))
    assert sorted(trained.epoch.unique()) == [0, 2] and sorted(untrained.epoch.unique()) == [0]
    at0 = trained[trained.epoch == 0].drop(columns="condition").reset_index(drop=True)
    pd.testing.assert_frame_equal(untrained.drop(columns="condition").reset_index(drop=True), at0)
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert verdicts["reused"] == verdicts["runs"] and len(verdicts["runs"]) == 3


@pytest.mark.slow
def test_shuffled_and_untrained_cells_train_once_end_to_end(tmp_path, capsys):
    """Real training: a factorial file (labels x untrained, one seed) trains two runs; the single-condition
    file of its true-label cell then trains nothing, and the shuffled run records its permutation."""
    data = _data(
        "labels=true,untrained=false",
        seeds=[0],
        factors={"labels": [True, "shuffled"], "untrained": [False, True]},
    )
    data["name"] = "tiny_factorial"
    factorial = tmp_path / "factorial.yaml"
    factorial.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["run", str(factorial), "--out", str(out), "--no-report", "--workers", "2"]) == 0
    assert "2 runs planned, 0 reused, 2 to train" in capsys.readouterr().out
    single = tmp_path / "single.yaml"
    single.write_text(yaml.safe_dump(_data(seeds=[0])))
    assert main(["run", str(single), "--out", str(out), "--no-report"]) == 0
    assert "1 run planned, 1 reused, 0 to train" in capsys.readouterr().out  # was "1 runs"
    shuffled = next(s for s in plan_runs(parse_hypothesis(data)) if s.condition.startswith("labels=shuffled"))
    result = json.loads((out / "runs" / shuffled.key / "result.json").read_text())
    assert result["run"]["labels"] == "shuffled" and result["labels"]["kind"] == "shuffled"
    table = pd.read_parquet(out / "studies" / "tiny_factorial" / "table.parquet")
    assert set(table.condition) == set(parse_hypothesis(data).design.condition_names())

    from mlflow import MlflowClient

    from study.tracking.store import default_tracking_uri

    client = MlflowClient(default_tracking_uri(out))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    child = next(r for r in runs if r.data.tags.get("condition") == "labels=shuffled,untrained=false")
    assert child.data.tags["factor.labels"] == "shuffled" and child.data.tags["factor.untrained"] == "false"
    parent = next(r for r in runs if "cells" in r.data.tags)
    assert "labels=true,untrained=true (1 runs)" in parent.data.tags["cells"]
