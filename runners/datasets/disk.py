"""What every on-disk layout shares: the settings base, the folder check and the loader. Nothing is downloaded.

    images, labels = load_disk_split(spec, "train", cache_dir)   # uint8 map (N, S, S, 3), int64 (N,)

A layout is one module of this package (``cifar100.py``, ``imagefolder.py``, ...): its settings model (a
:class:`DiskDataset` subclass), the publisher's layout in words, and a reader from the folder to file
lists (or arrays) per split and class names; it registers them with :func:`on_disk_kind`. Everything
else is here and the same for every layout: ``spec["path"]`` is the folder (``${VAR}`` expanded; a
missing or malformed one raises a one-line :class:`~vitstudy_core.errors.StudyError` naming the path and
the expected layout), the seeded subsets (``n_train``, ``n_test``), the probe set (drawn from the held-out
split with the probe seed, so it is the same for every training seed), and the decoded cache
(:mod:`runners.datasets.cache`, keyed by the folder's fingerprint and every setting that changes pixels).

No torch here: the planner imports it (through the package) to build run keys.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import Field

import runners.datasets.cache as cache
from runners.datasets.base import DATASETS, DatasetKind, ImageDatasetSettings, Reader
from runners.datasets.fingerprints import dataset_fingerprint
from runners.datasets.folders import resolve_path
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest

# Bump when the pixels or file lists a spec produces change (it enters the run keys of on-disk datasets).
LOADER_VERSION = 2  # 2: links followed, hidden entries skipped, nested folders read; .npy memory maps


class DiskDataset(ImageDatasetSettings):
    """A dataset already on disk. Nothing is downloaded.

    ``path`` may be ``${ENV_VAR}`` (or contain it) and may be replaced with ``--data-root NAME=PATH``.
    It is resolved when the run starts, not at validation, and is not part of the run key: a
    fingerprint of the folder's content (file names and sizes, links followed) is. ``run`` records it
    in ``<out>/data/fingerprints.json``, so a host without the data plans the same keys.
    """

    path: str = Field(min_length=1)
    # n_train, n_test (ImageDatasetSettings): a seeded subset of the training / held-out split (None: all)
    subset_seed: int = 0


def layout_error(spec: dict, root: Path, what: str) -> StudyError:
    """One line: ``<root>: dataset <name>: <what>; expected <kind> layout: <the layout in words>``."""
    return StudyError(
        f"{what}; expected {spec['kind']} layout: {DATASETS.get(spec['kind']).layout}",
        str(root),
        f"dataset {spec['name']}",
    )


def _reader(spec: dict) -> Reader:
    """The layout's reader of an on-disk kind (those this module loads register one)."""
    read = DATASETS.get(spec["kind"]).read
    if read is None:
        raise ValueError(f"dataset kind {spec['kind']!r} has no reader of an on-disk layout")
    return read


def check_folder(spec: dict) -> None:
    """Fail early (before anything is written) on data the decode would refuse, with one line naming it.

    The folder is set and exists, its layout is the publisher's (the reader's checks: class folders, no
    empty class), and every image file of the training subset (``n_train``) and of the whole held-out
    split (the probe is drawn from it) opens as an image (:func:`cache.check_images`: header, size limit,
    pixel mode, a PNG's chunks, a JPEG's end marker; no pixel is decoded). Its cost is one read of each
    file's header (a PNG: the file), by a pool of threads.
    """
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    if not root.is_dir():
        raise layout_error(spec, root, "folder not found")
    splits, _ = _reader(spec)(spec, root)
    for split, (items, labels) in splits.items():
        if isinstance(items, np.ndarray):  # decoded arrays (CIFAR-100): nothing to open
            continue
        idx = _indices(spec, split, len(labels), root, None, None) if split == "train" else range(len(labels))
        bad = cache.check_images([items[i] for i in idx])
        if bad is not None:
            raise unreadable_error(spec, *bad)


def unreadable_error(spec: dict, path: str, reason: str) -> StudyError:
    """One line: ``<image file>: dataset <name>: unreadable image (<reason>)``."""
    return StudyError(f"unreadable image ({reason})", path, f"dataset {spec['name']}")


def count_classes(spec: dict) -> int:
    """The number of classes, from the layout's reader (lists the folder; decodes nothing)."""
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    return len(_reader(spec)(spec, root)[1])


def on_disk_kind(
    name: str,
    model: type[DiskDataset],
    layout: str,
    read: Reader,
    example: dict,
    num_classes: Callable[[dict], int] | None = None,
    train_images: Callable[[dict], int | None] | None = None,
) -> DatasetKind:
    """The registry entry of an on-disk layout: the shared loader and check around its ``read``.

    Args:
        layout: the publisher's layout in words (error messages end with it).
        read: ``(spec, folder) -> ({"train": (items, labels), "test": ...}, class names)``; items are image
            paths or uint8 arrays (N, H, W, 3); labels int64 (N,); ``test`` is the held-out split. It
            raises :func:`layout_error` on a malformed folder.
        num_classes: the head's width without listing the folder (default: count the reader's classes).
        train_images: the publisher's training images of a spec (:class:`DatasetKind`); None: unknown.
    """
    return DatasetKind(
        name=name,
        model=model,
        example=example,
        load=load_disk_split,
        num_classes=num_classes or count_classes,
        check=check_folder,
        layout=layout,
        read=read,
        train_images=train_images,
    )


