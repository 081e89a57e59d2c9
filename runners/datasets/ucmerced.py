"""UC Merced Land Use, as its archive unpacks: ``Images/<class>/*.tif``.

There is no official split: a per-class stratified split drawn with ``split_seed`` (``test_fraction`` of
each class held out, at least one image on each side). The split is part of the spec, so of the cache key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from runners.datasets.base import DATASETS
from runners.datasets.disk import DiskDataset, layout_error, on_disk_kind
from runners.datasets.folders import is_image, unzip

LAYOUT = "Images/<class>/*.tif"


class UCMercedDataset(DiskDataset):
    """UC Merced Land Use: ``Images/<class>/*.tif``; no official split, so a seeded one (recorded)."""

    kind: Literal["ucmerced"]
    image_size: int = Field(256, ge=8, le=512)
    test_fraction: float = Field(0.2, gt=0, lt=1)
    split_seed: int = 0  # the per-class stratified train/test split


def read(spec: dict, root: Path) -> tuple[dict, list[str]]:
    """``{"train": (paths, int64 labels), "test": ...}`` (the seeded split) and the sorted class names."""
    images = root / "Images"
    if not images.is_dir():
        raise layout_error(spec, root, "missing Images/")
    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise layout_error(spec, root, f"found {len(classes)} class folders under Images/")
    rng = np.random.default_rng(spec.get("split_seed", 0))
    tr, te = [], []
    for i, c in enumerate(classes):
        files = sorted(p for p in (images / c).iterdir() if is_image(p))
        if len(files) < 2:
            raise layout_error(spec, root, f"Images/{c} holds {len(files)} images (need >= 2 to split)")
        order = rng.permutation(len(files))
        n_test = min(len(files) - 1, max(1, round(spec.get("test_fraction", 0.2) * len(files))))
        te += [(files[j], i) for j in sorted(order[:n_test])]
        tr += [(files[j], i) for j in sorted(order[n_test:])]
    return {"train": unzip(tr), "test": unzip(te)}, classes


CLASSES, PER_CLASS = 21, 100  # as published: 21 land-use classes x 100 images


def _train_images(spec: dict) -> int:
    """The training images after :func:`read`'s per-class split (``test_fraction`` of each class held out)."""
    n_test = min(PER_CLASS - 1, max(1, round(spec.get("test_fraction", 0.2) * PER_CLASS)))
    return CLASSES * (PER_CLASS - n_test)


DATASETS.register(
    "ucmerced",
    on_disk_kind(
        "ucmerced",
        UCMercedDataset,
        LAYOUT,
        read,
        example={"name": "ucmerced", "kind": "ucmerced", "path": "${UCMERCED_DIR}"},
        train_images=_train_images,
    ),
)
