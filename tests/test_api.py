"""The Python API (``study.api``): the default flow through it alone gives the CLI's verdicts on the same
inputs; ``analyze`` names missing columns; the seed aggregates reach the parent MLflow run; the quickstart
notebook and ``examples/use_from_python.py`` run on a finished study.

One tiny study (the planted run source of ``tests/planted.py``: synthetic run folders, no training) is run
once through the API (with MLflow) and once through the CLI, and every test here reads those two.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import study
from study.cli import main
from tests.conftest import REPO
from tests.planted import DIFF, U, plant, write_planted

NUMBERS = ["effect", "ci_low", "ci_high", "p_value", "p_adjusted"]


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    """(hypothesis path, the API's StudyResult, the CLI's study folder, what the API's bar printed)."""
    root = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as mp:
        plant(mp, 0.5)
        path = write_planted(root, [DIFF, U])
        assert study.validate(path, root / "api").message == f"ok: {path}: 2 claim(s), 3 run(s) planned"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # tqdm draws on stderr
            result = study.run(path, root / "api", workers=1, report=False)  # result.report() is tested below
        assert (
            main(["run", path, "--out", str(root / "cli"), "--workers", "1", "--no-mlflow", "--no-report"])
            == 0
        )
    return path, result, root / "cli" / "studies" / "tiny", err.getvalue()


def test_the_api_flow_gives_the_clis_verdicts(flows, capsys):
    path, result, cli_dir, bar = flows
    assert "3/3" in bar  # the progress bar counted the three runs
    cli = {c["name"]: c for c in json.loads((cli_dir / "verdicts.json").read_text())["claims"]}
    frame = result.verdicts
    assert list(frame.index) == ["higher", "dip"] and set(frame.verdict) <= {
        "ACCEPTED",
        "REJECTED",
        "INCONCLUSIVE",
    }
    assert frame.at["higher", "verdict"] == "ACCEPTED"  # the planted effect of 0.5 (noise 0.02)
    for name, claim in cli.items():
        assert frame.at[name, "verdict"] == claim["verdict"]
        assert frame.loc[name, NUMBERS].to_numpy(dtype=float) == pytest.approx([claim[k] for k in NUMBERS])
        assert frame.at[name, "n_seeds"] == claim["n_seeds"] == 3
    # every number of verdicts.json is a column, nested ones by dotted path
    assert {"bootstrap_ci_low", "bootstrap_ci_high", "subset.dataset", "registration.status"} <= set(
        frame.columns
    )
    assert "details.contrasts.early.p" in frame.columns
    # load() reads the same study back from its folder alone
    loaded = study.load(result.folder.parent.parent)
    pd.testing.assert_frame_equal(loaded.verdicts, frame)
    pd.testing.assert_frame_equal(loaded.table, pd.read_parquet(cli_dir / "table.parquet"), check_like=True)
    # analyze on a DataFrame gives what the CLI's analyze prints for the saved table
    assert main(["analyze", path, "--table", str(cli_dir / "table.parquet"), "--json"]) == 0
    printed = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    mine = study.analyze(path, result.table.drop(columns=["layer_index", "n_tokens"]))  # both derived again
    for r in mine:
        assert r.verdict == printed[r.name]["verdict"]
        assert [getattr(r, k) for k in NUMBERS] == pytest.approx([printed[r.name][k] for k in NUMBERS])


def test_analyze_names_every_missing_column(flows):
    _, result, _, _ = flows
    with pytest.raises(study.StudyError) as err:
        study.analyze(DIFF, result.table.drop(columns=["seed", "value"]))
    assert str(err.value) == (  # only the required columns (run_key, layer_index, n_tokens were listed)
        "table: missing columns ['seed', 'value']; expected at least ['dataset', 'seed', 'epoch', 'layer', "
        "'token_set', 'metric', 'value'] (run_key, layer_index, n_tokens and condition are optional)"
    )
    with pytest.raises(
        study.StudyError,
        match=r"claims\[0\]\.a\.layers: expected a layer of the table \['patch_embed', 'pos_embed'",
    ):
        study.analyze({**DIFF, "a": {"layers": ["block_09"]}}, result.table)
    with pytest.raises(study.StudyError, match=r"<claims>: claims\[0\]\.metric: required field is missing"):
        study.analyze([{k: v for k, v in DIFF.items() if k != "metric"}], result.table)


def test_profile_figure_report_and_html(flows, tmp_path):
    _, result, _, _ = flows
    prof = result.profile("diagonality", epoch=2)
    assert list(prof.index) == [0, 1, 2, "mean", "ci_low", "ci_high", "n"]
    assert list(prof.columns) == ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]
    seeds = prof.loc[[0, 1, 2], "block_02"].to_numpy(dtype=float)
    half = 4.302652729911275 * seeds.std(ddof=1) / np.sqrt(3)  # t(0.975, 2)
    assert prof.at["mean", "block_02"] == pytest.approx(seeds.mean())
    assert prof.at["ci_high", "block_02"] - prof.at["mean", "block_02"] == pytest.approx(half)
    with pytest.raises(study.StudyError, match="token_set: expected one of \\['all'\\], got 'cls'"):
        result.profile("diagonality", token_set="cls")
    fig = result.figure("dip")
    import matplotlib.figure

    assert isinstance(fig, matplotlib.figure.Figure) and fig.get_size_inches()[0] > 3
    assert fig._repr_png_() == result.figures("dip")[0].png  # shown inline as the report's own PNG
    assert result.figures("dip")[0].plotted["layers"][:2] == ["patch_embed", "pos_embed"]
    page = result._repr_html_()
    assert "#2e7d32" in page and "data:image/png;base64," in page and "higher" in page
    html_path = result.report(tmp_path / "r")
    assert html_path.is_file() and (tmp_path / "r" / "report.md").is_file()


