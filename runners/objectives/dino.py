"""DINO self-distillation (Caron et al. 2021, facebookresearch/dino ``main_dino.py``), one readable loop.

A student (timm ViT backbone + DINO head) sees 2 global and ``n_local_crops`` local crops of each image;
an EMA teacher (same architecture) sees the 2 global crops. The loss is the cross-entropy between the
teacher's centred, sharpened softmax and the student's softmax over every (teacher global crop,
student crop) pair of different views:

    L = mean_{i in global, j in crops, j != i} mean_b  sum_k  -q_i[b, k] log p_j[b, k]
    q_i = softmax((t_i - c) / tau_t),   p_j = softmax(s_j / tau_s)

The centre ``c`` is an EMA of the teacher's batch mean output (``center_momentum``). Schedules, per
step unless stated: lr linear warmup then cosine to 1e-6; weight decay cosine from
``training.weight_decay`` to ``weight_decay_end`` (weights only, not biases or norms); teacher momentum
cosine from ``momentum_teacher`` to 1; teacher temperature per epoch, linear from
``warmup_teacher_temp`` to ``teacher_temp`` over ``warmup_teacher_temp_epochs``. Gradients are clipped
per parameter (``clip_grad``) and the head's last layer is frozen during the first
``freeze_last_layer_epochs`` epochs, as in DINO.

**The teacher's backbone is the network whose spectra are measured** (``measured``), as in the
Inductive Bottleneck paper. Global crops are made at the dataset's ``image_size`` (so the teacher is a
plain timm ViT at that size and the extraction hooks see the usual token layout); local crops at
``local_crop_size`` (default: half of it, rounded to whole patches) go through the student, built with
``dynamic_img_size=True``.

Crops are made batched on the training device with ``torchvision.ops.roi_align`` (random resized
crop) and tensor arithmetic (flip, colour jitter with hue, grayscale, Gaussian blur, solarisation),
every random draw from one seeded ``torch.Generator`` (``seed + 104729``), so augmentation is
reproducible, separable from init and data order, and resumable; they live in
``runners.objectives.multicrop``.

The settings model (:class:`~runners.objectives.dino_settings.DinoObjective`) and the presets
(``dino_paper``, ``dino_small``) are in ``runners.objectives.dino_settings``, which imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from runners.inputs import batch_input, to_input
from runners.models import build_model
from runners.objectives.base import TrainerSetup
from runners.objectives.dino_settings import DinoObjective
from runners.objectives.meter import EpochMeter, adamw
from runners.objectives.multicrop import MultiCrop

AUG_SEED_OFFSET = 104729
# k-NN monitor: at most this many train / test images, the same seeded subset at every epoch and seed
KNN_TRAIN, KNN_TEST, KNN_SUBSET_SEED = 5000, 2000, 0


# ---- schedules ---------------------------------------------------------------------------------------
def cosine_schedule(
    base: float, final: float, epochs: int, steps_per_epoch: int, warmup_epochs: float = 0, start: float = 0.0
) -> np.ndarray:
    """Per-step values (epochs * steps_per_epoch,): linear warmup start -> base, then cosine base -> final.

    DINO's ``utils.cosine_scheduler``: the W warmup steps are ``linspace(start, base, W)`` (the last
    warmup step is at ``base``), then ``v[t] = final + (base - final) * (1 + cos(pi * t' / T')) / 2``
    with t' the step after warmup and T' the number of post-warmup steps.
    """
    warm = min(round(warmup_epochs * steps_per_epoch), epochs * steps_per_epoch)
    total = epochs * steps_per_epoch
    t = np.arange(total - warm)
    cos = final + 0.5 * (base - final) * (1 + np.cos(np.pi * t / max(1, len(t))))
    return np.concatenate([np.linspace(start, base, warm) if warm else np.zeros(0), cos])


def teacher_temp_schedule(warmup_temp: float, temp: float, warmup_epochs: int, epochs: int) -> np.ndarray:
    """Per-epoch teacher temperature (epochs,): linear warmup_temp -> temp over warmup_epochs, then temp."""
    warm = np.linspace(warmup_temp, temp, warmup_epochs) if warmup_epochs else np.zeros(0)
    return np.concatenate([warm, np.full(max(0, epochs - warmup_epochs), temp)])[:epochs]


# ---- head, loss, EMA -----------------------------------------------------------------------------------
class DINOHead(nn.Module):
    """MLP (in -> hidden -> hidden -> bottleneck, GELU) -> L2 normalise -> weight-normed linear to out_dim.

    Input (B, in_dim), output (B, out_dim) logits. With ``norm_last_layer`` the weight-norm gain is fixed
    at 1 (not trained), which DINO found stabler.
    """

    def __init__(
        self, in_dim: int, out_dim: int, hidden_dim: int, bottleneck_dim: int, norm_last_layer: bool
    ):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, bottleneck_dim),
        )
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = nn.utils.parametrizations.weight_norm(
            nn.Linear(bottleneck_dim, out_dim, bias=False)
        )
        g = self.last_layer.parametrizations.weight.original0
        with torch.no_grad():
            g.fill_(1.0)
        g.requires_grad = not norm_last_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_dim) -> (B, out_dim) float32 logits; under autocast the MLP runs in bf16, the rest not.

        The normalisation and the last layer run in float32 with autocast off: the logits are divided by
        temperatures down to 0.04 and fed to a softmax over up to 65536 prototypes, where bf16's 8-bit
        mantissa (relative error 2^-9 on a logit of |l| <= ||w||) is amplified 25x.
        """
        h = self.mlp(x)
        with torch.autocast(h.device.type, enabled=False):
            wide = torch.promote_types(h.dtype, torch.float32)  # float32 (or float64 if the head is)
            return self.last_layer(F.normalize(h.to(wide), dim=-1, p=2))


