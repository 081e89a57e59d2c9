"""Imported runs: checkpoints (both formats, every wrapper) and metric logs (TGO-I JSON lines, tidy CSV), the
verdicts they get, and every bad input as one line with exit 2 and nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from analysis.verdicts import INCONCLUSIVE
from study.cli import main
from study.pipeline.orchestrate import run_study
from study.pipeline.stages import RunOptions
from study.runspecs import plan_runs
from study.schema import load_hypothesis, parse_hypothesis

DESIGN = {
    "datasets": [{"name": "objects", "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 8}],
    "model": {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2},
    "seeds": [0, 1],
    "checkpoints": [0, 1, 2],
    "probe": {"size": 16},
}
TREND = {
    "name": "rank grows",
    "kind": "trend",
    "metric": "effective_rank",
    "subset": {"dataset": "objects"},
    "direction": "increasing",
    "layers": ["block_01", "block_02", "block_03"],
}
# TGO-I's observation points and metric keys, as its tgo_v1/trainer.py writes results/epoch_summaries.jsonl
TGO_LAYERS = [
    "Layer_00_PatchEmbed",
    "Layer_00_PosEmbed",
    *[f"Layer_{i:02d}_Block{i:02d}" for i in range(1, 13)],
    "Layer_13_CLS_Final",
]
TGO_METRICS = (
    "effective_rank",
    "stable_rank",
    "participation_ratio",
    "spectral_entropy",
    "spectral_flatness",
    "spectral_anisotropy",
)
REPO = Path(__file__).parents[2]


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny study trained with the normal `run`: 2 seeds x checkpoints at epochs 0, 1, 2."""
    root = tmp_path_factory.mktemp("trained")
    design = {**DESIGN, "training": {"epochs": 2, "batch_size": 32}}
    hyp = _write(root / "trained.yaml", {"name": "trained", "design": design, "claims": [TREND]})
    out = root / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1", "--no-mlflow", "--no-report"]) == 0
    runs = {s.seed: out / "runs" / s.key for s in plan_runs(load_hypothesis(hyp))}
    verdict = json.loads((out / "studies" / "trained" / "verdicts.json").read_text())["claims"][0]
    return root, runs, verdict


def _import_doc(paths: dict, seeds=(0, 1), claims=None, **design) -> dict:
    src = {"kind": "checkpoints", "paths": {s: str(paths[s]) for s in seeds}}
    return {
        "name": "imported",
        "design": {**DESIGN, "seeds": list(seeds), "source": src, **design},
        "claims": claims or [TREND],
    }


def _run(doc: dict, tmp_path: Path):
    """Write the hypothesis file, run its study in this process (no MLflow, no report)."""
    path = _write(tmp_path / f"{doc['name']}.yaml", doc)
    hyp = load_hypothesis(path)
    return hyp, run_study(hyp, path, tmp_path / "out", RunOptions(workers=1, track=False, report=False))


def _spectra(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "spectra.npz") as f:
        return {k: f[k] for k in f.files}


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------
def test_imported_checkpoints_give_the_trained_verdict(trained, tmp_path, capsys):
    _, runs, verdict = trained
    hyp = _write(tmp_path / "imp.yaml", _import_doc({s: d / "checkpoints" for s, d in runs.items()}))
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1", "--no-report"]) == 0
    assert "state dict model" in capsys.readouterr().out  # the key used is in the log
    got = json.loads((out / "studies" / "imported" / "verdicts.json").read_text())["claims"][0]
    assert got["verdict"] == verdict["verdict"]
    assert got["effect"] == pytest.approx(verdict["effect"], rel=1e-9)
    assert got["p_value"] == pytest.approx(verdict["p_value"], rel=1e-9)
    for spec in plan_runs(load_hypothesis(hyp)):
        mine, theirs = _spectra(out / "runs" / spec.key), _spectra(runs[spec.seed])
        assert mine.keys() == theirs.keys()
        assert all(np.allclose(mine[k], theirs[k], rtol=1e-9, atol=0) for k in mine)
        result = json.loads((out / "runs" / spec.key / "result.json").read_text())
        assert result["source"]["state_dict_key"] == "model"
        assert result["source"]["files"]["2"] == {
            "file": "epoch_002.pt",
            "state_dict_key": "model",
            "prefix_removed": "",
        }
    # MLflow: one child run per imported seed, tagged with its source
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("imported")
    children = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("study.role") == "training"
    ]
    assert len(children) == 2
    tags = children[0].data.tags
    assert tags["source.kind"] == "checkpoints" and tags["source.state_dict_key"] == "model"
    assert len(tags["source.fingerprint"]) == 16 and tags["source.format"] == "pt"
    # a second invocation reuses both imports (keyed by content)
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1", "--no-report", "--no-mlflow"]) == 0
    assert "2 reused, 0 to train" in capsys.readouterr().out


