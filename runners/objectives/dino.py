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
crop) and tensor arithmetic (flip, colour jitter without hue, grayscale, Gaussian blur, solarisation),
every random draw from one seeded ``torch.Generator`` (``seed + 104729``), so augmentation is
reproducible, separable from init and data order, and resumable.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from core.errors import RunFailedError
from runners.inputs import MEAN as _MEAN
from runners.inputs import STD as _STD
from runners.inputs import to_input
from runners.models import build_model

AUG_SEED_OFFSET = 104729


# ---- schedules ---------------------------------------------------------------------------------------
def cosine_schedule(
    base: float, final: float, epochs: int, steps_per_epoch: int, warmup_epochs: float = 0, start: float = 0.0
) -> np.ndarray:
    """Per-step values (epochs * steps_per_epoch,): linear warmup start -> base, then cosine base -> final.

    ``v[t] = final + (base - final) * (1 + cos(pi * t' / T')) / 2`` after warmup, with t' the step
    after warmup and T' the number of post-warmup steps (DINO's ``utils.cosine_scheduler``).
    """
    warm = min(round(warmup_epochs * steps_per_epoch), epochs * steps_per_epoch)
    total = epochs * steps_per_epoch
    t = np.arange(total - warm)
    cos = final + 0.5 * (base - final) * (1 + np.cos(np.pi * t / max(1, len(t))))
    return np.concatenate([np.linspace(start, base, warm, endpoint=False) if warm else np.zeros(0), cos])


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
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))


class DINOLoss(nn.Module):
    """The DINO loss (module docstring) with the teacher centre as a buffer (1, out_dim)."""

    def __init__(self, out_dim: int, n_crops: int, student_temp: float, center_momentum: float):
        super().__init__()
        self.n_crops, self.student_temp, self.center_momentum = n_crops, student_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(
        self, student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float
    ) -> torch.Tensor:
        """student_out: (n_crops * B, K), crops stacked crop-major; teacher_out: (2 * B, K). -> scalar.

        Also updates the centre from this batch's teacher outputs (after computing the loss).
        """
        student = (student_out / self.student_temp).chunk(self.n_crops)
        teacher = F.softmax((teacher_out - self.center) / teacher_temp, dim=-1).detach().chunk(2)
        total, terms = 0.0, 0
        for i, q in enumerate(teacher):
            for j, s in enumerate(student):
                if j == i:  # the same view seen by both: no information to distil
                    continue
                total = total + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
                terms += 1
        self.update_center(teacher_out)
        return total / terms

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """c <- m c + (1 - m) mean_b t[b]."""
        batch_center = teacher_out.mean(dim=0, keepdim=True)
        self.center.mul_(self.center_momentum).add_(batch_center * (1 - self.center_momentum))


@torch.no_grad()
def ema_update(student: nn.Module, teacher: nn.Module, momentum: float) -> None:
    """theta_t <- m theta_t + (1 - m) theta_s for every parameter (same order in both networks)."""
    for ps, pt in zip(student.parameters(), teacher.parameters(), strict=True):
        pt.mul_(momentum).add_(ps.detach(), alpha=1 - momentum)


