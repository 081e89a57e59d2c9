"""What every run source is: the :class:`RunSource` contract, the :data:`SOURCES` registry, the settings
base of imported runs and the design facts a source checks. Importing this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from pydantic import Field, model_validator

from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.registry import Registry
from vitstudy_core.settings import Strict

DEFAULT_SOURCE = "train"  # the source of a run whose design has no ``source`` section


@dataclass(frozen=True)
class DataRecord:
    """What a source tells tracking about the data a run uses.

    Attributes:
        name: the dataset's name in the hypothesis file.
        spec: the dataset spec (as in the run spec).
        digest: 16 hex digits identifying the data (the spec's hash; the images are a function of it).
        profile: sizes and shapes, e.g. ``{"train": [N, H, W, 3], "test": [...], "probe": [...],
            "n_classes": K}``.
    """

    name: str
    spec: dict
    digest: str
    profile: dict = field(default_factory=dict)


def probe_record(run: dict, data_dir: str | Path) -> DataRecord:
    """The data record of a run that measures a model on the probe set only (imported checkpoints, a
    published model): the dataset spec and the probe images' shape, loaded into the cache."""
    from runners.datasets import load_split

    ds, probe = run["dataset"], run["probe"]
    shape = list(load_split(ds, "probe", data_dir, probe["size"], probe["seed"])[0].shape)
    return DataRecord(ds["name"], ds, digest(ds, 16), {"probe": shape})


@dataclass(frozen=True)
class DesignFacts:
    """The parts of a validated design a source checks (plain values: a source never imports ``study``).

    Attributes:
        seeds: the design's seeds, in file order.
        datasets: the design's dataset names, in file order.
        layers: the model's observation points in depth order (``patch_embed`` ... ``norm``).
        checkpoints: ``design.checkpoints`` as written (None when left out).
        trained_epochs: ``design.training.epochs``.
    """

    seeds: tuple[int, ...]
    datasets: tuple[str, ...]
    layers: tuple[str, ...]
    checkpoints: tuple[int, ...] | None
    trained_epochs: int


class ImportedSettings(Strict):
    """Where imported runs live: ``path`` (one template for every seed) or ``paths`` (seed -> path).

    A path may hold ``${ENV_VAR}`` (or be replaced with ``--data-root source=PATH``), ``{seed}`` and
    ``{dataset}`` (filled in per run). It is resolved when the study runs; the run key holds a fingerprint
    of the files' content, not the path. Every imported source's settings model derives from this one and
    adds ``kind: Literal["<its name>"]``.
    """

    path: str | None = Field(None, min_length=1)
    paths: dict[int, str] | None = None

    if TYPE_CHECKING:
        kind: str  # each source's model declares it as Literal["<name>"] (declared here for the type checker)

    @model_validator(mode="after")
    def _one_path(self):
        if (self.path is None) == (self.paths is None):
            raise ValueError("give either path (a template with {seed}) or paths (seed -> path)")
        return self

    def templates(self) -> list[str]:
        """Every path template given (one, or one per seed)."""
        return [self.path] if self.path is not None else list((self.paths or {}).values())


class RunSource(Protocol):
    """A run source (see ``runners.sources`` for when each method is called and what it must leave).

    Attributes:
        name: its ``design.source.kind`` (and ``RunSpec.source``).
        settings: the model of its ``design.source`` section, or None for the source used when the design
            has none (training).
        example: design keys that select it, e.g. ``{"source": {...}, "checkpoints": [2]}`` (docs and the
            contract test); ``example_claim`` (optional, on ``SourceBase``): a claim that example needs.
        tag_fields: keys of its ``result.json`` ``source`` record tracking tags beyond ``kind``, ``path``,
            ``fingerprint`` and ``format`` (as JSON when not a string).
        measures_spectra: its runs hold spectra and probe covariances (``spectra.npz``), so claims may
            match token counts (``match_tokens``) or resample the probe (``uncertainty: seeds+probe``);
            False for a source of metric rows only.
    """

    # read-only (a source's class attributes: a subclass narrows settings to its own model)
    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> type[ImportedSettings] | None: ...
    @property
    def example(self) -> dict: ...
    @property
    def tag_fields(self) -> tuple[str, ...]: ...
    @property
    def measures_spectra(self) -> bool: ...

    def accepts_dataset(self, kind: str) -> bool:
        """Whether a design dataset of this kind can be a run of this source."""
        ...

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """Raise ``StudyError(message, None, field)`` for a design this source cannot run."""
        ...

    def default_epochs(self, trained_epochs: int) -> list[int]:
        """The epochs measured when ``design.checkpoints`` is left out ([]: whatever the files hold)."""
        ...

    def fingerprint(self, settings: dict, path: Path, epochs: list[int]) -> dict:
        """Updates of a run's imported record: ``fingerprint`` (16 hex digits) and what else the files say."""
        ...

    def check(self, run: dict) -> None:
        """Raise StudyError for bad input before anything is recorded."""
        ...

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord | None:
        """Make the run's shared inputs ready; describe its data."""
        ...

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        """Fill ``run_dir`` as a finished (or failed) run folder; return its ``result.json`` content."""
        ...


class SourceBase:
    """Defaults a source inherits: every dataset with images, no design checks, the last trained epoch."""

    name: ClassVar[str] = ""
    settings: ClassVar[type[ImportedSettings] | None] = None
    example: ClassVar[dict] = {}
    # a claim its example design needs (the shipped contract checks validate the example with it); None:
    # any claim of a trained design fits
    example_claim: ClassVar[dict | None] = None
    tag_fields: ClassVar[tuple[str, ...]] = ()
    measures_spectra: ClassVar[bool] = True
    # it trains its runs (their inputs are the dataset's, which the seeds share: checked once per dataset)
    trains: ClassVar[bool] = False
    # its settings' ``models`` mapping names published models, one per seed 0 .. M-1 in order: claims
    # then need unit: images or unit: models (analysis.units)
    models_are_seeds: ClassVar[bool] = False
    # it reads CNNs as well as ViTs (design.model may be a CNN of residual blocks: runners.models)
    reads_cnns: ClassVar[bool] = False

    def accepts_dataset(self, kind: str) -> bool:
        from runners.datasets import DATASETS

        # a dataset known by name only (``external``: no loader) has no images to train on or measure
        return DATASETS.get(kind).load is not None

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        return None

    def default_epochs(self, trained_epochs: int) -> list[int]:
        return [trained_epochs]

    def fingerprint(self, settings: dict, path: Path, epochs: list[int]) -> dict:
        return {}


class ImportedSourceBase(SourceBase):
    """A source whose runs are files on disk (``settings`` derives from :class:`ImportedSettings`)."""

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """``paths`` name every seed of the design."""
        if settings is not None and settings.paths is not None and set(settings.paths) != set(design.seeds):
            raise StudyError(
                f"expected one path per seed {list(design.seeds)}, got seeds {sorted(settings.paths)}",
                None,
                "design.source.paths",
            )


def _check_entry(name: str, entry: RunSource) -> None:
    """A source registers under its own name, and its settings model's ``kind`` is that name."""
    if entry.name != name:
        raise ValueError(f"run source {name!r} says its name is {entry.name!r}")
    model = entry.settings
    if model is not None:
        kind = model.model_fields.get("kind")
        if kind is None or getattr(kind.annotation, "__args__", None) != (name,):
            raise ValueError(f"run source {name!r}: its settings need kind: Literal[{name!r}]")


SOURCES: Registry[RunSource] = Registry("run source", check=_check_entry, group="vitstudy.sources")


def declares(name: str | None, capability: str) -> bool:
    """Whether the registered source ``name`` declares ``capability`` (a :class:`SourceBase` flag such as
    ``trains`` or ``models_are_seeds``); False for None, an unknown name or a source without the flag."""
    entry = SOURCES.get(name, None) if name is not None else None
    return bool(getattr(entry, capability, False))


def get_source(name: str) -> RunSource:
    """The registered source ``name`` (unknown: a one-line StudyError listing the registered names)."""
    return SOURCES.get(name)


def imported_record(source: dict, dataset: str, seed: int, epochs: list[int], n_seeds: int = 1) -> dict:
    """What a run spec carries about its imported files (``RunSpec.imported``).

    Args:
        source: ``design.source`` as a dict; dataset, seed: the run's; epochs: the epochs imported;
        n_seeds: seeds in the design (a file shared by several seeds must tell them apart).

    Returns:
        the source's settings plus ``path`` (resolved when ``${ENV}`` is set) and ``fingerprint``
        (the source's :meth:`RunSource.fingerprint` of the files), None when the files are not there yet
        (the study stops on that before anything runs).
    """
    entry = SOURCES.get(source["kind"])
    own = getattr(entry, "record", None)
    if own is not None:  # a source that lays out its runs' records itself (``pretrained``: one per model)
        return own(source, dataset, seed, epochs, n_seeds)
    from runners.imported import raw_path, resolve

    raw = raw_path(source, dataset, seed)
    path = resolve(raw, strict=False)
    record = {k: v for k, v in source.items() if k not in ("path", "paths")}
    record.update(path=str(path) if path is not None else raw, dataset=dataset, fingerprint=None)
    record["shared"] = n_seeds > 1 and not source.get("paths") and "{seed}" not in source["path"]
    if path is not None:
        try:
            record.update(entry.fingerprint(source, path, epochs))
        except StudyError:
            pass  # reported by the source's check before anything is recorded
    return record