def _resave(src: Path, dst: Path, fmt: str, wrapper: str | None) -> None:
    """Re-save a trained run's checkpoints in another format and wrapper (same weights)."""
    dst.mkdir(parents=True)
    for path in sorted(src.glob("epoch_*.pt")):
        sd = torch.load(path, weights_only=True)["model"]
        if wrapper == "teacher":  # as a DINO teacher: backbone.* plus head keys that are not the backbone
            sd = {**{f"backbone.{k}": v for k, v in sd.items()}, "head.last_layer.weight": torch.zeros(2, 2)}
        elif wrapper == "module":
            sd = {f"module.{k}": v for k, v in sd.items()}
        target = dst / path.with_suffix(f".{fmt}").name
        if fmt == "safetensors":
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in sd.items()}, target)
        else:
            torch.save(sd if wrapper in (None, "module") else {wrapper: sd, "epoch": 3}, target)


@pytest.mark.parametrize(
    "fmt,wrapper,key",
    [
        ("safetensors", None, "(top level)"),
        ("safetensors", "module", "(top level)"),
        ("pt", None, "(top level)"),
        ("pth", "state_dict", "state_dict"),
        ("pth", "model_state_dict", "model_state_dict"),
        ("pt", "teacher", "teacher"),
    ],
)
def test_formats_and_wrappers_import_the_same_spectra(trained, tmp_path, fmt, wrapper, key):
    _, runs, _ = trained
    folders = {}
    for seed, run_dir in runs.items():
        folders[seed] = tmp_path / f"seed{seed}"
        _resave(run_dir / "checkpoints", folders[seed], fmt, wrapper)
    hyp, outcome = _run(_import_doc(folders), tmp_path)
    assert not outcome.failed
    for spec in plan_runs(hyp):
        mine = _spectra(tmp_path / "out" / "runs" / spec.key)
        theirs = _spectra(runs[spec.seed])
        assert all(np.allclose(mine[k], theirs[k], rtol=1e-9, atol=0) for k in theirs)
        source = json.loads((tmp_path / "out" / "runs" / spec.key / "result.json").read_text())["source"]
        assert source["state_dict_key"] == key and source["format"] == fmt


def test_single_seed_import_is_inconclusive_with_description(trained, tmp_path):
    _, runs, _ = trained
    hyp, outcome = _run(_import_doc({0: runs[0] / "checkpoints"}, seeds=(0,)), tmp_path)
    r = outcome.results[0]
    assert r.verdict == INCONCLUSIVE and r.reason == "1 seed: a test across seeds needs >= 2"
    desc = r.details["descriptive"][0]
    table = outcome.table[(outcome.table.metric == "effective_rank") & (outcome.table.token_set == "all")]
    pooled = table[table.layer.isin(TREND["layers"])].groupby("epoch").value.mean()
    from scipy.stats import kendalltau

    assert desc["kendall_tau"] == pytest.approx(kendalltau(pooled.index, pooled.values).statistic)
    assert desc["n_layers"] == 3 and desc["share"] == desc["layers_in_direction"] / 3
    from analysis.kinds import get_kind

    lines = get_kind("trend").explain(hyp.claims[0], r)
    assert any(line.startswith("descriptive, within seed 0 (not a verdict") for line in lines)


def test_one_unnumbered_checkpoint_serves_an_end_of_training_claim(trained, tmp_path):
    _, runs, _ = trained
    folders = {}
    for seed, run_dir in runs.items():
        folders[seed] = tmp_path / f"seed{seed}"
        folders[seed].mkdir()
        sd = torch.load(run_dir / "checkpoints" / "epoch_002.pt", weights_only=True)["model"]
        torch.save(sd, folders[seed] / "final.pth")
    claim = {"name": "max", "kind": "extremum", "metric": "effective_rank", "subset": {"dataset": "objects"}}
    claim.update(direction="highest", target={"layers": ["block_03"]}, competitors=[{"layers": ["block_01"]}])
    _, outcome = _run(_import_doc(folders, claims=[claim], checkpoints=[2]), tmp_path)
    assert set(outcome.table.epoch) == {2} and outcome.results[0].n_seeds == 2


