"""Whether a run learned: DINO's collapse diagnostics on known answers, the learning checks of every
objective, and the flag carried from a run's result through the table to every claim that reads it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.table import NOT_LEARNED
from analysis.verdicts import ClaimResult, evaluate_claims, format_verdicts
from runners.objectives import OBJECTIVES, learning_status
from runners.objectives.dino import collapse_monitor
from runners.objectives.dino_settings import UNIFORM_SHARE, DinoObjective
from study.schema import parse_hypothesis


def test_collapse_monitor_on_known_answers():
    n, k = 8, 16
    feats = torch.eye(n, 12, dtype=torch.float64)  # orthonormal: spread sqrt(1 - 1/n)
    # uniform targets: entropy ln K, every image the same distribution
    out = collapse_monitor(torch.zeros(n, k), torch.zeros(1, k), 0.04, feats)
    assert out["teacher_entropy"] == pytest.approx(math.log(k), abs=1e-12)
    assert out["teacher_kl_mean"] == pytest.approx(0.0, abs=1e-12)
    assert out["feature_spread"] == pytest.approx(math.sqrt(1 - 1 / n), abs=1e-12)
    # one distinct prototype per image: entropy 0, KL to the mean ln n
    sharp = torch.eye(n, k) * 100.0
    out = collapse_monitor(sharp, torch.zeros(1, k), 0.04, feats)
    assert out["teacher_entropy"] == pytest.approx(0.0, abs=1e-9)
    assert out["teacher_kl_mean"] == pytest.approx(math.log(n), abs=1e-9)
    # one prototype for every image (the collapse centring prevents): entropy 0 and KL 0; one feature: spread 0
    same = torch.zeros(n, k)
    same[:, 3] = 100.0
    out = collapse_monitor(same, torch.zeros(1, k), 0.04, feats[:1].expand(n, -1))
    assert out["teacher_entropy"] == pytest.approx(0.0, abs=1e-9)
    assert out["teacher_kl_mean"] == pytest.approx(0.0, abs=1e-9)
    assert out["feature_spread"] == pytest.approx(0.0, abs=1e-12)
    # the centre is subtracted before the temperature: a centre equal to the logits leaves them uniform
    out = collapse_monitor(sharp, sharp.mean(0, keepdim=True) * 0 + sharp[:1], 1.0, feats)
    assert out["teacher_entropy"] < math.log(k)


def _history(**last) -> list[dict]:
    return [{"epoch": 1, "loss": 5.0}, {"epoch": 2, "loss": 4.0, **last}]


def test_default_check_is_chance_plus_three_binomial_ses():
    sup = OBJECTIVES["supervised"].model_validate({})
    bar = 0.1 + 3 * math.sqrt(0.1 * 0.9 / 2000)  # 0.1201
    assert sup.learning_check(_history(test_acc=bar - 1e-4, eval_images=2000), 10) is not None
    assert sup.learning_check(_history(test_acc=bar + 1e-4, eval_images=2000), 10) is None
    why = sup.learning_check(_history(test_acc=0.1, eval_images=2000), 10)
    assert why is not None and "test_acc 0.100 at epoch 2" in why and "0.120" in why
    # fewer images, a wider bar; without eval_images (runs from before it was recorded) nothing is said
    assert sup.learning_check(_history(test_acc=0.15, eval_images=100), 10) is not None
    assert sup.learning_check(_history(test_acc=0.1), 10) is None
    assert sup.learning_check([], 10) is None


def test_dino_check_reads_the_knn_and_the_teachers_entropy():
    dino = DinoObjective.model_validate({"kind": "dino", "out_dim": 1024})
    ln_k = math.log(1024)
    assert dino.learning_check(_history(knn_acc=0.11, eval_images=2000, teacher_entropy=2.0), 10)
    assert dino.learning_check(_history(knn_acc=0.40, eval_images=2000, teacher_entropy=2.0), 10) is None
    why = dino.learning_check(
        _history(knn_acc=0.40, eval_images=2000, teacher_entropy=UNIFORM_SHARE * ln_k + 0.01), 10
    )
    assert why is not None and "uniform" in why and f"{ln_k:.2f}" in why


def _result(objective, **last) -> dict:
    ds = {"name": "objects", "kind": "procedural", "variant": "objects", "n_classes": 10, "n_train": 64,
          "n_test": 32, "image_size": 8, "data_seed": 0}  # fmt: skip
    return {"run": {"objective": objective, "dataset": ds, "seed": 0}, "history": _history(**last)}


def test_learning_status_of_a_result_and_the_shuffled_control():
    assert learning_status(_result("supervised", test_acc=0.1, eval_images=2000)) is not None
    assert learning_status(_result("supervised", test_acc=0.9, eval_images=2000)) is None
    shuffled = _result("supervised", test_acc=0.1, eval_images=2000)
    shuffled["run"]["labels"] = "shuffled"  # chance-level test accuracy is what the control is for
    assert learning_status(shuffled) is None
    assert learning_status({"run": {"source": "pretrained"}, "history": []}) is None
    dino = DinoObjective.model_validate({"kind": "dino"}).model_dump()
    assert learning_status(_result(dino, knn_acc=0.1, eval_images=2000, teacher_entropy=1.0)) is not None


CLAIMS = """\
name: flags
design:
  datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  seeds: [0, 1, 2, 3]
  checkpoints: [0, 2]
  probe: {size: 16}
