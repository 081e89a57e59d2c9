"""Procedural image datasets: generated from a seed, deterministic, cached on disk, no download.

Two variants (``ProceduralDataset.variant``), plus complexity knobs (``texture_reliance``: a cue-mix
of shape and texture; ``object_scale``; ``clutter``: distractor shapes; ``noise``; and the image size
and number of classes) described in :class:`ProceduralDataset`:

* ``objects``: the label is the *shape* of one object (disk, square, triangle, plus, ring, star,
  crescent, half-disk, L, dumbbell) drawn at a random position, size, rotation and colour on a random
  textured background (oriented gratings or 1/f noise). The background carries no label information.
* ``textures``: the label is the *texture class* (oriented gratings at 4 orientations x 2 frequencies,
  a checkerboard and a dot lattice) with random phase, colour and noise; there is no object.

Images are rendered at 4x supersampling and box-filtered down (anti-aliasing), stored as uint8
``(N, H, W, 3)`` arrays. :func:`load` caches each split as ``.npz`` keyed by a hash of everything that
determines its pixels, so the same spec always gives the same images and is generated once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from runners.datasets.base import DATASETS, DatasetKind, ImageDatasetSettings
from vitstudy_core.hashing import digest
from vitstudy_core.io import cached_arrays

SHAPES = (
    "disk",
    "square",
    "triangle",
    "plus",
    "ring",
    "star",
    "crescent",
    "half_disk",
    "l_shape",
    "dumbbell",
)
TEXTURES = tuple(f"grating_{o}_{f}" for f in ("coarse", "fine") for o in (0, 45, 90, 135)) + (
    "checker",
    "dots",
)
_SUPERSAMPLE = 4
_CHUNK = 512  # images rendered at once: bounds memory at large image sizes
KNOBS = ("texture_reliance", "object_scale", "clutter", "noise")
GENERATOR_VERSION = 1  # bump when the pixels a spec produces change (invalidates caches and run keys)


class ProceduralDataset(ImageDatasetSettings):
    """A dataset generated from a seed (no download): shapes on textured backgrounds, or textures.

    ``variant`` picks the generator family; the knobs below set data complexity and are left out of
    the run key while unset, so files written before they existed keep their keys and cached images.

    * ``texture_reliance`` (0..1): switches to the cue-mix generator, where each image shows a
      texture-filled object; with probability ``1 - texture_reliance`` the label is carried by the
      object's shape (its texture is random), otherwise by its texture (its shape is random). 0 = only
      shape carries the label, 1 = only texture does.
    * ``object_scale``: object radius as a fraction of the image side (default 0.3-0.4 at random).
    * ``clutter`` (0..1): distractor shapes of random class, ``round(4 * clutter)`` per image.
    * ``noise``: standard deviation of additive Gaussian pixel noise (intensity units, image in [0, 1]).
    """

    kind: Literal["procedural"] = "procedural"
    variant: Literal["objects", "textures"] = "objects"
    n_classes: int = Field(10, ge=2, le=10)
    n_train: int = Field(
        10_000, ge=16
    )  # 10k images x 8 epochs: a 5-seed study trains in minutes on 2 CPU cores
    n_test: int = Field(2_000, ge=16)
    image_size: int = Field(16, ge=8, le=256)
    data_seed: int = 0  # the images; run seeds change init and data order only
    texture_reliance: float | None = Field(None, ge=0.0, le=1.0)
    object_scale: float | None = Field(None, gt=0.05, le=0.5)
    clutter: float | None = Field(None, ge=0.0, le=1.0)
    noise: float | None = Field(None, ge=0.0, le=0.5)

    @model_validator(mode="after")
    def _knobs(self) -> ProceduralDataset:
        if self.variant == "textures" and (
            self.texture_reliance is not None or self.object_scale is not None
        ):
            raise ValueError("texture_reliance/object_scale need variant 'objects' (textures has no object)")
        return self


def _grid(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [0, 1), shape (1, size*ss, size*ss) each."""
    s = size * _SUPERSAMPLE
    c = (np.arange(s, dtype=np.float32) + 0.5) / s
    yy, xx = np.meshgrid(c, c, indexing="ij")
    return xx[None], yy[None]


