"""DINO's training step equals an independent implementation on the same inputs.

The reference is built from lightly's DINO parts (``DINOProjectionHead``, ``DINOLoss`` with its own
teacher-temperature schedule, ``update_momentum``, ``get_weight_decay_parameters``,
``cancel_last_layer_gradients``) and, where lightly has none, facebookresearch/dino's ``main_dino.py`` /
``utils.py`` formulas written out here (``cosine_scheduler``, per-parameter ``clip_gradients``, the lr and
weight-decay set per iteration with the decay on the first group only). Both run in float64 on the same
fixed crops and initial weights; losses, the first step's gradients, the centre and every weight after
several steps (across the last-layer freeze and the temperature warmup) must agree to 1e-6 relative.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from runners.objectives import TrainerSetup
from runners.objectives.dino import DINOHead, DinoTrainer

lightly_heads = pytest.importorskip("lightly.models.modules.heads")
lightly_loss = pytest.importorskip("lightly.loss")
lightly_utils = pytest.importorskip("lightly.models.utils")

B, STEPS_PER_EPOCH, EPOCHS, N_LOCAL = 6, 2, 3, 2
RUN = {
    "seed": 0,
    "model": {"name": "vit_small_patch16_224", "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2},
    "training": {"epochs": EPOCHS, "batch_size": B, "lr": 2e-3, "weight_decay": 0.04, "warmup_epochs": 1},
    "objective": {
        "kind": "dino",
        "out_dim": 32,
        "hidden_dim": 24,
        "bottleneck_dim": 8,
        "norm_last_layer": False,  # the weight-norm gain trains too: the harder case for the freeze
        "n_local_crops": N_LOCAL,
        "student_temp": 0.1,
        "teacher_temp": 0.07,
        "warmup_teacher_temp": 0.04,
        "warmup_teacher_temp_epochs": 2,
        "center_momentum": 0.9,
        "momentum_teacher": 0.9,
        "weight_decay_end": 0.4,
        "freeze_last_layer_epochs": 1,
        "clip_grad": 0.05,  # small enough that some parameters' gradients are clipped
    },
}


def dino_cosine_scheduler(base, final, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0.0):
    """facebookresearch/dino ``utils.cosine_scheduler``, as its formula reads."""
    warmup = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup = np.linspace(start_warmup_value, base, warmup_iters)
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))
    return np.concatenate((warmup, schedule))


def dino_clip_gradients(model: torch.nn.Module, clip: float) -> None:
    """facebookresearch/dino ``utils.clip_gradients``: each parameter's gradient to norm <= clip."""
    for p in model.parameters():
        if p.grad is not None:
            coef = clip / (p.grad.norm(2) + 1e-6)
            if coef < 1:
                p.grad.mul_(coef)


def lightly_head_from(ours: DINOHead, norm_last_layer: bool):
    """lightly's DINOProjectionHead holding the same weights as ours (float64)."""
    lin = [m for m in ours.mlp if isinstance(m, torch.nn.Linear)]
    head = lightly_heads.DINOProjectionHead(
        input_dim=lin[0].in_features,
        hidden_dim=lin[0].out_features,
        bottleneck_dim=lin[-1].out_features,
        output_dim=ours.last_layer.out_features,
        batch_norm=False,
        freeze_last_layer=RUN["objective"]["freeze_last_layer_epochs"],
        norm_last_layer=norm_last_layer,
    ).double()
    theirs = [m for m in head.layers if isinstance(m, torch.nn.Linear)]
    assert len(theirs) == len(lin) == 3
    with torch.no_grad():
        for a, b in zip(lin, theirs, strict=True):
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)
        w = ours.last_layer.parametrizations.weight
        head.last_layer.weight_g.copy_(w.original0)
        head.last_layer.weight_v.copy_(w.original1)
    return head


def test_head_equals_lightlys_on_the_same_weights():
    torch.manual_seed(0)
    for norm_last in (True, False):
        ours = DINOHead(16, 32, hidden_dim=24, bottleneck_dim=8, norm_last_layer=norm_last).double()
        theirs = lightly_head_from(ours, norm_last)
        x = torch.randn(7, 16, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)
        g = ours.last_layer.parametrizations.weight.original0
        assert g.requires_grad == theirs.last_layer.weight_g.requires_grad == (not norm_last)


class _FixedCrops:
    """Stands in for MultiCrop: the precomputed crops of each step, in order."""

    def __init__(self, crops: list[list[torch.Tensor]]):
        self.crops, self.i = crops, 0

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.crops[self.i]
        self.i += 1
        return out


def _crops(n_steps: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        [torch.randn(B, 3, 16, 16, generator=g, dtype=torch.float64) for _ in range(2)]
        + [torch.randn(B, 3, 8, 8, generator=g, dtype=torch.float64) for _ in range(N_LOCAL)]
        for _ in range(n_steps)
    ]


