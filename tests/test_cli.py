"""`python -m study metrics` and `python -m study table`, and the run artifacts they read."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.observables import OBSERVABLES
from analysis.spectral import METRICS, TOKEN_METRICS
from study.cli import main


def test_metrics_verb_prints_every_metric(tmp_path, capsys):
    path = tmp_path / "lam.npy"
    lam = 0.8 ** np.arange(32)
    np.save(path, lam)
    assert main(["metrics", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(METRICS)
    assert out["effective_rank"] == pytest.approx(METRICS["effective_rank"](lam))


@pytest.mark.parametrize(
    "content", [np.ones((2, 2)), np.array([1.0, -2.0]), np.array([np.nan]), np.array(["x"]), None, "text"]
)
def test_metrics_verb_bad_file_exits_2_with_one_line(tmp_path, capsys, content):
    path = tmp_path / "bad.npy"
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif content == "text":
        path.write_text("hello")
    assert main(["metrics", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.npy" in err and "1-D non-negative" in err


def test_metrics_verb_reads_every_spectrum_of_a_run_s_spectra_npz(tmp_path, capsys):
    """The file runs write (``RunFolder.write_spectra``) is accepted: one metrics object per named
    spectrum (was refused: "holds several arrays")."""
    from vitstudy_core.runfolder import RunFolder

    spectra = {"0/norm/all": 0.8 ** np.arange(32), "8/block_00/patch": 0.5 ** np.arange(16)}
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    folder.write_spectra(spectra)
    assert main(["metrics", str(folder.path / "spectra.npz")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(spectra) and all(set(m) == set(METRICS) for m in out.values())
    for name, lam in spectra.items():
        assert out[name]["effective_rank"] == pytest.approx(METRICS["effective_rank"](lam))


def test_metrics_verb_names_the_bad_array_of_a_npz(tmp_path, capsys):
    path = tmp_path / "spectra.npz"
    np.savez(path, good=np.ones(4), bad=np.ones((2, 2)))
    assert main(["metrics", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "spectra.npz" in err and "bad: shape (2, 2)" in err, err
    np.savez(path)
    assert main(["metrics", str(path)]) == 2
    assert "holds no arrays" in capsys.readouterr().err


def _tiny(tmp_path, tiny_yaml, covariance_epochs="first_last"):
    text = tiny_yaml.read_text().replace("seeds: [0, 1, 2]", "seeds: [0]")
    text = text.replace("probe: {size: 16}", f"probe: {{size: 16, covariance_epochs: {covariance_epochs}}}")
    path = tmp_path / "one.yaml"
    path.write_text(text)
    return path


def test_train_run_writes_scalars_and_covariances_then_table_rebuilds(tmp_path, tiny_yaml, capsys):
    from runners.train import train_run
    from study.pipeline.tables import run_rows
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis

    hyp_path = _tiny(tmp_path, tiny_yaml)
    hyp = load_hypothesis(hyp_path)
    (spec,) = plan_runs(hyp)
    run_dir = tmp_path / "out" / "runs" / spec.key
    assert train_run(spec.model_dump(), run_dir, tmp_path / "out" / "data")["status"] == "finished"

    layers = hyp.design.layers
    with np.load(run_dir / "covariances.npz") as f:
        assert set(f.files) == {f"{e}/{la}" for e in (0, 2) for la in layers}
        assert f["2/block_02"].shape == (16, 16) and f["2/block_02"].dtype == np.float32
    values = json.loads((run_dir / "scalars.json").read_text())["values"]
    assert set(values) == {
        f"{e}/{la}/{t}/{o}"
        for e in (0, 2)
        for la in layers
        for t in ("all", "cls", "patch")
        for o in (*OBSERVABLES, *TOKEN_METRICS)  # token metrics (participation_ratio_bc) are streamed too
    } - {f"{e}/patch_embed/cls/{o}" for e in (0, 2) for o in (*OBSERVABLES, *TOKEN_METRICS)}

    to = tmp_path / "rebuilt.csv"
    assert main(["table", str(hyp_path), "--out", str(tmp_path / "out"), "--to", str(to)]) == 0
    rebuilt = pd.read_csv(to)
    assert set(rebuilt["metric"]) == set(METRICS) | set(OBSERVABLES) | set(TOKEN_METRICS)
    direct = run_rows(spec, run_dir, layers)
    assert len(rebuilt) == len(direct)
    with np.load(run_dir / "spectra.npz") as f:
        lam = f["2/block_03/all"]
    row = rebuilt.query("epoch == 2 and layer == 'block_03' and token_set == 'all' and metric == 'eed_pct'")
    assert row["value"].item() == pytest.approx(METRICS["eed_pct"](lam))
    row = rebuilt.query("epoch == 2 and layer == 'block_03' and token_set == 'all' and metric == 'twonn_id'")
    assert row["value"].item() == pytest.approx(values["2/block_03/all/twonn_id"])


def test_table_verb_without_runs_exits_2(tmp_path, tiny_yaml, capsys):
    (tmp_path / "nothing").mkdir()
    assert main(["table", str(tiny_yaml), "--out", str(tmp_path / "nothing")]) == 2
    assert "no finished run" in capsys.readouterr().err


@pytest.mark.parametrize(
    "verb",
    [["status"], ["doctor"], ["ui", "--no-browser"], ["table", "HYP"], ["report", "HYP"]],
    ids=lambda v: v[0],
)
def test_a_missing_output_folder_is_an_error_for_every_verb_that_reads_one(tmp_path, tiny_yaml, capsys, verb):
    """Before: ``status --out <typo>`` made the folder (and ``leases/`` in it), said "no runs" and exited 0;
    ``doctor`` then found nothing wrong there. Now one line, exit 2, nothing created."""
    out = tmp_path / "typo"
    argv = [str(tiny_yaml) if a == "HYP" else a for a in verb] + ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: {out}: --out: no such folder: expected the output folder of `python -m study run`\n"
    )
    assert not out.exists()
    out.write_text("")
    assert main(argv) == 2
    assert "--out: is a file" in capsys.readouterr().err


def test_status_with_a_lease_url_or_the_cluster_address_needs_no_output_folder(tmp_path, capsys):
    from unittest import mock

    leases = tmp_path / "leases"
    assert main(["status", "--leases", f"file://{leases}", "--out", str(tmp_path / "absent")]) == 0
    assert capsys.readouterr().out.startswith("no runs in the lease store")
    with mock.patch("study.cluster.jobs.ray_jobs", return_value="ray jobs: none"):
        assert main(["status", "--address", "http://127.0.0.1:1", "--out", str(tmp_path / "absent")]) == 0
    assert capsys.readouterr().out == "ray jobs: none\n"
    assert not (tmp_path / "absent").exists()


def test_covariance_epochs_validation(tmp_path, tiny_yaml):
    from study.schema import load_hypothesis
    from vitstudy_core.errors import StudyError

    assert load_hypothesis(_tiny(tmp_path, tiny_yaml, "[2]")).design.probe.covariance_epochs == [2]
    with pytest.raises(StudyError, match="covariance_epochs"):
        load_hypothesis(_tiny(tmp_path, tiny_yaml, "[1]"))
    with pytest.raises(StudyError, match="covariance_epochs"):
        load_hypothesis(_tiny(tmp_path, tiny_yaml, "sometimes"))


def test_claims_may_name_observables(tmp_path, tiny_yaml):
    from study.schema import load_hypothesis
    from vitstudy_core.errors import StudyError

    path = tmp_path / "obs.yaml"
    path.write_text(tiny_yaml.read_text().replace("metric: eed_pct", "metric: twonn_id"))
    assert load_hypothesis(path).claims[0].metric == "twonn_id"
    path.write_text(tiny_yaml.read_text().replace("metric: eed_pct", "metric: nonsense"))
    with pytest.raises(StudyError, match="claims\\[0\\].metric"):
        load_hypothesis(path)


def test_image_size_not_divisible_by_the_patch_is_one_line(tmp_path, capsys):
    """timm drops the border pixels of an image_size that is not a multiple of the patch (sizes 8 and 10
    give the same tokens at patch 4): validate and run refuse it before anything is written."""
    from tests.conftest import TINY_HYPOTHESIS

    path = tmp_path / "odd.yaml"
    path.write_text(TINY_HYPOTHESIS.replace("image_size: 8", "image_size: 10"))
    out = tmp_path / "out"
    for verb in ("validate", "run"):
        assert main([verb, str(path), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "design.datasets[0].image_size" in err and "patch size 4" in err, err
    assert not out.exists()
