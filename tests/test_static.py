"""Static checks of the layers without torch (``vitstudy_core``, ``analysis``): every function is at most 80
lines, and the type checker (mypy, configured in pyproject.toml) finds nothing."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MAX_LINES = 80


def test_no_function_in_analysis_or_core_is_over_80_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for package in ("analysis", "vitstudy_core")
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, long


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the test extra)")
def test_mypy_passes_on_core_and_analysis():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "vitstudy_core", "analysis"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
