"""A study's conditions in its figures and in MLflow (issue 39): one seed-aggregate set per condition on the
parent run, one chart over layer names, one colour per condition. Small synthetic tables, a stub MLflow
client; no training, no store (well under a second each)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.condition_figures import condition_colours, seed_aggregate_figure
from analysis.table import make_table, seed_profile
from study.tracking_write import RunWriter

LAYERS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]
SHIFT = {"trained": 0.0, "shuffled": 5.0, "untrained": 20.0}


def _table() -> pd.DataFrame:
    """eed_pct of 3 seeds x 3 conditions (untrained: epoch 0 only), each condition at its own level."""
    rng = np.random.default_rng(0)
    rows = []
    for cond, shift in SHIFT.items():
        for seed in range(3):
            for epoch in [0] if cond == "untrained" else [0, 2]:
                for i, layer in enumerate(LAYERS):
                    rows.append(
                        {"run_key": f"{cond}{seed}", "dataset": "objects", "seed": seed, "epoch": epoch,
                         "layer": layer, "layer_index": i, "token_set": "all", "n_tokens": 80,
                         "metric": "eed_pct", "value": 30 + shift + i + rng.normal(0, 0.5), "condition": cond}
                    )  # fmt: skip
    return make_table(rows)


class _Client:
    """What ``log_seed_aggregates`` calls on an ``MlflowClient``, recorded."""

    def __init__(self) -> None:
        self.metrics: list = []
        self.artifacts: dict[str, bytes] = {}
        self.tags: dict[str, str] = {}

    def log_batch(self, run_id, metrics):
        self.metrics += metrics

    def log_artifact(self, run_id, path, artifact_path):
        self.artifacts[f"{artifact_path}/{Path(path).name}"] = Path(path).read_bytes()

    def set_tag(self, run_id, key, value):
        self.tags[key] = value


def _writer() -> RunWriter:
    writer = RunWriter()
    writer.client, writer.parent_id = _Client(), "parent"
    return writer


class _Claim:
    metric = "eed_pct"
    subset = type("Subset", (), {"token_set": "all", "epoch": "last"})()

    @staticmethod
    def datasets_named():
        return ["objects"]


def test_seed_aggregates_are_one_set_per_condition():
    """Before: one set, ``seed_mean/eed_pct/all``, the mean of every condition's runs together."""
    table, writer = _table(), _writer()
    logged = writer.log_seed_aggregates([_Claim()], table)
    assert logged == [f"seed_mean/eed_pct/all/{c}" for c in ("shuffled", "trained", "untrained")]
    client = writer.client
    for cond in SHIFT:
        prof = seed_profile(table, "eed_pct", condition=cond)  # last epoch: 2, and 0 untrained
        for prefix, row in (("seed_mean", "mean"), ("seed_ci_low", "ci_low"), ("seed_ci_high", "ci_high")):
            hist = sorted(
                (m for m in client.metrics if m.key == f"{prefix}/eed_pct/all/{cond}"), key=lambda m: m.step
            )
            assert [m.step for m in hist] == list(range(6))
            assert [m.value for m in hist] == pytest.approx(prof.loc[row].to_numpy(dtype=float))
    means = {
        c: np.mean([m.value for m in client.metrics if m.key == f"seed_mean/eed_pct/all/{c}"]) for c in SHIFT
    }
    assert means["shuffled"] - means["trained"] == pytest.approx(5.0, abs=0.5)
    # one chart over layer names, every condition in it; the steps named in a tag
    assert list(client.artifacts) == ["seed_aggregates/eed_pct_all.png"]
    note = client.tags["seed_aggregates"]
    assert "step = layer (0 patch_embed, 1 pos_embed, 2 block_01, 3 block_02, 4 block_03, 5 norm)" in note
    assert ".../shuffled, .../trained, .../untrained" in note
    fig = seed_aggregate_figure(table, "eed_pct", "all", "objects")
    assert fig.png == client.artifacts["seed_aggregates/eed_pct_all.png"]
    assert fig.plotted["conditions"] == ["shuffled", "trained", "untrained"]
    assert fig.plotted["epochs"] == {"shuffled": 2, "trained": 2, "untrained": 0}
    assert fig.plotted["layers"] == LAYERS
    if os.environ.get("STUDY_KEEP_FIGURES"):
        (Path(os.environ["STUDY_KEEP_FIGURES"]) / "seed_aggregates.png").write_bytes(fig.png)


def test_seed_aggregates_without_conditions_keep_their_names():
    table = _table()
    plain = table[table.condition == "trained"].drop(columns="condition")
    writer = _writer()
    assert writer.log_seed_aggregates([_Claim()], plain) == ["seed_mean/eed_pct/all"]
    assert "condition" not in writer.client.tags["seed_aggregates"]


def test_condition_colours_depend_on_the_names_alone():
    """One colour per condition, whatever order or subset of the study's names a figure is given."""
    a = condition_colours(["trained", "shuffled", "untrained"])
    assert a == condition_colours(["untrained", "trained", "shuffled", "trained"])
    assert len(set(a.values())) == 3 and "C2" not in a.values()  # C2: the accuracy axis
