"""Benchmark: the shipped pretrained-model study end to end on a CPU, at its real size.

    PYTHONPATH=. python bench/pretrained_study.py                  # the shipped file: 512 probe images, 2 models
    PYTHONPATH=. python bench/pretrained_study.py --workers 1      # one run at a time (stage times add up)
    PYTHONPATH=. python bench/pretrained_study.py --probe 256 --images 256 --classes 4   # a quicker run

What runs: ``python -m study run hypotheses/zoo/bottleneck_dino_vs_supervised.yaml --data-root
imagenet=TMP/imagenet --out TMP/out --no-mlflow --workers W`` in a subprocess with ``HF_HOME=TMP/hf`` and
``HF_HUB_OFFLINE=1``: the shipped file itself, its two models (``vit_small_patch16_224.dino`` and
``vit_small_patch16_224.augreg_in21k_ft_in1k``: timm ViT-S/16, D = 384, 12 blocks, 224 px, each through its
own timm preprocessing), its 512-image probe in 16 blocks and its three ``unit: images`` claims. With
``--probe N`` a copy of the file with ``probe.size: N`` runs instead (nothing else changed).

What is generated (nothing is downloaded), in a temporary folder removed at the end (``--keep`` keeps it):

* the weights: each model is ``timm.create_model(NAME, pretrained=False)`` from a fixed seed (model ``i``:
  seed ``--seed + i``; random init, so the verdicts mean nothing: the cost is what is measured), written as
  the Hugging Face hub caches a timm repo (``hub/models--timm--NAME/snapshots/REV/model.safetensors`` and
  ``config.json``, ``refs/main``), the layout timm reads with ``HF_HUB_OFFLINE=1``;
* the images: an ImageNet-style folder ``imagenet/{train,val}/<class>/*.JPEG`` with ``--classes`` classes
  (default 8), ``--images`` val images (default 512) and 2 train images per class, at ``--image-px`` (256)
  px, JPEG quality 90; each class is a shape and a colour on a random textured background (seeded).

What is measured: the wall time of the ``run`` subprocess (start-up and imports included), split at its
own lines (up to the last run's ``finished`` line; from there to its ``report:`` line: verdicts, outputs,
report); per run, the stage times its ``result.json`` records (``timing``: load = building the model from
the cached weights, preprocessing = the probe images through the model's timm transform, forward +
extraction = the forward passes with the streaming spectra), summed over the runs with each stage's
share; and the statistics stage: the verdict computation ``run`` does after its runs
(``study.pipeline.evaluation.evaluate`` with the runs' probe files: the jackknife over probe blocks of each
``unit: images`` claim), redone in this process on the finished output with ``--redo-verdicts`` (it
is the same computation again; without it the statistics row is the ``run``'s own time from its last run's
``finished`` line to its ``report:`` line, i.e. verdicts, outputs and the report).
``python -m study analyze FILE --table TABLE`` is no measure of it: from a table alone a ``unit: images``
claim is not testable (it needs the runs' ``blocks.npz``). With ``--workers auto`` (``run``'s default) the
two runs go in parallel, one per core, so their stage times overlap in wall time.

The last line printed is machine-readable:
``wall_s=<x> runs=<n> load_s=<x> preprocessing_s=<x> extraction_s=<x> statistics_s=<x> runs_phase_s=<x>
after_runs_s=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "hypotheses" / "zoo" / "bottleneck_dino_vs_supervised.yaml"
REV = "0123456789abcdef0123456789abcdef01234567"  # the snapshot revision refs/main names
STAGES = (("load", "load_s"), ("preprocessing", "preprocessing_s"), ("forward + extraction", "extraction_s"))
SHAPES = ("disc", "square", "triangle", "ring", "cross", "hstripes", "vstripes", "diamond")


def shape_mask(kind: str, n: int, cx: float, cy: float, r: float) -> np.ndarray:
    """A boolean (n, n) mask of one shape centred at (cx, cy) with radius r (pixels)."""
    y, x = np.mgrid[0:n, 0:n].astype(np.float32)
    dx, dy = x - cx, y - cy
    d = np.hypot(dx, dy)
    masks = {
        "disc": d < r,
        "square": (abs(dx) < r) & (abs(dy) < r),
        "triangle": (dy < r) & (dy > -r) & (abs(dx) < (dy + r) / 2),
        "ring": (d < r) & (d > 0.6 * r),
        "cross": ((abs(dx) < r / 3) | (abs(dy) < r / 3)) & (abs(dx) < r) & (abs(dy) < r),
        "hstripes": (abs(dx) < r) & (abs(dy) < r) & ((y // max(r / 4, 1)) % 2 == 0),
        "vstripes": (abs(dx) < r) & (abs(dy) < r) & ((x // max(r / 4, 1)) % 2 == 0),
        "diamond": abs(dx) + abs(dy) < r,
    }
    return masks[kind]


def make_image(cls: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """A uint8 (n, n, 3) image of class ``cls``: a smooth random background, a textured noise field, and
    the class's shape in the class's colour (jittered) at a random place and size."""
    coarse = rng.uniform(0, 255, size=(4, 4, 3)).astype(np.float32)
    idx = np.linspace(0, 3, n).astype(np.int64)
    background = coarse[idx][:, idx]
    image = 0.6 * background + rng.normal(0, 25, size=(n, n, 3)).astype(np.float32)
    hue = np.array([(cls * 97) % 256, (cls * 53 + 80) % 256, (cls * 151 + 160) % 256], np.float32)
    r = rng.uniform(0.18, 0.35) * n
    cx, cy = rng.uniform(r, n - r, size=2)
    mask = shape_mask(SHAPES[cls % len(SHAPES)], n, cx, cy, r)
    image[mask] = 0.3 * image[mask] + 0.7 * (hue + rng.normal(0, 15, size=3))
    return np.clip(image, 0, 255).astype(np.uint8)


def write_image_folder(root: Path, classes: int, val: int, train_per_class: int, px: int, seed: int) -> Path:
    """``root/{train,val}/class_XX/*.JPEG``: ``val`` held-out images spread over the classes, and
    ``train_per_class`` training images per class; returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    counts = {"val": [val // classes + (c < val % classes) for c in range(classes)]}
    counts["train"] = [train_per_class] * classes
    for split, per_class in counts.items():
        for c, k in enumerate(per_class):
            folder = root / split / f"class_{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(k):
                img = Image.fromarray(make_image(c, px, rng))
                img.save(folder / f"{split}_{c:02d}_{i:05d}.JPEG", quality=90)
    return root


def write_hub_repo(hf_home: Path, repo_name: str, state_dict: dict, config: dict) -> Path:
    """One timm repo as ``huggingface_hub`` caches it (blobs inlined): ``hf_home/hub/models--timm--NAME/``
    with ``refs/main`` and ``snapshots/REV/{model.safetensors, config.json}``. The same layout as
    ``tests/zoo_cache.py``'s ``hub_cache`` writes (kept apart: a benchmark does not import the tests)."""
    from safetensors.torch import save_file

    repo = hf_home / "hub" / f"models--timm--{repo_name}"
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REV)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(snap / "model.safetensors"))
    (snap / "config.json").write_text(json.dumps(config))
    return snap / "model.safetensors"


def cache_random_models(hf_home: Path, names: list[str], seed: int) -> list[Path]:
    """Each timm ``NAME`` (a registered pretrained tag, e.g. ``vit_small_patch16_224.dino``) as a random
    init (``pretrained=False``, torch seed ``seed + i``) in the hub cache where timm looks for it."""
    import timm
    import torch

    files = []
    for i, name in enumerate(names):
        cfg = timm.models.get_pretrained_cfg(name)
        if cfg is None or not cfg.hf_hub_id or not cfg.hf_hub_id.startswith("timm/"):
            raise SystemExit(f"{name}: timm names no timm/ hub repo for it")
        torch.manual_seed(seed + i)
        model = timm.create_model(name, pretrained=False)
        config = {
            "architecture": name.split(".")[0],
            "num_classes": model.num_classes,
            "num_features": model.num_features,
            "pretrained_cfg": cfg.to_dict(),
        }
        files.append(write_hub_repo(hf_home, cfg.hf_hub_id.removeprefix("timm/"), model.state_dict(), config))
    return files


def shipped_models(path: Path) -> list[str]:
    import yaml

    return list(yaml.safe_load(path.read_text())["design"]["source"]["models"].values())


def hypothesis_file(tmp: Path, probe: int | None) -> Path:
    """The shipped file, or a copy of it with ``design.probe.size`` set."""
    if probe is None:
        return SHIPPED
    import yaml

    doc = yaml.safe_load(SHIPPED.read_text())
    doc["design"]["probe"]["size"] = probe
    out = tmp / SHIPPED.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def run_study(
    hyp: Path, data: Path, out: Path, hf_home: Path, workers: str
) -> tuple[float, list[tuple[float, str]]]:
    """``python -m study run`` in a subprocess (its lines passed through); (wall seconds, its lines with
    the second each arrived at, from the start)."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # keep what the caller put there
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=path)
    env.pop("HF_HUB_CACHE", None)
    cmd = [sys.executable, "-m", "study", "run", str(hyp), "--data-root", f"imagenet={data}"]
    cmd += ["--out", str(out), "--no-mlflow", "--workers", workers]
    lines: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))
            print(f"  {lines[-1][0]:7.1f} s | {lines[-1][1]}", flush=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"study run exited with status {p.returncode}")
    return wall, lines


def run_timings(out: Path) -> list[dict]:
    """Each pretrained run's ``result.json``: model, images, input size, its stage times."""
    rows = []
    for path in sorted(out.glob("**/result.json")):
        result = json.loads(path.read_text())
        source = result.get("source") or {}
        if source.get("kind") != "pretrained":
            continue
        row = {"model": source["model"], "timm": source["timm"], "device": result.get("device")}
        row["px"] = source["preprocessing"]["input_size"][1]
        row.update({key: float(result["timing"][key]) for _, key in STAGES})
        rows.append(row)
    return rows


