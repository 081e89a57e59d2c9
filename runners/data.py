"""Procedural image datasets: generated from a seed, deterministic, cached on disk, no download.

Two variants (``ProceduralDataset.variant``):

* ``objects``: the label is the *shape* of one object (disk, square, triangle, plus, ring, star,
  crescent, half-disk, L, dumbbell) drawn at a random position, size, rotation and colour on a random
  textured background (oriented gratings or 1/f noise). The background carries no label information.
* ``textures``: the label is the *texture class* (oriented gratings at 4 orientations x 2 frequencies,
  a checkerboard and a dot lattice) with random phase, colour and noise; there is no object.

Images are rendered at 4x supersampling and box-filtered down (anti-aliasing), stored as uint8
``(N, H, W, 3)`` arrays. ``load_split`` caches each split as ``.npz`` keyed by a hash of everything that
determines its pixels, so the same spec always gives the same images and is generated once.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

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
GENERATOR_VERSION = 1  # bump when the pixels a spec produces change (invalidates caches and run keys)


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


def _render_chunk(rng: np.random.Generator, labels: np.ndarray, variant: str, size: int) -> np.ndarray:
    n = labels.size
    xx, yy = _grid(n, size)
    s = xx.shape[-1]
    if variant == "textures":
        orient = np.deg2rad(np.array([0, 45, 90, 135] * 2, dtype=np.float32))
        freqs = np.array([2.0] * 4 + [4.5] * 4, dtype=np.float32) * size / 16  # cycles/image scale with size
        theta = orient[np.minimum(labels, 7)] + rng.normal(0, 0.08, n).astype(np.float32)
        freq = freqs[np.minimum(labels, 7)] * rng.uniform(0.9, 1.1, n).astype(np.float32)
        pattern = _gratings(rng, n, xx, yy, theta, freq)
        per = (size / 4.0) * rng.uniform(0.9, 1.1, n).astype(np.float32)  # period ~4 px
        ox, oy = rng.uniform(0, 1, (2, n)).astype(np.float32)
        gx = (xx * per[:, None, None] + ox[:, None, None]) % 1.0
        gy = (yy * per[:, None, None] + oy[:, None, None]) % 1.0
        checker = ((gx < 0.5) ^ (gy < 0.5)).astype(np.float32)
        dots = (((gx - 0.5) ** 2 + (gy - 0.5) ** 2) < 0.22**2).astype(np.float32)
        pattern = np.where((labels == 8)[:, None, None], checker, pattern)
        pattern = np.where((labels == 9)[:, None, None], dots, pattern)
        img = _colourise(rng, pattern)
        img += rng.normal(0, 0.06, img.shape).astype(np.float32)
    else:
        # background: half oriented gratings of random orientation/frequency, half 1/f noise
        theta = rng.uniform(0, np.pi, n).astype(np.float32)
        freq = rng.uniform(1.5, 5.0, n).astype(np.float32) * size / 16
        bg = np.where(
            rng.random(n)[:, None, None] < 0.5, _gratings(rng, n, xx, yy, theta, freq), _pink_noise(rng, n, s)
        )
        img = _colourise(rng, bg) * 0.4 + 0.3  # a muted mid-grey-ish background ...
        cx, cy = rng.uniform(0.4, 0.6, (2, n)).astype(np.float32)
        rad = rng.uniform(0.3, 0.4, n).astype(np.float32)
        rot = rng.uniform(-np.pi / 6, np.pi / 6, n).astype(
            np.float32
        )  # +-30 deg: shape, not pose, is the label
        dx = (xx - cx[:, None, None]) / rad[:, None, None]
        dy = (yy - cy[:, None, None]) / rad[:, None, None]
        cr, sr = np.cos(rot)[:, None, None], np.sin(rot)[:, None, None]
        u, v = cr * dx + sr * dy, -sr * dx + cr * dy
        mask = _shape_mask(labels, u, v)
        # ... and an object clearly darker or brighter than it, in a random hue
        bright = rng.random(n) < 0.5
        colour = np.where(bright[:, None], rng.uniform(0.75, 1.0, (n, 3)), rng.uniform(0.0, 0.25, (n, 3)))
        img = np.where(mask[..., None], colour[:, None, None, :].astype(np.float32), img)
        img += rng.normal(0, 0.03, img.shape).astype(np.float32)
    img = _downsample(img)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def generate(variant: str, n: int, size: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``n`` images of one variant from ``seed``.

    Returns:
        images: uint8 (n, size, size, 3); labels: int64 (n,) balanced over ``n_classes``.
    """
    if variant not in ("objects", "textures"):
        raise ValueError(f"unknown variant {variant!r}")
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % n_classes
    rng.shuffle(labels)
    chunks = [_render_chunk(rng, labels[i : i + _CHUNK], variant, size) for i in range(0, n, _CHUNK)]
    return np.concatenate(chunks), labels.astype(np.int64)


def _spec_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` via a temporary file and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
    os.close(fd)
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_split(
    spec: dict, split: str, cache_dir: Path, probe_size: int | None = None, probe_seed: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one split of a procedural dataset, generated once and cached.

    Args:
        spec: the dataset spec as a dict (``ProceduralDataset.model_dump()``).
        split: ``train`` (data_seed), ``test`` (data_seed + 1) or ``probe`` (its own probe_seed).
        cache_dir: folder for the ``.npz`` cache.
        probe_size, probe_seed: size and seed of the probe split.
    """
    if split == "train":
        n, seed = spec["n_train"], spec["data_seed"] * 1000 + 1
    elif split == "test":
        n, seed = spec["n_test"], spec["data_seed"] * 1000 + 2
    elif split == "probe":
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
    path = Path(cache_dir) / f"{spec['variant']}_{split}_{_spec_hash(key)}.npz"
    if path.exists():
        try:
            with np.load(path) as f:
                return f["images"], f["labels"]
        except Exception:  # a corrupt cache file is regenerated, never trusted
            path.unlink(missing_ok=True)
    images, labels = generate(spec["variant"], n, spec["image_size"], spec["n_classes"], seed)
    atomic_save_npz(path, images=images, labels=labels)
    return images, labels