# --------------------------------------------------------------------------------------------------
# Metric logs
# --------------------------------------------------------------------------------------------------
def _tgo_log(path: Path, epochs=(1, 2, 3, 4), seed: int | None = None, extra: dict | None = None) -> Path:
    """A log in TGO-I's layout (its layer names and metric keys); values rise with the epoch by design."""
    rng = np.random.default_rng(0 if seed is None else seed)
    lines = []
    for ep in epochs:
        layers = {
            name: {m: float(1 + ep + 0.5 * i + rng.normal(0, 0.05)) for m in TGO_METRICS}
            for i, name in enumerate(TGO_LAYERS)
        }
        for layer in layers.values():
            layer["spectral_anisotropy"] = 0.9 / (ep + 1)
        obj = {"epoch": ep, "layers": layers, **({"seed": seed} if seed is not None else {})}
        obj.update(extra or {})
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tgo_i_import_file_on_a_tgo_layout_log(tmp_path, capsys):
    log = _tgo_log(tmp_path / "epoch_summaries.jsonl")
    hyp = REPO / "hypotheses" / "paper" / "tgo_i_import.yaml"
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--data-root", f"source={log}"]) == 0
    printed = capsys.readouterr().out
    assert "Layer_05_Block05 -> block_05" in printed and "Layer_13_CLS_Final -> norm/cls" in printed
    verdicts = json.loads((out / "studies" / "tgo_i_import" / "verdicts.json").read_text())["claims"]
    by_name = {c["metric"]: c for c in verdicts}
    for metric in ("effective_rank", "stable_rank", "participation_ratio", "spectral_entropy"):
        c = by_name[metric]
        assert c["verdict"] == INCONCLUSIVE and c["reason"] == "1 seed: a test across seeds needs >= 2"
        assert c["details"]["descriptive"]["0"]["kendall_tau"] == pytest.approx(1.0)
        assert c["details"]["descriptive"]["0"]["share"] == 1.0
    assert by_name["spectral_anisotropy"]["details"]["descriptive"]["0"]["kendall_tau"] == pytest.approx(-1.0)
    diag = by_name["diagonality"]
    assert diag["verdict"] == INCONCLUSIVE and diag["reason"].startswith("not testable on this source")
    assert "'diagonality' is not in the table" in diag["reason"] and "spectral_flatness" in diag["reason"]
    report = (out / "studies" / "tgo_i_import" / "report.md").read_text()
    assert "descriptive, within seed 0 (not a verdict" in report
    assert (out / "studies" / "tgo_i_import" / "figures" / "claim0_epochs_effective_rank.png").is_file()
    (run_dir,) = (p for p in (out / "runs").iterdir() if p.is_dir())
    source = json.loads((run_dir / "result.json").read_text())["source"]
    assert source["format"] == "jsonl" and source["mapping"]["layers"]["Layer_13_CLS_Final"] == "norm/cls"
    assert "Layer_05_Block05" in source["mapping"]["inferred_layers"]
    rows = pd.read_parquet(run_dir / "rows.parquet")
    assert set(rows.epoch) == {1, 2, 3, 4} and len(rows) == 4 * 15 * 6
    table = pd.read_parquet(out / "studies" / "tgo_i_import" / "table.parquet")
    assert (table[table.layer == "block_05"].layer_index == 6).all()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tgo_i_import")
    (child,) = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("study.role") == "training"
    ]
    assert child.data.tags["source.kind"] == "table" and child.data.tags["source.format"] == "jsonl"
    assert json.loads(child.data.tags["source.mapping"])["layers"]["Layer_00_PosEmbed"] == "pos_embed"
    # the run folder gone, the import is fetched back from the tracking store (rows.parquet, not spectra)
    import shutil

    shutil.rmtree(out / "runs")
    assert main(["run", str(hyp), "--out", str(out), "--data-root", f"source={log}", "--no-report"]) == 0
    assert f"from MLflow run {child.info.run_id}" in capsys.readouterr().out
    again = json.loads((out / "studies" / "tgo_i_import" / "verdicts.json").read_text())["claims"]
    assert [c["details"] for c in again] == [c["details"] for c in verdicts]