def test_seed_aggregates_on_the_parent_run(flows):
    from mlflow.tracking import MlflowClient

    _, result, _, _ = flows
    client = MlflowClient(f"sqlite:///{result.folder.parent.parent / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    (parent,) = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("study.role") == "study"
    ]
    prof = result.profile("diagonality")
    for prefix, row in (("seed_mean", "mean"), ("seed_ci_low", "ci_low"), ("seed_ci_high", "ci_high")):
        hist = sorted(
            client.get_metric_history(parent.info.run_id, f"{prefix}/diagonality/all"), key=lambda m: m.step
        )
        assert [m.step for m in hist] == [0, 1, 2, 3, 4, 5]  # step = layer index
        assert [m.value for m in hist] == pytest.approx(prof.loc[row].to_numpy(dtype=float))
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "seed_aggregates")}
    assert arts == {"seed_aggregates/diagonality_all.png"}
    note = client.get_run(parent.info.run_id).data.tags["seed_aggregates"]  # what step i means
    assert "step = layer (0 patch_embed, 1 pos_embed, 2 block_01, 3 block_02, 4 block_03, 5 norm)" in note


def test_quickstart_notebook_runs(flows, monkeypatch):
    """examples/quickstart.ipynb, every cell, on the finished tiny study (nbclient; fails on a cell error)."""
    import nbclient  # the test extra (pyproject.toml) installs nbclient, nbformat and ipykernel
    import nbformat

    _, result, _, _ = flows
    monkeypatch.setenv("STUDY_FOLDER", str(result.folder))
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own backend (inline), as in Jupyter
    nb = nbformat.read(REPO / "examples" / "quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    shown = "".join(
        str(o.get("data", {}).get("text/html", "")) for c in nb.cells for o in c.get("outputs", [])
    )
    assert "higher" in shown and "ACCEPTED" in shown
    # figures show inline (before: importing study switched the kernel to Agg, so neither the notebook's
    # own plot nor result.figure(...) showed anything but "<Figure size ... with 1 Axes>")
    images = {
        "".join(c.source): base64.b64decode(o["data"]["image/png"])
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    }
    own_plot = next(src for src in images if "fill_between" in src)
    report_figure = next(src for src in images if src.startswith("result.figure("))
    expected = result.figures(result.hypothesis.claims[-1].name)[0].png
    assert images[report_figure] == expected  # the report's exact image
    assert images[own_plot][:8] == b"\x89PNG\r\n\x1a\n" and len(images[own_plot]) > 5000
    # the changed-region re-test says why its effect moved or did not (before: an unchanged result, no word)
    printed = "".join(
        o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout"
    )
    assert re.search(r"early region from \w+: effect -?\d+\.\d\d from the (early|late) shoulder", printed)
    assert "the early region does not enter it" in printed or "the early region decides it" in printed
    if os.environ.get("STUDY_KEEP_NOTEBOOK_PNG"):  # to look at what a notebook user sees
        for i, png in enumerate(images.values()):
            (Path(os.environ["STUDY_KEEP_NOTEBOOK_PNG"]) / f"cell{i}.png").write_bytes(png)


