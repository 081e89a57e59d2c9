"""Reports that mislead (issue 27): what the figures draw and what the verdicts and findings say, checked on
small synthetic sweep tables and trial tables (no training, seconds). Each test reads the matplotlib figure
the report really renders (``_png`` is wrapped in ``analysis.report.figures`` and ``analysis.report.knob_figures``, where
it is looked up)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import analysis.report.figures as figures
import analysis.report.knob_figures as knob_figures
from analysis.observables import metric_range
from analysis.report.figures import epoch_figure, profile_figure
from analysis.report.knob_figures import knob_figure, trials_figure
from analysis.report.sections import ReportInput, build_sections, findings
from analysis.spectral import METRICS, RANGES
from analysis.verdicts import evaluate_claims, format_verdicts
from study.schema import load_hypothesis, parse_hypothesis
from study.sweep._tables import accuracy_warnings, learning_lines, with_task_size
from tests.conftest import TINY_SWEEP

ROOT = Path(__file__).parents[2]
LAYERS = ["block_01", "block_02", "block_03"]


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures rendered during the test, in order."""
    kept = []
    png = figures._png
    monkeypatch.setattr(figures, "_png", lambda fig: kept.append(fig) or png(fig))
    monkeypatch.setattr(knob_figures, "_png", lambda fig: kept.append(fig) or png(fig))
    return kept


def _sweep_table(
    points: list[dict], n_seeds: int = 3, slope: float = 8.0, base: float = 40.0, sd: float = 0.5
):
    """Tidy rows of trial datasets at the given knob values (the first knob carries ``slope``), 3 layers."""
    rng = np.random.default_rng(0)
    offsets = rng.normal(0, 2, n_seeds)
    rows = []
    for point in points:
        name = "objects" + "".join(f"-{k}{v:g}" for k, v in sorted(point.items()))
        first = next(iter(point.values()))
        for s in range(n_seeds):
            for li, layer in enumerate(LAYERS):
                value = base + offsets[s] + slope * first + li + rng.normal(0, sd)
                rows.append(
                    {"run_key": f"{name}{s}", "dataset": name, "seed": s, "epoch": 1, "layer": layer,
                     "layer_index": li + 2, "token_set": "all", "n_tokens": 80, "metric": "eed_pct",
                     "value": value, **point}
                )  # fmt: skip
    return pd.DataFrame(rows)


