"""analysis/report.py: the HTML/Markdown report over a synthetic study folder (no training, seconds)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

from analysis.report import t_band, write_report
from analysis.table import make_table, rows_from_spectra, save_table
from analysis.verdicts import evaluate_claims
from core.errors import StudyError
from study.cli import main
from study.schema import load_hypothesis

LAYERS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]
SYNTH_HYPOTHESIS = """\
name: synth
description: EED% dips at block_02 (synthetic spectra, planted dip)
design:
  datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  training: {epochs: 2, batch_size: 32}
  seeds: [0, 1, 2]
  checkpoints: [0, 2]
  probe: {size: 16}
claims:
  - name: dip
    kind: u_shape
    metric: eed_pct
    subset: {dataset: objects}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
"""


def _spectrum(rng: np.random.Generator, decay: float, d: int = 16) -> np.ndarray:
    return np.exp(-decay * np.arange(d)) * (1 + 0.05 * rng.random(d))


def make_study(root: Path, covariances: bool = True, extra_claims: list[dict] | None = None) -> Path:
    """A study folder as ``run`` leaves it, from synthetic spectra (a dip at block_02), plus run folders.

    ``extra_claims`` are appended to verdicts.json only (claim kinds the schema may not know yet).
    """
    root.mkdir(parents=True, exist_ok=True)
    hyp_path = root / "synth.yaml"
    hyp_path.write_text(SYNTH_HYPOTHESIS)
    hyp = load_hypothesis(hyp_path)
    rng = np.random.default_rng(0)
    rows, keys = [], []
    for seed in (0, 1, 2):
        key = f"k{seed:015d}"
        keys.append(key)
        spectra = {}
        for epoch in (0, 2):
            for layer in LAYERS:
                decay = 0.6 if (layer == "block_02" and epoch == 2) else 0.2 + 0.02 * seed
                spectra[f"{epoch}/{layer}/all"] = _spectrum(rng, decay)
        rows += rows_from_spectra(key, "objects", seed, spectra, LAYERS)
        run_dir = root / "out" / "runs" / key
        run_dir.mkdir(parents=True)
        (run_dir / "result.json").write_text(
            json.dumps({"status": "finished", "environment": {"torch": "x"}})
        )
        if covariances:
            covs = {}
            for epoch in (0, 2):
                for layer in LAYERS:
                    a = rng.standard_normal((16, 16)).astype(np.float32)
                    covs[f"{epoch}/{layer}"] = a @ a.T
            np.savez(run_dir / "covariances.npz", **covs)
    table = make_table(rows)
    results = evaluate_claims(hyp, table, source=str(hyp_path))
    study_dir = root / "out" / "studies" / "synth"
    study_dir.mkdir(parents=True)
    save_table(table, study_dir / "table.parquet")
    claims = [r.to_dict() for r in results] + list(extra_claims or [])
    payload = {
        "hypothesis": "synth",
        "file": str(hyp_path),
        "runs": keys,
        "labels": {k: f"objects/seed{i}" for i, k in enumerate(keys)},
        "reused": [],
        "failed": {},
        "command": f"python -m study run {hyp_path}",
        "claims": claims,
    }
    (study_dir / "verdicts.json").write_text(json.dumps(payload, default=float))
    (study_dir / "hypothesis.yaml").write_text(SYNTH_HYPOTHESIS)
    return study_dir


NEW_KIND = {
    "name": "entropy grows with training",
    "kind": "trend",  # a kind this spine's schema does not know: must still render
    "metric": "spectral_entropy",
    "subset": {"dataset": "objects", "token_set": "all", "epochs": [0, 2], "layers": ["block_01", "norm"]},
    "verdict": "INCONCLUSIVE",
    "effect": 0.3,
    "ci_low": -0.1,
    "ci_high": 0.7,
    "p_value": 0.08,
    "p_adjusted": 0.08,
    "n_seeds": 3,
    "warnings": ["made up for the test"],
}


def _images(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]


def test_report_is_self_contained_with_every_figure(tmp_path):
    study_dir = make_study(tmp_path, extra_claims=[NEW_KIND])
    html_path, md_path = write_report(study_dir)
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
    text = write_report(study_dir)[0].read_text()
    assert "covariance snapshots not recorded" in text and len(_images(text)) == 2

    study_dir = make_study(tmp_path / "b")
    runs = study_dir.parent.parent / "runs"
    for run in runs.iterdir():
        (run / "covariances.npz").write_bytes(b"not a zip")
    (study_dir / "table.parquet").unlink()
    text = write_report(study_dir)[0].read_text()
    assert "<h2>Missing</h2>" in text
    assert "artifact covariances.npz unreadable" in text and "objects/seed0" in text
    assert "table.parquet unreadable" in text and 'id="verdicts"' in text
    assert len(_images(text)) == 1  # only the effect plot needs nothing but verdicts.json


def test_report_needs_verdicts(tmp_path):
    with pytest.raises(StudyError, match="verdicts.json"):
        write_report(tmp_path)


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
    monkeypatch.setattr("subprocess.call", lambda cmd: calls.append(cmd) or 0)  # never start a server
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
    from analysis.report import _claim_subset_text

    claim = {
        "kind": "ordering",
        "subset": {"dataset": None, "token_set": "all", "epoch": "last"},
        "details": {"per_seed_summary": {"objects": {}, "cue_mix": {}, "textures": {}}},
    }
    assert _claim_subset_text(claim) == "datasets=[objects, cue_mix, textures], token_set=all, epoch=last"
    assert _claim_subset_text({"kind": "trend", "subset": {"dataset": "objects"}}) == "dataset=objects"
