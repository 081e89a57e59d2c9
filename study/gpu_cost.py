"""What a design costs on one GPU, from the throughput measured there (``python -m study plan`` prints it).

    est = gpu_estimate(plan_runs(hyp))   # None when no run matches a measured configuration

The figures are the project's one record of measured GPU throughput (:data:`MEASURED`); the README and
``bench/README.md`` quote them. A run's GPU time is::

    epochs x training images / images_per_s(objective)            (training)
    + checkpoints x probe images / images_per_s("supervised")      (extraction)

Training images: the spec's ``n_train`` when it subsamples, else the dataset's known size
(:data:`TRAIN_IMAGES`; UC Merced after its per-class test split). An extraction image is counted as one
supervised training image (forward + backward, about 3 forwards): the streaming extraction was measured
at 3.05x a bf16 forward at 224 px on the same GPU, so this is about right, and at 6-12 checkpoints of
1,000 images it is seconds per run against hours of training. Not included: evaluation (k-NN per DINO
epoch), data loading before the first step, compilation (~1 minute per run), checkpoint writes.
Only runs of the measured configuration get an estimate: the ViT-S/16 model (timm
``vit_small_patch16_224``, patch 16) at 224 px, objective ``supervised`` (any preset) or DINO with the
``dino_paper`` preset; any other run makes the estimate None (it is not extrapolated).
"""

from __future__ import annotations

from typing import TypedDict

from study.runspecs import RunSpec


class _Measured(TypedDict):
    device: str
    source: str
    images_per_s: dict[str, float]
    batch_size: int


# Measured once on one NVIDIA H200 (torch 2.11.0+cu130, 2026-11-30) by `bench/gpu_check.py --steps
# throughput`: a training step of ViT-S/16 at 224 px, batch 128, bf16 autocast, torch.compile, through the
# project's own trainers (bench/README.md, "GPU check, measured once").
MEASURED: _Measured = {
    "device": "one H200",
    "source": "measured 2026-11-30 by bench/gpu_check.py: ViT-S/16, 224 px, batch 128, bf16, compiled",
    "images_per_s": {"supervised": 4514.0, "dino_paper": 868.0},
    "batch_size": 128,
}

# Training images of the datasets the paper files use, before any n_train subsample. UC Merced: 21
# classes x 100 images, split per class by test_fraction (runners.datasets.ucmerced). ImageNet-100 (an
# ImageFolder, dataset name "imagenet100"): the CMC class list's 126,689 training images; another folder
# gives its own count, so set n_train for an estimate of it.
TRAIN_IMAGES = {"cifar100": 50_000, "tiny_imagenet": 100_000, "imagenet100": 126_689}
UCMERCED_CLASSES, UCMERCED_PER_CLASS = 21, 100


def train_images(dataset: dict) -> int | None:
    """Training images of one run's dataset spec (None: unknown size)."""
    kind, name = dataset.get("kind"), dataset.get("name")
    if kind == "ucmerced":
        n_test = min(UCMERCED_PER_CLASS - 1, max(1, round(dataset.get("test_fraction", 0.2) * 100)))
        known: int | None = UCMERCED_CLASSES * (UCMERCED_PER_CLASS - n_test)
    elif kind == "imagefolder":
        known = TRAIN_IMAGES.get(name) if isinstance(name, str) else None
    else:
        known = TRAIN_IMAGES.get(kind) if isinstance(kind, str) else None
    n_train = dataset.get("n_train")
    if n_train:
        return min(n_train, known) if known else n_train
    return known


def _throughput_key(run: dict) -> str | None:
    """The :data:`MEASURED` key of a run's configuration, or None if it is not the measured one."""
    model, size = run["model"], run["dataset"].get("image_size")
    if model.get("name") != "vit_small_patch16_224" or model.get("patch_size", 16) != 16 or size != 224:
        return None
    for key in ("embed_dim", "depth", "num_heads"):  # ViT-S: 384 wide, 12 blocks, 6 heads
        if model.get(key) not in (None, {"embed_dim": 384, "depth": 12, "num_heads": 6}[key]):
            return None
    obj = run["objective"]
    obj = {"kind": obj} if isinstance(obj, str) else obj  # "supervised": the objective by name
    if obj.get("kind") == "supervised":
        return "supervised"
    return "dino_paper" if obj.get("kind") == "dino" and obj.get("preset") == "dino_paper" else None


def gpu_estimate(specs: list[RunSpec]) -> dict | None:
    """GPU seconds of every run of a design on the device of :data:`MEASURED` (None: a run's
    configuration or dataset size is not covered). -> {"hours", "train_hours", "extract_hours", "runs",
    "device", "source", "batch_sizes"}."""
    rates = MEASURED["images_per_s"]
    train_s = extract_s = 0.0
    batches = set()
    for spec in specs:
        run = spec.model_dump()
        key, n = _throughput_key(run), train_images(run["dataset"])
        if key is None or n is None:
            return None
        train_s += run["training"]["epochs"] * n / rates[key]
        extract_s += len(run["checkpoints"]) * run["probe"]["size"] / rates["supervised"]
        batches.add(run["training"]["batch_size"])
    return {
        "hours": (train_s + extract_s) / 3600,
        "train_hours": train_s / 3600,
        "extract_hours": extract_s / 3600,
        "runs": len(specs),
        "device": MEASURED["device"],
        "source": MEASURED["source"],
        "batch_sizes": sorted(batches),
    }


def format_estimate(est: dict) -> str:
    """One line: ``estimated GPU time on one H200 (measured ...): N h ...``."""
    rates = ", ".join(f"{k} {v:,.0f} img/s" for k, v in MEASURED["images_per_s"].items())
    line = (
        f"estimated GPU time on {est['device']} ({est['source']}; {rates}): {est['hours']:.1f} h for "
        f"{est['runs']} runs (training {est['train_hours']:.2f} h, extraction {est['extract_hours']:.2f} h)"
    )
    other = [b for b in est["batch_sizes"] if b != MEASURED["batch_size"]]
    if other:
        line += f"; measured at batch {MEASURED['batch_size']}, the file trains at batch {other[0]}"
    return line
