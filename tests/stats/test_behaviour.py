"""Behaviour snapshot: every shipped hypothesis file, analysed on a fixed synthetic table, gives the verdicts
stored in ``tests/fixtures/behaviour`` (written by ``make_fixtures.py`` before the claim-kind registry).

Everything in a claim's result is compared: verdict, reason, effect, CIs, p-values and every number in its
details, floats to 1e-12 relative.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from study.cli import main

ROOT = Path(__file__).parents[2]
FIX = Path(__file__).parents[1] / "fixtures" / "behaviour"
CASES = sorted(p.name.removeprefix("verdicts_").removesuffix(".json") for p in FIX.glob("verdicts_*.json"))


def _file_of(name: str) -> Path:
    base = name.removesuffix("_weak")
    for path in sorted((ROOT / "hypotheses").rglob("*.yaml")):
        if path.read_text().count(f"name: {base}\n"):
            return path
    raise LookupError(name)


def _same(a, b, where: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, f"{where}: {a} != {b}"
        # The display-only MixedLM (details.mixed_model) is an iterative REML fit whose starting point is
        # statsmodels' own optimiser: its numbers move by up to ~4e-6 relative (variance components) between statsmodels releases. Every number
        # a verdict rests on (effect, CI, p, per-seed values) must match to 1e-12.
        tol = 1e-5 if ".mixed_model." in where else 1e-12
        assert math.isclose(a, b, rel_tol=tol, abs_tol=1e-12), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, str) and isinstance(b, str) and "REML refined" in a:
        # the same display-fit warning; the refinement's gain (~1e-12 log-likelihood) is optimiser noise
        gain = re.compile(r"\(\+[0-9.e+-]+ log-likelihood\)")
        assert gain.sub("(+g)", a) == gain.sub("(+g)", b), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_every_shipped_file_has_a_snapshot():
    # sweep files are tested on sweep tables (tests/sweep/test_sweep.py); every other shipped file has a snapshot
    files = [p for p in (ROOT / "hypotheses").rglob("*.yaml") if "\nsweep:" not in p.read_text()]
    names = {yaml.safe_load(p.read_text())["name"] for p in files}
    assert {c.removesuffix("_weak") for c in CASES} == names


@pytest.mark.parametrize("name", CASES)
def test_verdicts_unchanged(name):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["analyze", str(_file_of(name)), "--table", str(FIX / f"table_{name}.parquet"), "--json"])
    assert rc == 0
    _same(json.loads(buf.getvalue()), json.loads((FIX / f"verdicts_{name}.json").read_text()), name)
