"""Tiny ImageNet as its archive unpacks: greyscale JPEGs, boxes files, val annotations."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runners.datasets import load_split, num_classes
from tests.datasets.conftest import N_CLASSES, PER_CLASS, disk_spec, rgb
from vitstudy_core.errors import StudyError


def write_fixture(root: Path) -> dict:
    """train/<wnid>/images/<wnid>_<i>.JPEG (+ boxes file), val/images + val_annotations.txt, wnids.txt."""
    rng = np.random.default_rng(1)
    wnids = [f"n0{i}000000" for i in range(N_CLASSES)]
    (root / "val" / "images").mkdir(parents=True)
    ann = []
    for c, w in enumerate(wnids):
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            img = Image.fromarray(rgb(rng, 64, c))
            if c == 0 and i == 0:  # a few Tiny ImageNet images are greyscale JPEGs (mode L)
                img = img.convert("L")
            img.save(d / f"{w}_{i}.JPEG", quality=95)
            fn = f"val_{c * PER_CLASS + i}.JPEG"
            Image.fromarray(rgb(rng, 64, c)).save(root / "val" / "images" / fn, quality=95)
            ann.append(f"{fn}\t{w}\t0\t0\t63\t63")
        (root / "train" / w / f"{w}_boxes.txt").write_text("")
    (root / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    return {}


def test_classes_are_the_sorted_wnids(roots):
    assert num_classes(disk_spec("tiny_imagenet", roots)) == N_CLASSES


def test_malformed_layouts_name_what_is_wrong(roots, tmp_path):
    bad = tmp_path / "tiny"
    shutil.copytree(roots["tiny_imagenet"][0], bad)
    (bad / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(StudyError, match="line 1: expected 'file<TAB>wnid<TAB>box'"):
        load_split(disk_spec("tiny_imagenet", roots, bad), "train", tmp_path)
    (bad / "val" / "val_annotations.txt").write_text("gone.JPEG\tn00000000\t0\t0\t1\t1\n")
    with pytest.raises(StudyError, match="val/images/gone.JPEG"):
        load_split(disk_spec("tiny_imagenet", roots, bad), "train", tmp_path)
    (bad / "val" / "val_annotations.txt").unlink()
    with pytest.raises(StudyError, match="val_annotations.txt"):
        load_split(disk_spec("tiny_imagenet", roots, bad), "train", tmp_path)
