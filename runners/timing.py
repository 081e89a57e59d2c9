"""A short timed training step of a run's design: what ``python -m study plan`` costs runs with when no
finished run of that design has recorded its epoch times.

    seconds = time_training_step(run_spec_dict)   # seconds per optimiser step on this machine

The objective (``runners.objectives``) is built exactly as ``runners.train.train_run`` builds it and
trained on random images of the dataset's size for a few steps; the first step (allocation, kernel
selection) is left out. Evaluation is not timed.

    seconds = time_extraction(run_spec_dict)      # seconds of one checkpoint's spectra extraction here

extracts the spectra of the run's freshly built model over a probe set of the run's size (random pixels),
as ``runners.train`` does at every checkpoint; ``plan`` multiplies it by the run's checkpoints.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from runners.datasets import num_classes
from runners.extract import extract_spectra
from runners.inputs import to_tensor
from runners.objectives import make_objective
from runners.train import pick_device


def time_training_step(run: dict, n_steps: int = 3, seed: int = 0) -> float:
    """Median wall-clock seconds of one training step of ``run``'s model and objective on this machine.

    Args:
        run: a ``RunSpec`` as a dict (dataset, model, objective, training, seed, ...).
        n_steps: timed steps (after one untimed warm-up step).

    Returns:
        Seconds per step at the run's batch size (images of the dataset's ``image_size``, random pixels).
    """
    ds, batch = run["dataset"], run["training"]["batch_size"]
    size, classes = ds["image_size"], num_classes(ds)
    device = pick_device()
    torch.manual_seed(seed)
    objective = make_objective(run, classes, size, n_steps + 1, device)
    rng = np.random.default_rng(seed)
    n = batch * (n_steps + 1)
    xtr = torch.from_numpy(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))
    ytr = torch.from_numpy(rng.integers(0, classes, n).astype(np.int64))
    stamps: list[float] = []

    def tick(step: int, loss: float | torch.Tensor, n_images: int) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    stamps.append(time.perf_counter())
    objective.train_epoch(1, xtr, ytr, torch.arange(n), tick)
    return float(np.median(np.diff(stamps)[1:]))


def time_extraction(run: dict, seed: int = 0) -> float:
    """Wall-clock seconds of one checkpoint's spectra extraction of ``run``'s model on this machine.

    Args:
        run: a ``RunSpec`` as a dict; its ``probe`` gives the probe set's size and batch size.

    Returns:
        Seconds for one :func:`runners.extract.extract_spectra` call (probe images of the dataset's
        ``image_size``, random pixels; observables included, covariance snapshots not).
    """
    ds, probe = run["dataset"], run["probe"]
    size = ds["image_size"]
    device = pick_device()
    torch.manual_seed(seed)
    model = make_objective(run, num_classes(ds), size, 1, device).measured
    images = np.random.default_rng(seed).integers(0, 256, (probe["size"], size, size, 3), dtype=np.uint8)
    x = to_tensor(images)
    t0 = time.perf_counter()
    extract_spectra(model, x, probe["batch_size"], epoch=0, blocks=probe.get("blocks", 0))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0
