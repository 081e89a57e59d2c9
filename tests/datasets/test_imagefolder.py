"""ImageFolder trees (ImageNet-100 style) as researchers build them: a class list, links into an ImageNet
tree, notebook litter, nested folders; the listing is torchvision's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runners.datasets import dataset_fingerprint, load_split, num_classes
from tests.datasets.conftest import N_CLASSES, PER_CLASS, disk_spec, rgb
from vitstudy_core.errors import StudyError


def write_fixture(root: Path) -> dict:
    """train/<class>/*.JPEG and val/<class>/*.JPEG (ImageNet-100 style), non-square images; one class
    folder more than the class list keeps."""
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for c in range(N_CLASSES + 1):
            d = root / split / f"n1{c}"
            d.mkdir(parents=True)
            for i in range(PER_CLASS):
                Image.fromarray(rgb(rng, 48, c)[:, :36]).save(d / f"img{i}.JPEG")
    return {"classes": [f"n1{c}" for c in range(N_CLASSES)]}


def test_an_unknown_class_is_named(roots, tmp_path):
    with pytest.raises(StudyError, match="n99"):
        load_split(disk_spec("imagefolder", roots, classes=["n10", "n99"]), "train", tmp_path)


def _linked(root: Path, source: Path, classes: list[str]) -> Path:
    """``ln -s source/<split>/<class> root/<split>/`` for each class: how ImageNet-100 is usually built."""
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        for c in classes:
            (root / split / c).symlink_to(source / split / c, target_is_directory=True)
    return root


def test_symlinked_class_folders_are_fingerprinted_and_read(roots, tmp_path):
    """Two folders of links to different classes: different fingerprints, caches and images."""
    src = roots["imagefolder"][0]
    a = _linked(tmp_path / "in_a", src, ["n10", "n11", "n12"])
    b = _linked(tmp_path / "in_b", src, ["n11", "n12", "n13"])
    empty = tmp_path / "empty"
    for split in ("train", "val"):
        for c in ("n10", "n11", "n12"):
            (empty / split / c).mkdir(parents=True)
    fps = {dataset_fingerprint({"path": str(p)}) for p in (a, b, empty)}
    assert len(fps) == 3
    xa, ya = load_split(disk_spec("imagefolder", roots, a, classes=None), "train", tmp_path / "cache")
    xb, yb = load_split(disk_spec("imagefolder", roots, b, classes=None), "train", tmp_path / "cache")
    assert len(xa) == len(xb) == N_CLASSES * PER_CLASS
    assert not np.array_equal(xa, xb)  # b is not served a's cache
    fresh, _ = load_split(disk_spec("imagefolder", roots, b, classes=None), "train", tmp_path / "fresh")
    np.testing.assert_array_equal(xb, fresh)
    # class i of b is source class n1(i+1): its dominant channel is (i + 1) mod 3
    assert (xb.reshape(len(xb), -1, 3).mean(1).argmax(1) == (yb + 1) % 3).all()


def test_hidden_folders_and_files_are_skipped(roots, tmp_path):
    """A ``.ipynb_checkpoints`` folder is no class and macOS ``._*`` files are not images."""
    root = tmp_path / "in100"
    shutil.copytree(roots["imagefolder"][0], root)
    for split in ("train", "val"):
        (root / split / ".ipynb_checkpoints").mkdir()
        Image.fromarray(rgb(np.random.default_rng(9), 48, 1)).save(
            root / split / ".ipynb_checkpoints" / "x.jpg"
        )
        (root / split / "n10" / "._img0.JPEG").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
        (root / split / "n10" / ".cache").mkdir()
        Image.fromarray(rgb(np.random.default_rng(9), 48, 1)).save(root / split / "n10" / ".cache" / "y.jpg")
    spec = disk_spec("imagefolder", roots, root, classes=None)
    assert num_classes(spec) == N_CLASSES + 1  # the fixture's 4 class folders, not 5
    for split in ("train", "test"):
        x, y = load_split(spec, split, tmp_path / "cache")
        assert len(x) == (N_CLASSES + 1) * PER_CLASS
        assert (x.reshape(len(x), -1, 3).mean(1).argmax(1) == y % 3).all()  # labels not shifted


def test_nested_folders_inside_a_class_are_read(roots, tmp_path):
    root = tmp_path / "nested"
    shutil.copytree(roots["imagefolder"][0], root)
    sub = root / "train" / "n10" / "extra" / "deeper"
    sub.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(rgb(np.random.default_rng(i), 48, 0)).save(sub / f"more{i}.png")
    x, y = load_split(disk_spec("imagefolder", roots, root), "train", tmp_path / "cache")
    assert np.bincount(y).tolist() == [PER_CLASS + 3, PER_CLASS, PER_CLASS]


def test_image_folder_listing_matches_torchvision(roots, tmp_path):
    """Our listing of class folders is torchvision's ``make_dataset`` (links followed, nested folders read)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    from runners.datasets.folders import list_image_folder

    src = roots["imagefolder"][0]
    root = _linked(tmp_path / "in", src, ["n10", "n11"]) / "train"
    shutil.copytree(src / "train" / "n12", root / "n12")
    (root / "n12" / "a-b").mkdir()  # '-' sorts before '/': the order of sorted(os.walk(...)) is kept
    (root / "n12" / "a").mkdir()
    for d in ("a-b", "a"):
        Image.fromarray(rgb(np.random.default_rng(0), 8, 0)).save(root / "n12" / d / "z.png")
    (root / "n12" / "notes.txt").write_text("not an image")
    classes, class_to_idx = find_classes(root)
    ours = list_image_folder(root, classes)
    assert [(str(p), y) for p, y in ours] == make_dataset(root, class_to_idx, IMG_EXTENSIONS)
