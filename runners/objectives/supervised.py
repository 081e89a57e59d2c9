"""Supervised cross-entropy: AdamW, linear warmup + cosine decay per step, optional label smoothing.

Its settings and presets are in ``runners.objectives.supervised_settings`` (no torch). The TGO-I recipe
is the ``tgo_supervised`` preset there: AdamW lr 1e-3, weight decay 0.05, label smoothing 0.1, drop path
0.1, cosine schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from runners.inputs import batch_input, to_input
from runners.models import build_model
from runners.objectives.base import TrainerSetup
from runners.objectives.meter import EpochMeter, adamw
from runners.objectives.supervised_settings import SupervisedObjective


def lr_lambda(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """Multiplier of the base lr at ``step``: linear warmup to 1, then cosine decay to 0."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


@torch.no_grad()
def accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int = 512
) -> float:
    """Top-1 accuracy of ``model`` on uint8 images ``x`` (N, H, W, 3) with labels ``y`` (N,), in eval mode."""
    was = model.training
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        logits = model(to_input(x[i : i + batch_size], device))
        correct += (logits.argmax(-1).cpu() == y[i : i + batch_size]).sum().item()
    model.train(was)
    return correct / x.shape[0]


class SupervisedTrainer:
    """A timm ViT with a linear head trained with cross-entropy on the labels."""

    def __init__(self, setup: TrainerSetup[SupervisedObjective], device: torch.device) -> None:
        tr, steps_per_epoch = setup.training, setup.steps_per_epoch
        self.tr, self.device, self.steps_per_epoch = tr, device, steps_per_epoch
        self.model = build_model(setup.model, setup.image_size, setup.n_classes).to(device)
        self.measured = self.model
        # compile only on CUDA: on CPU the compile time exceeds what short runs could save
        self.forward = torch.compile(self.model) if tr.compile and device.type == "cuda" else self.model
        self.opt = adamw(self.model.parameters(), device, lr=tr.lr, weight_decay=tr.weight_decay)
        total = steps_per_epoch * tr.epochs
        warmup = round(tr.warmup_epochs * steps_per_epoch)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(total, warmup))

    def train_epoch(
        self,
        epoch: int,
        xtr: torch.Tensor,
        ytr: torch.Tensor,
        order: torch.Tensor,
        tick: Callable[[int, float | torch.Tensor, int], None],  # the loss as a device tensor (read lazily)
    ) -> dict:
        """One epoch over ``order`` (a permutation of the training indices of uint8 ``xtr`` (N, H, W, 3)).

        Returns the epoch's mean loss, training accuracy and last learning rate.
        """
        tr, device = self.tr, self.device
        self.model.train()
        meter = EpochMeter(device, epoch)  # sums on the device: no host sync per step (meter module)
        for step in range(self.steps_per_epoch):
            idx = order[step * tr.batch_size : (step + 1) * tr.batch_size]
            xb, yb = batch_input(xtr, idx, device), ytr[idx].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = self.forward(xb)
                loss = F.cross_entropy(logits.float(), yb, label_smoothing=tr.label_smoothing)
            meter.add(step, loss, yb.shape[0], (logits.argmax(-1) == yb).sum())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.sched.step()
            tick(step, loss.detach(), yb.shape[0])
        return {"loss": meter.mean_loss(), "train_acc": meter.accuracy(), "lr": self.sched.get_last_lr()[0]}

    def evaluate(self, xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor) -> dict:
        return {"test_acc": accuracy(self.model, xte, yte, self.device), "eval_images": int(xte.shape[0])}

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
