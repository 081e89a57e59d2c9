"""Procedural generator: determinism, backwards-compatible pixels, complexity knobs, its cache."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from runners.datasets import load_split
from runners.datasets.procedural import generate


def _digest(x: np.ndarray, y: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    "variant, digest",
    # computed with the generator before the knobs existed (commit f7700c0): old files keep their images
    [("objects", "47b1e3edd1d04b21"), ("textures", "0cffe1eb6fdfda76")],
)
def test_pixels_unchanged_without_knobs(variant, digest):
    assert _digest(*generate(variant, 8, 8, 10, 0)) == digest


KNOBS = {"texture_reliance": 0.5, "object_scale": 0.25, "clutter": 0.5, "noise": 0.1}


def test_same_seed_same_images_with_knobs():
    a = generate("objects", 24, 16, 6, 3, KNOBS)
    b = generate("objects", 24, 16, 6, 3, KNOBS)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[0].shape == (24, 16, 16, 3) and a[0].dtype == np.uint8
    assert np.bincount(a[1]).tolist() == [4] * 6  # balanced labels


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_each_knob_changes_the_images(knob):
    base = generate("objects", 16, 16, 10, 1)[0]
    other = generate("objects", 16, 16, 10, 1, {knob: KNOBS[knob]})[0]
    assert not np.array_equal(base, other)


def test_noise_knob_sets_pixel_noise():
    quiet = generate("textures", 64, 16, 10, 2, {"noise": 0.0})[0].astype(float)
    loud = generate("textures", 64, 16, 10, 2, {"noise": 0.3})[0].astype(float)
    # neighbouring-pixel differences grow with independent pixel noise
    assert np.abs(np.diff(loud, axis=2)).mean() > 1.5 * np.abs(np.diff(quiet, axis=2)).mean()


def test_object_scale_sets_object_size():
    """Objects are bright or dark against a muted background: count extreme pixels."""

    def extreme_fraction(scale: float) -> float:
        x = generate("objects", 64, 16, 10, 4, {"object_scale": scale, "noise": 0.0})[0]
        return float(((x.max(-1) > 190) | (x.max(-1) < 65)).mean())

    assert extreme_fraction(0.45) > 2 * extreme_fraction(0.15)


def test_texture_reliance_moves_the_label_from_shape_to_texture():
    """A nearest-class-mean classifier on object silhouettes (extreme-pixel masks) reads the label
    from the shape: above chance (0.25) at reliance 0, at chance at reliance 1 (shape is random)."""

    def silhouette_accuracy(reliance: float) -> float:
        x, y = generate("objects", 400, 16, 4, 5, {"texture_reliance": reliance, "object_scale": 0.4})
        m = (np.abs(x.astype(float) - 128).max(-1) > 60).reshape(len(x), -1).astype(float)
        means = np.stack([m[:300][y[:300] == c].mean(0) for c in range(4)])
        pred = ((m[300:, None] - means[None]) ** 2).sum(-1).argmin(1)
        return float((pred == y[300:]).mean())

    assert silhouette_accuracy(0.0) > silhouette_accuracy(1.0) + 0.1


def test_load_split_cache_and_knob_keys(tmp_path):
    spec = {
        "variant": "objects",
        "n_train": 16,
        "n_test": 16,
        "image_size": 8,
        "n_classes": 4,
        "data_seed": 0,
    }
    x1, _ = load_split(spec, "train", tmp_path)
    x2, _ = load_split({**spec, "clutter": 1.0}, "train", tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2 and not np.array_equal(x1, x2)
    np.testing.assert_array_equal(load_split(spec, "train", tmp_path)[0], x1)