class DINOLoss(nn.Module):
    """The DINO loss (module docstring) with the teacher centre as a buffer (1, out_dim)."""

    center: torch.Tensor  # the buffer registered in __init__ (torch types a Module attribute Tensor | Module)

    def __init__(self, out_dim: int, n_crops: int, student_temp: float, center_momentum: float):
        super().__init__()
        self.n_crops, self.student_temp, self.center_momentum = n_crops, student_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(
        self, student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float
    ) -> torch.Tensor:
        """student_out: (n_crops * B, K), crops stacked crop-major; teacher_out: (2 * B, K). -> scalar.

        Computed in float32 whatever the inputs' dtype or an enclosing autocast. Also updates the centre from this batch's teacher outputs (after computing the loss).
        """
        # temperatures and softmaxes in float32 even inside an autocast region (see DINOHead.forward)
        with torch.autocast(student_out.device.type, enabled=False):
            wide = torch.promote_types(student_out.dtype, torch.float32)  # float32, or float64 if given
            student_out, teacher_out = student_out.to(wide), teacher_out.to(wide)
            student = (student_out / self.student_temp).chunk(self.n_crops)
            teacher = F.softmax((teacher_out - self.center) / teacher_temp, dim=-1).detach().chunk(2)
            total: torch.Tensor | float = 0.0
            terms = 0
            for i, q in enumerate(teacher):
                for j, s in enumerate(student):
                    if j == i:  # the same view seen by both: no information to distil
                        continue
                    total = total + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
                    terms += 1
            self.update_center(teacher_out)
        # two global crops (n_crops >= 2): at least the pair (0, 1) was added, so total is a tensor
        assert isinstance(total, torch.Tensor)
        return total / terms

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """c <- m c + (1 - m) mean_b t[b]."""
        batch_center = teacher_out.mean(dim=0, keepdim=True)
        self.center.mul_(self.center_momentum).add_(batch_center * (1 - self.center_momentum))


