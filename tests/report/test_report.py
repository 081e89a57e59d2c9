"""analysis/report/page.py: the HTML/Markdown report over a synthetic study folder (no training, seconds), and
what each claim's figures plot for every shipped hypothesis file."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import matplotlib.axes
import numpy as np
import pandas as pd
import pytest

from analysis.report.figures import t_band
from analysis.report.page import read_study
from analysis.report.sections import ReportInput, build_sections, subset_text
from analysis.verdicts import evaluate_claims
from study.cli import main
from study.schema import load_hypothesis
from tests.conftest import make_study, report
from vitstudy_core.errors import StudyError

ROOT = Path(__file__).parents[2]
BEHAVIOUR = Path(__file__).parents[1] / "fixtures" / "behaviour"


def _images(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]


def test_report_is_self_contained_with_every_figure(tmp_path):
    study_dir = make_study(tmp_path)
    html_path, md_path = report(study_dir)
    text = html_path.read_text()
    # no network: nothing but data: URIs, no script
    assert not re.search(r"(src|href)=\"(?!data:)", text) and "http" not in text.replace("http-equiv", "")
    assert "<script" not in text
    assert 'id="verdicts"' in text and "dip" in text and "entropy grows with training" in text
    imgs = _images(text)
    # u_shape: profile + effect; trend: epoch curves + effect; covariance heatmaps
    assert len(imgs) == 5
    assert all(b.startswith(b"\x89PNG") and len(b) > 1000 for b in imgs)
    assert "covariance snapshots not recorded" not in text and "Missing" not in text
    md = md_path.read_text()
    assert "| dip | u_shape |" in md and "## Reproduce" in md
    for link in re.findall(r"\]\((figures/[^)]+)\)", md):
        assert (study_dir / link).stat().st_size > 1000


def test_missing_and_corrupt_artifacts_are_marked_not_fatal(tmp_path):
    study_dir = make_study(tmp_path, covariances=False)
    text = report(study_dir)[0].read_text()
    assert "covariance snapshots not recorded" in text and len(_images(text)) == 4

    study_dir = make_study(tmp_path / "b")
    runs = study_dir.parent.parent / "runs"
    for run in runs.iterdir():
        (run / "covariances.npz").write_bytes(b"not a zip")
    (study_dir / "table.parquet").unlink()
    text = report(study_dir)[0].read_text()
    assert "<h2>Missing</h2>" in text
    assert "artifact covariances.npz unreadable" in text and "objects/seed0" in text
    assert "table.parquet unreadable" in text and 'id="verdicts"' in text
    assert len(_images(text)) == 2  # only the effect plots need nothing but verdicts.json


def test_report_needs_verdicts(tmp_path):
    with pytest.raises(StudyError, match="verdicts.json"):
        read_study(tmp_path, "x", "", None)


def test_t_band_matches_scipy():
    from scipy import stats

    x = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 9.0]])
    mean, low, high = t_band(x)
    ci = stats.t.interval(0.95, 2, loc=x[:, 1].mean(), scale=stats.sem(x[:, 1]))
    np.testing.assert_allclose(mean, [2.0, 5.0])
    np.testing.assert_allclose([low[1], high[1]], ci)


def test_cli_report_and_ui(tmp_path, capsys, monkeypatch):
    study_dir = make_study(tmp_path)
    assert main(["report", str(study_dir)]) == 0
    assert "report.html" in capsys.readouterr().out
    # the hypothesis file plus --out finds the same folder
    assert main(["report", str(tmp_path / "synth.yaml"), "--out", str(tmp_path / "out")]) == 0
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "verdicts.json" in capsys.readouterr().err

    calls = []
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(
        "study.cli.verbs._serve", lambda cmd, **kw: calls.append(cmd) or 0
    )  # never start a server
    assert main(["ui", "--out", str(tmp_path / "empty")]) == 2 and calls == []  # no store yet
    (tmp_path / "out" / "mlflow.db").write_bytes(b"")
    assert main(["ui", "--out", str(tmp_path / "out"), "--port", "5077"]) == 0
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "mlflow", "ui"] and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert (
        cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{(tmp_path / 'out' / 'mlflow.db').resolve()}"
    )
    assert cmd[cmd.index("--port") + 1] == "5077"


def test_ordering_subset_names_its_datasets_in_declared_order():
    hyp = load_hypothesis(ROOT / "hypotheses" / "texture_depth.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_texture_depth.parquet")
    claim, result = hyp.claims[0], evaluate_claims(hyp, table)[0]
    assert subset_text(claim, result) == "datasets=[objects, cue_mix, textures], token_set=all, epoch=last"
    hyp = load_hypothesis(ROOT / "hypotheses" / "rank_grows.yaml")
    result = evaluate_claims(hyp, pd.read_parquet(BEHAVIOUR / "table_rank_grows.parquet"))[0]
    # issue 27: a trend over epochs never reads subset.epoch: it shows the epochs it was tested over
    assert subset_text(hyp.claims[0], result) == "dataset=objects, token_set=all, epochs=[0, 1, 2, 4, 6, 8]"


def _shipped():
    for path in sorted((ROOT / "hypotheses").rglob("*.yaml")):
        hyp = load_hypothesis(path)
        if hyp.sweep is not None:  # its claims run over a knob: tests/sweep/test_sweep.py draws them
            continue
        yield pytest.param(hyp, pd.read_parquet(BEHAVIOUR / f"table_{hyp.name}.parquet"), id=hyp.name)


@pytest.mark.parametrize(("hyp", "table"), _shipped())
def test_each_claim_figure_plots_what_its_claim_tests(hyp, table, monkeypatch, tmp_path):
    """Built through the real schema from every shipped file: a trend over epochs draws every epoch of the
    table and exactly the claim's layers; a claim at one epoch draws that epoch and the claim's datasets."""
    drawn = []  # every line drawn: its x values and its label
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda ax, *a, **k: drawn.append((list(a[0]), k.get("label"))) or plot(ax, *a, **k),
    )
    results = evaluate_claims(hyp, table)
    sections = build_sections(
        ReportInput(hyp.name, hyp.description, list(hyp.claims), results, table, tmp_path)
    )
    for claim, sec in zip(hyp.claims, sections, strict=True):
        if getattr(claim, "unit", "seeds") == "images":  # needs the runs' probe blocks, not a table alone:
            continue  # (the offline study in tests/sources/test_pretrained.py runs such claims on real runs)
        fig = sec.figures[0]
        cell = getattr(claim.subset, "condition", None)  # a design with conditions: the claim's cell's rows
        # (a published model named as a condition is a seed of the table: its rows carry no condition)
        rows = table if cell is None or "condition" not in table else table[table.condition == cell]
        last = int(rows.epoch.max())
        assert fig.png is not None, (claim.name, fig.missing)
        if getattr(claim, "over", None) == "epoch":
            epochs = sorted(int(e) for e in table[table.dataset == claim.subset.dataset].epoch.unique())
            assert fig.plotted["epochs"] == (sorted(claim.epochs) if claim.epochs else epochs), claim.name
            assert fig.plotted["layers"] == list(claim.layers), claim.name
        else:
            assert fig.plotted["epochs"] == [last if claim.subset.epoch == "last" else claim.subset.epoch]
            named = (
                getattr(claim, "datasets", None) or [claim.subset.dataset] if claim.subset.dataset else None
            )
            if named:
                assert set(named) <= set(fig.plotted["datasets"]), claim.name
    # the lines really drawn: a trend over epochs draws one line per claimed layer over every epoch
    trend_lines = [x for x, label in drawn if label and label.startswith("block_")]
    if any(getattr(c, "over", None) == "epoch" for c in hyp.claims):
        assert trend_lines and all(sorted(x) == sorted(set(table.epoch)) for x in trend_lines)
        assert not any(label in ("patch_embed", "pos_embed") for _, label in drawn)


def test_u_shape_section_says_why(tmp_path):
    """The INCONCLUSIVE default claim's section shows both contrasts with per-seed values, CI and p, the
    reason, the bottleneck, the power and seeds needed."""
    hyp = load_hypothesis(ROOT / "hypotheses" / "u_shape.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_u_shape_weak.parquet")
    results = evaluate_claims(hyp, table)
    (sec,) = build_sections(ReportInput(hyp.name, "", list(hyp.claims), results, table, tmp_path))
    text = "\n".join(sec.findings)
    assert results[0].verdict == "INCONCLUSIVE"
    for contrast in ("early - bottleneck", "late - bottleneck"):
        line = next(x for x in sec.findings if x.startswith(contrast))
        assert "95% CI" in line and "p " in line and all(f"seed {s}:" in line for s in hyp.design.seeds)
    # issue 27: the location in layer names (the mean of each seed's lowest layer, its CI within the layers)
    assert re.search(
        r"bottleneck (at|between) block_.*\(the mean over seeds of each seed's lowest layer between the "
        r"shoulders\)",
        text,
    ) or ("no bottleneck location" in text)
    assert "INCONCLUSIVE: neither" in text
    assert re.search(r"power \d\.\d\d at the observed effect; 80% power needs \d+ seeds", text)


def test_report_names_the_test_a_claim_used(tmp_path):
    """A mixed-model trend that fell back says which test decided it, in the report's findings."""
    hyp = load_hypothesis(ROOT / "hypotheses" / "rank_grows.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_rank_grows.parquet")
    (result,) = evaluate_claims(hyp.model_copy(update={"claims": hyp.claims[:1]}), table)
    used = "per-seed slopes (fallback: mixed model did not converge)"
    result.details["method_used"] = used
    (sec,) = build_sections(ReportInput(hyp.name, "", hyp.claims[:1], [result], table, tmp_path))
    assert sec.findings[0] == f"test used: {used}"


def test_a_design_with_conditions_gets_a_condition_by_dataset_grid():
    """The report of a design with conditions opens with one grid per claimed metric: a panel per condition
    x dataset at the condition's own last epoch (the untrained cell's is 0), per-seed lines and a band."""
    from analysis.report.sections import conditions_preface

    hyp = load_hypothesis(ROOT / "hypotheses" / "controls.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_controls.parquet")
    (grid,) = conditions_preface(table, list(hyp.claims))
    assert grid.png is not None and grid.plotted["conditions"] == ["trained", "shuffled", "untrained"]
    assert grid.plotted["datasets"] == ["objects"]
    assert grid.plotted["epochs"] == {"trained": 8, "shuffled": 8, "untrained": 0}
    assert conditions_preface(table[table.condition == "trained"], list(hyp.claims)) == []
