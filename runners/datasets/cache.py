"""The decoded cache: images of an on-disk split decoded once into a ``.npy`` file and memory-mapped.

Every image is converted to RGB (:func:`to_rgb`: 16-bit greyscale scaled to 8 bits, palettes and CMYK
through PIL, alpha dropped as torchvision's loader drops it), its shorter side resized to ``image_size`` (bicubic) and centre-cropped
to a square (:func:`square`). A split is decoded by a pool of threads straight into a ``.npy`` file in
the data cache (:func:`write_images`), and read back as a copy-on-write memory map of it
(:func:`read_cache`): ImageNet-100 at 224 px (~18.5 GiB) never has to fit in RAM, and batches index the
map. The file is written under a temporary name and renamed when complete, so an interrupted decode never
leaves a cache that is reused. Which file holds which split is :mod:`runners.datasets.disk`'s business.
Before anything is written, :func:`check_images` opens every image a split will decode (header, PIL's
decompression-bomb limit, pixel mode; a PNG's chunks, a JPEG's end marker): a bad file is refused by
name before the decode, not in the middle of it. PIL is imported when an image is read, not before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vitstudy_core.io import atomic_path

_CHUNK = 1024  # images submitted to the decoding pool at once: bounds the pool's queue, not the speed
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # PNG/TIFF/PGM 16-bit greyscale open as these


class UnreadableImage(Exception):
    """An image file that cannot be read or decoded: ``path`` and the ``reason`` in a few words."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(str(path), reason)  # both in args: the exception crosses a process pool
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _reason(exc: BaseException) -> str:
    """An exception in a few words, without the path an OSError repeats."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def to_rgb(img):
    """A PIL image of any mode -> an RGB PIL image of its true colours at 8 bits.

    PIL's own ``convert("RGB")`` clips 16-bit greyscale (mode ``I;16`` / ``I``) at 255, so an image of
    values 0..65535 comes out white: those are scaled by 255/65535 instead. A palette with transparency
    goes through RGBA (PIL warns otherwise); alpha is dropped, as torchvision's ``pil_loader`` drops it.

    Raises:
        ValueError: floating-point pixels (mode ``F``: no 8-bit scale), or mode ``I`` values outside
            0..65535 (32-bit integers).
    """
    from PIL import Image

    if img.mode in _SIXTEEN_BIT:
        values = np.asarray(img)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ValueError(
                f"mode {img.mode} pixel values outside 0..65535 (32-bit integers): no 8-bit scale"
            )
        return Image.fromarray(np.rint(values / 257.0).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        raise ValueError("floating-point pixels (mode F): no 8-bit scale; save it as 8- or 16-bit")
    if img.mode in ("P", "PA") and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def square(img, size: int) -> np.ndarray:
    """PIL image -> uint8 (size, size, 3): RGB (:func:`to_rgb`), shorter side to ``size`` (bicubic),
    centre crop."""
    from PIL import Image

    img = to_rgb(img)
    w, h = img.size
    if (w, h) != (size, size):
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        img = img.resize((nw, nh), Image.Resampling.BICUBIC)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)


def _unreadable_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises on a file that is no (complete) image: OSError (truncated, unidentified, ELOOP, a
    broken link), SyntaxError and ValueError (broken chunks, bad modes), the decompression-bomb error."""
    import struct
    import zlib

    from PIL import Image

    return (
        OSError,
        SyntaxError,
        ValueError,
        EOFError,
        struct.error,
        zlib.error,
        Image.DecompressionBombError,
    )


def decode_file(path: str | Path, size: int) -> np.ndarray:
    """An image file -> uint8 (size, size, 3), as :func:`square`.

    Raises:
        UnreadableImage: the file cannot be opened or decoded (naming it).
    """
    from PIL import Image

    try:
        with Image.open(path) as img:
            return square(img, size)
    except _unreadable_errors() as exc:
        raise UnreadableImage(path, _reason(exc)) from None


def check_image(path: str | Path) -> str | None:
    """Why an image file cannot be decoded, in a few words; None when it can (as far as is cheap to tell).

    Reads the header (format, size against PIL's decompression-bomb limit, pixel mode); a PNG is verified
    whole (its chunks' CRCs: truncation and corruption); a JPEG whose last bytes are not its end marker
    (truncated, or trailing data after it) is decoded to tell which. Other formats are checked by their
    header only; what is wrong inside them is found when they are decoded (the error names the file).
    """
    from PIL import Image

    try:
        with Image.open(path) as img:
            if img.mode == "F":
                return "floating-point pixels (mode F): no 8-bit scale; save it as 8- or 16-bit"
            if img.format == "PNG":
                img.verify()
            elif img.format == "JPEG" and not _ends_with_eoi(path):
                img.load()
    except _unreadable_errors() as exc:
        return _reason(exc)
    return None


def _ends_with_eoi(path: str | Path) -> bool:
    """Whether a JPEG file ends with its end-of-image marker ``FF D9`` (padding bytes after it allowed)."""
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 64))
        return f.read().rstrip(b"\x00\r\n ").endswith(b"\xff\xd9")


def check_images(paths: Sequence[str | Path], workers: int | None = None) -> tuple[str, str] | None:
    """``(path, reason)`` of the first of ``paths`` (in order) :func:`check_image` refuses; None if none.

    Files are checked by a pool of threads (opening a file waits on the disk, not on the GIL).
    """
    with ThreadPoolExecutor(workers or default_workers()) as ex:
        for p, why in zip(paths, ex.map(check_image, paths), strict=True):
            if why is not None:
                return str(p), why
    return None


def _pwrite(fd: int, arr: np.ndarray, offset: int) -> None:
    """Write ``arr``'s bytes to ``fd`` from byte ``offset``."""
    # numpy's stubs give ndarray __buffer__ only from Python 3.12; it has the buffer protocol on every one
    view = memoryview(np.ascontiguousarray(arr)).cast("B")  # type: ignore[arg-type]
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
