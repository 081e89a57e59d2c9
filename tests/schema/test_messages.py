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