def _cache_paths(
    spec: dict, split: str, cache_dir: str | Path, probe_size: int | None, probe_seed: int | None
) -> tuple[Path, Path]:
    """The ``.npy`` files (images, labels) of a split: keyed by every setting that changes them."""
    key = {k: v for k, v in spec.items() if k not in ("name", "path", "fingerprint")}
    key.update(v=LOADER_VERSION, split=split, fp=spec.get("fingerprint") or dataset_fingerprint(spec))
    if split == "probe":
        key.update(probe_size=probe_size, probe_seed=probe_seed)
    path = Path(cache_dir) / f"{spec['kind']}_{split}_{digest(key, 16, compact=False)}.npy"
    return path, path.with_name(path.stem + ".labels.npy")


def _indices(
    spec: dict, split: str, n_total: int, root: Path, probe_size: int | None, probe_seed: int | None
) -> np.ndarray:
    """Sorted indices of the split's images: the seeded probe draw, or the seeded ``n_<split>`` subset."""
    if split == "probe":
        if probe_size is None or probe_size > n_total:
            raise StudyError(
                f"probe size {probe_size} exceeds the {n_total} held-out images",
                str(root),
                "design.probe.size",
            )
        return np.sort(np.random.default_rng(probe_seed).choice(n_total, probe_size, replace=False))
    n = spec.get(f"n_{split}")
    if n is None or n >= n_total:
        return np.arange(n_total)
    seed = spec.get("subset_seed", 0) * 2 + (split == "test")
    return np.sort(np.random.default_rng(seed).choice(n_total, n, replace=False))


def _free_space(spec: dict, split: str, n: int, size: int, cache_dir: str | Path) -> tuple[int, int]:
    """(bytes the decoded split needs, bytes free) in the cache; StudyError if they do not fit."""
    need = n * size * size * 3 + n * 8 + 256
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache_dir).free
    if need > free:
        raise StudyError(
            f"the decoded {split} split ({n} images at {size} px) needs {cache.size_text(need)} in the data "
            f"cache but only {cache.size_text(free)} is free there; free space or use another --out",
            str(cache_dir),
            f"dataset {spec['name']}",
        )
    return need, free


def load_disk_split(
    spec: dict,
    split: str,
    cache_dir: str | Path,
    probe_size: int | None = None,
    probe_seed: int | None = None,
    workers: int | None = None,
    log: Callable[[str], None] | None = print,
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one split of an on-disk dataset, decoded once into the cache and memory-mapped.

    Args:
        spec: the dataset spec as a dict (a ``*Dataset.model_dump()``; ``path`` may hold ``${VAR}``).
        split: ``train``, ``test`` (the held-out split) or ``probe`` (``probe_size`` images of the
            held-out split drawn with ``probe_seed``, before any ``n_test`` subsetting).
        cache_dir: folder for the ``.npy`` cache.
        workers: decoding threads (default: one per usable CPU).
        log: called with one line (the cache's size) before a split is decoded; None: quiet.

    Returns:
        images: uint8 (N, image_size, image_size, 3), a copy-on-write ``np.memmap`` of the cache file
        (index it batch by batch; ``np.asarray`` would read it all); labels: int64 (N,) in
        0..n_classes-1.

    Raises:
        StudyError: the folder is missing or malformed, an image is unreadable, or the cache's disk has
            less free space than the decoded split needs.
    """
    if split not in ("train", "test", "probe"):
        raise ValueError(f"unknown split {split!r}")
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    if not root.is_dir():
        raise layout_error(spec, root, "dataset folder not found")
    size = spec["image_size"]
    path, labels_path = _cache_paths(spec, split, cache_dir, probe_size, probe_seed)
    cached = cache.read_cache(path, labels_path, size)
    if cached is not None:
        return cached
    splits, _ = _reader(spec)(spec, root)
    items, labels = splits["test" if split == "probe" else split]
    idx = _indices(spec, split, len(labels), root, probe_size, probe_seed)
    items = items[idx] if isinstance(items, np.ndarray) else [items[i] for i in idx]
    need, free = _free_space(spec, split, len(idx), size, cache_dir)
    workers = workers or cache.default_workers()
    if log is not None:
        log(
            f"data {spec['name']}: decoding {len(idx)} {split} images at {size} px with {workers} threads "
            f"into {cache.size_text(need)} of cache ({path.name}; {cache.size_text(free)} free)"
        )
    try:
        cache.write_images(path, items, size, workers)
    except cache.UnreadableImage as exc:  # what the early check cannot see (e.g. a truncated TIFF)
        raise unreadable_error(spec, exc.path, exc.reason) from None
    except OSError as exc:
        raise layout_error(spec, root, f"unreadable image ({exc})") from None
    cache.write_labels(labels_path, labels[idx])
    out = cache.read_cache(path, labels_path, size)
    assert out is not None  # both files were written just above
    return out
