"""The decoded cache: a memory map written atomically, refused when the disk cannot hold it, never trusted
when damaged."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from runners.datasets import cache, load_split
from tests.datasets.conftest import N_CLASSES, PER_CLASS, disk_spec
from vitstudy_core.errors import StudyError


def test_split_is_a_memory_map_written_atomically(roots, tmp_path, monkeypatch, capsys):
    """The decoded split is a read-only-on-disk .npy map; an interrupted decode leaves no cache behind."""
    spec = disk_spec("imagefolder", roots)
    real, calls = cache.square, []

    def failing(img, size):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(img, size)

    monkeypatch.setattr(cache, "square", failing)
    with pytest.raises(KeyboardInterrupt):
        load_split(spec, "train", tmp_path / "cache")
    assert list((tmp_path / "cache").glob("*")) == []
    monkeypatch.setattr(cache, "square", real)
    x, y = load_split(spec, "train", tmp_path / "cache")
    assert isinstance(x, np.memmap) and x.shape == (N_CLASSES * PER_CLASS, 8, 8, 3)
    assert "decoding" in capsys.readouterr().out  # the cache size is printed before decoding
    again, y2 = load_split(spec, "train", tmp_path / "cache")
    assert isinstance(again, np.memmap)
    np.testing.assert_array_equal(again, x)
    np.testing.assert_array_equal(y2, y)


def test_a_damaged_cache_is_decoded_again(roots, tmp_path, capsys):
    spec = disk_spec("tiny_imagenet", roots)
    x, _ = load_split(spec, "train", tmp_path)
    x = np.array(x)
    (images,) = [p for p in tmp_path.glob("*.npy") if not p.name.endswith(".labels.npy")]
    images.write_bytes(images.read_bytes()[:100])  # truncated
    capsys.readouterr()
    again, _ = load_split(spec, "train", tmp_path)
    assert "decoding" in capsys.readouterr().out
    np.testing.assert_array_equal(again, x)


def test_refuses_when_the_disk_cannot_hold_the_cache(roots, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 100))
    with pytest.raises(StudyError) as err:
        load_split(disk_spec("cifar100", roots, image_size=64), "train", tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and "free" in msg and "cifar100" in msg
    assert not list((tmp_path / "cache").glob("*.npy"))
