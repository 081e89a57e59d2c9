"""What a design costs on one GPU, from the throughput measured there (``python -m study plan`` prints it).

    est = gpu_estimate(plan_runs(hyp))   # None when no run matches a measured configuration

The figures are the project's one record of measured GPU throughput (:data:`MEASURED`); the README and
``bench/README.md`` quote them. A run's GPU time is::

    epochs x training images / images_per_s(objective)            (training)
    + checkpoints x probe images / images_per_s("supervised")      (extraction)

Training images: the spec's ``n_train`` when it subsamples, else the dataset's known size
(what its dataset kind declares, ``runners.datasets.DatasetKind.train_images``; UC Merced after its
per-class test split). An extraction image is counted as one
supervised training image (forward + backward, about 3 forwards): the streaming extraction was measured
at 3.05x a bf16 forward at 224 px on the same GPU on 2026-11-30 and 11.5x on 2026-12-04 (with the
probe-size extras, host-bound: bench/README.md), so an extraction image may cost ~4 training images; at
6-12 checkpoints of 1,000 images that is still minutes per run against hours of training. Not included: evaluation (k-NN per DINO
epoch), data loading before the first step, compilation (~1 minute per run), checkpoint writes.
Only runs of the measured configuration get an estimate: the ViT-S/16 model (timm
``vit_small_patch16_224``, patch 16) at 224 px, with an objective whose ``throughput_key()`` names a
measured rate (``supervised``, any preset; DINO with the ``dino_paper`` preset); any other run makes the
estimate None (it is not extrapolated).
"""

from __future__ import annotations

from typing import TypedDict

from runners.datasets import DATASETS, kind_of
from runners.objectives import objective_settings
from study.runspecs import RunSpec


class _Measured(TypedDict):
    device: str
    source: str
    images_per_s: dict[str, float]
    batch_size: int


# Measured on one NVIDIA H200 (torch 2.11.0+cu130) by `bench/gpu_check.py --steps throughput`: a training
# step of ViT-S/16 at 224 px, batch 128, bf16 autocast, torch.compile, through the project's own trainers
# (bench/README.md, "GPU check, measured"). supervised: 2026-12-04 (1,527 img/s; 4,514 on 2026-11-30, before
# the steps stopped waiting for the device, timed then with a sync after every step); dino_paper:
# 2026-11-30 (its compiled rate was not reached within the step's limit on 2026-12-04, where its eager rate
# was 510 img/s against 620 on 2026-11-30, so 868 is likely high).
MEASURED: _Measured = {
    "device": "one H200",
    "source": "measured by bench/gpu_check.py (supervised 2026-12-04, dino_paper 2026-11-30): ViT-S/16, "
    "224 px, batch 128, bf16, compiled",
    "images_per_s": {"supervised": 1527.0, "dino_paper": 868.0},
    "batch_size": 128,
}


def train_images(dataset: dict) -> int | None:
    """Training images of one run's dataset spec (None: unknown size): its ``n_train`` when it
    subsamples, else what its dataset kind declares (``DatasetKind.train_images``)."""
    entry = DATASETS.get(kind_of(dataset), None)
    size = entry.train_images if entry is not None else None
    known = size(dataset) if size is not None else None
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
    measured = objective_settings(run["objective"]).throughput_key()
    return measured if measured in MEASURED["images_per_s"] else None


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