def _trials(points: list[dict], acc, n_seeds: int = 3, objective=None) -> pd.DataFrame:
    """One row per trial x seed (as ``study.sweep.loop.trials_table``): ``acc(point, seed)`` its test accuracy."""
    rows = [
        {"trial": t, **point, "seed": s, "run_key": f"k{t}{s}", "test_acc": acc(point, s),
         "objective": objective(point, s) if objective else 40.0 + 8 * next(iter(point.values())) + s}
        for t, point in enumerate(points)
        for s in range(n_seeds)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def _hyp(space: dict, seeds=(0, 1, 2), over: str | None = None, **dataset):
    """TINY_SWEEP's claims (an ordering and a trend with level 50) over ``space``, ``over`` its knob."""
    doc = yaml.safe_load(TINY_SWEEP)
    doc["sweep"]["space"] = space
    if any(isinstance(v, dict) for v in space.values()):
        doc["sweep"].update(sampler="random", n_trials=6)
    doc["design"]["seeds"] = list(seeds)
    doc["design"]["datasets"][0].update(dataset)
    for claim in doc["claims"]:
        claim["over"] = over or next(iter(space))
    return parse_hypothesis(doc)


def _sections(hyp, table, trials=None):
    results = evaluate_claims(hyp, table)
    if trials is not None:
        accuracy_warnings(results, hyp.claims, trials)
    return results, build_sections(ReportInput(hyp.name, "", list(hyp.claims), results, table, ROOT))


# ---- 1. the accuracy axis, chance, and runs that never learnt ------------------------------------------------
AT_CHANCE = [{"n_classes": n} for n in (2, 4, 10)]


def _at_chance(point, seed):
    """Accuracy at chance, a little noise: 1 / n_classes moves with the knob (0.5 -> 0.1)."""
    return 1.0 / point["n_classes"] + (seed - 1) * 0.01


def test_runs_at_chance_fixed_accuracy_axis_chance_line_and_no_confound(drawn, tmp_path):
    """Every run at chance over an n_classes knob (accuracy 0.5 -> 0.1 only because chance does): the sweep
    report's figures show accuracy on [0, 1] with a legend and the chance of each trial; the verdicts and
    the report say no run learnt, and no accuracy confound is claimed."""
    from study.sweep.report import sweep_report

    hyp = _hyp({"n_classes": [2, 4, 10]}, n_test=400)
    trials = with_task_size(_trials(AT_CHANCE, _at_chance), hyp)
    table = _sweep_table(AT_CHANCE)
    results = evaluate_claims(hyp, table)
    accuracy_warnings(results, hyp.claims, trials)
    inp = ReportInput(hyp.name, "", list(hyp.claims), results, table, tmp_path / "runs")
    md = sweep_report(tmp_path, hyp, inp, trials, None).with_name("report.md").read_text()
    with_accuracy = [fig for fig in drawn if len(fig.axes) == 2]
    assert len(with_accuracy) == 3  # the sweep's objective and the two claims' curves
    for fig in with_accuracy:
        right = fig.axes[1]
        assert right.get_ylim() == (0.0, 1.0)  # never zoomed in on a few hundredths of accuracy
        labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        assert any(x.startswith("test accuracy") for x in labels), labels
        assert any(x.startswith("chance") for x in labels), labels
        (chance,) = [line for line in right.get_lines() if line.get_label().startswith("chance")]
        np.testing.assert_allclose(chance.get_ydata(), [0.5, 0.25, 0.1])  # 1 / n_classes of each trial
    for r in results:
        assert not any("accuracy above chance changes" in w or "accuracy changes" in w for w in r.warnings)
        assert any(w.startswith("no run learnt the task") for w in r.warnings), r.warnings
        assert r.details["accuracy"]["chance"] == pytest.approx([0.5, 0.25, 0.1])
    assert "test accuracy: 0 of 9 runs above chance" in md
    assert md.count("warning: no run learnt the task") == 3  # the sweep's summary and each claim


def test_accuracy_that_learns_with_the_knob_still_warns_and_a_stuck_trial_is_named():
    hyp = _hyp({"texture_reliance": [0.0, 0.5, 1.0]}, n_test=400)
    points = [{"texture_reliance": k} for k in (0.0, 0.5, 1.0)]

    def acc(point, seed):  # chance 0.1 (10 classes); at 0 at chance, then learnt more with the knob
        return 0.1 + (0.55 + 0.05 * seed) * point["texture_reliance"] + 0.003 * seed

    trials = with_task_size(_trials(points, acc), hyp)
    results = evaluate_claims(hyp, _sweep_table(points))
    accuracy_warnings(results, hyp.claims, trials)
    assert any("accuracy above chance changes with texture_reliance" in w for w in results[0].warnings)
    assert learning_lines(trials, "texture_reliance") == [
        "1 of 3 trials never learnt (at texture_reliance = 0): every seed's test accuracy is within binomial "
        "error of chance (n_test = 400); their points describe networks that learnt nothing"
    ]


# ---- 2. bands clipped to the metric's range -------------------------------------------------------------------
def test_every_metric_declares_its_range():
    assert set(RANGES) == set(METRICS)
    assert metric_range("eed_pct") == (0.0, 100.0) and metric_range("cosine_anisotropy") == (-1.0, 1.0)
    assert metric_range("effective_rank") == (1.0, None) and metric_range("nope") == (None, None)


def _bands(fig) -> list[tuple[float, float]]:
    """(lowest, highest) y of every filled band of a figure."""
    out = []
    for ax in fig.axes:
        for coll in ax.collections:
            for path in coll.get_paths():
                y = path.vertices[:, 1]
                out.append((float(y.min()), float(y.max())))
    return out


def test_bands_stay_inside_the_metric_range(drawn):
    # two seeds at 2 and 98 EED%: a t band of +-560 pp; every figure clips it to [0, 100]
    rows = []
    for s, v in ((0, 2.0), (1, 98.0)):
        for epoch in (0, 1):
            for li, layer in enumerate(LAYERS):
                rows.append(
                    {"run_key": f"r{s}", "dataset": "objects", "seed": s, "epoch": epoch, "layer": layer,
                     "layer_index": li + 2, "token_set": "all", "n_tokens": 80, "metric": "eed_pct",
                     "value": v + li + epoch}
                )  # fmt: skip
    table = pd.DataFrame(rows)
    profile_figure(table, "eed_pct", "all", ["objects"], "last")
    epoch_figure(table, "eed_pct", "all", ["objects"], [0, 1], LAYERS)
    hyp = _hyp({"texture_reliance": [0.0, 0.5, 1.0]}, seeds=(0, 1))
    points = [{"texture_reliance": k} for k in (0.0, 0.5, 1.0)]
    sweep = _sweep_table(points, n_seeds=2, base=2.0, sd=30.0)
    _sections(hyp, sweep)
    objective = lambda point, s: 2.0 + 96.0 * s  # noqa: E731 - two seeds far apart
    trials_figure(
        _trials(points, lambda p, s: 0.5, 2, objective), "texture_reliance", "mean of eed_pct", (0, 100)
    )
    assert len(drawn) == 7  # profile, epochs, (knob figure, effect plot) x 2 claims, sweep
    bands = [b for fig in drawn if "effect" not in fig.axes[0].get_xlabel() for b in _bands(fig)]
    assert len(bands) >= 7 and all(0.0 <= lo and hi <= 100.0 for lo, hi in bands), bands
    assert min(lo for lo, _ in bands) == 0.0  # clipped, not merely narrow


# ---- 3. two continuous knobs: no line joins trials that differ in the other knob ----------------------------
def _joining_lines(ax, n_points: int) -> list:
    """Lines of an axis that connect several points with a visible line (not the fitted trend)."""
    return [
        line
        for line in ax.get_lines()
        if len(line.get_xdata()) > 1
        and line.get_linestyle() not in ("None", "", " ")
        and line.get_linestyle() != "--"
    ]


def test_two_continuous_knobs_draw_points_and_a_grid_draws_one_line_per_level(drawn):
    rng = np.random.default_rng(3)
    points = [{"texture_reliance": float(a), "clutter": float(b)} for a, b in rng.uniform(0, 1, (6, 2))]
    trials = _trials(points, lambda p, s: 0.5)
    fig = trials_figure(trials, "texture_reliance", "min of eed_pct", others=["texture_reliance", "clutter"])
    assert fig.plotted["mode"] == "points" and "points only" in fig.caption and "clutter" in fig.caption
    assert _joining_lines(drawn[-1].axes[0], 6) == [] and _joining_lines(drawn[-1].axes[1], 6) == []

    grid = [{"texture_reliance": a, "clutter": b} for a in (0.0, 0.5, 1.0) for b in (0.0, 1.0)]
    fig = trials_figure(_trials(grid, lambda p, s: 0.5), "texture_reliance", "min", others=["clutter"])
    assert fig.plotted["mode"] == "grouped" and "one line per value of clutter" in fig.caption
    lines = _joining_lines(drawn[-1].axes[0], 3)
    assert lines and all(sorted(line.get_xdata()) == [0.0, 0.5, 1.0] for line in lines)
    assert sum(1 for line in lines if line.get_label().startswith("min at clutter=")) == 2

    # the claims' curves over a knob: points with error bars, only the fitted trend is a line
    hyp = _hyp({"texture_reliance": {"low": 0.0, "high": 1.0}, "clutter": {"low": 0.0, "high": 1.0}})
    _, sections = _sections(hyp, _sweep_table(points))
    for sec in sections:
        assert sec.figures[0].plotted["joined"] is False and "points only" in sec.figures[0].caption
    knob_figs = [f for f in drawn if f.axes[0].get_xlabel() == "texture_reliance"][-2:]
    assert all(_joining_lines(f.axes[0], 6) == [] for f in knob_figs)


# ---- 4. units and crossings that do not exist -----------------------------------------------------------------
def test_slopes_say_per_unit_of_the_knob_and_a_missing_crossing_says_never(drawn):
    hyp = _hyp({"texture_reliance": [0.0, 0.5, 1.0]})
    points = [{"texture_reliance": k} for k in (0.0, 0.5, 1.0)]
    results, sections = _sections(hyp, _sweep_table(points))  # the trend's level 50 is never reached
    text = "\n".join(sections[1].findings)
    assert "n/a" not in text.split("the seed-mean curve")[1].split("\n")[0]
    assert "the seed-mean curve never reaches 50.00 within the swept range (texture_reliance 0 to 1)" in text
    assert f"effect {results[1].effect:.2f} pp per unit of texture_reliance (95% t CI" in text
    assert "pooled: " in text and "pp per unit of texture_reliance (95% CI" in text
    for sec in sections:
        assert sec.unit == " pp per unit of texture_reliance"
        assert sec.figures[-1].caption == "effect with 95% CI (pp per unit of texture_reliance)"
    effect_axes = [f.axes[0] for f in drawn if f.axes[0].get_xlabel().startswith("eed_pct effect")]
    assert [ax.get_xlabel() for ax in effect_axes] == ["eed_pct effect (pp per unit of texture_reliance)"] * 2
    legend = [t.get_text() for t in drawn[2].axes[0].get_legend().get_texts()]
    assert any("pp per unit of texture_reliance" in x for x in legend), legend


def test_a_crossing_reached_by_some_seeds_only():
    from analysis.kinds._parts.curves import crossing, crossing_lines

    x, y = np.array([0.0, 1.0]), np.array([[0.0, 4.0], [0.0, 1.0], [0.0, 6.0]])  # mean reaches 3.0 at 0.818
    (line,) = crossing_lines(crossing(x, y, 3.0), "clutter")
    assert line.startswith(
        "the seed-mean curve reaches 3.00 at clutter = 0.818; 2 of 3 seeds' curves reach it"
    )
    (line,) = crossing_lines(crossing(x, y, 5.0), "clutter")
    assert line.startswith(
        "the seed-mean curve never reaches 5.00 within the swept range (clutter 0 to 1); 1 of"
    )
    assert "one seed: no CI" in line


# ---- 5. trends over epochs ----------------------------------------------------------------------------------
def test_a_trend_over_epochs_draws_its_seeds_and_a_band(drawn):
    hyp = load_hypothesis(ROOT / "hypotheses" / "rank_grows.yaml")
    table = pd.read_parquet(ROOT / "tests" / "fixtures" / "behaviour" / "table_rank_grows.parquet")
    claim = hyp.claims[0]
    results = evaluate_claims(hyp.model_copy(update={"claims": [claim]}), table)
    (sec,) = build_sections(ReportInput(hyp.name, "", [claim], results, table, ROOT))
    assert "epoch=last" not in sec.subset and "epochs=[0, 1, 2, 4, 6, 8]" in sec.subset
    ax = drawn[0].axes[0]
    seeds = table[table.dataset == claim.subset.dataset].seed.nunique()
    per_seed = [line for line in ax.get_lines() if line.get_label().startswith("_")]
    assert len(per_seed) == seeds * len(claim.layers)  # one thin line per seed and layer
    assert len(ax.collections) == len(claim.layers)  # a 95% band per layer around its mean
    assert "95% t band" in sec.figures[0].caption


# ---- 6. the bottleneck's location in layer names ---------------------------------------------------------------
def test_the_bottleneck_location_names_layers_and_never_leaves_them():
    hyp = load_hypothesis(ROOT / "hypotheses" / "u_shape.yaml")
    blocks = [f"block_{i:02d}" for i in range(1, 13)]
    rows = []
    for s, low in ((0, 3), (1, 9)):  # two seeds whose minima lie far apart: a t CI far past the blocks
        for i, layer in enumerate(blocks):
            rows.append(
                {"run_key": f"r{s}", "dataset": "objects", "seed": s, "epoch": 8, "layer": layer,
                 "layer_index": i + 2, "token_set": "all", "n_tokens": 80, "metric": "eed_pct",
                 "value": 30.0 + 2 * abs(i + 1 - low) + s}
            )  # fmt: skip
    table = pd.DataFrame(rows)
    (r,) = evaluate_claims(hyp, table)
    lo, hi = r.details["bottleneck_location"]["ci"]
    assert lo < 2 and hi > 13  # the raw interval leaves the layers; the report must not show it
    (line,) = [x for x in findings(hyp.claims[0], r) if x.startswith("bottleneck ")]
    claim_regions = hyp.claims[0].regions
    first = blocks[blocks.index(claim_regions.early[-1]) + 1]
    last = blocks[blocks.index(claim_regions.late[0]) - 1]
    where = (
        f"bottleneck at block_06 (95% CI {first} to {last}, clipped to the layers between "
        f"the shoulders, {first}..{last})"
    )
    assert line.startswith(where) and "layer index" not in line, line
    # issue 50: verdicts.txt (and the terminal) say the same, never "at between" nor a CI into the shoulders
    assert f"  - {hyp.claims[0].name}: {where}, depth " in format_verdicts([r])
    assert r.details["bottleneck_location"]["text"] == where


# ---- 7. a one-level curve ---------------------------------------------------------------------------------
def test_a_one_level_curve_is_not_testable_without_numpy_warnings(tmp_path):
    hyp = _hyp({"texture_reliance": [0.5]})
    table = _sweep_table([{"texture_reliance": 0.5}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning (0/0 slopes) fails the test
        results, sections = _sections(hyp, table)
    for r in results:
        assert r.verdict == "INCONCLUSIVE" and math.isnan(r.p_value)
        assert r.reason == "not testable: one level of texture_reliance (0.5): a slope needs at least 2"
        assert not any("between-seed variance" in w or "other way" in w for w in r.warnings), r.warnings
    for sec in sections:
        assert not any("power" in line for line in sec.findings)


# ---- 8. issue 39: a profile that peaks between the shoulders has no bottleneck to locate ----------------------
def test_a_profile_peaking_between_the_shoulders_reports_no_interior_minimum():
    """Before: "bottleneck at block_09 (95% CI block_09 to block_09)", the edge where the search between the
    shoulders is cut, not a minimum of the profile."""
    hyp = load_hypothesis(ROOT / "hypotheses" / "u_shape.yaml")
    blocks = [f"block_{i:02d}" for i in range(1, 13)]
    rows = []
    for s in range(3):  # an inverted U: up to block_05, then down to the late shoulder
        for i, layer in enumerate(blocks):
            rows.append(
                {"run_key": f"r{s}", "dataset": "objects", "seed": s, "epoch": 8, "layer": layer,
                 "layer_index": i + 2, "token_set": "all", "n_tokens": 80, "metric": "eed_pct",
                 "value": 40.0 - 2 * abs(i + 1 - 5) + 0.3 * s}
            )  # fmt: skip
    (r,) = evaluate_claims(hyp, pd.DataFrame(rows))
    assert r.details["bottleneck_location"]["interior_seeds"] == 0
    text = format_verdicts([r])
    assert "bottleneck at block_09" not in text and "block_09 to block_09" not in text
    assert (
        "no interior minimum between the shoulders (in every seed the lowest layer between them, block_09,"
        in text
    )
    (line,) = [x for x in findings(hyp.claims[0], r) if x.startswith("no bottleneck location")]
    assert "no interior minimum" in line and "95% CI" not in line.split(";")[0]
    # a real dip keeps its location
    for row in rows:
        row["value"] = 40.0 - 2 * (row["layer"] == "block_04") - (row["layer"] in ("block_03", "block_05"))
        row["value"] += 0.1 * row["seed"]
    (r,) = evaluate_claims(hyp, pd.DataFrame(rows))
    assert r.details["bottleneck_location"]["interior_seeds"] == 3
    assert "bottleneck at block_04 (95% CI block_04 to block_04)" in format_verdicts([r])


# ---- 9. issue 39: an adjusted claim draws the relation its verdict tests ---------------------------------------
def _line_slope(line) -> float:
    x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    return float(np.polyfit(x, y, 1)[0])


def test_an_adjusted_claim_draws_the_adjusted_relation_and_labels_each_line_by_its_slope(drawn):
    """Before: the raw fit (rising) drawn under a legend giving the adjusted slope (falling). The metric
    rises with the knob only through test accuracy: -4 per unit at equal accuracy, +8 raw."""
    doc = yaml.safe_load(TINY_SWEEP)
    doc["sweep"]["space"] = {"texture_reliance": [0.0, 0.25, 0.5, 0.75, 1.0]}
    doc["design"]["seeds"] = [0, 1, 2, 3]
    claim = {k: v for k, v in doc["claims"][1].items() if k != "level"}
    doc["claims"] = [
        {**claim, "layers": ["block_02"], "direction": "decreasing", "adjust_for": "test_accuracy"}
    ]
    hyp = parse_hypothesis(doc)
    rng = np.random.default_rng(1)
    points = [{"texture_reliance": k} for k in doc["sweep"]["space"]["texture_reliance"]]
    table = _sweep_table(points, n_seeds=4, slope=0.0, sd=0.01)
    acc = {
        (p["texture_reliance"], s): 0.3 + 0.2 * p["texture_reliance"] + rng.normal(0, 0.05)
        for p in points
        for s in range(4)
    }
    table["test_accuracy"] = [acc[(k, s)] for k, s in zip(table.texture_reliance, table.seed, strict=True)]
    table["value"] += -4.0 * table.texture_reliance + 60.0 * table.test_accuracy
    (r,) = evaluate_claims(hyp, table)
    assert r.effect == pytest.approx(-4.0, abs=0.5) and r.details["adjusted"]["raw"]["effect"] > 4
    fig = knob_figure(r, "eed_pct", table=table)
    assert "at equal test_accuracy" in fig.caption
    lines = {line.get_label(): line for line in drawn[-1].axes[0].get_lines() if "slope" in line.get_label()}
    assert len(lines) == 2, list(lines)
    for label, line in lines.items():  # every slope in the legend is the slope of the line it labels
        stated = float(label.split("slope ")[1].split(" ")[0])
        assert _line_slope(line) == pytest.approx(stated, rel=0.01), label
    (adjusted,) = [line for label, line in lines.items() if label.startswith("at equal test_accuracy")]
    assert _line_slope(adjusted) == pytest.approx(r.effect, rel=0.01)
    (raw,) = [line for label, line in lines.items() if label.startswith("raw fit")]
    assert _line_slope(raw) == pytest.approx(r.details["adjusted"]["raw"]["effect"], rel=0.01)


# ---- 10. issue 50: one text for the location everywhere, and only where every replicate dips ----------------
def _u_rows(minimum_of) -> pd.DataFrame:
    """A u_shape.yaml table over block_01..12 (and patch_embed, lowest of all): seed s dips at layer
    ``minimum_of(s)`` (a 1-based block number, or None: a profile rising from the early shoulder)."""
    rows = []
    for s in range(5):
        low = minimum_of(s)
        for i in range(12):
            value = 40.0 + 2 * abs(i + 1 - low) + 0.1 * s if low else 30.0 + i + 0.1 * s
            rows.append(
                {"run_key": f"r{s}", "dataset": "objects", "seed": s, "epoch": 8, "layer": f"block_{i + 1:02d}",
                 "layer_index": i + 2, "token_set": "all", "n_tokens": 80, "metric": "eed_pct", "value": value}
            )  # fmt: skip
        rows.append({**rows[-1], "layer": "patch_embed", "layer_index": 0, "value": 1.0})
    return pd.DataFrame(rows)


def test_the_location_is_one_text_and_only_where_every_replicate_has_an_interior_minimum():
    """Before: verdicts.txt said "95% CI block_02 to block_10" (into the shoulders) where the report said
    "block_03 to block_09, clipped", the terminal "bottleneck at between ...", a location was given though
    4 of 5 seeds had no interior minimum, and the report added "lowest layer of the mean profile:
    patch_embed", a layer outside every region; a ``unit: images`` claim said "in every seed"."""
    hyp = load_hypothesis(ROOT / "hypotheses" / "u_shape.yaml")
    claim = hyp.claims[0]
    (r,) = evaluate_claims(hyp, _u_rows(lambda s: (4, 5, 6, 5, 5)[s]))  # every seed dips, at block_04..06
    where = r.details["bottleneck_location"]["text"]
    assert where.startswith("bottleneck at block_05 (95% CI block_0"), where
    assert f"  - {claim.name}: {where}, depth " in format_verdicts([r])
    (line,) = [x for x in findings(claim, r) if x.startswith("bottleneck ")]
    assert line.startswith(where) and line.endswith("lowest layer of the mean profile between them: block_05")
    assert "patch_embed" not in line
    (r,) = evaluate_claims(hyp, _u_rows(lambda s: 5 if s == 0 else None))  # 4 of 5 seeds rise: no dip
    text = r.details["bottleneck_location"]["text"]
    assert text == (
        "no bottleneck location: 4 of 5 seeds have no interior minimum between the shoulders (their lowest "
        "layer between them, block_03, lies at their edge, above the shoulder layer beside it)"
    )
    assert f"  - {claim.name}: {text}, depth " in format_verdicts([r])
    assert any(x.startswith(text) for x in findings(claim, r))
    (r,) = evaluate_claims(hyp, _u_rows(lambda s: None))
    r.details["unit"] = {"unit": "images", "blocks": 5}  # the replicates are probe blocks
    from analysis.kinds.base import bottleneck_text

    assert "in every probe block the lowest layer" in bottleneck_text(r.details)


def test_the_compare_figure_marks_the_two_layers_it_compares(drawn):
    """Before: the compare claim's profile showed every layer alike, nothing marking ``a`` and ``b``."""
    hyp = load_hypothesis(ROOT / "hypotheses" / "u_shape.yaml")
    table = pd.read_parquet(ROOT / "tests" / "fixtures" / "behaviour" / "table_u_shape.parquet")
    claim = {"name": "c", "kind": "compare", "metric": "eed_pct", "subset": {"dataset": "objects"},
             "a": {"layers": ["block_02"]}, "b": {"layers": ["block_05", "block_06"]}}  # fmt: skip
    data = {**hyp.model_dump(mode="json", exclude_unset=True), "claims": [claim]}
    one = parse_hypothesis(data)
    results = evaluate_claims(one, table)
    (sec,) = build_sections(ReportInput(one.name, "", list(one.claims), results, table, ROOT))
    profile = next(f for f in sec.figures if f.name.startswith("claim0_profile"))
    assert profile.plotted["regions"] == {"a": ["block_02"], "b": ["block_05", "block_06"]}
    ax = drawn[0].axes[0]
    assert {t.get_text() for t in ax.texts} >= {"a", "b"} and len(ax.patches) >= 2
