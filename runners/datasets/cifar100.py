"""CIFAR-100, python version: ``<path>/train``, ``<path>/test``, ``<path>/meta``, as the archive ships them.

The files were pickled by Python 2's cPickle (protocol 2). Loaded with ``encoding="bytes"`` their keys
are bytes: a batch holds ``b"data"`` (uint8 (N, 3072): channel-major 32x32 images), ``b"fine_labels"``,
``b"coarse_labels"``, ``b"filenames"`` and ``b"batch_label"``; ``meta`` holds ``b"fine_label_names"`` and
``b"coarse_label_names"``. The test split is the held-out split.

A pickle can name any callable and have it called, so a crafted file in a data folder would run code
when read. These files are read by :class:`_CifarUnpickler`, which resolves only the globals the real
files contain (numpy's array reconstruction and the builtin containers) and refuses any other with one
line naming the file: nothing a file names is imported or executed.
"""

from __future__ import annotations

import builtins
import codecs
import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from runners.datasets.base import DATASETS
from runners.datasets.disk import DiskDataset, layout_error, on_disk_kind

LAYOUT = "the CIFAR-100 python version: files train, test, meta (pickled dicts)"


class Cifar100Dataset(DiskDataset):
    """CIFAR-100, python version: ``<path>/train``, ``<path>/test``, ``<path>/meta`` pickle files."""

    kind: Literal["cifar100"]
    image_size: int = Field(32, ge=8, le=512)
    label: Literal["fine", "coarse"] = "fine"


def _numpy_globals() -> dict[tuple[str, str], object]:
    """numpy's array-pickling callables under every module name numpy has pickled them with.

    Taken from numpy's own reductions (not imported by name), so numpy 1.x (``numpy.core``) and 2.x
    (``numpy._core``) files both load without importing the deprecated alias.
    """
    reconstruct = np.empty(0, np.uint8).__reduce__()[0]  # protocols 0-4: _reconstruct + __setstate__
    frombuffer = np.empty(1, np.uint8).__reduce_ex__(5)[0]  # protocol 5: _frombuffer(buffer, dtype, ...)
    out: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        out[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return out


_CONTAINERS = ("dict", "list", "tuple", "set", "frozenset", "bytearray")
_ALLOWED = {
    **_numpy_globals(),
    # Python 3 pickles at protocols 0-2 spell bytes as _codecs.encode(str, "latin1"): a pure function
    ("_codecs", "encode"): codecs.encode,
    **{(m, n): getattr(builtins, n) for m in ("builtins", "__builtin__") for n in _CONTAINERS},
}


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`_ALLOWED` globals (what CIFAR-100's files contain)."""

    def __init__(self, file, where: str):
        super().__init__(file, encoding="bytes")
        self.where = where

    def find_class(self, module: str, name: str) -> object:
        """The allowed global ``module.name``; any other is refused before anything is imported."""
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name} in {self.where} (a CIFAR-100 file holds only numpy arrays, "
                "lists and bytes)"
            ) from None

    def persistent_load(self, pid: object) -> object:
        """Refuse persistent ids (the real files have none; a custom loader would be code)."""
        raise pickle.UnpicklingError(f"refused persistent id in {self.where}")


def load_pickle(path: Path) -> dict[str, Any]:
    """A CIFAR-100 python file as a dict with str keys (bytes keys decoded; str keys accepted as they are).

    Raises:
        pickle.UnpicklingError: the file names a global other than the allowed ones, or is no pickle.
    """
    with open(path, "rb") as f:
        d = _CifarUnpickler(f, path.name).load()
    if not isinstance(d, dict):
        raise pickle.UnpicklingError(f"{path.name} holds a {type(d).__name__}, expected a dict")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


def read(spec: dict, root: Path) -> tuple[dict, list[str]]:
    """``{"train": (uint8 (N, 32, 32, 3), int64 (N,)), "test": ...}`` and the label set's class names."""
    missing = [n for n in ("train", "test", "meta") if not (root / n).is_file()]
    if missing:
        raise layout_error(spec, root, f"missing {', '.join(missing)}")
    label = spec.get("label", "fine")
    try:
        names = load_pickle(root / "meta")[f"{label}_label_names"]
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        splits = {}
        for split in ("train", "test"):
            d = load_pickle(root / split)
            data = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            splits[split] = (data, np.asarray(d[f"{label}_labels"], dtype=np.int64))
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError, TypeError, AttributeError) as exc:
        raise layout_error(spec, root, f"unreadable pickle ({type(exc).__name__}: {exc})") from None
    return splits, classes


def _num_classes(spec: dict) -> int:
    return 100 if spec.get("label", "fine") == "fine" else 20


DATASETS.register(
    "cifar100",
    on_disk_kind(
        "cifar100",
        Cifar100Dataset,
        LAYOUT,
        read,
        example={"name": "cifar100", "kind": "cifar100", "path": "${CIFAR100_DIR}"},
        num_classes=_num_classes,
        train_images=lambda spec: 50_000,  # the publisher's training split
    ),
)
