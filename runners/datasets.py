"""Loaders for datasets already on disk, in the layouts their publishers ship. Nothing is downloaded.

    images, labels = load_disk_split(spec, "train", cache_dir)   # uint8 (N, S, S, 3), int64 (N,)

Layouts (``spec["path"]`` is the folder; a missing or malformed one raises a one-line
:class:`~core.errors.StudyError` naming the path and the expected layout):

* ``cifar100``: the python version: ``train``, ``test``, ``meta`` pickle files (``b"data"``: uint8
  (N, 3072) channel-major 32x32, ``b"fine_labels"``/``b"coarse_labels"``; ``meta``:
  ``b"fine_label_names"``/``b"coarse_label_names"``). The test split is the held-out split.
* ``tiny_imagenet``: ``train/<wnid>/images/*.JPEG``; ``val/images/*.JPEG`` with
  ``val/val_annotations.txt`` (tab-separated: file, wnid, box). The val split is the held-out split.
* ``ucmerced``: ``Images/<class>/*.tif``. No official split: a per-class stratified split drawn with
  ``split_seed`` (``test_fraction`` of each class held out); the split's file lists go in the cache.
* ``imagefolder``: ``<train_dir>/<class>/*`` and ``<test_dir>/<class>/*`` (ImageNet-100 and similar);
  ``classes`` restricts and orders the classes.

Every image is converted to RGB, its shorter side resized to ``image_size`` (bicubic) and centre-cropped
to a square, so a split is one uint8 array ``(N, image_size, image_size, 3)`` held in memory and cached
as ``.npz`` (keyed by the folder's fingerprint and every setting that changes pixels). The probe set is
drawn from the held-out split with the probe seed, so it is the same for every training seed.

This module does not import torch: the planner uses :func:`resolve_path` and
:func:`dataset_fingerprint` to build run keys.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from core.errors import StudyError
from core.hashing import digest
from core.io import cached_arrays

LOADER_VERSION = 1  # bump when the pixels a spec produces change
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm")
LAYOUTS = {
    "cifar100": "the CIFAR-100 python version: files train, test, meta (pickled dicts)",
    "tiny_imagenet": "train/<wnid>/images/*.JPEG, val/images/*.JPEG and val/val_annotations.txt",
    "ucmerced": "Images/<class>/*.tif",
    "imagefolder": "<train_dir>/<class>/<image> and <test_dir>/<class>/<image>",
}


def resolve_path(raw: str, strict: bool = True, name: str | None = None) -> Path | None:
    """Expand ``${VAR}``/``$VAR`` and ``~`` in a dataset path.

    Returns None (``strict=False``) or raises StudyError (``strict=True``) if a variable is unset.
    """
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" in expanded:
        if not strict:
            return None
        var = re.search(r"\$\{?(\w+)", expanded)
        raise StudyError(
            f"environment variable {var.group(1) if var else expanded} is not set; set it or pass "
            f"--data-root {name or 'NAME'}=PATH",
            raw,
            f"dataset {name}" if name else None,
        )
    return Path(expanded)


def check_dataset_folder(spec: dict) -> None:
    """Fail early (before anything is written) when an on-disk dataset's folder is unset or missing.

    The full layout check happens when the data are read; this catches the common cases first: an unset
    ``${VAR}`` and a folder that does not exist. Procedural datasets pass.
    """
    if spec.get("kind", "procedural") == "procedural":
        return
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    if not root.is_dir():
        raise _bad(spec, root, "folder not found")


def _files(root: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            out.append((os.path.relpath(p, root), os.path.getsize(p)))
    return out


def dataset_fingerprint(spec: dict) -> str | None:
    """sha256 (16 hex digits) of the folder's sorted (relative path, size) list; None if it is absent."""
    root = resolve_path(spec["path"], strict=False)
    if root is None or not root.is_dir():
        return None
    return digest(_files(root), 16)


def _bad(spec: dict, root: Path, what: str) -> StudyError:
    return StudyError(
        f"{what}; expected {spec['kind']} layout: {LAYOUTS[spec['kind']]}",
        str(root),
        f"dataset {spec['name']}",
    )


def _square(img, size: int) -> np.ndarray:
    """PIL image -> uint8 (size, size, 3): RGB, shorter side to ``size`` (bicubic), centre crop."""
    from PIL import Image

    img = img.convert("RGB")
    w, h = img.size
    if (w, h) != (size, size):
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        img = img.resize((nw, nh), Image.BICUBIC)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)