claims:
  - name: u
    kind: u_shape
    metric: eed_pct
    subset: {dataset: objects}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
"""


def _table(flagged: dict[int, str]) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(4):
        for i, layer in enumerate(["block_01", "block_02", "block_03"]):
            value = [30.0, 20.0, 31.0][i] + rng.normal(0, 1)
            rows.append(
                {
                    "run_key": f"k{seed}",
                    "dataset": "objects",
                    "seed": seed,
                    "epoch": 2,
                    "layer": layer,
                    "layer_index": i + 2,
                    "token_set": "all",
                    "metric": "eed_pct",
                    "value": value,
                    "n_tokens": 272,
                    NOT_LEARNED: flagged.get(seed, ""),
                }  # fmt: skip
            )
    return pd.DataFrame(rows)


def test_every_claim_reading_a_run_that_did_not_learn_says_so():
    import yaml

    hyp = parse_hypothesis(yaml.safe_load(CLAIMS))
    (r,) = evaluate_claims(hyp, _table({1: "knn_acc 0.100 at epoch 2 is not above chance"}))
    assert r.not_learned == {"objects seed 1": "knn_acc 0.100 at epoch 2 is not above chance"}
    assert any("1 of the runs it reads did not learn" in w for w in r.warnings)
    text = format_verdicts([r])
    assert "(runs did not learn)" in text.splitlines()[1]
    assert "objects seed 1: knn_acc 0.100" in text
    d = r.to_dict()
    assert d["not_learned"] == r.not_learned
    assert ClaimResult.from_dict(d).not_learned == r.not_learned
    # every run learned: no flag, no key in verdicts.json, the table without the column gives the same
    (ok,) = evaluate_claims(hyp, _table({}))
    assert ok.not_learned == {} and "not_learned" not in ok.to_dict()
    (bare,) = evaluate_claims(hyp, _table({}).drop(columns=NOT_LEARNED))
    assert bare.to_dict() == ok.to_dict()


TINY_DINO = (
    CLAIMS.replace("image_size: 8}]", "image_size: 32}]")
    .replace(
        "  seeds: [0, 1, 2, 3]",
        "  objective: {kind: dino, out_dim: 32, hidden_dim: 16, bottleneck_dim: 8, n_local_crops: 2}\n"
        "  training: {epochs: 1, batch_size: 32}\n  seeds: [0, 1]",
    )
    .replace("checkpoints: [0, 2]", "checkpoints: [0, 1]")
)


def test_a_study_of_runs_that_did_not_learn_says_so_everywhere(tmp_path, capsys):
    """Two DINO steps learn nothing: the verdict line, verdicts.json, the report, the table and MLflow say
    so, through the CLI as a user runs it; a rerun reuses the runs and says it again."""
    import json

    import mlflow

    from study.cli import main

    hyp = tmp_path / "dino.yaml"
    hyp.write_text(TINY_DINO)
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "(runs did not learn)" in printed and "objects seed 0: knn_acc" in printed
    study = out / "studies" / "flags"
    verdicts = json.loads((study / "verdicts.json").read_text())
    flagged = verdicts["claims"][0]["not_learned"]
    assert (
        set(flagged) == {"objects seed 0", "objects seed 1"}
        and "not above chance" in flagged["objects seed 0"]
    )
    report = (study / "report.md").read_text()
    assert "runs did not learn" in report and "objects seed 1: knn_acc" in report
    table = pd.read_parquet(study / "table.parquet")
    assert (table[NOT_LEARNED] != "").all()
    for key in {p.name for p in (out / "runs").iterdir() if p.is_dir()}:
        result = json.loads((out / "runs" / key / "result.json").read_text())
        assert {"knn_acc", "teacher_entropy", "eval_images"} <= set(result["initial"]) and result[
            "n_classes"
        ] == 10
    # a client of this store, not mlflow.set_tracking_uri: that sets MLFLOW_TRACKING_URI for every later test
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id], "tags.`study.role` = 'training'")
    ]
    assert len(runs) == 2 and all("not above chance" in r.data.tags["not_learned"] for r in runs)
    steps = client.get_metric_history(runs[0].info.run_id, "train/knn_acc")
    assert sorted(m.step for m in steps) == [0, 1]  # the evaluation at initialisation is step 0
    assert main(["run", str(hyp), "--out", str(out), "--workers", "1"]) == 0  # reuses every run
    assert "(runs did not learn)" in capsys.readouterr().out
