"""Loaders for datasets already on disk, in the layouts their publishers ship. Nothing is downloaded.

    images, labels = load_disk_split(spec, "train", cache_dir)   # uint8 map (N, S, S, 3), int64 (N,)

Layouts (``spec["path"]`` is the folder; a missing or malformed one raises a one-line
:class:`~vitstudy_core.errors.StudyError` naming the path and the expected layout):

* ``cifar100``: the python version: ``train``, ``test``, ``meta`` pickle files (``b"data"``: uint8
  (N, 3072) channel-major 32x32, ``b"fine_labels"``/``b"coarse_labels"``; ``meta``:
  ``b"fine_label_names"``/``b"coarse_label_names"``). The test split is the held-out split.
* ``tiny_imagenet``: ``train/<wnid>/images/*.JPEG``; ``val/images/*.JPEG`` with
  ``val/val_annotations.txt`` (tab-separated: file, wnid, box). The val split is the held-out split.
* ``ucmerced``: ``Images/<class>/*.tif``. No official split: a per-class stratified split drawn with
  ``split_seed`` (``test_fraction`` of each class held out); the split's file lists go in the cache.
* ``imagefolder``: ``<train_dir>/<class>/**`` and ``<test_dir>/<class>/**`` (ImageNet-100 and similar);
  ``classes`` restricts and orders the classes. The rules are torchvision's ``ImageFolder``
  (``find_classes`` + ``make_dataset``): class folders may be symbolic links and are walked recursively
  with links followed, files are kept by extension (torchvision's ``IMG_EXTENSIONS``), samples come in
  ``sorted(os.walk(class folder))`` order. One difference, on purpose: entries whose name starts with
  ``.`` are skipped at every level, so a ``.ipynb_checkpoints`` folder is no class (torchvision 0.29's
  ``find_classes`` would make it class 0) and macOS ``._*.JPEG`` resource forks are not read as images.

Every image is converted to RGB, its shorter side resized to ``image_size`` (bicubic) and centre-cropped
to a square. A split is decoded once, by a pool of threads, straight into a ``.npy`` file in the data
cache (keyed by the folder's fingerprint and every setting that changes pixels), and returned as a
copy-on-write memory map of it: ImageNet-100 at 224 px (~18.5 GiB) never has to fit in RAM, and batches
index the map. The file is written under a temporary name and renamed when complete, so an interrupted
decode never leaves a cache that is reused. The probe set is drawn from the held-out split with the probe
seed, so it is the same for every training seed.

Run keys use the folder's content fingerprint (:func:`dataset_fingerprint`: file paths and sizes, links
followed). ``run`` records it in ``<out>/data/fingerprints.json`` (:func:`resolve_fingerprint`), and a
host without the data (``table`` on an analysis machine) reuses the recorded one, so a hypothesis file
plans the same keys with or without the data present.

This module does not import torch: the planner uses :func:`resolve_path` and
:func:`resolve_fingerprint` to build run keys.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.io import atomic_path, atomic_write_json

# Bump when the pixels or file lists a spec produces change (it enters the run keys of on-disk datasets).
LOADER_VERSION = 2  # 2: links followed, hidden entries skipped, nested folders read; .npy memory maps
IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".bmp",
    ".pgm",
    ".tif",
    ".tiff",
    ".webp",
)  # torchvision's
FINGERPRINTS = "fingerprints.json"  # in the data cache: the fingerprint each on-disk dataset was run with
_CHUNK = 1024  # images submitted to the decoding pool at once: bounds the pool's queue, not the speed
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


def _walk(top: str | Path) -> list[tuple[str, list[str]]]:
    """``(folder, sorted file names)`` of every folder under ``top``, in ``sorted(os.walk(top))`` order.

    Symbolic links to folders are followed (as ``os.walk(followlinks=True)``), except a link back to a
    folder above it (a cycle); names starting with ``.`` are skipped. A broken link counts as a file.
    """
    out: list[tuple[str, list[str]]] = []

    def visit(folder: str, above: frozenset[str]) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable: skipped, as os.walk does
            return
        files = sorted(e.name for e in entries if not e.name.startswith(".") and not e.is_dir())
        out.append((folder, files))
        for e in entries:
            if not e.name.startswith(".") and e.is_dir():
                real = os.path.realpath(e.path)
                if real not in above:
                    visit(e.path, above | {real})

    visit(str(top), frozenset({os.path.realpath(top)}))
    return sorted(out)


def list_image_folder(directory: str | Path, classes: Sequence[str]) -> list[tuple[Path, int]]:
    """``(image path, class index)`` of ``directory/<class>/**``: torchvision's ``make_dataset`` rules.

    ``classes[i]`` gets label ``i``; classes are visited in sorted order and each class folder in
    ``sorted(os.walk(folder, followlinks=True))`` order, keeping files by extension (``IMAGE_EXTENSIONS``),
    as ``make_dataset(directory, {c: i}, IMG_EXTENSIONS)`` does, except that hidden entries are skipped.
    A class without a folder contributes nothing.
    """
    index = {c: i for i, c in enumerate(classes)}
    out = []
    for c in sorted(index):
        folder = os.path.join(directory, c)
        if not os.path.isdir(folder):
            continue
        for root, files in _walk(folder):
            out += [(Path(root, f), index[c]) for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
    return out


def _files(root: Path) -> list[tuple[str, int]]:
    """Sorted ``(relative path, size in bytes)`` of every non-hidden file under ``root``, links followed."""
    out = []
    for folder, files in _walk(root):
        for fn in files:
            p = os.path.join(folder, fn)
            try:
                size = os.path.getsize(p)
            except OSError:  # a broken link: listed, so that fixing it changes the fingerprint
                size = -1
            out.append((os.path.relpath(p, root), size))
    return out


def dataset_fingerprint(spec: dict) -> str | None:
    """sha256 (16 hex digits) of the folder's sorted (relative path, size) list; None if it is absent.

    Files are listed as :func:`_walk` does (links followed, hidden entries skipped), so a folder of
    links into an ImageNet tree is fingerprinted by the images the links reach.
    """
    root = resolve_path(spec["path"], strict=False)
    if root is None or not root.is_dir():
        return None
    return digest(_files(root), 16)


def fingerprint_record_key(spec: dict) -> str:
    """The entry of a dataset in ``fingerprints.json``: ``<kind>:<name>``."""
    return f"{spec['kind']}:{spec['name']}"


def recorded_fingerprints(data_dir: str | Path) -> dict[str, dict]:
    """The ``fingerprints.json`` of a data cache: ``{"<kind>:<name>": {"fingerprint", "path", ...}}``."""
    path = Path(data_dir) / FINGERPRINTS
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(
            f"unreadable fingerprint record ({exc}); delete it to re-record", str(path)
        ) from None


def resolve_fingerprint(spec: dict, data_dir: str | Path | None = None, record: bool = False) -> str | None:
    """The content fingerprint that keys the runs of an on-disk dataset (``spec["path"]`` resolved).

    * ``record=True`` (``run``, the data present): the folder's own fingerprint, written to
      ``data_dir/fingerprints.json`` under ``<kind>:<name>`` (the previous value is kept in ``history``).
      The folder's content wins: if it changed since it was recorded, its runs get new keys.
    * otherwise (``table``, ``validate``): the recorded fingerprint if ``data_dir`` holds one, so the keys
      are those the runs were trained under whether or not the data are on this host; else the folder's
      own fingerprint; else None (keys unknown).
    """
    if not record:
        entry = (
            recorded_fingerprints(data_dir).get(fingerprint_record_key(spec))
            if data_dir is not None
            else None
        )
        return entry["fingerprint"] if entry else dataset_fingerprint(spec)
    fingerprint = dataset_fingerprint(spec)
    if fingerprint is None or data_dir is None:
        return fingerprint
    book = recorded_fingerprints(data_dir)
    old = book.get(fingerprint_record_key(spec))
    if old is None or old["fingerprint"] != fingerprint:
        history = ([old["fingerprint"], *old.get("history", [])] if old else [])[:20]
        book[fingerprint_record_key(spec)] = {
            "fingerprint": fingerprint,
            "path": str(spec["path"]),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "history": history,
        }
        atomic_write_json(Path(data_dir) / FINGERPRINTS, book, indent=1, sort_keys=True)
    return fingerprint


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


def _decode_file(path: str | Path, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return _square(img, size)


def _pwrite(fd: int, arr: np.ndarray, offset: int) -> None:
    view = memoryview(np.ascontiguousarray(arr)).cast("B")
    while view:  # a regular file takes it in one call; the loop is for the rare short write
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _decode_range(paths: list[str], size: int, file: str, offset: int) -> None:
    """Process-pool task: decode ``paths`` and write them, one after another, from byte ``offset``."""
    fd = os.open(file, os.O_WRONLY)
    try:
        for j, p in enumerate(paths):
            _pwrite(fd, _decode_file(p, size), offset + j * size * size * 3)
    finally:
        os.close(fd)


def default_workers() -> int:
    """Decoding threads: one per CPU this process may use (PIL releases the GIL while it decodes)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def write_images(
    out: Path,
    items: Sequence[str | Path] | np.ndarray,
    size: int,
    workers: int | None = None,
    pool: str = "thread",
) -> None:
    """Decode ``items`` into the ``.npy`` file ``out``: uint8 ``(N, size, size, 3)``, written atomically.

    Each worker writes each image at its offset in the file (``os.pwrite``): nothing is held in memory but
    the images being decoded, and the pages written are the page cache's, not this process's (writing
    through a memory map would count every page written in the resident set). The file is written as
    ``out.<pid>.tmp`` and renamed when complete; an exception or interrupt removes it.

    Args:
        items: image file paths, or uint8 images ``(N, H, W, 3)`` (CIFAR-100) to resize.
        workers: pool size (default: :func:`default_workers`).
        pool: ``thread`` or ``process`` (file paths only; the benchmark compares them).
    """
    n, nbytes = len(items), size * size * 3
    workers = workers or default_workers()
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as f:
            header = {"descr": "|u1", "fortran_order": False, "shape": (n, size, size, 3)}
            np.lib.format.write_array_header_1_0(f, header)
            offset = f.tell()
            f.truncate(offset + n * nbytes)
        if pool == "process":
            if isinstance(items, np.ndarray):
                raise ValueError("pool='process' decodes files, not arrays")
            step = max(1, min(256, -(-n // (4 * workers))))
            with ProcessPoolExecutor(workers) as ex:
                tasks = [
                    ex.submit(
                        _decode_range,
                        [str(p) for p in items[i : i + step]],
                        size,
                        str(tmp),
                        offset + i * nbytes,
                    )
                    for i in range(0, n, step)
                ]
                for t in tasks:
                    t.result()
        else:
            _fill_with_threads(tmp, offset, items, size, workers)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _fill_with_threads(tmp: Path, offset: int, items, size: int, workers: int) -> None:
    from PIL import Image

    nbytes = size * size * 3
    if isinstance(items, np.ndarray):

        def one(i: int) -> None:
            img = items[i] if items.shape[1] == size else _square(Image.fromarray(items[i]), size)
            _pwrite(fd, img, offset + i * nbytes)
    else:

        def one(i: int) -> None:
            _pwrite(fd, _decode_file(items[i], size), offset + i * nbytes)

    fd = os.open(tmp, os.O_WRONLY)
    ex: Executor = ThreadPoolExecutor(workers)
    try:
        for start in range(0, len(items), _CHUNK):
            for _ in ex.map(one, range(start, min(len(items), start + _CHUNK))):
                pass
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        os.close(fd)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


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
    # torchvision's find_classes, hidden folders skipped (is_dir() follows links: linked classes count)
    found = sorted(e.name for e in os.scandir(dirs["train"]) if e.is_dir() and not e.name.startswith("."))
    classes = list(spec.get("classes") or found)
    absent = [c for c in classes if c not in found]
    if absent or len(classes) < 2:
        raise _bad(spec, root, f"class folders {absent[:3] or classes} not found under {dirs['train'].name}/")
    splits = {}
    for split, d in dirs.items():
        pairs = list_image_folder(d, classes)
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


def _read_cache(path: Path, labels_path: Path, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached split as a copy-on-write map (writes stay in this process) and its labels, or None."""
    if not (path.exists() and labels_path.exists()):
        return None
    try:
        images, labels = np.load(path, mmap_mode="c"), np.load(labels_path)
        if images.shape[1:] == (size, size, 3) and images.dtype == np.uint8 and len(labels) == len(images):
            return images, labels
    except (OSError, ValueError, EOFError):  # a corrupt cache is decoded again, never trusted
        pass
    path.unlink(missing_ok=True)
    labels_path.unlink(missing_ok=True)
    return None


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
        raise StudyError(
            f"dataset folder not found; expected {spec['kind']} layout: {LAYOUTS[spec['kind']]}",
            str(root),
            f"dataset {spec['name']}",
        )
    size = spec["image_size"]
    key = {k: v for k, v in spec.items() if k not in ("name", "path", "fingerprint")}
    key.update(v=LOADER_VERSION, split=split, fp=spec.get("fingerprint") or dataset_fingerprint(spec))
    if split == "probe":
        key.update(probe_size=probe_size, probe_seed=probe_seed)
    path = Path(cache_dir) / f"{spec['kind']}_{split}_{digest(key, 16, compact=False)}.npy"
    labels_path = path.with_name(path.stem + ".labels.npy")
    cached = _read_cache(path, labels_path, size)
    if cached is not None:
        return cached
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
    items, labels = splits[source]
    items = items[idx] if isinstance(items, np.ndarray) else [items[i] for i in idx]
    need = len(idx) * size * size * 3 + len(idx) * 8 + 256
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache_dir).free
    if need > free:
        raise StudyError(
            f"the decoded {split} split ({len(idx)} images at {size} px) needs {_size(need)} in the data "
            f"cache but only {_size(free)} is free there; free space or use another --out",
            str(cache_dir),
            f"dataset {spec['name']}",
        )
    workers = workers or default_workers()
    if log is not None:
        log(
            f"data {spec['name']}: decoding {len(idx)} {split} images at {size} px with {workers} threads "
            f"into {_size(need)} of cache ({path.name}; {_size(free)} free)"
        )
    try:
        write_images(path, items, size, workers)
    except OSError as exc:  # PIL: truncated or not an image
        raise _bad(spec, root, f"unreadable image ({exc})") from None
    with atomic_path(labels_path, suffix=".tmp.npy") as tmp:
        np.save(tmp, labels[idx])
    return _read_cache(path, labels_path, size)


def disk_num_classes(spec: dict) -> int:
    """Number of classes of an on-disk dataset (the model head's width)."""
    if spec["kind"] == "cifar100":
        return 100 if spec.get("label", "fine") == "fine" else 20
    if spec["kind"] == "imagefolder" and spec.get("classes"):
        return len(spec["classes"])
    root = resolve_path(spec["path"], strict=True, name=spec["name"])
    return len(READERS[spec["kind"]](spec, root)[1])
