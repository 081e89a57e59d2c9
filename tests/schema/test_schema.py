"""Hypothesis files: valid ones load, malformed ones fail with one line naming file and field (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from study.cli import main
from study.schema import load_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "hypotheses").glob("**/*.yaml")), ids=lambda p: p.name)
def test_shipped_hypotheses_validate(path):
    hyp = load_hypothesis(path)
    assert hyp.claims


def _bad_texts(tiny: str) -> dict[str, tuple[str, str, str | None]]:
    """case -> (file text, expected phrase in the error, expected field in the error)."""
    return {
        "bad_yaml": ("name: x\ndesign: [unclosed\n", "invalid YAML", None),
        "unknown_key": (tiny + "extra_key: 1\n", "unknown key", "extra_key"),
        "wrong_type": (tiny.replace("seeds: [0, 1, 2]", "seeds: many"), "valid list", "design.seeds"),
        "missing_claims": (tiny[: tiny.index("claims:")], "required field is missing", "claims"),
        "unknown_metric": (
            tiny.replace("metric: eed_pct", "metric: eed_percent"),
            "unknown metric",
            "claims[0].metric",
        ),
        "unknown_layer": (
            tiny.replace("bottleneck: [block_02]", "bottleneck: [block_09]"),
            "unknown layer",
            "claims[0].regions.bottleneck",
        ),
        "unknown_dataset": (
            tiny.replace("subset: {dataset: objects}", "subset: {dataset: cifar}"),
            "expected one of the design's datasets",
            "claims[0].subset.dataset",
        ),
        "python_tag": ("!!python/object/apply:os.system ['echo pwned']\n", "invalid YAML", None),
        "repeated_seed": (
            tiny.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2, 2]"),
            "expected each seed once; 2 given more than once",
            "design.seeds",
        ),
        "repeated_checkpoint": (  # changes no run, only the design's hash (registration)
            tiny.replace("checkpoints: [0, 2]", "checkpoints: [0, 1, 2, 2]"),
            "expected each epoch once; 2 given more than once",
            "design.checkpoints",
        ),
    }


CASES = sorted(_bad_texts(TINY_HYPOTHESIS))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("verb", ["validate", "run"])
def test_malformed_file_one_line_exit_2(case, verb, tmp_path, capsys):
    text, expect, field = _bad_texts(TINY_HYPOTHESIS)[case]
    bad = tmp_path / f"{case}.yaml"
    bad.write_text(text)
    out_dir = tmp_path / "out"
    args = [verb, str(bad)] + (["--out", str(out_dir)] if verb == "run" else [])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(bad) in err and expect in err, err
    if field:
        assert f": {field}:" in err, err
    assert not out_dir.exists()  # nothing trained or written


def test_missing_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_cli_subprocess_exit_code(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "study", "validate", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"error: {bad}: design")


def test_error_is_one_line():
    err = StudyError("a\nmulti   line\nmessage", "f.yaml", "claims[0]")
    assert str(err) == "f.yaml: claims[0]: a multi line message"
