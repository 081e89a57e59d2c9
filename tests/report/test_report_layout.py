"""The report as a reader meets it (issue 50 item 6): each claim section leads with its verdict sentence
("(post hoc)" as the table shows it) and the figures, then the details; registration lines without nested
parentheses; legends, colour bars and the conditions grid laid out so nothing covers anything; a verdict
never told by a condition's or a region's colour. Screenshots of the rendered pages were looked at too."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
import yaml

import analysis.report.figures as figures
import analysis.report.knob_figures as knob_figures
from analysis.report.page import header_lines, write_report
from analysis.report.palette import CONDITION_PALETTE
from analysis.report.sections import ReportInput, conditions_preface
from analysis.verdicts import evaluate_claims
from study.schema import load_hypothesis, parse_hypothesis
from tests.conftest import BEHAVIOUR, REPO, TINY_SWEEP
from tests.report.test_report_figures import _sweep_table
from vitstudy_core.io import atomic_save_npz

REASON = (
    "registered 2026-12-04T10:00:00+00:00, after 5 of its 10 runs had finished (the first, trained/objects/"
    "seed0, at 2026-12-04T09:00:00+00:00; runs reused ... count): its data existed before the claim"
)


@pytest.fixture
def drawn(monkeypatch):
    kept: list = []
    png = figures._png
    monkeypatch.setattr(figures, "_png", lambda fig: kept.append(fig) or png(fig))
    monkeypatch.setattr(knob_figures, "_png", lambda fig: kept.append(fig) or png(fig))
    return kept


def _controls(tmp_path: Path, drawn=None) -> tuple[str, ReportInput]:
    """hypotheses/controls.yaml's report on its behaviour table, its first claim post hoc."""
    hyp = load_hypothesis(REPO / "hypotheses" / "controls.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_controls.parquet")
    first = hyp.claims[0].name
    results = evaluate_claims(hyp, table, post_hoc={first})
    for r in results:
        r.registration = {
            "registered_at": "2026-12-04T10:00:00+00:00",
            "hash": "h",
            "status": "pre-registered",
        }
    results[0].registration.update(status="post hoc", data_from="2026-12-04T09:00:00+00:00", reason=REASON)
    pre = conditions_preface(table, list(hyp.claims), hyp.design.condition_names())
    inp = ReportInput(hyp.name, "", list(hyp.claims), results, table, tmp_path / "runs", preface=pre)
    html_path, _ = write_report(tmp_path, inp)
    return html_path.read_text(), inp


def test_a_claim_section_leads_with_its_verdict_sentence_and_figure(tmp_path):
    """Before: "Verdict INCONCLUSIVE" without the table's "(post hoc)", then a wall of findings before the
    figures."""
    page, inp = _controls(tmp_path)
    r = inp.results[0]
    section = page.split(f"<h2>Claim 0: {r.name}</h2>", 1)[1].split("<h2>", 1)[0]
    lead = re.search(r'<p class="verdict-line"><span class="badge (\w+)">([^<]+)</span> ([^<]+)</p>', section)
    assert lead is not None and section.startswith("\n" + lead.group(0)), section[:300]
    assert lead.group(2) == f"{r.verdict} (post hoc)" and lead.group(1) == r.verdict
    assert lead.group(3).startswith(r.reason) and "95% CI" in lead.group(3)
    assert section.index("<figure>") < section.index("<h3>Details</h3>") < section.index('class="findings"')
    md = (tmp_path / "report.md").read_text().split(f"## Claim 0: {r.name}", 1)[1]
    assert md.lstrip().startswith(f"**{r.verdict} (post hoc)**: {r.reason}")
    assert md.index("![") < md.index("Details:")


def test_registration_lines_give_the_time_once_without_nested_parentheses(tmp_path):
    """Before: "post hoc (its data existed from T) (registered T, after 5 of its 10 runs ... (the first ...))"."""
    _, inp = _controls(tmp_path)
    line = header_lines(inp)[0]
    assert line.count("2026-12-04T10:00:00+00:00") == 1 and ") (" not in line, line
    assert ": registered 2026-12-04T10:00:00+00:00, post hoc: after 5 of its 10 runs had finished (" in line
    depth, deepest = 0, 0
    for ch in line:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, depth)
    assert deepest == 1


