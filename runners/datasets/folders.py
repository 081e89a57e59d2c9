"""Reading the folders of on-disk datasets: path expansion, the walk every layout uses, image listings.

The walk follows symbolic links (ImageNet-100 is usually a folder of links into an ImageNet tree) and
skips names starting with ``.`` at every level (a ``.ipynb_checkpoints`` folder is no class, macOS
``._*.JPEG`` resource forks are no images). :func:`list_image_folder` is torchvision's ``ImageFolder``
listing (``find_classes`` + ``make_dataset``) with that one difference. No torch, no PIL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitstudy_core.errors import StudyError

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


def walk(top: str | Path) -> list[tuple[str, list[str]]]:
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
        for root, files in walk(folder):
            out += [(Path(root, f), index[c]) for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
    return out


def is_image(p: Path) -> bool:
    """A file with one of :data:`IMAGE_EXTENSIONS` (any case)."""
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def unzip(pairs: list[tuple[Path, int]]) -> tuple[list[Path], np.ndarray]:
    """``[(path, label), ...]`` -> (paths, int64 labels (N,)): the shape a layout's reader returns."""
    return [p for p, _ in pairs], np.asarray([y for _, y in pairs], dtype=np.int64)
