"""Published models (the ``pretrained`` source) and the unit of a claim (``analysis.units``).

The slow test runs a whole study offline (``HF_HUB_OFFLINE=1``) over tiny timm ViTs saved in timm's
formats and the Hugging Face cache layout (``tests/zoo_cache.py``): nothing is downloaded.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from study.schema import load_hypothesis, parse_hypothesis
from tests.zoo_cache import DESIGN_MODEL, MODEL_ARGS, OTHER_NORM, checkpoint_file, hub_cache
from vitstudy_core.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]
REGIONS = {"early": ["pos_embed"], "bottleneck": ["block_01"], "late": ["norm"]}
DESIGN = {
    "datasets": [{"name": "objects", "n_train": 32, "n_test": 256, "image_size": 16}],
    "model": DESIGN_MODEL,
    "probe": {"size": 256, "blocks": 8},
    "source": {"kind": "pretrained", "models": {"a": "hf-hub:timm/tiny_a", "b": "hf-hub:timm/tiny_b"}},
}
U_SHAPE = {"kind": "u_shape", "metric": "eed_pct", "subset": {"dataset": "objects"}, "regions": REGIONS}


def _doc(claim: dict, **design) -> dict:
    return {
        "name": "zoo",
        "design": {**copy.deepcopy(DESIGN), **design},
        "claims": [{"name": "c", **claim}],
    }


@pytest.mark.parametrize(
    "claim,design,expected",
    [
        (
            U_SHAPE,
            {},
            "claims[0].unit: published models are not seeds of one training recipe: declare unit: images "
            "(this checkpoint, on images like these) or unit: models (models like these)",
        ),
        (
            {**U_SHAPE, "unit": "models"},
            {"source": {"kind": "pretrained", "models": {"a": "hf-hub:timm/tiny_a"}}},
            "claims[0].unit: unit: models needs >= 2 models (the source names 1); one model: unit: images",
        ),
        (
            {**U_SHAPE, "unit": "images", "subset": {"dataset": "objects", "condition": "a"}},
            {"probe": {"size": 256}},
            "claims[0].unit: unit: images needs design.probe.blocks >= 8 (e.g. 16): the probe's image blocks "
            "are the replicates",
        ),
        (
            {
                "kind": "trend",
                "unit": "images",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "over": "layer",
                "layers": ["block_01", "block_02"],
                "direction": "increasing",
            },
            {},
            "claims[0].unit: unit: images is not available for kind trend (it is for ['compare', 'differs', "
            "'exceeds', 'u_shape'])",
        ),
        (
            {**U_SHAPE, "unit": "images", "subset": {"dataset": "objects", "condition": "a"}},
            {"probe": {"size": 128, "blocks": 8}},
            "claims[0].unit: unit: images is calibrated from 256 probe images up (design.probe.size is 128)",
        ),
        (
            {
                "kind": "compare",
                "unit": "images",
                "metric": "eed_pct",
                "subset": {"dataset": "objects", "condition": "a"},
                "a": {"layers": ["block_01"]},
                "b": {"layers": ["block_02"]},
            },
            {},
            "claims[0].unit: unit: images is not calibrated for compare on eed_pct (its calibration rows "
            "hold for compare on participation_ratio, differs on eed_pct, differs on participation_ratio, "
            "exceeds on eed_pct, exceeds on participation_ratio, u_shape on eed_pct, u_shape on "
            "participation_ratio; docs/statistics.md)",
        ),
        (
            {**U_SHAPE, "unit": "images", "regions": {**REGIONS, "bottleneck": "leave_one_seed_out"}},
            {},
            "claims[0].unit: unit: images: a leave-one-seed-out bottleneck is chosen per replicate (not "
            "linear in the layer values): declare it",
        ),
        (
            {**U_SHAPE, "unit": "images", "subset": {"dataset": "objects", "condition": "z"}},
            {},
            "claims[0].subset.condition: condition 'z' is not in the design (it has ['a', 'b'])",
        ),
        (
            {**U_SHAPE, "unit": "seeds"},
            {"source": None, "seeds": [0]},
            "claims[0].unit: unit: seeds needs >= 2 seeds (the design has 1); one fixed model: unit: images",
        ),
        (
            {**U_SHAPE, "unit": "models"},
            {"source": None, "seeds": [0, 1]},
            "claims[0].unit: unit: models needs a pretrained source (design.source.kind: pretrained) naming "
            "the models",
        ),
        (
            {**U_SHAPE, "unit": "images"},
            {"seeds": [0, 1, 2]},
            "design.seeds: with a pretrained source the seeds are the models' indices [0, 1] (leave seeds "
            "out), got [0, 1, 2]",
        ),
    ],
)
def test_a_unit_that_does_not_fit_the_design_is_refused_in_one_line(claim, design, expected):
    doc = _doc(claim, **design)
    if doc["design"].get("source") is None:
        doc["design"].pop("source")
    with pytest.raises(StudyError) as err:
        parse_hypothesis(doc, "zoo.yaml")
    assert str(err.value) == f"zoo.yaml: {expected}"


def test_models_are_seeds_in_file_order():
    hyp = parse_hypothesis(_doc({**U_SHAPE, "unit": "models"}), "zoo.yaml")
    assert hyp.design.seeds == [0, 1] and hyp.design.checkpoint_epochs == [0]


@pytest.mark.parametrize("name", ["bottleneck_dino_vs_supervised.yaml", "bottleneck_family.yaml"])
def test_shipped_zoo_files_validate_without_weights_or_data(name, monkeypatch):
    monkeypatch.delenv("IMAGENET_DIR", raising=False)
    hyp = load_hypothesis(ROOT / "hypotheses" / "zoo" / name)
    assert hyp.design.source.kind == "pretrained"
    assert {c.unit for c in hyp.claims} == ({"images"} if "dino" in name else {"models"})


@pytest.mark.slow  # imports timm and torchvision's transforms
def test_preprocessing_is_the_models_own():
    """Each model's transform is timm's ``create_transform`` of its data config: another mean and std
    give other inputs, and the size follows the config."""
    from PIL import Image
    from timm.data import create_transform

    from runners.pretrained import data_config, preprocess
    from tests.zoo_cache import pretrained_cfg

    images = np.random.default_rng(0).integers(0, 256, (3, 20, 20, 3), dtype=np.uint8)
    own, other = data_config(pretrained_cfg(), {}), data_config(pretrained_cfg(OTHER_NORM), {})
    x, y = preprocess(images, own), preprocess(images, other)
    assert tuple(x.shape) == (3, 3, 16, 16) and not np.allclose(x.numpy(), y.numpy())
    tf = create_transform(**{k: tuple(v) if isinstance(v, list) else v for k, v in own.items()})
    assert np.allclose(x[1].numpy(), tf(Image.fromarray(images[1])).numpy())
    assert data_config(pretrained_cfg(), {"img_size": 32})["input_size"] == [3, 32, 32]


def test_jackknife_removes_the_finite_probe_bias():
    """On simulated probes with a known population spectrum, the mean of the jackknife pseudo-values sits
    far closer to the population participation ratio than the plug-in value, which reads low."""
    from analysis import unit_calibration as uc
    from analysis.spectral import participation_ratio
    from analysis.units import pseudo_values

    lam = uc.power_law(0.5)
    rng = np.random.default_rng(1)
    plug, jack = [], []
    for _ in range(30):
        sums = uc.block_sums({"x": lam}, 64, rng)["x"]
        full, pv = pseudo_values({k: v[None] for k, v in sums.items()}, "participation_ratio")
        plug.append(full[0])
        jack.append(pv[0].mean())
    truth = participation_ratio(lam)
    bias_plug, bias_jack = np.mean(plug) - truth, np.mean(jack) - truth
    se = np.std(jack, ddof=1) / np.sqrt(len(jack))
    assert bias_plug < -3 * se  # the plug-in reads low
    assert abs(bias_jack) < abs(bias_plug) / 3


def _study_doc(hf: Path, weights: Path) -> dict:
    args = {k: v for k, v in MODEL_ARGS.items() if k != "num_classes"}
    models = {
        "a": "hf-hub:timm/tiny_a",
        "b": "hf-hub:timm/tiny_b",
        "c": "hf-hub:timm/tiny_c",  # a's weights, another mean and std
        "d": {"timm": "vit_tiny_patch16_224", "file": "d.pth", "model_args": args},  # a DINO checkpoint
    }
    return {
        "name": "zoo_tiny",
        "design": {
            **copy.deepcopy(DESIGN),
            "source": {"kind": "pretrained", "path": str(weights), "models": models},
        },
        "claims": [
            {
                "name": "dip in a",
                **U_SHAPE,
                "unit": "images",
                "subset": {"dataset": "objects", "condition": "a"},
            },
            {
                "name": "a differs from c",
                "kind": "differs",
                "unit": "images",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "claim": {"kind": "u_shape", "regions": REGIONS},
                "a": {"condition": "a"},
                "b": {"condition": "c"},
            },
            {
                "name": "block_02 above block_01 over models",
                "kind": "compare",
                "unit": "models",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "a": {"layers": ["block_02"]},
                "b": {"layers": ["block_01"]},
            },
        ],
    }


def _study(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "study", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_offline_study_over_published_models(tmp_path):
    """Three tiny timm models in the Hugging Face cache layout and one DINO checkpoint on disk, run
    offline: verdicts for unit: images and unit: models, each naming its population; model c (a's
    weights, another mean and std) gives other spectra, so its own preprocessing was applied."""
    hf = hub_cache(tmp_path / "hf", {"tiny_a": 0, "tiny_b": 1, "tiny_c": (0, OTHER_NORM)})
    checkpoint_file(tmp_path / "w" / "d.pth", 2, teacher=True)
    hyp = tmp_path / "zoo.yaml"
    hyp.write_text(yaml.safe_dump(_study_doc(hf, tmp_path / "w")))
    out = tmp_path / "out"

    empty = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    assert _study(["validate", str(hyp)], empty, tmp_path).returncode == 0  # no weights needed
    missing = _study(["run", str(hyp), "--out", str(out), "--no-mlflow"], empty, tmp_path)
    assert missing.returncode == 2 and "is not in the Hugging Face cache" in missing.stderr
    assert not (out / "runs").exists()

    env = {"HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    done = _study(["run", str(hyp), "--out", str(out), "--no-mlflow", "--workers", "1"], env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    study_dir = out / "studies" / "zoo_tiny"
    verdicts = {v["name"]: v for v in json.loads((study_dir / "verdicts.json").read_text())["claims"]}
    assert all(v["verdict"] in ("ACCEPTED", "REJECTED", "INCONCLUSIVE") for v in verdicts.values())
    assert verdicts["dip in a"]["details"]["population"].startswith(
        "this checkpoint (a), on images like these"
    )
    assert verdicts["dip in a"]["n_seeds"] == 8  # the probe blocks
    assert verdicts["a differs from c"]["details"]["population"].startswith("these checkpoints (a, c)")
    assert verdicts["block_02 above block_01 over models"]["details"]["population"].startswith(
        "models like these (a, b, c, d)"
    )
    assert (
        "the verdict is about this checkpoint (a), on images like these"
        in (study_dir / "report.md").read_text()
    )
    assert "about models like these" in (study_dir / "verdicts.txt").read_text()

    results = {}
    for run in (p for p in (out / "runs").iterdir() if (p / "result.json").is_file()):
        r = json.loads((run / "result.json").read_text())
        results[r["source"]["model"]] = (run, r)
    assert set(results) == {"a", "b", "c", "d"}
    (run_a, a), (run_c, c) = results["a"], results["c"]
    assert a["source"]["fingerprint"] == c["source"]["fingerprint"] and run_a.name != run_c.name
    assert c["source"]["preprocessing"]["mean"] == list(OTHER_NORM[0])
    assert a["source"]["preprocessing"] == a["run"]["imported"]["preprocessing"]
    assert results["d"][1]["source"]["state_dict_key"] == "teacher"
    sa, sc = (np.load(r / "spectra.npz") for r in (run_a, run_c))
    assert not np.allclose(sa["0/block_01/all"], sc["0/block_01/all"])


def test_each_covariance_s_pseudo_values_are_computed_once_per_study(monkeypatch):
    """The claims of a file share rows (a u_shape per model and their difference read the same layers):
    a row's K + 1 eigendecompositions run once per study (``ProbeData.pseudo``), with the same values
    as a fresh computation, and a claim with new rows computes only those."""
    import pandas as pd

    from analysis import unit_calibration as uc
    from analysis import units
    from analysis.probe import ProbeData

    layers = {"block_01": uc.power_law(0.5), "block_02": uc.step(0.2), "block_03": uc.power_law(1.0)}
    sums = uc.block_sums(layers, 256, np.random.default_rng(0))
    table = pd.DataFrame(
        [
            {"run_key": "r0", "dataset": "d", "seed": 0, "epoch": 0, "layer": ly, "token_set": "all"}
            for ly in layers
        ]
    ).assign(metric="eed_pct", value=0.0)
    computed: list[int] = []
    original = units.pseudo_values

    def stacked(probe, rows, where):
        return {k: np.stack([sums[ly][k] for ly in rows.layer]) for k in ("n", "s", "q", "u", "w")}

    def counting(block_sums, metric):
        computed.append(len(block_sums["n"]))
        return original(block_sums, metric)

    monkeypatch.setattr(units, "_block_sums", stacked)
    monkeypatch.setattr(units, "claim_rows", lambda t, claim: t[t.layer.isin(claim.layers)])
    first = SimpleNamespace(metric="eed_pct", layers=["block_01", "block_02"])
    wider = SimpleNamespace(metric="eed_pct", layers=list(layers))
    fresh = units.images_table(table, wider, ProbeData({}), "t", None)  # what an uncached study gives

    monkeypatch.setattr(units, "pseudo_values", counting)
    probe = ProbeData({})
    a = units.images_table(table, first, probe, "t", None)
    b = units.images_table(table, first, probe, "t", None)
    c = units.images_table(table, wider, probe, "t", None)
    assert computed == [2, 1]  # the first claim's two rows, then only the wider claim's new one
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(c, fresh)


_NPZ_ONLY = """
import json
import timm, torch
from safetensors.torch import save_file