def _downsample(img: np.ndarray) -> np.ndarray:
    """(n, H*ss, W*ss, C) -> (n, H, W, C) by box filter."""
    n, h, w, c = img.shape
    s = _SUPERSAMPLE
    return img.reshape(n, h // s, s, w // s, s, c).mean(axis=(2, 4))


def _shape_mask(cls: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean mask (n, H, W) of each image's shape in its local frame (u, v), unit radius."""
    r = np.sqrt(u**2 + v**2)
    phi = np.arctan2(v, u)
    s3 = np.sqrt(3.0)
    masks = {
        0: r < 0.9,
        1: np.maximum(np.abs(u), np.abs(v)) < 0.75,
        2: (v > -0.55) & (s3 * u + v < 0.9) & (-s3 * u + v < 0.9),
        3: ((np.abs(u) < 0.28) & (np.abs(v) < 0.95)) | ((np.abs(v) < 0.28) & (np.abs(u) < 0.95)),
        4: (r > 0.5) & (r < 0.95),
        5: r < 0.5 + 0.45 * np.cos(5 * phi),
        6: (r < 0.9) & ((u - 0.45) ** 2 + v**2 > 0.6**2),
        7: (r < 0.95) & (v > 0),
        8: ((u > -0.8) & (u < -0.2) & (np.abs(v) < 0.85)) | ((np.abs(u) < 0.8) & (v > -0.85) & (v < -0.25)),
        9: ((u - 0.5) ** 2 + v**2 < 0.42**2)
        | ((u + 0.5) ** 2 + v**2 < 0.42**2)
        | ((np.abs(u) < 0.5) & (np.abs(v) < 0.12)),
    }
    out = np.zeros(u.shape, dtype=bool)
    for k, m in masks.items():
        sel = cls == k
        if sel.any():
            out[sel] = m[sel]
    return out


def _gratings(
    rng: np.random.Generator, n: int, xx: np.ndarray, yy: np.ndarray, theta: np.ndarray, freq: np.ndarray
) -> np.ndarray:
    """(n, H, W) sinusoidal gratings in [0, 1], orientation theta (rad), freq in cycles per image."""
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)
    proj = xx * np.cos(theta)[:, None, None] + yy * np.sin(theta)[:, None, None]
    return 0.5 + 0.5 * np.sin(2 * np.pi * freq[:, None, None] * proj + phase[:, None, None])


def _pink_noise(rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    """(n, s, s) 1/f noise normalised to [0, 1]."""
    white = rng.standard_normal((n, s, s)).astype(np.float32)
    f = np.fft.fftfreq(s)
    amp = 1.0 / np.maximum(np.sqrt(f[:, None] ** 2 + f[None, :] ** 2), 1.0 / s)
    noise = np.fft.ifft2(np.fft.fft2(white) * amp).real
    lo = noise.min(axis=(1, 2), keepdims=True)
    hi = noise.max(axis=(1, 2), keepdims=True)
    return ((noise - lo) / (hi - lo + 1e-8)).astype(np.float32)


def _colourise(rng: np.random.Generator, pattern: np.ndarray) -> np.ndarray:
    """Map a (n, H, W) pattern in [0, 1] between two random colours -> (n, H, W, 3)."""
    n = pattern.shape[0]
    c0 = rng.uniform(0, 1, (n, 1, 1, 3)).astype(np.float32)
    c1 = rng.uniform(0, 1, (n, 1, 1, 3)).astype(np.float32)
    return c0 + (c1 - c0) * pattern[..., None]


def _texture_pattern(rng: np.random.Generator, cls: np.ndarray, xx: np.ndarray, yy: np.ndarray, size: int):
    """(n, H, W) pattern in [0, 1] of texture class ``cls`` (see ``TEXTURES``), random phase."""
    n = cls.size
    orient = np.deg2rad(np.array([0, 45, 90, 135] * 2, dtype=np.float32))
    freqs = np.array([2.0] * 4 + [4.5] * 4, dtype=np.float32) * size / 16  # cycles/image scale with size
    theta = orient[np.minimum(cls, 7)] + rng.normal(0, 0.08, n).astype(np.float32)
    freq = freqs[np.minimum(cls, 7)] * rng.uniform(0.9, 1.1, n).astype(np.float32)
    pattern = _gratings(rng, n, xx, yy, theta, freq)
    per = (size / 4.0) * rng.uniform(0.9, 1.1, n).astype(np.float32)  # period ~4 px
    ox, oy = rng.uniform(0, 1, (2, n)).astype(np.float32)
    gx = (xx * per[:, None, None] + ox[:, None, None]) % 1.0
    gy = (yy * per[:, None, None] + oy[:, None, None]) % 1.0
    checker = ((gx < 0.5) ^ (gy < 0.5)).astype(np.float32)
    dots = (((gx - 0.5) ** 2 + (gy - 0.5) ** 2) < 0.22**2).astype(np.float32)
    pattern = np.where((cls == 8)[:, None, None], checker, pattern)
    return np.where((cls == 9)[:, None, None], dots, pattern)


def _place(rng: np.random.Generator, cls: np.ndarray, xx, yy, cx, cy, rad, max_rot: float) -> np.ndarray:
    """Mask (n, H, W) of shape ``cls`` centred at (cx, cy) with radius ``rad`` (image units), random rotation."""
    n = cls.size
    rot = rng.uniform(-max_rot, max_rot, n).astype(np.float32)
    dx = (xx - cx[:, None, None]) / rad[:, None, None]
    dy = (yy - cy[:, None, None]) / rad[:, None, None]
    cr, sr = np.cos(rot)[:, None, None], np.sin(rot)[:, None, None]
    return _shape_mask(cls, cr * dx + sr * dy, -sr * dx + cr * dy)


def _clutter(rng: np.random.Generator, img: np.ndarray, xx, yy, clutter: float) -> np.ndarray:
    """Paint ``round(4 * clutter)`` small distractor shapes of random class, position and colour."""
    n = int(img.shape[0])
    for _ in range(round(4 * clutter)):
        cls = rng.integers(0, len(SHAPES), n)
        cx, cy = rng.uniform(0.1, 0.9, (2, n)).astype(np.float32)
        rad = rng.uniform(0.1, 0.18, n).astype(np.float32)
        mask = _place(rng, cls, xx, yy, cx, cy, rad, np.pi)
        colour = rng.uniform(0, 1, (n, 3)).astype(np.float32)
        img = np.where(mask[..., None], colour[:, None, None, :], img)
    return img


def _render_chunk(
    rng: np.random.Generator, labels: np.ndarray, variant: str, size: int, knobs: dict
) -> np.ndarray:
    """Render (n, size, size, 3) uint8 images of ``labels``; ``knobs`` as in ``ProceduralDataset``.

    The random draws happen in a fixed order and a knob left unset draws nothing extra, so specs
    written before the knobs existed give the same pixels as before.
    """
    n = labels.size
    xx, yy = _grid(n, size)
    s = xx.shape[-1]
    clutter, scale, reliance = knobs.get("clutter"), knobs.get("object_scale"), knobs.get("texture_reliance")
    if variant == "textures":
        img = _colourise(rng, _texture_pattern(rng, labels, xx, yy, size))
        if clutter:
            img = _clutter(rng, img, xx, yy, clutter)
        noise = 0.06 if knobs.get("noise") is None else knobs["noise"]
        img += rng.normal(0, noise, img.shape).astype(np.float32)
    else:
        # background: half oriented gratings of random orientation/frequency, half 1/f noise
        theta = rng.uniform(0, np.pi, n).astype(np.float32)
        freq = rng.uniform(1.5, 5.0, n).astype(np.float32) * size / 16
        bg = np.where(
            rng.random(n)[:, None, None] < 0.5, _gratings(rng, n, xx, yy, theta, freq), _pink_noise(rng, n, s)
        )
        img = _colourise(rng, bg) * 0.4 + 0.3  # a muted mid-grey-ish background ...
        if clutter:
            img = _clutter(rng, img, xx, yy, clutter)
        shape_cls = labels
        if reliance is not None:
            # cue mix: per image, the label is carried by the texture with probability `reliance`,
            # else by the shape; the other cue is drawn at random, so it carries no label information
            by_texture = rng.random(n) < reliance
            other = rng.integers(0, knobs["n_classes"], n)
            shape_cls = np.where(by_texture, other, labels)
            texture_cls = np.where(by_texture, labels, other)
        cx, cy = rng.uniform(0.4, 0.6, (2, n)).astype(np.float32)
        lo, hi = (0.3, 0.4) if scale is None else (0.9 * scale, 1.1 * scale)
        rad = rng.uniform(lo, hi, n).astype(np.float32)
        mask = _place(
            rng, shape_cls, xx, yy, cx, cy, rad, np.pi / 6
        )  # +-30 deg: shape, not pose, is the label
        # ... and an object clearly darker or brighter than it, in a random hue
        bright = rng.random(n) < 0.5
        colour = np.where(bright[:, None], rng.uniform(0.75, 1.0, (n, 3)), rng.uniform(0.0, 0.25, (n, 3)))
        fill = np.broadcast_to(colour[:, None, None, :].astype(np.float32), img.shape)
        if reliance is not None:  # a textured object: high-contrast pattern between dark and bright
            pattern = _texture_pattern(rng, texture_cls, xx, yy, size)[..., None]
            fill = colour[:, None, None, :].astype(np.float32) * (0.35 + 0.65 * pattern)
        img = np.where(mask[..., None], fill, img)
        noise = 0.03 if knobs.get("noise") is None else knobs["noise"]
        img += rng.normal(0, noise, img.shape).astype(np.float32)
    img = _downsample(img)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def generate(
    variant: str, n: int, size: int, n_classes: int, seed: int, knobs: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``n`` images of one variant from ``seed`` (same arguments, same pixels).

    Args:
        knobs: optional ``texture_reliance``, ``object_scale``, ``clutter``, ``noise`` (see
            :class:`ProceduralDataset`); None or missing entries keep the variant's defaults.

    Returns:
        images: uint8 (n, size, size, 3); labels: int64 (n,) balanced over ``n_classes``.
    """
    if variant not in ("objects", "textures"):
        raise ValueError(f"unknown variant {variant!r}")
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % n_classes
    rng.shuffle(labels)
    knobs = {**(knobs or {}), "n_classes": n_classes}
    chunks = [_render_chunk(rng, labels[i : i + _CHUNK], variant, size, knobs) for i in range(0, n, _CHUNK)]
    return np.concatenate(chunks), labels.astype(np.int64)


def load(
    spec: dict, split: str, cache_dir: Path, probe_size: int | None = None, probe_seed: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one split of a procedural dataset, generated once and cached.

    Args:
        spec: the dataset spec as a dict (``ProceduralDataset.model_dump()``).
        split: ``train`` (data_seed), ``test`` (data_seed + 1) or ``probe`` (its own probe_seed).
        cache_dir: folder for the ``.npz`` cache.
        probe_size, probe_seed: size and seed of the probe split.

    Returns:
        images: uint8 (N, image_size, image_size, 3); labels: int64 (N,) in 0..n_classes-1.
    """
    if split == "train":
        n, seed = spec["n_train"], spec["data_seed"] * 1000 + 1
    elif split == "test":
        n, seed = spec["n_test"], spec["data_seed"] * 1000 + 2
    elif split == "probe":
        if probe_size is None or probe_seed is None:
            raise ValueError("the probe split needs probe_size and probe_seed")
        n, seed = int(probe_size), int(probe_seed) * 1000 + 3
    else:
        raise ValueError(f"unknown split {split!r}")
    key = {
        "v": GENERATOR_VERSION,
        "variant": spec["variant"],
        "n": n,
        "size": spec["image_size"],
        "classes": spec["n_classes"],
        "seed": seed,
    }
    knobs = {k: spec.get(k) for k in KNOBS if spec.get(k) is not None}
    key.update(knobs)  # only set knobs enter the hash: caches of older specs stay valid
    path = Path(cache_dir) / f"{spec['variant']}_{split}_{digest(key, 16, compact=False)}.npz"

    def build() -> dict[str, np.ndarray]:
        images, labels = generate(spec["variant"], n, spec["image_size"], spec["n_classes"], seed, knobs)
        return {"images": images, "labels": labels}

    images, labels = cached_arrays(path, build, ("images", "labels"))
    return images, labels


DATASETS.register(
    "procedural",
    DatasetKind(
        name="procedural",
        model=ProceduralDataset,
        example={"name": "objects", "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 8},
        load=load,
        num_classes=lambda spec: spec["n_classes"],
        generated=True,
    ),
)
