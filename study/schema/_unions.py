"""The unions of a hypothesis file's plug-in fields, built from the registries at import time: one member
per registered dataset kind, objective, run source and claim kind, each tagged by its kind (the tags are
what pydantic inserts into an error's location, and ``study.schema._errors`` leaves out). The installed
plug-ins (``vitstudy_core.plugins``) are loaded first, so their parts are members whatever was imported before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Protocol, Union

from pydantic import (
    Discriminator,
    Field,
    Tag,
)

from analysis.kinds import KINDS, claim_models
from runners.datasets import DATASETS, kind_of
from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    objective_names,
)
from runners.sources import SOURCES
from vitstudy_core.plugins import load_plugins

# the installed plug-ins register before any union below is built from the registries
load_plugins()

if TYPE_CHECKING:
    # What the type checker reads: the unions below are built from the registries at import time, which
    # mypy cannot evaluate, so each is typed as what every member is (its base class, or for datasets,
    # whose models share no base, the fields and methods every registered model has).
    from typing import TypeAlias

    from typing_extensions import Self

    from analysis.kinds.base import ClaimBase
    from runners.objectives import ObjectiveSettings
    from runners.sources.base import ImportedSettings

    class DatasetSpec(Protocol):
        """One ``design.datasets`` entry: a registered dataset kind's model (``runners.datasets``)."""

        @property
        def name(self) -> str: ...
        @property
        def kind(self) -> str: ...
        def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Self: ...
        def model_dump(self, **kwargs: Any) -> dict[str, Any]: ...

    ObjectiveSpec: TypeAlias = ObjectiveSettings
    SourceSpec: TypeAlias = ImportedSettings
    Claim: TypeAlias = ClaimBase


# --------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------
def _dataset_kind(v: object) -> str:
    """The tag of a ``design.datasets`` entry: its ``kind`` (none given: ``runners.datasets.DEFAULT_KIND``)."""
    return kind_of(v)  # files written before real datasets existed have no kind


# one union member per registered dataset kind (runners.datasets), tagged by its kind
DATASET_KINDS = tuple(DATASETS)
if not TYPE_CHECKING:
    DatasetSpec = Annotated[
        Union[tuple(Annotated[k.model, Tag(k.name)] for k in DATASETS.values())],  # noqa: UP007 - built at run time
        Discriminator(_dataset_kind),
    ]


# --------------------------------------------------------------------------------------------------
# Model, training and objective: their settings live beside the code that uses them (runners.models,
# runners.objectives); the objective union is built from the registry, one member per objective
# --------------------------------------------------------------------------------------------------
def _objective_kind(v: object) -> str:
    if isinstance(v, dict):
        return v.get("kind", DEFAULT_OBJECTIVE)
    return getattr(v, "kind", DEFAULT_OBJECTIVE)


if not TYPE_CHECKING:
    ObjectiveSpec = Annotated[
        Union[tuple(Annotated[OBJECTIVES[name], Tag(name)] for name in objective_names())],  # noqa: UP007 - built at run time
        Discriminator(_objective_kind),
    ]


# --------------------------------------------------------------------------------------------------
# Run sources: training (no ``source``), or runs imported from disk; each source's settings model and
# design checks live in its plug-in (runners.sources), this section only assembles them
# --------------------------------------------------------------------------------------------------
_IMPORTED_SOURCES = [s for s in SOURCES.values() if s.settings is not None]
SOURCE_TAGS = tuple(f"{s.name}_source" for s in _IMPORTED_SOURCES)  # "_source": never a field's name


def _source_kind(v: object) -> str:
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return f"{kind}_source"


if not TYPE_CHECKING:
    SourceSpec = Annotated[
        Union[tuple(Annotated[s.settings, Tag(f"{s.name}_source")] for s in _IMPORTED_SOURCES)],  # noqa: UP007
        Discriminator(_source_kind),
    ]


# --------------------------------------------------------------------------------------------------
# Claims: one model per registered kind (analysis.kinds), discriminated by ``kind``
# --------------------------------------------------------------------------------------------------
CLAIM_KINDS = tuple(KINDS)
if not TYPE_CHECKING:
    Claim = Annotated[Union[tuple(claim_models())], Field(discriminator="kind")]  # noqa: UP007 - built at run time
