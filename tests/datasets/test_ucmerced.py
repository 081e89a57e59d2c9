"""UC Merced Land Use as its archive unpacks; its seeded stratified split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from runners.datasets import load_split
from tests.datasets.conftest import N_CLASSES, PER_CLASS, disk_spec, rgb


def write_fixture(root: Path) -> dict:
    """Images/<class>/<class>NN.tif (the archive's own layout); some are 40 x 38 (the archive has 256 x 247).

    Each class has 2 * PER_CLASS images; ``test_fraction: 0.5`` holds PER_CLASS of them out."""
    rng = np.random.default_rng(2)
    for c, name in enumerate(["agricultural", "airplane", "beach"][:N_CLASSES]):
        d = root / "Images" / name
        d.mkdir(parents=True)
        for i in range(2 * PER_CLASS):
            img = rgb(rng, 40, c)
            Image.fromarray(img[:38] if i % 3 == 0 else img).save(d / f"{name}{i:02d}.tif")
    return {"test_fraction": 0.5}


def test_split_is_seeded_stratified_and_disjoint(roots, tmp_path):
    spec = disk_spec("ucmerced", roots, test_fraction=0.25)
    xtr, ytr = load_split(spec, "train", tmp_path)
    xte, yte = load_split(spec, "test", tmp_path)
    assert np.bincount(yte).tolist() == [2] * N_CLASSES and np.bincount(ytr).tolist() == [6] * N_CLASSES
    assert not any((t == x).all() for t in xte for x in xtr)
    other, _ = load_split({**spec, "split_seed": 1}, "test", tmp_path / "b")
    assert not np.array_equal(other, xte)
