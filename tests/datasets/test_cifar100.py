"""CIFAR-100 (python version): the Python 2 pickles as shipped, label sets, and no code run by a crafted file."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from runners.datasets import load_split, num_classes
from runners.datasets.cifar100 import load_pickle
from tests.datasets.conftest import N_CLASSES, PER_CLASS, disk_spec, rgb
from vitstudy_core.errors import StudyError


def _py2_pickle(d: dict) -> bytes:
    """Pickle ``d`` as Python 2's cPickle (protocol 2) does: ``str`` keys as BINSTRING opcodes, numpy arrays
    through ``numpy.core.multiarray._reconstruct`` with the raw bytes as a BINSTRING (as in the official
    CIFAR-100 files). Values: uint8 arrays, lists of ints, lists of ``bytes``, ``bytes``."""

    def s(b: bytes) -> bytes:
        return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)

    def i(n: int) -> bytes:
        return b"J" + struct.pack("<i", n)

    def value(v) -> bytes:
        if isinstance(v, bytes):
            return s(v)
        if isinstance(v, np.ndarray):
            dt = b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R(" + i(3) + s(b"|") + b"NNN"
            dt += i(-1) + i(-1) + i(0) + b"tb"
            shape = b"(" + b"".join(i(n) for n in v.shape) + b"t"
            head = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s(b"b")
            return head + b"\x87R(" + i(1) + shape + dt + b"\x89" + s(v.astype(np.uint8).tobytes()) + b"tb"
        return b"](" + b"".join(s(x) if isinstance(x, bytes) else i(int(x)) for x in v) + b"e"

    return b"\x80\x02}(" + b"".join(s(k.encode()) + value(v) for k, v in d.items()) + b"u."


def write_fixture(root: Path) -> dict:
    """train/test/meta as the official python version: Python 2 pickles, str keys, (N, 3072) channel-major."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split, batch_label in (("train", b"training batch 1 of 1"), ("test", b"testing batch 1 of 1")):
        labels = [c for c in range(N_CLASSES) for _ in range(PER_CLASS)]
        data = np.stack([rgb(rng, 32, c).transpose(2, 0, 1).reshape(-1) for c in labels])
        d = {
            "filenames": [f"img_{j}.png".encode() for j in range(len(labels))],
            "batch_label": batch_label,
            "fine_labels": labels,
            "coarse_labels": [c % 2 for c in labels],
            "data": data,
        }
        (root / split).write_bytes(_py2_pickle(d))
    meta = {
        "fine_label_names": [f"fine{i}".encode() for i in range(100)],
        "coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    }
    (root / "meta").write_bytes(_py2_pickle(meta))
    return {}


def test_the_python2_files_read_as_published(roots):
    """Every key of a real batch comes back (bytes keys decoded), the data as uint8 (N, 3072)."""
    root, _ = roots["cifar100"]
    d = load_pickle(root / "train")
    assert set(d) == {"filenames", "batch_label", "fine_labels", "coarse_labels", "data"}
    assert d["data"].dtype == np.uint8 and d["data"].shape == (N_CLASSES * PER_CLASS, 3072)
    assert d["batch_label"] == b"training batch 1 of 1" and d["filenames"][0] == b"img_0.png"
    # the same pixels as an unrestricted unpickler gives
    with open(root / "train", "rb") as f:
        plain = pickle.load(f, encoding="bytes")
    np.testing.assert_array_equal(d["data"], plain[b"data"])
    meta = load_pickle(root / "meta")
    assert meta["fine_label_names"][3] == b"fine3" and len(meta["coarse_label_names"]) == 20


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_files_repickled_by_python3_read_too(roots, tmp_path, protocol):
    """A copy re-pickled by Python 3 (str keys, numpy 2's ``numpy._core`` names, protocol 5 buffers)."""
    root, _ = roots["cifar100"]
    copy = tmp_path / "cifar"
    copy.mkdir()
    for name in ("train", "test", "meta"):
        d = load_pickle(root / name)
        (copy / name).write_bytes(pickle.dumps(d, protocol=protocol))
    spec = disk_spec("cifar100", roots, copy)
    x, y = load_split(spec, "train", tmp_path / "cache")
    x0, y0 = load_split(disk_spec("cifar100", roots), "train", tmp_path / "cache0")
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


def test_coarse_labels(roots, tmp_path):
    spec = disk_spec("cifar100", roots, label="coarse")
    _, y = load_split(spec, "train", tmp_path)
    assert set(y.tolist()) == {0, 1} and num_classes(spec) == 20
    assert num_classes(disk_spec("cifar100", roots)) == 100


def test_malformed_pickle_names_what_is_wrong(roots, tmp_path):
    cifar = tmp_path / "cifar"
    shutil.copytree(roots["cifar100"][0], cifar)
    (cifar / "train").write_bytes(b"not a pickle")
    with pytest.raises(StudyError, match="unreadable pickle"):
        load_split(disk_spec("cifar100", roots, cifar), "train", tmp_path)
    (cifar / "train").unlink()
    with pytest.raises(StudyError, match="missing train"):
        load_split(disk_spec("cifar100", roots, cifar), "train", tmp_path)


class _Canary:
    """A payload: unpickling it would create the file ``path``."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.makedirs, (self.path,))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("where", ["train", "meta", "nested"])
def test_a_crafted_batch_runs_nothing(roots, tmp_path, where, protocol):
    """A batch (or meta) whose pickle names another callable is refused in one line; the payload never runs."""
    cifar = tmp_path / "cifar"
    shutil.copytree(roots["cifar100"][0], cifar)
    canary = tmp_path / "canary"
    name = "meta" if where == "meta" else "train"
    # the payload comes before the array, so the test is that the payload's own global is refused
    if where == "nested":  # hidden inside the labels list
        payload = {"fine_labels": [0, [1, _Canary(canary)]], "fine_label_names": [b"x"]}
    else:
        payload = {"batch_label": _Canary(canary), "fine_labels": [0], "fine_label_names": [b"x"]}
    payload["data"] = np.zeros((1, 3072), np.uint8)
    (cifar / name).write_bytes(pickle.dumps(payload, protocol=protocol))
    assert not canary.exists()
    with pytest.raises(StudyError) as err:
        load_split(disk_spec("cifar100", roots, cifar), "train", tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and "refused global" in msg and "makedirs" in msg and name in msg
    assert not canary.exists()
    with pytest.raises(pickle.UnpicklingError):  # the restricted reader itself, not only the layout's
        load_pickle(cifar / name)
    assert not canary.exists()
    with open(cifar / name, "rb") as f:  # the same file through plain pickle does run it: a real payload
        pickle.load(f)
    assert canary.exists()
