"""What a training step shares across objectives: the epoch's loss bookkeeping on the device, AdamW.

Reading a CUDA tensor on the host (``loss.item()``, ``if not torch.isfinite(loss)``) waits until the
device has finished every queued kernel, so the host cannot prepare the next step while the device
computes the current one. :class:`EpochMeter` sums the loss (float64, as the Python float sum it
replaces: bitwise the same totals) and counts on the device, remembers the first step whose loss was
not finite, and looks at that only every ``check_every`` steps (1 on the CPU, where reading costs
nothing: a non-finite loss stops the epoch at that very step, as it always did).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from vitstudy_core.errors import RunFailedError

CUDA_CHECK_EVERY = 50  # steps between two looks at the non-finite flag on a device (one sync each)
CPU_CHECK_EVERY = 1  # on the CPU a look costs nothing: stop at the first non-finite step


class EpochMeter:
    """Sums of ``loss * n`` and of correct predictions over an epoch, and the first non-finite step.

    Args:
        device: the training device (where the sums live).
        epoch: the epoch being trained (for the error).
        check_every: steps between checks of the non-finite flag; None: ``CPU_CHECK_EVERY`` (1) on
            the CPU, else ``CUDA_CHECK_EVERY``.
    """

    def __init__(self, device: torch.device, epoch: int, check_every: int | None = None) -> None:
        self.epoch, self.device = epoch, device
        self.check_every = check_every or (CPU_CHECK_EVERY if device.type == "cpu" else CUDA_CHECK_EVERY)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.seen = 0

    def add(self, step: int, loss: torch.Tensor, n: int, correct: torch.Tensor | None = None) -> None:
        """Record step ``step``'s mean loss (0-d) over ``n`` images; raise if a non-finite loss is seen.

        Raises:
            RunFailedError: "non-finite loss at step S" (S: the first such step of the epoch), at the
                first check at or after step S.
        """
        loss = loss.detach()
        if self.check_every == 1:  # the CPU: stop at once, before the sums see it (reading is free)
            if not torch.isfinite(loss):
                raise RunFailedError(f"non-finite loss at step {step}", self.epoch)
        else:
            bad = ~torch.isfinite(loss) & (self.first_bad < 0)
            self.first_bad = torch.where(bad, step, self.first_bad)
        self.loss_sum += loss.double() * n
        if correct is not None:
            self.correct += correct
        self.seen += n
        if self.check_every > 1 and (step + 1) % self.check_every == 0:
            self.check()

    def check(self) -> None:
        """Raise RunFailedError if any step so far had a non-finite loss (one host sync on a device)."""
        first = int(self.first_bad)
        if first >= 0:
            raise RunFailedError(f"non-finite loss at step {first}", self.epoch)

    def mean_loss(self) -> float:
        """The epoch's mean loss per image (checks the non-finite flag first)."""
        self.check()
        return float(self.loss_sum) / self.seen

    def accuracy(self) -> float:
        """Correct predictions / images seen."""
        return int(self.correct) / self.seen


def adamw(params: Iterable[Any], device: torch.device, **kwargs: Any) -> torch.optim.AdamW:
    """``torch.optim.AdamW``; on CUDA the fused kernel (one launch for every parameter, no host sync).

    Elsewhere torch's default, unchanged (so CPU optimiser states and results stay as they were).
    """
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(params, **kwargs)