# ---- multi-crop augmentation -----------------------------------------------------------------------------
class MultiCrop:
    """Batched DINO crops of normalised images (B, 3, H, W) -> [global_1, global_2, local_1, ...].

    Global crops: (B, 3, H, W), area fraction in ``global_scale``; local crops: (B, 3, local, local),
    area fraction in ``local_scale``; aspect ratio log-uniform in [3/4, 4/3]. Then, as in DINO:
    horizontal flip (p 0.5), colour jitter (p 0.8; brightness 0.4, contrast 0.4, saturation 0.2; hue
    is left out), grayscale (p 0.2), Gaussian blur (p 1.0 / 0.1 / 0.5 for global 1 / global 2 / local,
    sigma U(0.1, 2.0) scaled by image size / 224), solarisation (p 0.2, global 2 only).
    """

    def __init__(
        self,
        image_size: int,
        local_size: int,
        n_local: int,
        global_scale: tuple[float, float],
        local_scale: tuple[float, float],
        generator: torch.Generator,
    ):
        self.image_size, self.local_size, self.n_local = image_size, local_size, n_local
        self.global_scale, self.local_scale, self.gen = global_scale, local_scale, generator

    def _u(self, n: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=self.gen)

    def _resized_crop(self, x: torch.Tensor, size: int, scale: tuple[float, float]) -> torch.Tensor:
        b, _, h, w = x.shape
        area = self._u(b, *scale) * h * w
        ratio = torch.exp(self._u(b, math.log(3 / 4), math.log(4 / 3)))
        cw = torch.sqrt(area * ratio).clamp(1, w)
        ch = torch.sqrt(area / ratio).clamp(1, h)
        x0, y0 = self._u(b) * (w - cw), self._u(b) * (h - ch)
        boxes = torch.stack([torch.arange(b, dtype=torch.float32), x0, y0, x0 + cw, y0 + ch], dim=1)
        return roi_align(x, boxes.to(x.device, x.dtype), (size, size), spatial_scale=1.0, aligned=True)

    def _blur(self, x: torch.Tensor, p: float) -> torch.Tensor:
        b, c, h, w = x.shape
        apply = self._u(b) < p
        sigma = self._u(b, 0.1, 2.0) * self.image_size / 224
        radius = max(1, math.ceil(3 * float(sigma.max())))
        t = torch.arange(-radius, radius + 1, dtype=torch.float32)
        k = torch.exp(-(t[None] ** 2) / (2 * sigma[:, None] ** 2))
        k = (k / k.sum(1, keepdim=True)).to(x.device, x.dtype)  # (B, 2r+1), one kernel per image
        kk = k.repeat_interleave(c, 0)[:, None]  # (B*C, 1, 2r+1)
        y = x.reshape(1, b * c, h, w)
        y = F.conv2d(F.pad(y, (radius, radius, 0, 0), mode="replicate"), kk[:, :, None, :], groups=b * c)
        y = F.conv2d(F.pad(y, (0, 0, radius, radius), mode="replicate"), kk[:, :, :, None], groups=b * c)
        return torch.where(apply.to(x.device)[:, None, None, None], y.reshape(b, c, h, w), x)

    def _colour(self, x: torch.Tensor, blur_p: float, solarize_p: float) -> torch.Tensor:
        b, dev = x.shape[0], x.device

        def per(v: torch.Tensor) -> torch.Tensor:
            return v.to(dev, x.dtype)[:, None, None, None]

        x = torch.where(per(self._u(b) < 0.5) > 0, x.flip(-1), x)
        x = x * _STD + _MEAN  # colour operations work on [0, 1] intensities
        jitter = per(self._u(b) < 0.8) > 0
        y = x * per(self._u(b, 0.6, 1.4))
        mean = y.mean(dim=(1, 2, 3), keepdim=True)
        y = (y - mean) * per(self._u(b, 0.6, 1.4)) + mean
        gray = (0.299 * y[:, :1] + 0.587 * y[:, 1:2] + 0.114 * y[:, 2:]).expand_as(y)
        y = (y - gray) * per(self._u(b, 0.8, 1.2)) + gray
        x = torch.where(jitter, y.clamp(0, 1), x)
        gray = (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]).expand_as(x)
        x = torch.where(per(self._u(b) < 0.2) > 0, gray, x)
        x = self._blur(x, blur_p)
        if solarize_p > 0:
            x = torch.where((per(self._u(b) < solarize_p) > 0) & (x >= 0.5), 1 - x, x)
        return (x - _MEAN) / _STD

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        crops = [
            self._colour(self._resized_crop(x, self.image_size, self.global_scale), 1.0, 0.0),
            self._colour(self._resized_crop(x, self.image_size, self.global_scale), 0.1, 0.2),
        ]
        for _ in range(self.n_local):
            crops.append(self._colour(self._resized_crop(x, self.local_size, self.local_scale), 0.5, 0.0))
        return crops


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

    def __init__(
        self, run: dict, n_classes: int, image_size: int, steps_per_epoch: int, device: torch.device
    ) -> None:
        tr, o = run["training"], run["objective"]
        self.tr, self.o, self.device, self.steps_per_epoch = tr, o, device, steps_per_epoch
        patch = int(run["model"].get("patch_size", 16))
        self.local_size = o.get("local_crop_size") or max(patch, round(image_size / 2 / patch) * patch)
        student = build_model(run["model"], image_size, 0, dynamic_img_size=True)
        # the teacher has no stochastic depth (DINO builds it without drop path)
        teacher = build_model({**run["model"], "drop_path_rate": 0.0}, image_size, 0)
        head = dict(
            in_dim=student.num_features,
            out_dim=o["out_dim"],
            hidden_dim=o["hidden_dim"],
            bottleneck_dim=o["bottleneck_dim"],
            norm_last_layer=o["norm_last_layer"],
        )
        self.student = nn.ModuleDict({"backbone": student, "head": DINOHead(**head)}).to(device)
        self.teacher = nn.ModuleDict({"backbone": teacher, "head": DINOHead(**head)}).to(device)
        self.teacher.load_state_dict(self.student.state_dict())  # teacher starts as the student
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.measured = self.teacher["backbone"]
        compile_ = tr.get("compile") and device.type == "cuda"
        self.student_backbone = torch.compile(student) if compile_ else student
        self.teacher_backbone = torch.compile(teacher) if compile_ else teacher

        n_crops = 2 + o["n_local_crops"]
        self.loss_fn = DINOLoss(o["out_dim"], n_crops, o["student_temp"], o["center_momentum"]).to(device)
        # weight decay on weights only, not on biases and norm gains (DINO's get_params_groups)
        params = [p for p in self.student.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        self.opt = torch.optim.AdamW(
            [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=tr["lr"]
        )
        e, s = tr["epochs"], steps_per_epoch
        self.lr = cosine_schedule(tr["lr"], 1e-6, e, s, tr["warmup_epochs"])
        self.wd = cosine_schedule(tr["weight_decay"], o["weight_decay_end"], e, s)
        self.momentum = cosine_schedule(o["momentum_teacher"], 1.0, e, s)
        self.teacher_temp = teacher_temp_schedule(
            o["warmup_teacher_temp"], o["teacher_temp"], o["warmup_teacher_temp_epochs"], e
        )
        self.aug_gen = torch.Generator().manual_seed(run["seed"] + AUG_SEED_OFFSET)
        self.crops = MultiCrop(
            image_size,
            self.local_size,
            o["n_local_crops"],
            o["global_crop_scale"],
            o["local_crop_scale"],
            self.aug_gen,
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
        temp = float(self.teacher_temp[epoch - 1])
        loss_sum, seen = 0.0, 0
        for step in range(self.steps_per_epoch):
            it = (epoch - 1) * self.steps_per_epoch + step
            for i, group in enumerate(self.opt.param_groups):
                group["lr"] = float(self.lr[it])
                if i == 0:
                    group["weight_decay"] = float(self.wd[it])
            idx = order[step * tr["batch_size"] : (step + 1) * tr["batch_size"]]
            crops = self.crops(to_input(xtr[idx], device))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                with torch.no_grad():
                    teacher_out = self.teacher["head"](self.teacher_backbone(torch.cat(crops[:2])))
                student_out = self.student_forward(crops)
            loss = self.loss_fn(student_out.float(), teacher_out.float(), temp)
            if not torch.isfinite(loss):
                raise RunFailedError(f"non-finite loss at step {step}", epoch)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if o["clip_grad"]:
                for p in self.student.parameters():  # per-parameter clipping, as DINO's clip_gradients
                    if p.grad is not None:
                        norm = p.grad.norm(2)
                        p.grad.mul_(torch.clamp(o["clip_grad"] / (norm + 1e-6), max=1.0))
            if epoch - 1 < o["freeze_last_layer_epochs"]:
                for p in self.student["head"].last_layer.parameters():
                    p.grad = None
            self.opt.step()
            ema_update(self.student, self.teacher, float(self.momentum[it]))
            loss_sum += loss.item() * len(idx)
            seen += len(idx)
            tick(step, loss.item(), len(idx))
        return {
            "loss": loss_sum / seen,
            "lr": float(self.lr[it]),
            "weight_decay": float(self.wd[it]),
            "teacher_momentum": float(self.momentum[it]),
            "teacher_temp": temp,
        }

    def evaluate(self, xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor) -> dict:
        """Weighted k-NN (k=20) accuracy of the teacher's features: up to 5000 train / 2000 test images."""
        ftr = features(self.measured, xtr[:5000], self.device)
        fte = features(self.measured, xte[:2000], self.device)
        return {"knn_acc": knn_accuracy(ftr, ytr[:5000], fte, yte[:2000])}

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
