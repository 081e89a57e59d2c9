"""What every dataset kind shares: its registry entry (:class:`DatasetKind`) and the registry.

A dataset kind is one module in this package (``procedural.py``, ``cifar100.py``, ...). It defines its
settings model (a subclass of :class:`ImageDatasetSettings` adding ``kind: Literal["<kind>"]``, or of
:class:`DatasetSettings` for a kind without images; the hypothesis schema builds ``design.datasets`` from
these models) and registers one :class:`DatasetKind` saying how its images are read. An on-disk layout registers through
:func:`runners.datasets.disk.on_disk_kind`, which supplies the shared loader (the decoded cache) and the
folder check; the module itself only says how the publisher's folder is laid out and read.

Nothing here imports torch or PIL: the schema and the planner import every kind's module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from vitstudy_core.registry import Registry
from vitstudy_core.settings import Strict

DEFAULT_KIND = "procedural"  # a dataset entry without ``kind`` (files written before real datasets existed)

Arrays = tuple[np.ndarray, np.ndarray]

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"  # a dataset's name: a folder name, an MLflow tag, a table value


class DatasetSettings(Strict):
    """The base of every dataset kind's settings model: one ``design.datasets`` entry.

    A subclass adds ``kind: Literal["<kind>"]`` (its registered name) and its own fields. ``name`` is how
    claims, tables and figures call the dataset (it is not part of the run key).
    """

    name: str = Field(pattern=NAME_PATTERN)
    kind: str  # a subclass narrows it to Literal["<kind>"] (the registry refuses any other)


class ImageDatasetSettings(DatasetSettings):
    """The base of the settings of a dataset kind with images (its :class:`DatasetKind` has ``load``):
    the fields the core reads besides ``name`` and ``kind``.

    Attributes:
        image_size: the side ``S`` of the ``(N, S, S, 3)`` images its loader returns; the model is built
            for it, ``validate`` checks it against the patch size and the memory the images need.
        n_train, n_test: how many training and held-out images a run reads (None: the folder's all;
            then ``validate`` checks no memory, as the size is known only once the folder is read).
            The probe is drawn from the held-out split: ``validate`` refuses a probe larger than
            ``n_test``.

    A subclass gives ``image_size`` its default and bounds (``image_size: int = Field(32, ge=8, le=512)``).
    """

    image_size: int = Field(ge=8)
    n_train: int | None = Field(None, ge=16)
    n_test: int | None = Field(None, ge=16)


# (spec, split, cache_dir, probe_size, probe_seed) -> images uint8 (N, S, S, 3), labels int64 (N,)
Loader = Callable[[dict, str, Path, int | None, int | None], Arrays]
# (spec, folder) -> ({"train": (paths or uint8 arrays, int64 labels), "test": ...}, class names)
Reader = Callable[[dict, Path], tuple[dict[str, tuple[Any, np.ndarray]], list[str]]]


@dataclass(frozen=True)
class DatasetKind:
    """One registered dataset kind.

    Attributes:
        name: the ``kind`` a hypothesis file writes (the model's ``kind`` literal).
        model: the settings model (fields of one ``design.datasets`` entry).
        example: a ``design.datasets`` entry of this kind that validates (docs and the contract test).
        load: reads one split (``train``, ``test``, ``probe``) of a spec dict (``model.model_dump()``);
            None: the kind has no images (it only names the dataset of an imported table).
        num_classes: the classifier head's width for a spec dict; None with ``load``.
        check: fails early (one-line StudyError) when the data are not there, before anything is written;
            None: nothing to check (generated data).
        layout: on-disk kinds: the publisher's layout in words (error messages show it); else None.
        read: on-disk kinds: the layout's reader, used by the shared loader; else None.
        train_images: the training images of a spec dict before any ``n_train`` subsample, as the
            publisher ships them (``study plan``'s GPU estimate); None: not known without reading the data.
        generated: its images are made from the spec and a seed and cached under the output folder's
            ``data/`` (``validate`` checks that folder's free disk for them); False: read from a folder.
    """

    name: str
    model: type[DatasetSettings]
    example: dict
    load: Loader | None
    num_classes: Callable[[dict], int] | None
    check: Callable[[dict], None] | None = None
    layout: str | None = None
    read: Reader | None = field(default=None, repr=False)
    train_images: Callable[[dict], int | None] | None = None
    generated: bool = False


def _check(name: str, entry: DatasetKind) -> None:
    """Refuse an entry whose model does not carry its name as the ``kind`` literal, or has no ``name``."""
    fields = entry.model.model_fields
    kind = fields.get("kind")
    if entry.name != name or kind is None or getattr(kind.annotation, "__args__", None) != (name,):
        raise ValueError(f"dataset kind {name!r}: its model needs kind: Literal[{name!r}]")
    if "name" not in fields:
        raise ValueError(f"dataset kind {name!r}: its model needs a name field")
    if (entry.load is None) != (entry.num_classes is None):
        raise ValueError(f"dataset kind {name!r}: give both load and num_classes, or neither")
    if not issubclass(entry.model, DatasetSettings):
        raise ValueError(
            f"dataset kind {name!r}: its model must subclass runners.datasets.base.DatasetSettings"
        )
    if entry.load is not None and not issubclass(entry.model, ImageDatasetSettings):
        raise ValueError(
            f"dataset kind {name!r}: a kind with images (a loader) needs a model subclassing "
            "runners.datasets.base.ImageDatasetSettings (it declares image_size, n_train and n_test)"
        )


DATASETS: Registry[DatasetKind] = Registry("dataset kind", check=_check, group="vitstudy.datasets")


def kind_of(spec: object) -> str:
    """The kind of a dataset entry (a mapping or a model); :data:`DEFAULT_KIND` when it names none."""
    if isinstance(spec, dict):
        return spec.get("kind", DEFAULT_KIND)
    return getattr(spec, "kind", DEFAULT_KIND)
