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
from typing import Literal, overload

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


@overload
def resolve_path(raw: str, strict: Literal[True] = True, name: str | None = None) -> Path: ...
@overload
def resolve_path(raw: str, strict: bool = True, name: str | None = None) -> Path | None: ...
def resolve_path(raw: str, strict: bool = True, name: str | None = None) -> Path | None:
    """Expand ``${VAR}``/``$VAR`` and ``~`` in a dataset path.

    A path that exists as written is taken as written: a folder whose name holds ``$`` (given through
    ``--data-root``, or a path resolved once already) is a folder, not a variable to expand.
    Returns None (``strict=False``) or raises StudyError (``strict=True``) if a variable is unset.
    """
    if "$" in raw and os.path.exists(raw):
        return Path(raw)
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


def is_dir(entry: os.DirEntry) -> bool:
    """``entry.is_dir()`` (links followed); False for a link that cannot be followed (a loop: ELOOP), so
    that it is listed as a file and the image check names it."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def walk(top: str | Path) -> list[tuple[str, list[str]]]:
    """``(folder, sorted file names)`` of every folder under ``top``, in ``sorted(os.walk(top))`` order.

    Symbolic links to folders are followed (as ``os.walk(followlinks=True)``), except a link back to a
    folder above it (a cycle); names starting with ``.`` are skipped. A broken link, or one that cannot be
    followed (a link to itself), counts as a file.
    """
    out: list[tuple[str, list[str]]] = []

    def visit(folder: str, above: frozenset[str]) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable: skipped, as os.walk does
            return
        files = sorted(e.name for e in entries if not e.name.startswith(".") and not is_dir(e))
        out.append((folder, files))
        for e in entries:
            if not e.name.startswith(".") and is_dir(e):
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
    """A name with one of :data:`IMAGE_EXTENSIONS` (any case) that is not a folder: a broken link or a link
    to itself is kept, so that the image check refuses it by name instead of the data shrinking silently."""
    return p.suffix.lower() in IMAGE_EXTENSIONS and not p.is_dir()


def unzip(pairs: list[tuple[Path, int]]) -> tuple[list[Path], np.ndarray]:
    """``[(path, label), ...]`` -> (paths, int64 labels (N,)): the shape a layout's reader returns."""
    return [p for p, _ in pairs], np.asarray([y for _, y in pairs], dtype=np.int64)
