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
reproducible, separable from init and data order, and resumable.

The settings model (:class:`~runners.objectives.dino_settings.DinoObjective`) and the presets
(``dino_paper``, ``dino_small``) are in ``runners.objectives.dino_settings``, which imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from runners.inputs import MEAN as _MEAN
from runners.inputs import STD as _STD
from runners.inputs import batch_input, to_input
from runners.models import build_model
from runners.objectives.base import TrainerSetup
from runners.objectives.dino_settings import DinoObjective
from runners.objectives.meter import EpochMeter, adamw

AUG_SEED_OFFSET = 104729
# k-NN monitor: at most this many train / test images, the same seeded subset at every epoch and seed
KNN_TRAIN, KNN_TEST, KNN_SUBSET_SEED = 5000, 2000, 0


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
        """(B, in_dim) -> (B, out_dim) float32 logits; under autocast the MLP runs in bf16, the rest not.

        The normalisation and the last layer run in float32 with autocast off: the logits are divided by
        temperatures down to 0.04 and fed to a softmax over up to 65536 prototypes, where bf16's 8-bit
        mantissa (relative error 2^-9 on a logit of |l| <= ||w||) is amplified 25x.
        """
        h = self.mlp(x)
        with torch.autocast(h.device.type, enabled=False):
            return self.last_layer(F.normalize(h.float(), dim=-1, p=2))


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

        Computed in float32 whatever the inputs' dtype or an enclosing autocast. Also updates the centre from this batch's teacher outputs (after computing the loss).
        """
        # temperatures and softmaxes in float32 even inside an autocast region (see DINOHead.forward)
        with torch.autocast(student_out.device.type, enabled=False):
            wide = torch.promote_types(student_out.dtype, torch.float32)  # float32, or float64 if given
            student_out, teacher_out = student_out.to(wide), teacher_out.to(wide)
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
    """theta_t <- m theta_t + (1 - m) theta_s for every parameter (same order in both networks).

    As ``pt.mul_(m).add_(ps, alpha=1 - m)`` per parameter, in two ``torch._foreach_*`` calls (one
    kernel launch each on CUDA instead of two per parameter; on the CPU the same per-tensor ops).
    """
    ps, pt = list(student.parameters()), list(teacher.parameters())
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


# ---- multi-crop augmentation -----------------------------------------------------------------------------
def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma of [0, 1] RGB images (B, 3, H, W) -> (B, 1, H, W), torchvision's ``rgb_to_grayscale`` weights."""
    return 0.2989 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue of [0, 1] RGB images (B, 3, H, W) by ``shift`` (B,) turns, through HSV.

    The same conversion as torchvision's ``adjust_hue`` on tensors (h in [0, 1), h <- (h + shift) mod 1),
    with one shift per image instead of one per call.
    """
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    flat = maxc == minc
    span = maxc - minc
    s = span / torch.where(flat, torch.ones_like(maxc), maxc)
    div = torch.where(flat, torch.ones_like(span), span)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    h = (
        (maxc == r) * (bc - gc)
        + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
        + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    )
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    h = torch.remainder(h + shift[:, None, None], 1.0)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    v = maxc
    p = (v * (1 - s)).clamp(0, 1)
    q = (v * (1 - s * f)).clamp(0, 1)
    t = (v * (1 - s * (1 - f))).clamp(0, 1)
    # sector i -> (R, G, B) as (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)
    table = torch.stack(
        [
            torch.stack([v, q, p, p, t, v], 1),
            torch.stack([t, v, v, q, p, p], 1),
            torch.stack([p, p, t, v, v, q], 1),
        ],
        1,
    )  # (B, 3, 6, H, W)
    return torch.gather(table, 2, i[:, None, None].expand(-1, 3, 1, -1, -1)).squeeze(2)


JITTER_OPS = ("brightness", "contrast", "saturation", "hue")


def colour_op(name: str, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """One of torchvision's ``adjust_*`` on tensors, with a factor (B,) per image of x (B, 3, H, W) in [0, 1].

    brightness: ``clamp(f x)``; contrast: ``clamp(f x + (1 - f) mean(gray(x)))``; saturation:
    ``clamp(f x + (1 - f) gray(x))``; hue: ``shift_hue(x, f)``. Output (B, 3, H, W) in [0, 1].
    """
    if name == "hue":
        return shift_hue(x, factor)
    f = factor[:, None, None, None]
    if name == "brightness":  # a blend with black
        return (f * x).clamp(0, 1)
    ref = _gray(x).mean(dim=(1, 2, 3), keepdim=True) if name == "contrast" else _gray(x)
    return (f * x + (1 - f) * ref).clamp(0, 1)


class MultiCrop:
    """Batched DINO crops of normalised images (B, 3, H, W) -> [global_1, global_2, local_1, ...].

    Global crops: (B, 3, H, W), area fraction in ``global_scale``; local crops: (B, 3, local, local),
    area fraction in ``local_scale``. The crop box is drawn as torchvision's ``RandomResizedCrop``: up to
    10 tries of area fraction U(scale) and aspect ratio log-uniform in [3/4, 4/3], sides rounded to
    pixels, the first that fits inside the image is taken, else the whole image (a square image has no
    aspect-ratio clamp). Then, as DINO's ``DataAugmentationDINO``: horizontal flip (p 0.5); colour
    jitter (p 0.8) as torchvision's ``ColorJitter(0.4, 0.4, 0.2, 0.1)``: brightness, contrast,
    saturation and hue factors U(0.6, 1.4), U(0.6, 1.4), U(0.8, 1.2), U(-0.1, 0.1), applied in a random
    order per image, each clamped to [0, 1]; grayscale (p 0.2); Gaussian blur (p 1.0 / 0.1 / 0.5 for
    global 1 / global 2 / local); solarisation (p 0.2, global 2 only).

    Differences from the reference, kept on purpose: the crop is resampled by ``roi_align`` (bilinear,
    area-averaged) instead of PIL bicubic; the blur's sigma U(0.1, 2.0) is scaled by image size / 224
    (the reference blurs 224 px crops, so the blur keeps its size relative to the image); crop offsets
    are continuous instead of whole pixels.

    A call draws every random number of the step on the CPU first (:meth:`draw`, from ``generator``, in
    a fixed order), moves them to the images' device in one copy (:meth:`to_device`), then makes the
    crops there (:meth:`apply`) without the host ever waiting for the device. The jitter runs each op
    on the images whose next op it is; which images those are is worked out on the CPU from the drawn
    order (``nonzero`` there, sizes known to the host), so the device never has to report it.
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

    def _u(self, n: int | tuple[int, ...], lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=self.gen)

    def crop_boxes(self, b: int, h: int, w: int, scale: tuple[float, float], tries: int = 10) -> torch.Tensor:
        """Crop boxes (b, 4) as (x0, y0, x1, y1) pixels, drawn as torchvision's ``RandomResizedCrop``."""
        area = self._u((b, tries), *scale) * h * w
        ratio = torch.exp(self._u((b, tries), math.log(3 / 4), math.log(4 / 3)))
        cw, ch = torch.sqrt(area * ratio).round(), torch.sqrt(area / ratio).round()
        fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
        first = fits.to(torch.int8).argmax(1, keepdim=True)  # the first try that fits
        any_fit = fits.any(1)
        # fallback: the whole image, cut to aspect ratio 3/4 .. 4/3 (a centred crop, as torchvision)
        fw, fh = (float(min(w, round(h * 4 / 3))), float(min(h, round(w * 4 / 3))))
        cw = torch.where(any_fit, cw.gather(1, first).squeeze(1), torch.tensor(fw))
        ch = torch.where(any_fit, ch.gather(1, first).squeeze(1), torch.tensor(fh))
        x0 = torch.where(any_fit, self._u(b) * (w - cw), (w - cw) / 2)
        y0 = torch.where(any_fit, self._u(b) * (h - ch), (h - ch) / 2)
        return torch.stack([x0, y0, x0 + cw, y0 + ch], dim=1)

    def _draw_one(
        self, b: int, h: int, w: int, scale: tuple[float, float], blur_p: float, sol_p: float
    ) -> dict:
        """One crop's draws for b images of h x w, in the generator order of the crop pipeline.

        -> ``rois`` (b, 5) roi_align boxes, ``flip``/``jitter``/``gray``/``blur`` (b,) bool, ``factors``
        (b, 4) jitter factors, ``order`` (b, 4) op order (with ``jitter_idx`` (4b,) and ``jitter_sizes``
        (16 ints): the images of each (position, op)), ``sigma`` (b,) and ``kernel`` (b, 2r+1): blur
        widths (pixels) and kernels, and ``solarize`` (b,) bool when ``sol_p`` > 0.
        """
        d = {
            "rois": torch.cat(
                [torch.arange(b, dtype=torch.float32)[:, None], self.crop_boxes(b, h, w, scale)], 1
            )
        }
        d["flip"], d["jitter"] = self._u(b) < 0.5, self._u(b) < 0.8
        factors = [self._u(b, 0.6, 1.4), self._u(b, 0.6, 1.4), self._u(b, 0.8, 1.2), self._u(b, -0.1, 0.1)]
        d["factors"] = torch.stack(factors, 1)
        d["order"] = order = torch.rand((b, 4), generator=self.gen).argsort(1)  # an order of the 4 ops
        # the images whose step-th op is k, for step = 0..3, k = 0..3: (4b,) indices, 16 group sizes
        groups = [torch.nonzero(order[:, step] == k).squeeze(1) for step in range(4) for k in range(4)]
        d["jitter_idx"], d["jitter_sizes"] = torch.cat(groups), [len(g) for g in groups]
        d["gray"], d["blur"] = self._u(b) < 0.2, self._u(b) < blur_p
        d["sigma"] = sigma = self._u(b, 0.1, 2.0) * self.image_size / 224
        radius = max(1, math.ceil(3 * float(sigma.max())))  # a CPU tensor: no device sync
        t = torch.arange(-radius, radius + 1, dtype=torch.float32)
        k = torch.exp(-(t[None] ** 2) / (2 * sigma[:, None] ** 2))
        d["kernel"] = k / k.sum(1, keepdim=True)  # (B, 2r+1), one kernel per image
        if sol_p > 0:
            d["solarize"] = self._u(b) < sol_p
        return d

    def draw(self, b: int, h: int, w: int) -> list[dict]:
        """Every random draw of one call for b images of h x w, on the CPU: one dict per crop."""
        draws = [
            self._draw_one(b, h, w, self.global_scale, 1.0, 0.0),
            self._draw_one(b, h, w, self.global_scale, 0.1, 0.2),
        ]
        return draws + [self._draw_one(b, h, w, self.local_scale, 0.5, 0.0) for _ in range(self.n_local)]

    @staticmethod
    def to_device(draws: list[dict], device: torch.device) -> list[dict]:
        """The draws on ``device``: unchanged on the CPU, else :func:`packed_copy` (one copy)."""
        return draws if device.type == "cpu" else packed_copy(draws, device)

    @staticmethod
    def _jitter(x: torch.Tensor, factors: torch.Tensor, idx: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """torchvision's ``ColorJitter(0.4, 0.4, 0.2, 0.1)`` per image of [0, 1] images (B, 3, H, W).

        factors (B, 4); idx (4B,) and sizes (16,): the images whose step-th op is k, grouped by (step, k).
        """
        groups = iter(idx.split(sizes))
        for _step in range(4):
            for k in range(4):
                sub = next(groups)
                if sub.numel():
                    x = x.index_copy(0, sub, colour_op(JITTER_OPS[k], x[sub], factors[sub, k]))
        return x

    def _colour(self, x: torch.Tensor, d: dict) -> torch.Tensor:
        def per(v: torch.Tensor) -> torch.Tensor:
            return v[:, None, None, None]

        x = torch.where(per(d["flip"]), x.flip(-1), x)
        x = (x * _STD + _MEAN).clamp(0, 1)  # colour operations work on [0, 1] intensities
        jittered = self._jitter(x, d["factors"].to(x.dtype), d["jitter_idx"], d["jitter_sizes"])
        x = torch.where(per(d["jitter"]), jittered, x)
        x = torch.where(per(d["gray"]), _gray(x).expand_as(x), x)
        x = torch.where(per(d["blur"]), blur(x, d["kernel"].to(x.dtype)), x)
        if "solarize" in d:
            x = torch.where(per(d["solarize"]) & (x >= 0.5), 1 - x, x)
        return (x - _MEAN) / _STD

    def apply(self, x: torch.Tensor, draws: list[dict]) -> list[torch.Tensor]:
        """The crops of x (B, 3, H, W) from draws already on its device (:meth:`draw`, :meth:`to_device`)."""
        sizes = [self.image_size] * 2 + [self.local_size] * self.n_local
        crops = []
        for size, d in zip(sizes, draws, strict=True):
            crop = roi_align(x, d["rois"].to(x.dtype), (size, size), spatial_scale=1.0, aligned=True)
            crops.append(self._colour(crop, d))
        return crops

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        b, _, h, w = x.shape
        return self.apply(x, self.to_device(self.draw(b, h, w), x.device))


def packed_copy(draws: list[dict], device: torch.device) -> list[dict]:
    """Dicts of CPU tensors -> the same on ``device``, in one host-to-device copy that does not wait.

    Every tensor is flattened into one float32 buffer (bools as 0/1, int64 op orders and image indices
    below 2^24 are exact in it; anything else, e.g. group sizes, stays on the host), pinned on CUDA (a
    copy from pinned memory with ``non_blocking`` lets the host go on), copied, split, and cast back to
    its dtype and shape on the device.
    """
    flat = [t for d in draws for t in d.values() if isinstance(t, torch.Tensor)]
    buf = torch.cat([t.reshape(-1).to(torch.float32) for t in flat])
    if device.type == "cuda":
        buf = buf.pin_memory()
    parts = iter(buf.to(device, non_blocking=True).split([t.numel() for t in flat]))
    return [
        {
            k: next(parts).reshape(t.shape).to(t.dtype) if isinstance(t, torch.Tensor) else t
            for k, t in d.items()
        }
        for d in draws
    ]


def blur(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur of x (B, C, H, W) with one kernel (B, 2r+1) per image, replicate padding."""
    b, c, h, w = x.shape
    radius = (kernel.shape[1] - 1) // 2
    kk = kernel.repeat_interleave(c, 0)[:, None]  # (B*C, 1, 2r+1)
    y = x.reshape(1, b * c, h, w)
    y = F.conv2d(F.pad(y, (radius, radius, 0, 0), mode="replicate"), kk[:, :, None, :], groups=b * c)
    y = F.conv2d(F.pad(y, (0, 0, radius, radius), mode="replicate"), kk[:, :, :, None], groups=b * c)
    return y.reshape(b, c, h, w)


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
        head = dict(
            in_dim=student.num_features,
            out_dim=o.out_dim,
            hidden_dim=o.hidden_dim,
            bottleneck_dim=o.bottleneck_dim,
            norm_last_layer=o.norm_last_layer,
        )
        self.student = nn.ModuleDict({"backbone": student, "head": DINOHead(**head)}).to(device)
        self.teacher = nn.ModuleDict({"backbone": teacher, "head": DINOHead(**head)}).to(device)
        self.teacher.load_state_dict(self.student.state_dict())  # teacher starts as the student
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.measured = self.teacher["backbone"]
        self.knn_train, self.knn_test = KNN_TRAIN, KNN_TEST
        compile_ = tr.compile and device.type == "cuda"
        self.student_backbone = torch.compile(student) if compile_ else student
        self.teacher_backbone = torch.compile(teacher) if compile_ else teacher

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
        self.aug_gen = torch.Generator().manual_seed(setup.seed + AUG_SEED_OFFSET)
        self.crops = MultiCrop(
            setup.image_size,
            self.local_size,
            o.n_local_crops,
            o.global_crop_scale,
            o.local_crop_scale,
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
                for p in self.student["head"].last_layer.parameters():
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
        """Weighted k-NN (k=20) accuracy of the teacher's features on ``knn_subset`` of each split."""
        tr, te = knn_subset(len(xtr), self.knn_train), knn_subset(len(xte), self.knn_test)
        ftr = features(self.measured, xtr[tr], self.device)
        fte = features(self.measured, xte[te], self.device)
        return {"knn_acc": knn_accuracy(ftr, ytr[tr], fte, yte[te])}

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
