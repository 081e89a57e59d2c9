"""Messages that point where the user wrote the problem (issue 50 item 5): each names the field as the file
spells it and what is expected there, and is given by ``validate`` before ``run`` or ``sweep`` fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from study.schema import parse_hypothesis
from tests.conftest import REPO
from vitstudy_core.errors import StudyError

PRETRAINED = {
    "name": "pt",
    "description": "two checkpoints",
    "design": {
        "datasets": [{"name": "objects", "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 16}],
        "source": {"kind": "pretrained", "models": {"a": "vit_tiny_patch16_224"}},
        "probe": {"size": 16, "blocks": 4},
    },
    "claims": [
        {"name": "dip", "kind": "u_shape", "metric": "eed_pct", "unit": "images", "subset": {"dataset": "objects"},
         "regions": {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["norm"]}}
    ],
}  # fmt: skip


def _pretrained(entry) -> str:
    data = yaml.safe_load(yaml.safe_dump(PRETRAINED))
    data["design"]["source"]["models"]["a"] = entry
    with pytest.raises(StudyError) as err:
        parse_hypothesis(data, "pt.yaml")
    return str(err.value)


def test_a_pretrained_model_file_entry_names_its_own_key():
    """Before: ``design.source.models.a.str: Input should be a valid string`` (the union's other branch)."""
    got = _pretrained({"timm": "vit_tiny_patch16_224", "file": "/w/a.safetensors", "img_size": 32})
    assert got == (
        "pt.yaml: design.source.models.a.img_size: unknown key: a model file takes timm, file and model_args "
        "(arguments of the model such as img_size go under model_args: {img_size: ...})"
    )
    got = _pretrained({"timm": "vit_tiny_patch16_224"})
    assert got.startswith("pt.yaml: design.source.models.a.file: Field required"), got


def test_model_args_num_classes_is_refused_at_validation():
    """Before: accepted, then ``run`` failed with "got multiple values for keyword argument 'num_classes'"."""
    got = _pretrained({"timm": "vit_tiny_patch16_224", "file": "a.pt", "model_args": {"num_classes": 10}})
    assert got == (
        "pt.yaml: design.source.models.a.model_args: set by the source (the head's size is read from the "
        "weights file): leave num_classes out of model_args"
    )


@pytest.mark.parametrize(
    "url, why",
    [
        ("foo://host/db", "expected a database URL optuna can open (sqlite:///PATH, postgresql://USER@HOST/DB, "
         "...), got an unknown scheme 'foo'"),
        ("study.db", "expected a database URL optuna can open (sqlite:///PATH, postgresql://USER@HOST/DB, ...), "
         "got 'study.db', not a URL"),
        ("sqlite:////no/such/folder/s.db", "the SQLite file's folder /no/such/folder does not exist"),
        ("postgresql://u@127.0.0.1:1/db", "cannot reach the database postgresql://u@127.0.0.1:1/db"),
    ],
)  # fmt: skip
def test_validate_checks_the_sweep_storage_and_names_the_file_s_field(tmp_path, capsys, url, why):
    """Before: ``validate`` accepted these, and ``sweep`` said ``error: --storage: cannot reach the
    database`` with no flag given. With ``--storage`` given, the flag is named."""
    from study.cli import main

    data = yaml.safe_load((REPO / "hypotheses" / "complexity_sweep.yaml").read_text())
    data["sweep"]["storage"] = url
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    for argv in (["validate", str(path)], ["sweep", str(path), "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"error: {path}: sweep.storage: {why}"), line
    assert not (tmp_path / "out").exists()
    data["sweep"]["storage"] = None
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--storage", url]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: --storage: {why}")


def test_a_table_missing_columns_lists_only_the_required_ones():
    """Before: ``expected ['run_key', 'dataset', ..., 'layer_index', 'n_tokens', ...]``, optional ones too."""
    from analysis.table import REQUIRED, check_table

    with pytest.raises(StudyError) as err:
        check_table(pd.DataFrame({"dataset": ["a"], "layer": ["x"], "token_set": ["all"], "metric": ["m"]}))
    assert str(err.value) == (
        f"table: missing columns ['epoch', 'seed', 'value']; expected at least {list(REQUIRED)} (run_key, "
        "layer_index, n_tokens and condition are optional)"
    )
    assert "run_key" not in REQUIRED and "n_tokens" not in REQUIRED


def test_help_says_what_the_tool_does_not_an_internal_docstring():
    """Before: "The command line's argument parser: every verb of ``python -m study`` and its options"."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "study", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    ).stdout
    text = " ".join(out.split())
    assert "argument parser" not in text and "``" not in text and ":func:" not in text
    assert "Test hypotheses about the representation geometry of vision transformers" in text
    assert "python -m study validate FILE, then python -m study run FILE" in text


# ---- issue 66 item 6: each message names the field as the file spells it, and what is expected there ----
def _tiny_error(change) -> str:
    from tests.conftest import TINY_HYPOTHESIS

    data = yaml.safe_load(TINY_HYPOTHESIS)
    change(data)
    with pytest.raises(StudyError) as err:
        parse_hypothesis(data, "t.yaml")
    return str(err.value)


def test_a_bool_seed_is_refused_as_a_bool():
    """Before: ``seeds: [0, 1, true]`` said "1 given more than once"."""
    got = _tiny_error(lambda d: d["design"].update(seeds=[0, 1, True]))
    assert got == "t.yaml: design.seeds: expected integers; [2] is true, a bool, not a seed"
    got = _tiny_error(lambda d: d["design"].update(checkpoints=[0, True]))
    assert got == "t.yaml: design.checkpoints: expected integers; [1] is true, a bool, not a checkpoint epoch"


@pytest.mark.parametrize("value", ["first", 1.5, True])
def test_a_bad_epoch_names_the_field_and_last(value):
    """Before: ``claims[0].subset.epoch.int: Input should be a valid integer ...`` (the union's member, and
    never 'last')."""
    got = _tiny_error(lambda d: d["claims"][0]["subset"].update(epoch=value))
    assert got == f"t.yaml: claims[0].subset.epoch: expected an epoch number or 'last', got {value!r}"


def test_an_unknown_kind_lists_the_known_kinds():
    """Before: pydantic's "Input tag 'trends' found using 'kind' does not match any of the expected tags"."""
    from analysis.kinds import KINDS
    from runners.datasets import DATASETS

    got = _tiny_error(lambda d: d["claims"][0].update(kind="trends"))
    assert got == f"t.yaml: claims[0].kind: unknown claim kind 'trends'; expected one of {', '.join(KINDS)}"
    got = _tiny_error(lambda d: d["claims"][0].pop("kind"))
    assert (
        got == f"t.yaml: claims[0].kind: required field is missing: the claim kind, one of {', '.join(KINDS)}"
    )
    got = _tiny_error(lambda d: d["design"]["datasets"][0].update(kind="procedurall"))
    assert got == (
        f"t.yaml: design.datasets[0].kind: unknown dataset kind 'procedurall'; expected one of {', '.join(DATASETS)}"
    )
    got = _tiny_error(lambda d: d["design"].update(source={"kind": "pretrainedd"}))
    assert got.startswith("t.yaml: design.source.kind: unknown source kind 'pretrainedd'; expected one of ")
    assert "pretrained" in got and "_source" not in got
    got = _tiny_error(lambda d: d["design"].update(objective={"kind": "dinoo"}))
    assert got.startswith("t.yaml: design.objective.kind: unknown objective kind 'dinoo'; expected one of ")


def test_design_errors_name_their_own_field():
    """Before: a checkpoint past ``epochs`` and ``num_heads: 3`` were both blamed on ``design``."""
    got = _tiny_error(lambda d: d["design"].update(checkpoints=[0, 5]))
    assert got == (
        "t.yaml: design.checkpoints: checkpoint epoch 5 outside 0..2 (0 = initialisation, 2 = training.epochs)"
    )
    got = _tiny_error(lambda d: d["design"]["model"].update(num_heads=3))
    assert got == "t.yaml: design.model.num_heads: embed_dim 16 is not divisible by num_heads 3"


def test_a_directory_given_as_the_file_says_it_is_a_directory(tmp_path, capsys):
    """Before: "file not found"."""
    from study.cli import main

    assert main(["validate", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path}: is a directory (expected a hypothesis YAML file, such as hypotheses/u_shape.yaml)"
    )


@pytest.mark.parametrize(
    "text, line, says",
    [
        ("name: x\ndesign:\n  datasets: []\n   seeds: [0]\n", 4,
         "bad indentation: the line at column 4 does not continue the block that starts on line 3 (yaml expected "
         "another line of that block at column 3, or a line further left to end it; indent with spaces)"),
        ("claims:\n- name: a\n  kind: b\n    metric: c\n", 4,
         "a 'key:' at column 11 where yaml expected a value: the line is indented deeper than the keys beside "
         "it, or a plain value holds ': ' (quote the value)"),
        ("name: x\n\tdesign: 1\n", 2, "a tab at column 1: YAML indents with spaces"),
    ],
)  # fmt: skip
def test_a_yaml_indentation_error_is_one_line_with_its_line_and_what_yaml_expected(
    tmp_path, capsys, text, line, says
):
    """Before: yaml's parser tokens (``expected <block end>, but found '<block mapping start>'``)."""
    from study.cli import main

    path = tmp_path / "h.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "<block" not in err
    assert err.strip() == f"error: {path}: line {line}: invalid YAML: {says}"