def test_tgo_log_per_seed_files_give_a_verdict(tmp_path, monkeypatch):
    for seed in (0, 1, 2):
        _tgo_log(tmp_path / f"seed{seed}.jsonl", seed=seed)
    doc = yaml.safe_load((REPO / "hypotheses" / "paper" / "tgo_i_import.yaml").read_text())
    doc["design"]["seeds"] = [0, 1, 2]
    doc["design"]["source"]["path"] = "${TGO_LOGS}/seed{seed}.jsonl"
    monkeypatch.setenv("TGO_LOGS", str(tmp_path))
    _, outcome = _run(doc, tmp_path)
    r = outcome.results[0]
    assert r.n_seeds == 3 and r.verdict == "ACCEPTED" and "descriptive" not in r.details


def test_tidy_csv_with_declared_mapping(tmp_path):
    rng = np.random.default_rng(1)
    rows = [
        {"seed": s, "epoch": e, "layer": f"blk{i}", "metric": "erank", "value": 2 + e + rng.normal(0, 0.1)}
        for s in (0, 1, 2, 3)
        for e in (0, 5, 10)
        for i in (1, 2, 3)
    ]
    rows += [{**r, "metric": "loss", "value": 1.0} for r in rows]
    pd.DataFrame(rows).to_csv(tmp_path / "log.csv", index=False)
    src = {
        "kind": "table",
        "path": str(tmp_path / "log.csv"),
        "layers": {"blk1": "block_01", "blk2": "block_02", "blk3": "block_03"},
        "metrics": {"erank": "effective_rank", "loss": None},
    }
    design = {**DESIGN, "datasets": [{"name": "objects", "kind": "external"}], "seeds": [0, 1, 2, 3]}
    design.pop("checkpoints")
    _, outcome = _run({"name": "csv", "design": {**design, "source": src}, "claims": [TREND]}, tmp_path)
    r = outcome.results[0]
    assert r.verdict == "ACCEPTED" and r.n_seeds == 4
    assert r.effect == pytest.approx(1.0, abs=0.05)  # the planted slope: +1 per epoch
    assert set(outcome.table.metric) == {"effective_rank"} and (outcome.table.n_tokens == -1).all()


# --------------------------------------------------------------------------------------------------
# Bad input: one line naming the file (and line or key), exit 2, nothing recorded
# --------------------------------------------------------------------------------------------------
def _fails(capsys, doc: dict, tmp_path: Path, *expected: str) -> str:
    hyp = _write(tmp_path / "bad.yaml", doc)
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ")
    for text in expected:
        assert text in err, err
    assert not out.exists()  # no run folder, no MLflow store
    return err


def _log_doc(path: Path, **source) -> dict:
    doc = yaml.safe_load((REPO / "hypotheses" / "paper" / "tgo_i_import.yaml").read_text())
    doc["design"]["source"] = {"kind": "table", "path": str(path), "format": "jsonl", **source}
    return doc


def test_missing_checkpoint_folder(tmp_path, capsys):
    doc = _import_doc({0: tmp_path / "nowhere0", 1: tmp_path / "nowhere1"})
    _fails(capsys, doc, tmp_path, str(tmp_path / "nowhere0"), "folder not found")


def test_checkpoint_that_does_not_fit_the_model(trained, tmp_path, capsys):
    _, runs, _ = trained
    folder = tmp_path / "seed0"
    folder.mkdir()
    for path in sorted((runs[0] / "checkpoints").glob("*.pt")):
        sd = torch.load(path, weights_only=True)["model"]
        sd["blocks.0.extra.weight"] = sd.pop("blocks.0.norm1.weight")
        torch.save({"model": sd}, folder / path.name)
    doc = _import_doc({0: folder}, seeds=(0,))
    _fails(
        capsys,
        doc,
        tmp_path,
        "epoch_000.pt: state dict (model)",
        "first missing key 'blocks.0.norm1.weight'",
        "first unexpected key 'blocks.0.extra.weight'",
    )


def test_duplicate_checkpoint_epoch(trained, tmp_path, capsys):
    _, runs, _ = trained
    folder = tmp_path / "seed0"
    _resave(runs[0] / "checkpoints", folder, "pt", None)
    (folder / "epoch_1.pth").write_bytes((folder / "epoch_001.pt").read_bytes())
    _fails(capsys, _import_doc({0: folder}, seeds=(0,)), tmp_path, "duplicate epoch 1")


