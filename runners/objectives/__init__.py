"""Training objectives: one readable epoch loop per objective, sharing ``runners.train``'s scaffolding.

Each objective is a small class with the same five members, called by ``runners.train.train_run``:

* ``measured``: the network whose layer-wise spectra are measured (supervised: the classifier's ViT;
  DINO: the EMA *teacher* backbone, as in the Inductive Bottleneck paper);
* ``train_epoch(epoch, xtr, ytr, order, tick) -> dict``: one pass over ``order``; raises
  ``RunFailedError`` on a non-finite loss; calls ``tick(step, loss, n_images)`` after every step;
* ``evaluate(xtr, ytr, xte, yte) -> dict``: held-out quality (test accuracy, or teacher k-NN accuracy);
* ``state_dict()`` / ``load_state_dict(state)``: everything a resumed run needs.
"""

from __future__ import annotations

import torch

from runners.objectives.dino import DinoTrainer
from runners.objectives.supervised import SupervisedTrainer


def make_objective(
    run: dict, n_classes: int, image_size: int, steps_per_epoch: int, device: torch.device
) -> SupervisedTrainer | DinoTrainer:
    """Build the objective named in ``run["objective"]`` ("supervised", or a dict with ``kind``)."""
    obj = run["objective"]
    kind = obj if isinstance(obj, str) else obj["kind"]
    if kind == "supervised":
        return SupervisedTrainer(run, n_classes, image_size, steps_per_epoch, device)
    if kind == "dino":
        return DinoTrainer(run, n_classes, image_size, steps_per_epoch, device)
    raise ValueError(f"unknown objective {kind!r}")


__all__ = ["DinoTrainer", "SupervisedTrainer", "make_objective"]
