"""DINO's multi-crop augmentation (:class:`MultiCrop`), batched on the training device.

Random resized crops with ``torchvision.ops.roi_align``, flip, colour jitter with hue, grayscale, Gaussian
blur and solarisation as tensor arithmetic, every random draw from one seeded ``torch.Generator``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

from runners.inputs import MEAN as _MEAN
from runners.inputs import STD as _STD


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
    jitter (p 0.8) as torchvision's ``ColorJitter(*jitter)``, by default DINO's (0.4, 0.4, 0.2, 0.1):
    brightness, contrast, saturation and hue factors U(1 - b, 1 + b), U(1 - c, 1 + c), U(1 - s, 1 + s),
    U(-h, h), applied in a random order per image, each clamped to [0, 1]; grayscale (p ``gray_p``, by
    default DINO's 0.2); Gaussian blur (p 1.0 / 0.1 / 0.5 for
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
        jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1),
        gray_p: float = 0.2,
    ):
        self.image_size, self.local_size, self.n_local = image_size, local_size, n_local
        self.global_scale, self.local_scale, self.gen = global_scale, local_scale, generator
        self.jitter, self.gray_p = jitter, gray_p

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
        d: dict[str, torch.Tensor | list[int]] = {
            "rois": torch.cat(
                [torch.arange(b, dtype=torch.float32)[:, None], self.crop_boxes(b, h, w, scale)], 1
            )
        }
        d["flip"], d["jitter"] = self._u(b) < 0.5, self._u(b) < 0.8
        jb, jc, js, jh = self.jitter  # ColorJitter(brightness, contrast, saturation, hue)
        factors = [self._u(b, 1 - jb, 1 + jb), self._u(b, 1 - jc, 1 + jc), self._u(b, 1 - js, 1 + js)]
        factors.append(self._u(b, -jh, jh))
        d["factors"] = torch.stack(factors, 1)
        d["order"] = order = torch.rand((b, 4), generator=self.gen).argsort(1)  # an order of the 4 ops
        # the images whose step-th op is k, for step = 0..3, k = 0..3: (4b,) indices, 16 group sizes
        groups = [torch.nonzero(order[:, step] == k).squeeze(1) for step in range(4) for k in range(4)]
        d["jitter_idx"], d["jitter_sizes"] = torch.cat(groups), [len(g) for g in groups]
        d["gray"], d["blur"] = self._u(b) < self.gray_p, self._u(b) < blur_p
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
