"""A study's conditions in its figures and in MLflow (issue 39): one seed-aggregate set per condition on the
parent run, one chart over layer names, one colour per condition. Small synthetic tables, a stub MLflow
client; no training, no store (well under a second each)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.report.condition_figures import seed_aggregate_figure
from analysis.report.palette import condition_colours
from analysis.table import make_table, seed_profile
from study.tracking._write import RunWriter

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


# ---- the report: one colour per condition in every figure, one y range per claim, labels whole ----------------
def _controls_report(drawn_figs: list):
    """A controls.yaml-shaped study (trained, shuffled, untrained; the claims of hypotheses/controls.yaml)
    on a synthetic table, its report sections built; ``drawn_figs`` collects the matplotlib figures."""
    import yaml

    from analysis.report.sections import ReportInput, build_sections, conditions_preface
    from analysis.verdicts import evaluate_claims
    from study.schema import parse_hypothesis
    from tests.conftest import TINY_HYPOTHESIS

    doc = yaml.safe_load(TINY_HYPOTHESIS)
    doc["design"]["conditions"] = [
        {"name": "trained"},
        {"name": "shuffled", "labels": "shuffled"},
        {"name": "untrained", "untrained": True},
    ]
    regions = {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]}
    inner = {"kind": "u_shape", "regions": regions}
    base = {"metric": "eed_pct", "subset": {"dataset": "objects"}}
    doc["claims"] = [
        {**base, "name": "dip beats controls", "kind": "u_shape", "regions": regions, "controls": ["untrained", "shuffled"],
         "subset": {"dataset": "objects", "condition": "trained"}},
        {**base, "name": "deeper trained than untrained", "kind": "exceeds", "claim": inner,
         "a": {"condition": "trained"}, "b": {"condition": "untrained"}},
        {**base, "name": "deeper on true labels than on shuffled ones", "kind": "exceeds", "claim": inner,
         "a": {"condition": "trained"}, "b": {"condition": "shuffled"}},
    ]  # fmt: skip
    hyp = parse_hypothesis(doc)
    table = _table()
    table.loc[(table.condition == "trained") & (table.layer == "block_02"), "value"] -= 8.0  # a dip, trained
    results = evaluate_claims(hyp, table)
    sections = build_sections(ReportInput(hyp.name, "", list(hyp.claims), results, table, Path(".")))
    return table, sections, conditions_preface(table, list(hyp.claims))


def test_a_reports_figures_keep_one_colour_per_condition_and_one_y_range_per_claim(monkeypatch):
    """Before: each figure coloured conditions by their place in it (C0, C1, ...): shuffled was green in the
    controls figure and orange in the trained-vs-shuffled one, and every profile was blue; and each
    condition's profile had its own y range, so a dip drawn beside another looked as deep."""
    import matplotlib.colors

    import analysis.report.figures as figures

    kept: list = []
    png = figures._png
    monkeypatch.setattr(figures, "_png", lambda fig: kept.append(fig) or png(fig))
    table, sections, preface = _controls_report(kept)
    palette = condition_colours(["trained", "shuffled", "untrained"])
    seen: dict[str, set[str]] = {c: set() for c in palette}
    for f in [g for s in sections for g in s.figures] + preface:
        for cond, colour in (f.plotted.get("colours") or {}).items():
            if cond in palette:
                seen[cond].add(colour)
    # effects figures: each condition's mean marker is drawn in its palette colour
    effect_figs = [fig for fig in kept if fig.axes[0].get_ylabel().startswith("the bottleneck depth")]
    assert len(effect_figs) == 3
    for fig in effect_figs:
        ax = fig.axes[0]
        names = [t.get_text() for t in ax.get_xticklabels()]
        markers = [line for line in ax.get_lines() if line.get_marker() == "s"]
        assert len(markers) == len(names)
        for name, line in zip(names, markers, strict=True):
            assert matplotlib.colors.same_color(line.get_color(), palette[name]), (name, line.get_color())
            seen[name].add(palette[name])
    # profiles of one condition: in its colour, named by it
    profiles = [f for s in sections for f in s.figures if "profile" in f.name]
    assert len(profiles) == 5  # claim 1's own, and each exceeds claim's two conditions
    for f in profiles:
        ((label, colour),) = f.plotted["colours"].items()
        cond = f.caption.split("condition ")[-1] if "condition " in f.caption else "trained"
        assert colour == palette[cond], (f.name, colour)
    assert preface[0].plotted["colours"] == palette
    assert all(len(colours) == 1 for colours in seen.values()), seen
    profile_axes = [
        fig.axes[0] for fig in kept if fig.axes[0].get_ylabel() == "eed_pct" and len(fig.axes) == 1
    ]
    # drawn in order: claim 1's own profile, then each exceeds claim's two (the preface grid has 3 axes)
    by_claim = [profile_axes[1:3], profile_axes[3:5]]
    for pair in by_claim:
        assert pair[0].get_ylim() == pytest.approx(pair[1].get_ylim())
        for ax in pair:  # every line drawn inside the shared range
            lo, hi = ax.get_ylim()
            assert all(lo <= min(line.get_ydata()) and max(line.get_ydata()) <= hi for line in ax.get_lines())


def test_axis_labels_break_between_words_only():
    """Before: the effects figure's y label was cut every 40 characters ("mea/n", "deep/er")."""
    from analysis.kinds._parts.difference_display import _wrapped

    text = "the bottleneck depth: the shoulders' mean minus the bottleneck, per seed (a deeper dip is larger)"
    lines = _wrapped(text).split("\n")
    assert len(lines) <= 3 and all(len(line) <= 40 for line in lines)
    words = set(text.split())
    assert all(w in words or w == "..." for line in lines for w in line.split()), lines
    assert " ".join(lines).replace(" ...", "") in text


def test_the_panels_of_an_epoch_figure_share_their_y_axis(monkeypatch):
    """Before: one panel per dataset, each zoomed on its own values (a 1-pp change looked like a 20-pp one)."""
    import analysis.report.figures as figures

    kept: list = []
    png = figures._png
    monkeypatch.setattr(figures, "_png", lambda fig: kept.append(fig) or png(fig))
    table = _table()
    table = table[table.condition == "trained"].drop(columns="condition")
    other = table.assign(dataset="textures", value=table.value * 3.0)
    figures.epoch_figure(
        pd.concat([table, other]), "eed_pct", "all", ["objects", "textures"], [0, 2], LAYERS[2:4]
    )
    (fig,) = kept
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
