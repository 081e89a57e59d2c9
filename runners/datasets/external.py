"""A dataset known by name only: the dataset of a metric log imported with ``design.source: {kind: table}``.

Its images are never read, so it has no path, no loader and nothing is generated; asking for its images
is a one-line error (``runners.datasets.load_split``).
"""

from __future__ import annotations

from typing import Literal

from runners.datasets.base import DATASETS, DatasetKind, DatasetSettings


class ExternalDataset(DatasetSettings):
    """A dataset known by name only, for a metric log imported with ``design.source: {kind: table}``:
    its images are never read, so it has no path and nothing is generated."""

    kind: Literal["external"]


DATASETS.register(
    "external",
    DatasetKind(
        name="external",
        model=ExternalDataset,
        example={"name": "tgo_i", "kind": "external"},
        load=None,
        num_classes=None,
    ),
)
