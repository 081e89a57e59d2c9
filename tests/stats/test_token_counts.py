"""Compared conditions with unequal token counts are flagged (finite-sample bias differs between them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.kinds._parts.outcome import token_count_warnings
from analysis.simulate import simulate_layer_table
from analysis.verdicts import evaluate_claims
from study.schema import parse_hypothesis


def _hyp(claim: dict):
    return parse_hypothesis(
        {"name": "t", "design": {"datasets": [{"name": "objects"}], "seeds": [0, 1, 2, 3]}, "claims": [claim]}
    )


def _table(n_all: int, n_cls: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    all_ = simulate_layer_table("flat", 4, 0.0, rng).assign(n_tokens=n_all)
    cls = simulate_layer_table("flat", 4, 0.0, rng).assign(token_set="cls", n_tokens=n_cls)
    return pd.concat([all_, cls], ignore_index=True)


COMPARE = {
    "name": "cls above all",
    "kind": "compare",
    "metric": "eed_pct",
    "subset": {"dataset": "objects", "epoch": "last"},
    "a": {"token_set": "cls", "layers": ["block_12"]},
    "b": {"token_set": "all", "layers": ["block_12"]},
}


def test_unequal_token_counts_warn():
    r = evaluate_claims(_hyp(COMPARE), _table(8704, 512))[0]
    assert any("different token counts (a: 512, b: 8704)" in w for w in r.warnings), r.warnings


def test_equal_or_unknown_token_counts_do_not_warn():
    r = evaluate_claims(_hyp(COMPARE), _table(512, 512))[0]
    assert not any("token counts" in w for w in r.warnings)
    assert token_count_warnings({"a": [], "b": [512]}) == []