def test_the_conditions_grid_is_in_file_order_side_by_side(tmp_path, drawn):
    """Before: one narrow column, the conditions in alphabetical order (shuffled, trained, untrained)."""
    _controls(tmp_path)
    grid = next(f for f in drawn if f.axes[0].get_title().startswith("trained |"))
    titles = [ax.get_title().split(" |")[0] for ax in grid.axes if ax.get_title()]
    assert titles == ["trained", "shuffled", "untrained"]  # the file's order
    x0 = [ax.get_position().x0 for ax in grid.axes]
    assert len(set(np.round(x0, 3))) == 3  # three columns, one row


def test_verdicts_are_not_drawn_in_a_condition_s_or_a_region_s_colour(tmp_path, drawn):
    """Before: an ACCEPTED effect in the regions' green, a REJECTED one in a condition's red."""
    _controls(tmp_path)
    taken = {matplotlib.colors.to_hex(c) for c in (*CONDITION_PALETTE, *figures._REGION_COLOURS)}
    effect_figs = [f for f in drawn if f.axes[0].get_xlabel().endswith("effect (pp)")]
    assert effect_figs
    for fig in effect_figs:
        ax = fig.axes[0]
        assert ax.get_title(loc="right").split(" (")[0] in ("ACCEPTED", "REJECTED", "INCONCLUSIVE")
        inks = {
            matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines() if line.get_marker() == "o"
        }
        assert inks and not inks & taken, inks


def test_the_adjust_for_legend_sits_below_the_plot(drawn):
    """Before: inside the axes (``loc="best"``), over the y tick labels."""
    doc = yaml.safe_load(TINY_SWEEP)
    doc["sweep"]["space"] = {"texture_reliance": [0.0, 0.5, 1.0]}
    claim = {k: v for k, v in doc["claims"][1].items() if k != "level"}
    doc["claims"] = [
        {**claim, "layers": ["block_02"], "direction": "decreasing", "adjust_for": "test_accuracy"}
    ]
    hyp = parse_hypothesis(doc)
    table = _sweep_table([{"texture_reliance": k} for k in (0.0, 0.5, 1.0)], slope=0.0, sd=0.01)
    table["test_accuracy"] = 0.3 + 0.2 * table.texture_reliance + 0.01 * table.seed
    table["value"] += 60.0 * table.test_accuracy
    (r,) = evaluate_claims(hyp, table)
    knob_figures.knob_figure(r, "eed_pct", table=table)
    fig = drawn[-1]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer() if hasattr(fig.canvas, "get_renderer") else fig._get_renderer()
    legend, labels = ax.get_legend().get_window_extent(renderer), ax.get_yticklabels()
    assert legend.y1 < ax.get_window_extent(renderer).y0  # below the axes
    assert not any(legend.overlaps(t.get_window_extent(renderer)) for t in labels if t.get_text())


def test_covariance_colour_bar_ticks_stay_clear_of_the_next_panel(tmp_path, drawn):
    """Before: a bar's tick labels (``1e6`` scale) ran into the next panel."""
    rng = np.random.default_rng(0)
    layers = ["patch_embed", "block_04", "block_08", "norm"]
    covs = {
        f"{e}/{name}": rng.normal(size=(8, 8)) * 10.0 ** (3 * i)
        for e in (0, 8)
        for i, name in enumerate(layers)
    }
    atomic_save_npz(tmp_path / "k" / "covariances.npz", **covs)
    (f,) = figures.covariance_figures(tmp_path, ["k"], {}, [])
    assert f.png is not None
    fig = drawn[-1]
    renderer = fig._get_renderer()
    heat = [ax for ax in fig.axes if ax.get_title()]
    bars = [ax for ax in fig.axes if not ax.get_title()]
    assert len(heat) == len(bars) == 8
    for bar in bars:
        box = bar.get_tightbbox(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in heat), bar