def test_unmapped_layer(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl")
    text = log.read_text().replace("Layer_00_PosEmbed", "Layer_00_Mystery", 1)
    log.write_text(text)
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 1:", "layer 'Layer_00_Mystery' is not mapped")


def test_unmapped_metric(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl", extra=None)
    lines = log.read_text().splitlines()
    obj = json.loads(lines[2])
    obj["layers"]["Layer_01_Block01"]["knn_accuracy"] = 0.5
    lines[2] = json.dumps(obj)
    log.write_text("\n".join(lines) + "\n")
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 3:", "metric 'knn_accuracy' is not one of ours")


def test_duplicate_epoch_in_a_log(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl", epochs=(1, 2, 2))
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 3:", "duplicate epoch 2", "first at line 2")


def test_non_finite_value(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl")
    lines = log.read_text().splitlines()
    obj = json.loads(lines[1])
    obj["layers"]["Layer_03_Block03"]["stable_rank"] = float("nan")
    lines[1] = json.dumps(obj)  # json writes NaN, as Python's json does
    log.write_text("\n".join(lines) + "\n")
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 2,", "'Layer_03_Block03'", "non-finite value nan")


def test_line_that_is_not_an_object(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl")
    log.write_text(log.read_text() + "[1, 2]\n")
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 5:", "expected a JSON object", "got list")


def test_unset_environment_variable_names_the_data_root(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TGO_I_LOG", raising=False)
    doc = yaml.safe_load((REPO / "hypotheses" / "paper" / "tgo_i_import.yaml").read_text())
    _fails(capsys, doc, tmp_path, "TGO_I_LOG is not set", "--data-root source=PATH")


@pytest.mark.parametrize(
    "change,field",
    [
        ({"checkpoints": None}, "design.checkpoints"),
        ({"source": {"kind": "checkpoints", "paths": {0: "a"}}}, "design.source.paths"),
        ({"source": {"kind": "checkpoints", "path": "/ckpt"}}, "design.source.path"),
        (
            {"source": {"kind": "table", "path": "x.jsonl", "layers": {"L1": "block_99"}}},
            "design.source.layers",
        ),
        ({"source": {"kind": "table", "path": "x.jsonl", "metrics": {"m": "nope"}}}, "design.source.metrics"),
        ({"source": {"kind": "table", "path": "x.jsonl", "wat": 1}}, "design.source.wat"),
        ({"source": None, "datasets": [{"name": "objects", "kind": "external"}]}, "design.datasets"),
    ],
)
def test_schema_rejects_bad_sources(change, field):
    from vitstudy_core.errors import StudyError

    doc = _import_doc({0: "a", 1: "b"})
    doc["design"].update(change)
    doc["design"] = {k: v for k, v in doc["design"].items() if v is not None}
    with pytest.raises(StudyError) as err:
        parse_hypothesis(doc, "f.yaml")
    assert f"f.yaml: {field}" in str(err.value)


def test_log_that_is_not_utf8(tmp_path, capsys):
    log = _tgo_log(tmp_path / "log.jsonl")
    log.write_bytes(log.read_bytes().replace(b"Layer_00_PosEmbed", b"Layer_00_Pos\xffEmbed", 1))
    _fails(capsys, _log_doc(log), tmp_path, f"{log}: line 1:", "not UTF-8 text (byte 0xff")


@pytest.mark.parametrize(
    "column, bad, says",
    [
        ("epoch", "", "expected an integer 'epoch', got nan"),
        ("seed", "abc", "expected an integer 'seed', got 'abc'"),
    ],
)
def test_tidy_log_with_a_cell_that_is_no_integer(tmp_path, capsys, column, bad, says):
    """A CSV's epoch left empty (NaN) or a seed written as text: one line naming the file's line."""
    rows = [
        {"seed": 0, "epoch": e, "layer": f"block_0{i}", "metric": "effective_rank", "value": 1.0 + e}
        for e in (1, 2)
        for i in (1, 2, 3)
    ]
    frame = pd.DataFrame(rows).astype({column: object})
    frame.loc[3, column] = bad
    frame.to_csv(tmp_path / "log.csv", index=False)
    design = {**DESIGN, "datasets": [{"name": "objects", "kind": "external"}], "seeds": [0]}
    design.pop("checkpoints")
    doc = {
        "name": "csv",
        "design": {**design, "source": {"kind": "table", "path": str(tmp_path / "log.csv")}},
    }
    _fails(capsys, {**doc, "claims": [TREND]}, tmp_path, f"{tmp_path / 'log.csv'}: line 5:", says)