NAME = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # timm's registry: custom_load=True (JAX .npz origin)
assert timm.models.get_pretrained_cfg(NAME).custom_load
torch.manual_seed(0)
want = timm.create_model(NAME, pretrained=False).state_dict()
snap = HF / "hub" / f"models--timm--{NAME}" / "snapshots" / ("0" * 40)
snap.mkdir(parents=True)
(snap.parent.parent / "refs").mkdir()
(snap.parent.parent / "refs" / "main").write_text("0" * 40)
save_file({k: v.contiguous() for k, v in want.items()}, str(snap / "model.safetensors"))


overlays = []
create = timm.create_model


def spy(name, *args, **kwargs):  # what build asks of timm: the overlay decides how timm reads the file
    overlays.append(kwargs.get("pretrained_cfg_overlay"))
    return create(name, *args, **kwargs)


timm.create_model = spy
from runners.pretrained import build

model, key = build({"path": "timm:" + NAME, "model": "a"})
same = all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
print(json.dumps({"key": key, "same": same, "custom_load": [o.get("custom_load") for o in overlays]}))
"""


def test_a_hub_model_whose_config_says_custom_load_is_read_as_a_state_dict(tmp_path):
    """timm's augreg ViTs declare ``custom_load`` (their original weights were JAX .npz files); their hub
    files are state dicts. timm 1.0.29 (seen on a GPU machine) kept ``custom_load`` for a file overlay and
    handed the cached .safetensors to ``load_pretrained``, which reads .npz only (timm 1.0.31 drops it
    itself): the source says ``custom_load: False`` for a state-dict file, and the weights are the file's."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    script = f"from pathlib import Path\nHF = Path({str(tmp_path / 'hf')!r})\n" + _NPZ_ONLY
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "key": "(timm)",
        "same": True,
        "custom_load": [False],
    }