def _two_studies(result, root):
    """An output folder ``root/study_results`` as the README's first two steps leave it: the default study
    (``u_shape``) and ``controls`` finished side by side (here both the tiny study's folder, linked)."""
    out = root / "study_results"
    (out / "studies").mkdir(parents=True)
    (out / "runs").symlink_to(result.folder.parent.parent / "runs")
    for name in ("u_shape", "controls"):
        (out / "studies" / name).symlink_to(result.folder)
    return out


def test_use_from_python_example(flows, capsys, tmp_path, monkeypatch):
    """examples/use_from_python.py (the README's "Use from Python" snippet) runs as written, in a folder
    whose ``study_results`` holds two finished studies (the default study and controls.yaml's); without
    ``name=`` ``load`` says in one line which to pick."""
    _, result, _, _ = flows
    out = _two_studies(result, tmp_path)
    with pytest.raises(study.StudyError) as err:
        study.load(out)
    assert str(err.value) == (
        f"{out}: 2 finished studies and sweeps here ['controls', 'u_shape']: pick one with "
        f"study.load('{out}', name='controls')"
    )
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(REPO / "examples" / "use_from_python.py"))
    printed = capsys.readouterr().out
    assert "higher" in printed and "ACCEPTED" in printed and "ci_high" in printed
    assert (tmp_path / "claim.png").stat().st_size > 1000


def test_profile_of_a_study_with_conditions_names_one(flows):
    """``profile`` never averages conditions (before: trained and shuffled runs of a seed were averaged):
    without ``condition=`` on a study of several it is one error; with it, that condition's seeds alone."""
    from dataclasses import replace

    _, result, _, _ = flows
    table = result.table
    shifted = table.assign(condition="shuffled", value=table.value + 10.0, run_key=table.run_key + "s")
    both = replace(
        result, inp=replace(result.inp, table=pd.concat([table.assign(condition="trained"), shifted]))
    )
    assert both.conditions == ["trained", "shuffled"] and result.conditions == []
    with pytest.raises(study.StudyError) as err:
        both.profile("diagonality")
    assert str(err.value) == (
        f"{result.folder}: condition: this study has 2 conditions ['trained', 'shuffled']: expected "
        "condition= one of them (rows of different conditions come from different runs and are never averaged)"
    )
    plain = result.profile("diagonality")
    pd.testing.assert_frame_equal(both.profile("diagonality", condition="trained"), plain)
    pd.testing.assert_frame_equal(
        both.profile("diagonality", condition="shuffled").loc[[0, 1, 2]], plain.loc[[0, 1, 2]] + 10.0
    )
    with pytest.raises(
        study.StudyError, match=r"condition: expected condition= one of \['trained', 'shuffled'\]"
    ):
        both.profile("diagonality", condition="untrained")
    with pytest.raises(study.StudyError, match="this study's design has none"):
        result.profile("diagonality", condition="trained")


def test_import_study_stays_light():
    """``import study`` (and so ``python -m study``) loads no pandas or torch: the API is imported on first use."""
    code = "import sys, study; assert not {'pandas', 'torch', 'study.api'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert study.load.__module__ == "study.api" and "run" in study.__all__


def test_readme_use_from_python_is_the_tested_example():
    """The README's "Use from Python" code block is examples/use_from_python.py's code (which
    test_use_from_python_example runs), line for line."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Use from Python", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    example = (REPO / "examples" / "use_from_python.py").read_text()
    code = example.split('"""', 2)[2].strip()  # after the module docstring
    assert block.strip() == code