def time_verdicts(hyp: Path, out: Path, hf_home: Path, data: Path) -> float:
    """Seconds of the verdict computation ``run`` does after its runs (``study.pipeline.evaluation.evaluate`` of the
    study's table with its runs' probe files: the jackknife of each ``unit: images`` claim), redone in
    this process on the finished output."""
    import pandas as pd

    from study.pipeline.evaluation import evaluate
    from study.schema import load_hypothesis

    tables = sorted(out.glob("studies/*/table.parquet"))
    if len(tables) != 1:
        raise SystemExit(f"expected one study table under {out}/studies, found {len(tables)}")
    os.environ.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", IMAGENET_DIR=str(data))
    hypothesis, table = load_hypothesis(hyp), pd.read_parquet(tables[0])
    t0 = time.perf_counter()
    evaluate(hypothesis, table, str(hyp), None, set(), out / "runs")
    return time.perf_counter() - t0


def phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float]:
    """The ``run`` subprocess's wall time split at its own lines: up to the last run's ``finished`` line
    (start-up, planning, the runs), from there to its ``report:`` line (verdicts, outputs, report), and
    the rest (the verdict table printed, exit)."""
    runs_end = max((t for t, line in lines if "] finished (" in line), default=float("nan"))
    report = min((t for t, line in lines if line.startswith("report: ")), default=float("nan"))
    return {"runs": runs_end, "verdicts + report": report - runs_end, "rest": wall - report}