@torch.no_grad()
def ema_update(student: nn.Module, teacher: nn.Module, momentum: float) -> None:
    """theta_t <- m theta_t + (1 - m) theta_s for every parameter (same order in both networks).

    As ``pt.mul_(m).add_(ps, alpha=1 - m)`` per parameter, in two ``torch._foreach_*`` calls (one
    kernel launch each on CUDA instead of two per parameter; on the CPU the same per-tensor ops).
    """
    ps: list[torch.Tensor] = list(student.parameters())
    pt: list[torch.Tensor] = list(teacher.parameters())
    if len(ps) != len(pt):
        raise ValueError(f"student has {len(ps)} parameters, teacher {len(pt)}")
    torch._foreach_mul_(pt, momentum)
    torch._foreach_add_(pt, [p.detach() for p in ps], alpha=1 - momentum)


@torch.no_grad()
def clip_gradients(params: list[torch.Tensor], clip: float) -> None:
    """Per-parameter clipping as DINO's ``clip_gradients``: g <- g * min(1, clip / (||g||_2 + 1e-6)).

    With ``torch._foreach_*`` (a handful of launches on CUDA for every parameter, no host sync); the
    arithmetic of ``g.mul_(torch.clamp(clip / (g.norm(2) + 1e-6), max=1.0))``, bitwise (``c / t`` is
    ``t.reciprocal() * c`` in torch).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    scale = torch._foreach_add(torch._foreach_norm(grads, 2), 1e-6)
    torch._foreach_reciprocal_(scale)
    torch._foreach_mul_(scale, clip)
    torch._foreach_clamp_max_(scale, 1.0)
    torch._foreach_mul_(grads, scale)


# ---- evaluation --------------------------------------------------------------------------------------
@torch.no_grad()
def knn_accuracy(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    test_labels: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
) -> float:
    """DINO's weighted k-NN: cosine similarity, top-k neighbours vote with weight exp(sim / T).

    Args: feats (N, D) and labels (N,) for train and test. Returns the test accuracy in [0, 1].
    """
    n_classes = int(max(train_labels.max(), test_labels.max())) + 1
    tr, te = F.normalize(train_feats.float(), dim=1), F.normalize(test_feats.float(), dim=1)
    sim, idx = (te @ tr.T).topk(min(k, tr.shape[0]), dim=1)
    votes = torch.zeros(te.shape[0], n_classes).scatter_add_(1, train_labels[idx], (sim / temperature).exp())
    return (votes.argmax(1) == test_labels).float().mean().item()


@torch.no_grad()
def collapse_monitor(
    logits: torch.Tensor, center: torch.Tensor, teacher_temp: float, feats: torch.Tensor
) -> dict[str, float]:
    """DINO's collapse diagnostics of the teacher on a fixed set of images (float64).

    Args:
        logits: the teacher head's outputs (N, K) for N images (uncentred).
        center: the loss's centre (1, K).
        teacher_temp: the teacher temperature now.
        feats: the teacher backbone's pooled features (N, D) of the same images.

    Returns:
        ``teacher_entropy``: mean over images of H(q_n) in nats, q_n = softmax((t_n - c) / tau_t); ln K
        when the targets are uniform (collapse to uniform, what centring alone drives towards).
        ``teacher_kl_mean``: mean over images of KL(q_n || q_bar), q_bar the mean of q_n over the images
        (the distribution the centre tracks): 0 when every image gets the same target, collapse of either
        kind (uniform, or one dominant prototype); it is the mutual information between image and
        prototype, at most ln K.
        ``feature_spread``: sqrt(mean_n ||f_n - f_bar||^2) of the L2-normalised features f_n: 0 when
        every image has the same representation, at most 1.
    """
    z = (logits.double() - center.double()) / teacher_temp
    logq = F.log_softmax(z, dim=-1)
    q = logq.exp()
    log_mean = q.mean(0).clamp_min(torch.finfo(torch.float64).tiny).log()
    f = F.normalize(feats.double(), dim=1)
    return {
        "teacher_entropy": float(-(q * logq).sum(1).mean()),
        "teacher_kl_mean": float((q * (logq - log_mean)).sum(1).mean()),
        "feature_spread": float((f - f.mean(0)).square().sum(1).mean().sqrt()),
    }


def knn_subset(n: int, cap: int, seed: int = KNN_SUBSET_SEED) -> torch.Tensor:
    """Indices (min(n, cap),) of the images the k-NN monitor uses from a split of ``n`` images.

    Every image when ``n <= cap``; otherwise a seeded uniform random subset, sorted. Never the first
    ``cap``: disk datasets are stored class by class (Tiny ImageNet: 500 images per class in order), where
    the first 5,000 training images hold 10 of 200 classes.
    """
    if n <= cap:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:cap].sort().values


@torch.no_grad()
def features(
    backbone: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256
) -> torch.Tensor:
    """Pooled backbone features (N, D), on the CPU, of uint8 images (N, H, W, 3)."""
    was = backbone.training
    backbone.eval()
    out = torch.cat(
        [
            backbone(to_input(x[i : i + batch_size], device)).float().cpu()
            for i in range(0, len(x), batch_size)
        ]
    )
    backbone.train(was)
    return out


# ---- the trainer ----------------------------------------------------------------------------------------
class DinoTrainer:
    """Student/teacher pair, optimiser, loss and schedules of one DINO run (see the module docstring)."""

    def __init__(self, setup: TrainerSetup[DinoObjective], device: torch.device) -> None:
        tr, o, steps_per_epoch = setup.training, setup.objective, setup.steps_per_epoch
        self.tr, self.o, self.device, self.steps_per_epoch = tr, o, device, steps_per_epoch
        self.local_size = o.local_size(setup.image_size, int(setup.model.patch_size or 16))
        student = build_model(setup.model, setup.image_size, 0, dynamic_img_size=True)
        # the teacher has no stochastic depth (DINO builds it without drop path)
        teacher = build_model(setup.model.model_copy(update={"drop_path_rate": 0.0}), setup.image_size, 0)
        # num_features: timm's int attribute (torch types a Module attribute Tensor | Module)
        head = partial(
            DINOHead,
            in_dim=cast(int, student.num_features),
            out_dim=o.out_dim,
            hidden_dim=o.hidden_dim,
            bottleneck_dim=o.bottleneck_dim,
            norm_last_layer=o.norm_last_layer,
        )
        self.student = nn.ModuleDict({"backbone": student, "head": head()}).to(device)
        self.teacher = nn.ModuleDict({"backbone": teacher, "head": head()}).to(device)
        self.teacher.load_state_dict(self.student.state_dict())  # teacher starts as the student
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.measured = self.teacher["backbone"]
        self.knn_train, self.knn_test = KNN_TRAIN, KNN_TEST
        compile_ = tr.compile and device.type == "cuda"
        # dynamic=False: the student sees two shapes (global and local crops); without it the second shape
        # recompiles the graph with symbolic sizes (slower to build and to run) instead of a static second
        self.student_backbone = torch.compile(student, dynamic=False) if compile_ else student
        self.teacher_backbone = torch.compile(teacher, dynamic=False) if compile_ else teacher

        n_crops = 2 + o.n_local_crops
        self.loss_fn = DINOLoss(o.out_dim, n_crops, o.student_temp, o.center_momentum).to(device)
        # weight decay on weights only, not on biases and norm gains (DINO's get_params_groups)
        params = [p for p in self.student.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.opt = adamw(groups, device, lr=tr.lr)
        e, s = tr.epochs, steps_per_epoch
        self.lr = cosine_schedule(tr.lr, 1e-6, e, s, tr.warmup_epochs)
        self.wd = cosine_schedule(tr.weight_decay, o.weight_decay_end, e, s)
        self.momentum = cosine_schedule(o.momentum_teacher, 1.0, e, s)
        self.teacher_temp = teacher_temp_schedule(
            o.warmup_teacher_temp, o.teacher_temp, o.warmup_teacher_temp_epochs, e
        )
        self.temp_now = float(self.teacher_temp[0])  # of the last epoch trained (the first before any)
        self.aug_gen = torch.Generator().manual_seed(setup.seed + AUG_SEED_OFFSET)
        self.crops = MultiCrop(
            setup.image_size,
            self.local_size,
            o.n_local_crops,
            o.global_crop_scale,
            o.local_crop_scale,
            self.aug_gen,
            jitter=o.jitter(),
            gray_p=o.gray_p(),
        )

    def student_forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        """Crops of one resolution go through the backbone together; -> head logits ((n_crops*B), K)."""
        feats = [self.student_backbone(torch.cat(crops[:2]))]
        if len(crops) > 2:
            feats.append(self.student_backbone(torch.cat(crops[2:])))
        return self.student["head"](torch.cat(feats))

    def train_epoch(
        self,
        epoch: int,
        xtr: torch.Tensor,
        ytr: torch.Tensor,
        order: torch.Tensor,
        tick: Callable[[int, float, int], None],
    ) -> dict:
        """One epoch of DINO over ``order`` (labels unused). Returns loss and the schedules' last values."""
        tr, o, device = self.tr, self.o, self.device
        self.student.train()
        temp = self.temp_now = float(self.teacher_temp[epoch - 1])
        meter = EpochMeter(device, epoch)  # sums on the device: no host sync per step (meter module)
        for step in range(self.steps_per_epoch):
            it = (epoch - 1) * self.steps_per_epoch + step
            for i, group in enumerate(self.opt.param_groups):
                group["lr"] = float(self.lr[it])
                if i == 0:
                    group["weight_decay"] = float(self.wd[it])
            idx = order[step * tr.batch_size : (step + 1) * tr.batch_size]
            crops = self.crops(batch_input(xtr, idx, device))
            # bf16 autocast on CUDA for the backbones and the head's MLP; the head's last layer and the
            # loss (temperatures, softmaxes) run in float32 (DINOHead.forward, DINOLoss.forward)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                with torch.no_grad():
                    teacher_out = self.teacher["head"](self.teacher_backbone(torch.cat(crops[:2])))
                student_out = self.student_forward(crops)
                loss = self.loss_fn(student_out, teacher_out, temp)
            meter.add(step, loss, len(idx))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if o.clip_grad:
                clip_gradients(list(self.student.parameters()), o.clip_grad)
            if epoch - 1 < o.freeze_last_layer_epochs:
                for p in self.student["head"].get_submodule("last_layer").parameters():
                    p.grad = None
            self.opt.step()
            ema_update(self.student, self.teacher, float(self.momentum[it]))
            tick(step, loss.detach(), len(idx))
        return {
            "loss": meter.mean_loss(),
            "lr": float(self.lr[it]),
            "weight_decay": float(self.wd[it]),
            "teacher_momentum": float(self.momentum[it]),
            "teacher_temp": temp,
        }

    def evaluate(self, xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor) -> dict:
        """Weighted k-NN (k=20) accuracy of the teacher's features on ``knn_subset`` of each split, the
        test images it used (``eval_images``), and the teacher's collapse diagnostics
        (:func:`collapse_monitor`) on the k-NN training images at the current teacher temperature."""
        tr, te = knn_subset(len(xtr), self.knn_train), knn_subset(len(xte), self.knn_test)
        ftr = features(self.measured, xtr[tr], self.device)
        fte = features(self.measured, xte[te], self.device)
        out = {"knn_acc": knn_accuracy(ftr, ytr[tr], fte, yte[te]), "eval_images": len(te)}
        if self.measured is self.teacher["backbone"]:  # (a test may stand another network in for it)
            with torch.no_grad():
                head = self.teacher["head"]
                logits = torch.cat(
                    [head(ftr[i : i + 1024].to(self.device)).cpu() for i in range(0, len(ftr), 1024)]
                )
            out.update(collapse_monitor(logits, self.loss_fn.center.cpu(), self.temp_now, ftr))
        return out

    def state_dict(self) -> dict:
        return {
            "student": self.student.state_dict(),
            "teacher": self.teacher.state_dict(),
            "opt": self.opt.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "aug_gen": self.aug_gen.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.student.load_state_dict(state["student"])
        self.teacher.load_state_dict(state["teacher"])
        self.opt.load_state_dict(state["opt"])
        self.loss_fn.load_state_dict(state["loss"])
        self.aug_gen.set_state(state["aug_gen"])
