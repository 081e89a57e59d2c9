"""What the dataset tests share: the fixture convention every on-disk layout's test follows.

Each on-disk layout ``runners/datasets/<kind>.py`` has a test ``tests/datasets/test_<kind>.py`` that
defines ``write_fixture(root) -> dict``: it writes a tiny folder in the publisher's exact layout under
``root`` (:data:`N_CLASSES` classes; :data:`PER_CLASS` images per class in the training split and as many
held out; class ``c``'s images drawn by :func:`rgb`, so their dominant channel is ``c % 3``) and returns
the settings the layout needs to read it as that (e.g. ``classes``). The contract test
(``test_contract.py``) and the layout tests read these folders through the :func:`roots` fixture.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from runners.datasets import DATASETS

N_CLASSES, PER_CLASS = 3, 4  # 12 train and 12 held-out images: enough for an 8-image probe

# a one-run study over an on-disk dataset read from ${STUDY_TEST_DATA}
DISK_HYPOTHESIS = """\
name: disk
design:
  datasets:
    - {name: ucm, kind: ucmerced, path: "${STUDY_TEST_DATA}", image_size: 8, test_fraction: 0.5}
  model: {preset: vit_cpu12, embed_dim: 16, depth: 2, num_heads: 2}
  training: {epochs: 1, batch_size: 8, max_steps_per_epoch: 2}
  seeds: [0]
  probe: {size: 8}
claims:
  - {name: u, kind: u_shape, metric: eed_pct, subset: {dataset: ucm},
     regions: {early: [block_01], bottleneck: [block_02], late: [norm]}}
"""


def rgb(rng: np.random.Generator, size: int, cls: int) -> np.ndarray:
    """A noisy uint8 (size, size, 3) image whose mean colour encodes the class (dominant channel cls % 3),
    so labels can be checked after resizing."""
    base = np.zeros((size, size, 3)) + 40
    base[..., cls % 3] = 200
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


def on_disk_kinds() -> list[str]:
    """Registered kinds read from a folder in a publisher's layout."""
    return [name for name, entry in DATASETS.items() if entry.layout is not None]


def fixture_writer(kind: str) -> Callable[[Path], dict]:
    """``write_fixture`` of ``tests/datasets/test_<kind>.py`` (a layout without one fails here, by name)."""
    name = f"tests.datasets.test_{kind}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        pytest.fail(f"dataset layout {kind!r} has no test module tests/datasets/test_{kind}.py")
    writer = getattr(module, "write_fixture", None)
    if writer is None:
        pytest.fail(f"tests/datasets/test_{kind}.py defines no write_fixture(root) -> dict")
    return writer


class _Roots(dict):
    """``{kind: (fixture folder, settings it needs)}``, each folder written when first asked for."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base

    def __missing__(self, kind: str) -> tuple[Path, dict]:
        root = self.base / kind
        self[kind] = (root, fixture_writer(kind)(root))
        return self[kind]


@pytest.fixture(scope="session")
def roots(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """``roots[kind]``: (the layout's fixture folder, the settings it needs); shared: copy to modify."""
    return _Roots(tmp_path_factory.mktemp("datasets"))


def disk_spec(kind: str, roots: dict, path: Path | str | None = None, **kw) -> dict:
    """A spec dict of ``kind`` read from ``path`` (default: its fixture) at 8 px, fixture settings applied."""
    root, extra = roots[kind]
    return {"name": kind, "kind": kind, "path": str(path or root), "image_size": 8, **extra, **kw}
