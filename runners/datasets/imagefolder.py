"""Any ``<train_dir>/<class>/**`` + ``<test_dir>/<class>/**`` tree (ImageNet-100 and similar).

``classes`` restricts and orders the classes. The rules are torchvision's ``ImageFolder``
(``find_classes`` + ``make_dataset``): class folders may be symbolic links and are walked recursively
with links followed, files are kept by extension (torchvision's ``IMG_EXTENSIONS``), samples come in
``sorted(os.walk(class folder))`` order. One difference, on purpose: entries whose name starts with
``.`` are skipped at every level, so a ``.ipynb_checkpoints`` folder is no class (torchvision 0.29's
``find_classes`` would make it class 0) and macOS ``._*.JPEG`` resource forks are not read as images.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from runners.datasets.base import DATASETS
from runners.datasets.disk import DiskDataset, count_classes, layout_error, on_disk_kind
from runners.datasets.folders import is_dir, list_image_folder, unzip

LAYOUT = "<train_dir>/<class>/<image> and <test_dir>/<class>/<image>"


class ImageFolderDataset(DiskDataset):
    """Any ``<path>/<train_dir>/<class>/*`` + ``<path>/<test_dir>/<class>/*`` tree (e.g. ImageNet-100).

    ``classes`` restricts and orders the classes (ImageNet-100's class list); default: every folder.
    """

    kind: Literal["imagefolder"]
    image_size: int = Field(224, ge=8, le=512)
    train_dir: str = "train"
    test_dir: str = "val"
    classes: list[str] | None = Field(None, min_length=2)


def read(spec: dict, root: Path) -> tuple[dict, list[str]]:
    """``{"train": (paths, int64 labels), "test": ...}`` and the classes (given, or every train folder)."""
    dirs = {"train": root / spec.get("train_dir", "train"), "test": root / spec.get("test_dir", "val")}
    for d in dirs.values():
        if not d.is_dir():
            raise layout_error(spec, root, f"missing {d.name}/")
    # torchvision's find_classes, hidden folders skipped (is_dir() follows links: linked classes count)
    found = sorted(e.name for e in os.scandir(dirs["train"]) if is_dir(e) and not e.name.startswith("."))
    classes = list(spec.get("classes") or found)
    absent = [c for c in classes if c not in found]
    if absent or len(classes) < 2:
        raise layout_error(
            spec, root, f"class folders {absent[:3] or classes} not found under {dirs['train'].name}/"
        )
    splits = {}
    for split, d in dirs.items():
        pairs = list_image_folder(d, classes)
        if not pairs:
            raise layout_error(spec, root, f"no images under {d.name}/<class>/")
        # torchvision's make_dataset refuses a class folder without an image; a class with no folder
        # under the held-out split contributes nothing there (its label stays that of train/)
        have = {y for _, y in pairs}
        empty = [c for i, c in enumerate(classes) if i not in have and (split == "train" or (d / c).is_dir())]
        if empty:
            raise layout_error(spec, root, f"class folder {d.name}/{empty[0]} holds no image")
        splits[split] = unzip(pairs)
    return splits, classes


# training images of the ImageFolder datasets whose size is known by name: ImageNet-100 (dataset name
# "imagenet100"), the CMC class list's 126,689 training images; another folder gives its own count
KNOWN_TRAIN_IMAGES = {"imagenet100": 126_689}


def _num_classes(spec: dict) -> int:
    """The given class list's length without listing the folder; else the folders found."""
    return len(spec["classes"]) if spec.get("classes") else count_classes(spec)


DATASETS.register(
    "imagefolder",
    on_disk_kind(
        "imagefolder",
        ImageFolderDataset,
        LAYOUT,
        read,
        example={"name": "imagenet100", "kind": "imagefolder", "path": "${IMAGENET100_DIR}"},
        num_classes=_num_classes,
        train_images=lambda spec: KNOWN_TRAIN_IMAGES.get(spec.get("name", "")),
    ),
)