def _read_images(paths: list[Path], size: int) -> np.ndarray:
    """Decode and resize files in threads (PIL releases the GIL while decoding). -> (N, size, size, 3)."""
    from PIL import Image

    def one(p: Path) -> np.ndarray:
        with Image.open(p) as img:
            return _square(img, size)

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        for i, arr in enumerate(pool.map(one, paths)):
            out[i] = arr
    return out


def _resize_array(images: np.ndarray, size: int) -> np.ndarray:
    if images.shape[1] == size:
        return images
    from PIL import Image

    return np.stack([_square(Image.fromarray(im), size) for im in images])


# ---- one reader per layout: -> {"train": (paths or arrays, labels), "test": ...}, class names ----------
def _cifar100(spec: dict, root: Path) -> tuple[dict, list[str]]:
    need = [root / n for n in ("train", "test", "meta")]
    missing = [p.name for p in need if not p.is_file()]
    if missing:
        raise _bad(spec, root, f"missing {', '.join(missing)}")
    label = spec.get("label", "fine")

    def load(name: str) -> dict:
        # the official files were pickled by Python 2: keys load as bytes; accept str keys too
        with open(root / name, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}

    try:
        names = load("meta")[f"{label}_label_names"]
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        splits = {}
        for split in ("train", "test"):
            d = load(split)
            data = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            splits[split] = (data, np.asarray(d[f"{label}_labels"], dtype=np.int64))
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError, TypeError, AttributeError) as exc:
        raise _bad(spec, root, f"unreadable pickle ({type(exc).__name__}: {exc})") from None
    return splits, classes


def _tiny_imagenet(spec: dict, root: Path) -> tuple[dict, list[str]]:
    train, ann = root / "train", root / "val" / "val_annotations.txt"
    if not train.is_dir() or not ann.is_file():
        raise _bad(spec, root, "missing train/ or val/val_annotations.txt")
    wnids = sorted(p.name for p in train.iterdir() if (p / "images").is_dir())
    if len(wnids) < 2:
        raise _bad(spec, root, f"found {len(wnids)} class folders with images/ under train/")
    index = {w: i for i, w in enumerate(wnids)}
    tr = [(p, index[w]) for w in wnids for p in sorted((train / w / "images").iterdir()) if _is_image(p)]
    te = []
    for line_no, line in enumerate(ann.read_text().splitlines(), 1):
        parts = line.split("\t")
        if len(parts) < 2 or parts[1] not in index:
            raise _bad(
                spec, root, f"val/val_annotations.txt line {line_no}: expected 'file<TAB>wnid<TAB>box'"
            )
        p = root / "val" / "images" / parts[0]
        if not p.is_file():
            raise _bad(spec, root, f"val/images/{parts[0]} listed in val_annotations.txt is missing")
        te.append((p, index[parts[1]]))
    return {"train": _unzip(tr), "test": _unzip(te)}, wnids


def _ucmerced(spec: dict, root: Path) -> tuple[dict, list[str]]:
    images = root / "Images"
    if not images.is_dir():
        raise _bad(spec, root, "missing Images/")
    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise _bad(spec, root, f"found {len(classes)} class folders under Images/")
    rng = np.random.default_rng(spec.get("split_seed", 0))
    tr, te = [], []
    for i, c in enumerate(classes):
        files = sorted(p for p in (images / c).iterdir() if _is_image(p))
        if len(files) < 2:
            raise _bad(spec, root, f"Images/{c} holds {len(files)} images (need >= 2 to split)")
        order = rng.permutation(len(files))
        n_test = min(len(files) - 1, max(1, round(spec.get("test_fraction", 0.2) * len(files))))
        te += [(files[j], i) for j in sorted(order[:n_test])]
        tr += [(files[j], i) for j in sorted(order[n_test:])]
    return {"train": _unzip(tr), "test": _unzip(te)}, classes


def _imagefolder(spec: dict, root: Path) -> tuple[dict, list[str]]:
    dirs = {"train": root / spec.get("train_dir", "train"), "test": root / spec.get("test_dir", "val")}
    for d in dirs.values():
        if not d.is_dir():
            raise _bad(spec, root, f"missing {d.name}/")
    found = sorted(p.name for p in dirs["train"].iterdir() if p.is_dir())
    classes = list(spec.get("classes") or found)
    absent = [c for c in classes if c not in found]
    if absent or len(classes) < 2:
        raise _bad(spec, root, f"class folders {absent[:3] or classes} not found under {dirs['train'].name}/")
    splits = {}
    for split, d in dirs.items():
        pairs = []
        for i, c in enumerate(classes):
            if (d / c).is_dir():
                pairs += [(p, i) for p in sorted((d / c).iterdir()) if _is_image(p)]
        if not pairs:
            raise _bad(spec, root, f"no images under {d.name}/<class>/")
        splits[split] = _unzip(pairs)
    return splits, classes