def stage_table(rows: list[dict], statistics_s: float, after_runs_s: float) -> str:
    """Stage, seconds (summed over the runs), share of the stages' sum; the statistics stage is the
    verdicts alone when they were redone, else the run's time after its runs (verdicts + report)."""
    sums = {name: sum(r[key] for r in rows) for name, key in STAGES}
    if statistics_s == statistics_s:
        sums["statistics (verdicts)"] = statistics_s
    else:
        sums["statistics + report"] = after_runs_s
    total = sum(v for v in sums.values() if v == v)
    lines = [f"{'stage':24s} {'seconds':>9s} {'share':>7s}"]
    lines += [f"{name:24s} {s:9.1f} {100 * s / total:6.1f}%" for name, s in sums.items()]
    lines.append(f"{'sum':24s} {total:9.1f} {100.0:6.1f}%")
    return "\n".join(lines)


def print_results(rows: list[dict], statistics_s: float, wall: float, split: dict, workers: str) -> None:
    for r in rows:
        print(
            f"run {r['model']} ({r['timm']}, {r['px']} px, {r['device']}): load {r['load_s']:.1f} s, "
            f"preprocessing {r['preprocessing_s']:.1f} s, forward + extraction {r['extraction_s']:.1f} s"
        )
    print(stage_table(rows, statistics_s, split["verdicts + report"]))
    print(
        f"study run wall time: {wall:.1f} s (--workers {workers}): {split['runs']:.1f} s to the last run's "
        f"'finished' line (start-up, planning, data, the runs), {split['verdicts + report']:.1f} s from "
        f"there to its 'report:' line (verdicts, outputs, report), {split['rest']:.1f} s to exit"
    )
    sums = {key: sum(r[key] for r in rows) for _, key in STAGES}
    print(
        f"wall_s={wall:.2f} runs={len(rows)} load_s={sums['load_s']:.2f} "
        f"preprocessing_s={sums['preprocessing_s']:.2f} extraction_s={sums['extraction_s']:.2f} "
        f"statistics_s={statistics_s:.2f} runs_phase_s={split['runs']:.2f} "
        f"after_runs_s={split['verdicts + report']:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512, help="val images in the generated folder")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--image-px", type=int, default=256, help="side of each generated image")
    p.add_argument("--probe", type=int, default=None, help="probe.size (default: the shipped file's)")
    p.add_argument("--workers", default="auto", help="run's --workers (default auto, as run's)")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the first model's random init")
    p.add_argument("--keep", type=Path, default=None, help="keep the generated folders here")
    p.add_argument(
        "--redo-verdicts", action="store_true", help="time the verdicts alone, redone in this process"
    )
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="pretrained_study_")) if args.keep is None else args.keep
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        names = shipped_models(SHIPPED)
        cache_random_models(tmp / "hf", names, args.seed)
        data = write_image_folder(tmp / "imagenet", args.classes, args.images, 2, args.image_px, args.seed)
        hyp = hypothesis_file(tmp, args.probe)
        print(
            f"generated in {time.perf_counter() - t0:.1f} s: {len(names)} random-init models "
            f"({', '.join(names)}) in {tmp / 'hf'}; {args.images} val images ({args.classes} classes, "
            f"{args.image_px} px JPEG) in {data}",
            flush=True,
        )
        wall, lines = run_study(hyp, data, tmp / "out", tmp / "hf", args.workers)
        rows = run_timings(tmp / "out")
        nan = float("nan")
        statistics_s = nan if not args.redo_verdicts else time_verdicts(hyp, tmp / "out", tmp / "hf", data)
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print_results(rows, statistics_s, wall, phases(lines, wall), args.workers)


if __name__ == "__main__":
    main()
