"""The decoded cache: images of an on-disk split decoded once into a ``.npy`` file and memory-mapped.

Every image is converted to RGB, its shorter side resized to ``image_size`` (bicubic) and centre-cropped
to a square (:func:`square`). A split is decoded by a pool of threads straight into a ``.npy`` file in
the data cache (:func:`write_images`), and read back as a copy-on-write memory map of it
(:func:`read_cache`): ImageNet-100 at 224 px (~18.5 GiB) never has to fit in RAM, and batches index the
map. The file is written under a temporary name and renamed when complete, so an interrupted decode never
leaves a cache that is reused. Which file holds which split is :mod:`runners.datasets.disk`'s business.
PIL is imported when an image is decoded, not before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vitstudy_core.io import atomic_path

_CHUNK = 1024  # images submitted to the decoding pool at once: bounds the pool's queue, not the speed


def square(img, size: int) -> np.ndarray:
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


def decode_file(path: str | Path, size: int) -> np.ndarray:
    """An image file -> uint8 (size, size, 3), as :func:`square`."""
    from PIL import Image

    with Image.open(path) as img:
        return square(img, size)


def _pwrite(fd: int, arr: np.ndarray, offset: int) -> None:
    """Write ``arr``'s bytes to ``fd`` from byte ``offset``."""
    view = memoryview(np.ascontiguousarray(arr)).cast("B")
    while view:  # a regular file takes it in one call; the loop is for the rare short write
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _decode_range(paths: list[str], size: int, file: str, offset: int) -> None:
    """Process-pool task: decode ``paths`` and write them, one after another, from byte ``offset``."""
    fd = os.open(file, os.O_WRONLY)
    try:
        for j, p in enumerate(paths):
            _pwrite(fd, decode_file(p, size), offset + j * size * size * 3)
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
    """Decode (paths) or resize (uint8 arrays) ``items`` into ``tmp`` from byte ``offset``, by threads."""
    from PIL import Image

    nbytes = size * size * 3
    if isinstance(items, np.ndarray):

        def one(i: int) -> None:
            img = items[i] if items.shape[1] == size else square(Image.fromarray(items[i]), size)
            _pwrite(fd, img, offset + i * nbytes)
    else:

        def one(i: int) -> None:
            _pwrite(fd, decode_file(items[i], size), offset + i * nbytes)

    fd = os.open(tmp, os.O_WRONLY)
    ex: Executor = ThreadPoolExecutor(workers)
    try:
        for start in range(0, len(items), _CHUNK):
            for _ in ex.map(one, range(start, min(len(items), start + _CHUNK))):
                pass
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        os.close(fd)


def size_text(nbytes: int) -> str:
    """A byte count as ``12.3 MiB`` or ``1.23 GiB``."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def read_cache(path: Path, labels_path: Path, size: int) -> tuple[np.ndarray, np.ndarray] | None:
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


def write_labels(labels_path: Path, labels: np.ndarray) -> None:
    """Save int64 labels (N,) beside the decoded images, atomically (written after the images)."""
    with atomic_path(labels_path, suffix=".tmp.npy") as tmp:
        np.save(tmp, labels)