READERS: dict[str, Callable[[dict, Path], tuple[dict, list[str]]]] = {
    "cifar100": _cifar100,
    "tiny_imagenet": _tiny_imagenet,
    "ucmerced": _ucmerced,
    "imagefolder": _imagefolder,
}


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def _unzip(pairs: list[tuple[Path, int]]) -> tuple[list[Path], np.ndarray]:
    return [p for p, _ in pairs], np.asarray([y for _, y in pairs], dtype=np.int64)


def _subset(n_total: int, n: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded subset of size ``n`` (all if None or n >= n_total)."""
    if n is None or n >= n_total:
        return np.arange(n_total)
    return np.sort(np.random.default_rng(seed).choice(n_total, n, replace=False))


def _materialise(spec: dict, data: tuple, size: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    items, labels = data
    if isinstance(items, np.ndarray):
        return _resize_array(items[idx], size), labels[idx]
    return _read_images([items[i] for i in idx], size), labels[idx]


def load_disk_split(
    spec: dict,
    split: str,
    cache_dir: str | Path,
    probe_size: int | None = None,
    probe_seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one split of an on-disk dataset, read once and cached.

    Args:
        spec: the dataset spec as a dict (a ``*Dataset.model_dump()``; ``path`` may hold ``${VAR}``).
        split: ``train``, ``test`` (the held-out split) or ``probe`` (``probe_size`` images of the
            held-out split drawn with ``probe_seed``, before any ``n_test`` subsetting).
        cache_dir: folder for the ``.npz`` cache.

    Returns:
        images: uint8 (N, image_size, image_size, 3); labels: int64 (N,) in 0..n_classes-1.
    """
    if split not in ("train", "test", "probe"):
        raise ValueError(f"unknown split {split!r}")
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    if not root.is_dir():
        raise StudyError(
            f"dataset folder not found; expected {spec['kind']} layout: {LAYOUTS[spec['kind']]}",
            str(root),
            f"dataset {spec['name']}",
        )
    key = {k: v for k, v in spec.items() if k not in ("name", "path", "fingerprint")}
    key.update(v=LOADER_VERSION, split=split, fp=spec.get("fingerprint") or dataset_fingerprint(spec))
    if split == "probe":
        key.update(probe_size=probe_size, probe_seed=probe_seed)
    path = Path(cache_dir) / f"{spec['kind']}_{split}_{digest(key, 16, compact=False)}.npz"
    return cached_arrays(
        path, lambda: _decode(spec, split, root, probe_size, probe_seed), ("images", "labels")
    )


def _decode(spec: dict, split: str, root: Path, probe_size: int | None, probe_seed: int | None) -> dict:
    """Read and resize one split of an on-disk dataset: ``{images, labels, n_classes}`` arrays."""
    splits, classes = READERS[spec["kind"]](spec, root)
    source = "test" if split == "probe" else split
    n_total = len(splits[source][1])
    if split == "probe":
        if probe_size is None or probe_size > n_total:
            raise StudyError(
                f"probe size {probe_size} exceeds the {n_total} held-out images",
                str(root),
                "design.probe.size",
            )
        idx = np.sort(np.random.default_rng(probe_seed).choice(n_total, probe_size, replace=False))
    else:
        seed = spec.get("subset_seed", 0) * 2 + (split == "test")
        idx = _subset(n_total, spec.get(f"n_{split}"), seed)
    try:
        images, labels = _materialise(spec, splits[source], spec["image_size"], idx)
    except OSError as exc:  # PIL: truncated or not an image
        raise _bad(spec, root, f"unreadable image ({exc})") from None
    return {"images": images, "labels": labels, "n_classes": np.int64(len(classes))}


def disk_num_classes(spec: dict) -> int:
    """Number of classes of an on-disk dataset (the model head's width)."""
    if spec["kind"] == "cifar100":
        return 100 if spec.get("label", "fine") == "fine" else 20
    if spec["kind"] == "imagefolder" and spec.get("classes"):
        return len(spec["classes"])
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    return len(READERS[spec["kind"]](spec, root)[1])
