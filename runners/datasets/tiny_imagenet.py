"""Tiny ImageNet, as its archive unpacks: ``train/<wnid>/images/*.JPEG``; ``val/images/*.JPEG`` with
``val/val_annotations.txt`` (tab-separated: file, wnid, box). The val split is the held-out split; the
classes are the wnids with an ``images/`` folder under ``train/``, in sorted order."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runners.datasets.base import DATASETS
from runners.datasets.disk import DiskDataset, layout_error, on_disk_kind
from runners.datasets.folders import is_image, unzip

LAYOUT = "train/<wnid>/images/*.JPEG, val/images/*.JPEG and val/val_annotations.txt"


class TinyImageNetDataset(DiskDataset):
    """Tiny ImageNet: ``train/<wnid>/images/*.JPEG``, ``val/images/*.JPEG`` + ``val/val_annotations.txt``."""

    kind: Literal["tiny_imagenet"]
    image_size: int = Field(64, ge=8, le=512)


def read(spec: dict, root: Path) -> tuple[dict, list[str]]:
    """``{"train": (paths, int64 labels), "test": (val paths, labels)}`` and the sorted wnids."""
    train, ann = root / "train", root / "val" / "val_annotations.txt"
    if not train.is_dir() or not ann.is_file():
        raise layout_error(spec, root, "missing train/ or val/val_annotations.txt")
    wnids = sorted(p.name for p in train.iterdir() if (p / "images").is_dir())
    if len(wnids) < 2:
        raise layout_error(spec, root, f"found {len(wnids)} class folders with images/ under train/")
    index = {w: i for i, w in enumerate(wnids)}
    tr = [(p, index[w]) for w in wnids for p in sorted((train / w / "images").iterdir()) if is_image(p)]
    empty = sorted(set(wnids) - {wnids[y] for _, y in tr})
    if empty:
        raise layout_error(spec, root, f"train/{empty[0]}/images holds no image")
    te = []
    for line_no, line in enumerate(ann.read_text().splitlines(), 1):
        parts = line.split("\t")
        if len(parts) < 2 or parts[1] not in index:
            raise layout_error(
                spec, root, f"val/val_annotations.txt line {line_no}: expected 'file<TAB>wnid<TAB>box'"
            )
        p = root / "val" / "images" / parts[0]
        if not p.is_file():
            raise layout_error(spec, root, f"val/images/{parts[0]} listed in val_annotations.txt is missing")
        te.append((p, index[parts[1]]))
    return {"train": unzip(tr), "test": unzip(te)}, wnids


DATASETS.register(
    "tiny_imagenet",
    on_disk_kind(
        "tiny_imagenet",
        TinyImageNetDataset,
        LAYOUT,
        read,
        example={"name": "tiny_imagenet", "kind": "tiny_imagenet", "path": "${TINY_IMAGENET_DIR}"},
        train_images=lambda spec: 100_000,  # 200 classes x 500 training images
    ),
)