def test_a_unit_images_claim_counts_probe_blocks_not_seeds(tmp_path):
    """Before: "16 seeds (0, 1, ...)" and "in every seed" where the replicates are the probe's image blocks."""
    from analysis.report.sections import findings, verdict_sentence

    hyp = load_hypothesis(REPO / "hypotheses" / "u_shape.yaml")
    table = pd.read_parquet(BEHAVIOUR / "table_u_shape.parquet")
    (r,) = evaluate_claims(hyp, table)
    r.details["unit"] = {"unit": "images", "blocks": 5, "test": "jackknife over probe blocks"}
    assert verdict_sentence(r, " pp").endswith(", 5 probe blocks")
    lines = "\n".join(findings(hyp.claims[0], r))
    assert "5 probe blocks (0, 1, 2, 3, 4)" in lines and "per probe block block 0:" in lines
    assert " seeds (" not in lines and "seed 0:" not in lines


def test_claims_are_numbered_from_0_in_sections_and_figure_files_as_in_messages_and_mlflow(tmp_path):
    """Before: ``Claim 1`` and ``claim1_*.png`` in the report for what messages call ``claims[0]`` and MLflow
    ``claim_0/``; a report written again over such a folder drops the old numbering's files."""
    stale = tmp_path / "figures" / "claim9_profile.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    (tmp_path / "figures" / "notes.png").write_bytes(b"mine")
    page, inp = _controls(tmp_path)
    titles = re.findall(r"<h2>(Claim \d+): ([^<]+)</h2>", page)
    assert titles == [(f"Claim {i}", r.name) for i, r in enumerate(inp.results)]
    names = sorted(p.name for p in (tmp_path / "figures").glob("claim*_*.png"))
    assert names and {int(re.match(r"claim(\d+)_", n).group(1)) for n in names} == set(
        range(len(inp.results))
    )
    assert not stale.exists() and (tmp_path / "figures" / "notes.png").exists()


def _env(cpu: str, capability: str) -> dict:
    return {"cpu_model": cpu, "cpu_flags": "avx2 fma", "torch_cpu_capability": capability, "blas": "mkl 2024.2",
            "onednn": "v3.12.0", "torch_threads": 1, "torch": "2.14.1+cpu", "gpu": None}  # fmt: skip


def test_the_reproduce_section_shows_the_runs_arithmetic_and_notes_when_it_differs(tmp_path):
    """Before: the report named versions only (the first run's), never the CPU, torch's CPU capability or
    the BLAS, so numbers that depend on them said nothing of it; a run written before they were recorded
    reads "not recorded"."""
    from analysis.report.page import _reproduce
    from vitstudy_core.runfolder import RunFolder

    runs = {
        "a": _env("Intel Xeon Platinum 8480+", "AVX512"),
        "b": _env("Intel Xeon Platinum 8480+", "AVX512"),
    }
    for key, env in runs.items():
        RunFolder(tmp_path / key).write_result({"status": "finished", "environment": env})
    inp = ReportInput("s", "", [], [], None, tmp_path, runs=list(runs))
    _, text = _reproduce(inp, {})
    assert text.splitlines()[0] == (
        "arithmetic of every run (2): cpu_model Intel Xeon Platinum 8480+; cpu_flags avx2 fma; "
        "torch_cpu_capability AVX512; blas mkl 2024.2; onednn v3.12.0; torch_threads 1; torch 2.14.1+cpu; gpu none"
    )
    assert not [ln for ln in header_lines(inp) if "arithmetic" in ln]
    RunFolder(tmp_path / "c").write_result({"status": "finished", "environment": _env("AMD EPYC", "AVX2")})
    RunFolder(tmp_path / "old").write_result({"status": "finished", "environment": {"torch": "2.2.0"}})
    inp = ReportInput("s", "", [], [], None, tmp_path, runs=[*runs, "c", "old"])
    _, text = _reproduce(inp, {})
    lines = text.splitlines()
    assert lines[0].startswith("arithmetic differs across the runs: they come from 3 machines or settings")
    assert lines[1].startswith("arithmetic of 2 run(s) (a, b): cpu_model Intel Xeon Platinum 8480+;")
    assert any(ln.startswith("arithmetic of 1 run(s) (c): cpu_model AMD EPYC;") for ln in lines)
    old = next(ln for ln in lines if ln.startswith("arithmetic of 1 run(s) (old)"))
    assert "cpu_model not recorded" in old and "torch 2.2.0" in old
    assert [ln for ln in header_lines(inp) if ln.startswith("arithmetic differs")] == [lines[0]]
