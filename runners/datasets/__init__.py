"""Datasets as plug-ins: every module here that is not a shared part registers one dataset kind on import.

    from runners.datasets import DATASETS, load_split, num_classes
    images, labels = load_split(run["dataset"], "train", data_dir)   # uint8 (N, S, S, 3), int64 (N,)

The modules, by job:

* one per kind, owning its settings model and how its data are made or read: ``procedural`` (generated
  from a seed), the on-disk layouts ``cifar100``, ``tiny_imagenet``, ``ucmerced``, ``imagefolder``, and
  ``external`` (a name only, for imported tables);
* shared by the on-disk layouts: ``disk`` (the settings base, folder check and loader), ``folders``
  (paths, the walk, image listings), ``fingerprints`` (what run keys hold in place of a path) and
  ``cache`` (images decoded once into memory-mapped ``.npy`` files);
* ``base``: the registry (:data:`DATASETS`) and its entry (:class:`DatasetKind`).

Adding a layout is adding one module (its model, its reader, ``DATASETS.register(...)``) plus its test;
the hypothesis schema (``design.datasets``), the planner and the run sources find it through this
registry. Nothing in this package imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import numpy as np

from runners.datasets.base import DATASETS, DEFAULT_KIND, DatasetKind, kind_of
from runners.datasets.disk import LOADER_VERSION, load_disk_split
from runners.datasets.fingerprints import (
    dataset_fingerprint,
    fingerprint_record_key,
    recorded_fingerprints,
    resolve_fingerprint,
)
from runners.datasets.folders import resolve_path
from runners.datasets.procedural import GENERATOR_VERSION
from vitstudy_core.errors import StudyError

__all__ = [
    "DATASETS",
    "DEFAULT_KIND",
    "GENERATOR_VERSION",
    "LABEL_SEED_OFFSET",
    "LOADER_VERSION",
    "DatasetKind",
    "check_dataset_folder",
    "dataset_fingerprint",
    "fingerprint_record_key",
    "kind_of",
    "load_disk_split",
    "load_split",
    "num_classes",
    "recorded_fingerprints",
    "resolve_fingerprint",
    "resolve_path",
    "shuffled_labels",
]

# the permutation of a run's shuffled training labels is seeded from the run seed by this offset: a stream
# of its own (runners.train seeds the init with the seed, the data order with seed + 7919)
LABEL_SEED_OFFSET = 15485863

_SHARED = {"base", "cache", "disk", "fingerprints", "folders"}
# These register first, in this order: the order error messages have always listed the kinds in
# (``procedural`` first: it is the default). Any other kind module follows, in name order.
_FIRST = ("procedural", "cifar100", "tiny_imagenet", "ucmerced", "imagefolder", "external")
_found = {m.name for m in pkgutil.iter_modules(__path__)} - _SHARED
for _module in [m for m in _FIRST if m in _found] + sorted(_found - set(_FIRST)):
    if not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")


def _with_images(spec: dict) -> DatasetKind:
    entry = DATASETS.get(kind_of(spec))
    if entry.load is None:
        raise StudyError(
            f"dataset kind {entry.name} has no images (it names the dataset of an imported table)",
            None,
            f"dataset {spec.get('name')}",
        )
    return entry


def load_split(
    spec: dict,
    split: str,
    cache_dir: str | Path,
    probe_size: int | None = None,
    probe_seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one split of any dataset kind (its ``load``; made or decoded once, cached).

    Args:
        spec: the dataset spec as a dict (the kind's ``model_dump()``; no ``kind``: procedural).
        split: ``train``, ``test`` (held out) or ``probe`` (``probe_size`` images drawn with ``probe_seed``).
        cache_dir: the data cache folder.

    Returns:
        images: uint8 (N, image_size, image_size, 3) (on-disk kinds: a memory map); labels: int64 (N,).
    """
    load = _with_images(spec).load
    assert load is not None  # _with_images refuses a kind without images
    return load(spec, split, Path(cache_dir), probe_size, probe_seed)


def shuffled_labels(labels: np.ndarray, seed: int) -> np.ndarray:
    """The training labels of a ``labels: shuffled`` run: a permutation of ``labels`` (N,) drawn from
    ``numpy.random.default_rng(seed + LABEL_SEED_OFFSET)``. Class frequencies are kept; which image has
    which label is random (the control of Zhang et al. 2017 and Ansuini et al. 2019), the same for every
    run of that seed. The test and probe splits keep their true labels."""
    perm = np.random.default_rng(int(seed) + LABEL_SEED_OFFSET).permutation(len(labels))
    return np.asarray(labels)[perm]


def num_classes(spec: dict) -> int:
    """Width of the classifier head for a dataset spec (any kind with images)."""
    count = _with_images(spec).num_classes
    assert count is not None  # a kind with images has both (the registry's check)
    return count(spec)


def check_dataset_folder(spec: dict) -> None:
    """Fail early (one-line StudyError, before anything is written) when a dataset's data are not there.

    Generated kinds pass; on-disk kinds check that their folder is set and exists (the full layout
    check happens when the data are read).
    """
    check = DATASETS.get(kind_of(spec)).check
    if check is not None:
        check(spec)