def _grads(module: torch.nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _lightly_reference(trainer, crops):
    """The reference run: the same initial weights in lightly's modules, main_dino's loop over ``crops``;
    returns the four modules, the loss (with its centre), the losses and the first step's gradients."""
    o, tr = RUN["objective"], RUN["training"]
    s_backbone = copy.deepcopy(trainer.student["backbone"])
    s_head = lightly_head_from(trainer.student["head"], o["norm_last_layer"])
    t_backbone = copy.deepcopy(trainer.teacher["backbone"])
    t_head = lightly_head_from(trainer.teacher["head"], o["norm_last_layer"])
    lightly_utils.deactivate_requires_grad(t_backbone)
    lightly_utils.deactivate_requires_grad(t_head)
    loss_fn = lightly_loss.DINOLoss(
        output_dim=o["out_dim"],
        warmup_teacher_temp=o["warmup_teacher_temp"],
        teacher_temp=o["teacher_temp"],
        warmup_teacher_temp_epochs=o["warmup_teacher_temp_epochs"],
        student_temp=o["student_temp"],
        center_momentum=o["center_momentum"],
    ).double()
    decay, no_decay = lightly_utils.get_weight_decay_parameters([s_backbone, s_head])
    decay = [p for p in decay if p.requires_grad]
    no_decay = [p for p in no_decay if p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=tr["lr"])
    n_iter = EPOCHS * STEPS_PER_EPOCH
    lr = dino_cosine_scheduler(tr["lr"], 1e-6, EPOCHS, STEPS_PER_EPOCH, tr["warmup_epochs"])
    wd = dino_cosine_scheduler(tr["weight_decay"], o["weight_decay_end"], EPOCHS, STEPS_PER_EPOCH)
    mom = dino_cosine_scheduler(o["momentum_teacher"], 1.0, EPOCHS, STEPS_PER_EPOCH)
    assert len(lr) == len(wd) == len(mom) == n_iter
    np.testing.assert_allclose(trainer.lr, lr, rtol=1e-12)
    np.testing.assert_allclose(trainer.wd, wd, rtol=1e-12)
    np.testing.assert_allclose(trainer.momentum, mom, rtol=1e-12)

    ref_losses, ref_first_grads = [], None
    for it in range(n_iter):
        epoch = it // STEPS_PER_EPOCH  # 0-based, as main_dino counts
        for i, group in enumerate(opt.param_groups):
            group["lr"] = lr[it]
            if i == 0:
                group["weight_decay"] = wd[it]
        views = crops[it]
        with torch.no_grad():
            teacher_out = [t_head(t_backbone(v)) for v in views[:2]]
        student_out = [s_head(s_backbone(v)) for v in views]
        loss = loss_fn(teacher_out, student_out, epoch=epoch)
        opt.zero_grad()
        loss.backward()
        dino_clip_gradients(torch.nn.ModuleList([s_backbone, s_head]), o["clip_grad"])
        s_head.cancel_last_layer_gradients(epoch)
        if it == 0:
            ref_first_grads = _grads(s_backbone) + _grads(s_head)
        opt.step()
        lightly_utils.update_momentum(s_backbone, t_backbone, mom[it])
        lightly_utils.update_momentum(s_head, t_head, mom[it])
        ref_losses.append(loss.item())

    return (s_backbone, s_head, t_backbone, t_head), loss_fn, ref_losses, ref_first_grads


def test_training_steps_equal_lightly_and_main_dino_on_fixed_crops_and_weights():
    torch.manual_seed(0)
    o = RUN["objective"]
    trainer = DinoTrainer(
        TrainerSetup.from_run(RUN, 2, 16, steps_per_epoch=STEPS_PER_EPOCH), torch.device("cpu")
    )
    trainer.student.double()
    trainer.teacher.double()
    trainer.loss_fn.double()
    crops = _crops(EPOCHS * STEPS_PER_EPOCH)

    (s_backbone, s_head, t_backbone, t_head), loss_fn, ref_losses, ref_first_grads = _lightly_reference(
        trainer, crops
    )

    # ---- ours, on the same crops ------------------------------------------------------------------------
    trainer.crops = _FixedCrops(crops)
    our_losses, our_first_grads = [], None
    real_step = trainer.opt.step

    def step_and_keep_first_grads(*a, **k):
        nonlocal our_first_grads
        if our_first_grads is None:
            our_first_grads = _grads(trainer.student["backbone"]) + _grads(trainer.student["head"])
        return real_step(*a, **k)

    trainer.opt.step = step_and_keep_first_grads
    x, y = torch.zeros(B, 16, 16, 3, dtype=torch.uint8), torch.zeros(B, dtype=torch.long)
    for epoch in range(1, EPOCHS + 1):
        trainer.train_epoch(
            epoch, x, y, torch.arange(B), lambda step, loss, n: our_losses.append(float(loss))
        )

    np.testing.assert_allclose(our_losses, ref_losses, rtol=1e-6)
    assert ref_first_grads is not None and our_first_grads is not None
    assert len(our_first_grads) == len(ref_first_grads)
    n_clipped = 0
    for ours_g, ref_g in zip(our_first_grads, ref_first_grads, strict=True):
        assert (ours_g is None) == (ref_g is None)  # the frozen last layer has no gradient in epoch 0
        if ours_g is not None:
            torch.testing.assert_close(ours_g, ref_g, rtol=1e-6, atol=1e-9)
            n_clipped += bool(ours_g.norm() > o["clip_grad"] * (1 - 1e-6) * 0.999)
    assert n_clipped > 0  # the clip acted on some parameters
    pairs = [
        (trainer.student["backbone"], s_backbone),
        (trainer.student["head"], s_head),
        (trainer.teacher["backbone"], t_backbone),
        (trainer.teacher["head"], t_head),
    ]
    for ours_m, ref_m in pairs:
        for a, b in zip(ours_m.parameters(), ref_m.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    # the centre is a mean of the teacher outputs: weights equal to 1e-9 give it to 1e-8
    torch.testing.assert_close(trainer.loss_fn.center, loss_fn.center.reshape(1, -1), rtol=1e-6, atol=1e-8)
    # the student's last layer moved only after the freeze (epoch 0 cancels its gradient in both)
    assert not torch.equal(
        trainer.student["head"].last_layer.parametrizations.weight.original1,
        trainer.teacher["head"].last_layer.parametrizations.weight.original1,
    )
