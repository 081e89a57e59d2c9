"""What every training objective is made of, without torch: its registry, settings, presets and setup.

An objective is one settings model, registered under its name, next to its trainer::

    # runners/objectives/byol_settings.py  (no torch: the hypothesis schema imports it)
    @OBJECTIVES.register("byol")
    class ByolObjective(ObjectiveSettings):
        '''What the hypothesis file's ``objective:`` section sets for BYOL.'''
        kind: Literal["byol"] = "byol"
        trainer: ClassVar[str] = "runners.objectives.byol:ByolTrainer"   # imported when a run trains
        presets: ClassVar[dict[str, Preset]] = {"byol_paper": Preset({"tau": 0.996}, {"lr": 0.2})}
        tau: float = 0.99

    # runners/objectives/byol.py  (torch): class ByolTrainer, built from a TrainerSetup

``runners.objectives`` imports every ``*_settings`` module of its folder, so the schema, the run specs
and ``make_objective`` find the new objective; the hypothesis file names it (``objective: byol``,
``objective: byol_paper`` or ``objective: {kind: byol, tau: 0.98}``). ``tests/plugins/test_objective_contract.py``
checks every registered objective.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import Field, field_validator, model_validator

from runners.models import TimmModel
from vitstudy_core.registry import Registry
from vitstudy_core.settings import Strict

if TYPE_CHECKING:
    import torch

DEFAULT_OBJECTIVE = "supervised"  # a design without ``objective``, or one without ``kind``


class TrainingSpec(Strict):
    """Optimisation settings of one training run (AdamW, linear warmup + cosine decay per step)."""

    epochs: int = Field(8, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)  # AdamW 1e-3 / wd 0.05: the TGO-I recipe; absolute, never batch-scaled
    weight_decay: float = Field(0.05, ge=0)
    warmup_epochs: float = Field(1.0, ge=0)  # short linear warmup keeps early ViT training stable
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    max_steps_per_epoch: int | None = Field(None, ge=1)  # for smoke tests only
    compile: bool = False  # torch.compile the model (CUDA only; ignored on CPU where compile time dominates)


@dataclass(frozen=True)
class Preset:
    """A named recipe: the fields it fills in the ``objective``, ``training`` and ``model`` sections.

    A hypothesis file's own values always win over a preset's.
    """

    objective: Mapping[str, Any] = field(default_factory=dict)  # the objective's fields (not ``kind``)
    training: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)


class ObjectiveSettings(Strict):
    """Base of every objective's settings model (the hypothesis file's ``design.objective``).

    A subclass sets ``kind: Literal[NAME] = NAME``, the class variables ``trainer`` (``"module:Class"``
    of its torch trainer, imported only when a run trains) and ``presets``, and its own fields, each with
    a default (``objective: NAME`` alone must be a valid objective).
    """

    kind: str
    preset: str | None = None

    trainer: ClassVar[str] = ""
    presets: ClassVar[Mapping[str, Preset]] = {}
    # whether training reads the labels (a design's ``labels: shuffled`` is refused when it does not)
    uses_labels: ClassVar[bool] = True
    # the per-epoch history keys its runs record (result.json): what a claim's ``adjust_for`` may read
    records: ClassVar[frozenset[str]] = frozenset({"loss", "train_acc", "test_acc"})
    # its loss falls within a few steps on a small learnable batch (the shipped contract checks it);
    # False for a loss that may first rise (self-distillation while its teacher warms up): the check then
    # asks only that training moves the weights and the loss
    loss_falls_at_once: ClassVar[bool] = True
    # fields added after runs were trained: left out of the run spec (and so the run key) while None, the
    # value that trains as before, so those runs keep their keys
    added_later: ClassVar[frozenset[str]] = frozenset()
    # raised when the trainer's code changes what the same settings train: from 2 on it enters the run
    # key (``study.runspecs.run_key``), so runs trained by the old code are not taken for new ones
    trainer_version: ClassVar[int] = 1

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: object) -> object:
        """A known ``preset`` fills the objective's fields the file leaves unset."""
        preset = data.get("preset") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(preset, str) and preset in cls.presets:
            data = {**cls.presets[preset].objective, **data}
        return data

    @field_validator("preset", mode="before")
    @classmethod
    def _known_preset(cls, v: object) -> object:
        """One of this objective's presets (the message pydantic gives for a ``Literal`` of their names)."""
        if v is not None and not (isinstance(v, str) and v in cls.presets):
            names = [repr(p) for p in cls.presets]
            expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            raise ValueError(f"Input should be {expected}" if names else "this objective has no presets")
        return v

    def learning_check(self, history: Sequence[Mapping[str, Any]], n_classes: int) -> str | None:
        """Why a finished run did not learn, or None: it did, or its history cannot tell.

        The default reads the last epoch's held-out quality, ``test_acc`` (or ``knn_acc``), and calls a
        run untrained when it is not above chance (1 / ``n_classes``) by 3 binomial standard errors of
        the ``eval_images`` it was measured on, ``sqrt(p0 (1 - p0) / n)``; without ``eval_images``
        (runs trained before it was recorded) nothing is said. An objective with other signals of
        collapse overrides this (DINO: its teacher's entropy against ln K).

        Args:
            history: ``result.json``'s per-epoch entries, in order.
            n_classes: classes of the dataset the quality was measured on.
        """
        return _not_above_chance(history, n_classes, ("test_acc", "knn_acc"))

    def throughput_key(self) -> str | None:
        """The rate of ``study.cluster.gpu_cost.MEASURED["images_per_s"]`` measured with these settings (the GPU
        estimate of ``study plan``); None: not measured, no estimate."""
        return None

    def check_model(self, model: TimmModel) -> tuple[str, str] | None:
        """A conflict of these settings with the resolved model: ``(field, expectation)``, or None."""
        return None

    def check_data(self, model: TimmModel, image_size: int) -> tuple[str, str] | None:
        """A conflict of these settings with a dataset's images (side ``image_size`` pixels) that would keep
        the model from learning on them: ``(field, expectation)``, or None."""
        return None


# a run is untrained when its held-out quality is within this many binomial standard errors of chance
CHANCE_SES = 3.0


def _not_above_chance(
    history: Sequence[Mapping[str, Any]], n_classes: int, keys: Sequence[str]
) -> str | None:
    """The default learning check (:meth:`ObjectiveSettings.learning_check`) on the first of ``keys`` that
    the last epoch recorded."""
    if not history or n_classes < 2:
        return None
    last = history[-1]
    key = next((k for k in keys if isinstance(last.get(k), int | float)), None)
    n = last.get("eval_images")
    if key is None or not isinstance(n, int) or n < 1:
        return None
    chance = 1.0 / n_classes
    bar = chance + CHANCE_SES * math.sqrt(chance * (1 - chance) / n)
    if float(last[key]) > bar:
        return None
    return (
        f"{key} {float(last[key]):.3f} at epoch {last.get('epoch')} is not above chance {chance:.3f} by "
        f"{CHANCE_SES:g} binomial SEs of {n} images ({bar:.3f})"
    )


def _check_entry(name: str, cls: type[ObjectiveSettings]) -> None:
    """Registry check: a settings subclass whose ``kind`` defaults to its name, with a trainer path."""
    if not (isinstance(cls, type) and issubclass(cls, ObjectiveSettings)):
        raise ValueError(f"objective {name!r}: expected an ObjectiveSettings subclass, got {cls!r}")
    if cls.model_fields["kind"].default != name:
        raise ValueError(f"objective {name!r}: its settings' kind must default to {name!r}")
    module, _, attr = cls.trainer.partition(":")
    if not module or not attr:
        raise ValueError(f"objective {name!r}: trainer must be 'module:Class', got {cls.trainer!r}")


OBJECTIVES: Registry[type[ObjectiveSettings]] = Registry(
    "objective", check=_check_entry, group="vitstudy.objectives"
)


def objective_names() -> list[str]:
    """Registered objective names, the default first (the order error messages list them in)."""
    return [DEFAULT_OBJECTIVE, *(n for n in OBJECTIVES.names() if n != DEFAULT_OBJECTIVE)]


def find_preset(name: str) -> tuple[str, Preset] | None:
    """``(objective name, preset)`` of the preset called ``name`` in any objective, or None."""
    for kind, cls in OBJECTIVES.items():
        if name in cls.presets:
            return kind, cls.presets[name]
    return None


def preset_names() -> list[str]:
    """Every registered preset's name, sorted."""
    return sorted(p for cls in OBJECTIVES.values() for p in cls.presets)


def objective_payload(settings: ObjectiveSettings) -> str | dict:
    """The objective as a run spec holds it (and so as its run key hashes it).

    The default objective with default settings stays the bare string it always was (``"supervised"``:
    keys of runs trained before objectives had settings do not move); anything else is its settings.
    """
    if settings == OBJECTIVES[DEFAULT_OBJECTIVE].model_validate({}):  # its defaults (= calling it bare)
        return DEFAULT_OBJECTIVE
    return settings.model_dump(exclude={k for k in settings.added_later if getattr(settings, k) is None})


def trainer_version(payload: str | Mapping[str, Any]) -> int:
    """The ``trainer_version`` of the objective a run spec's ``objective`` names (1 if not installed)."""
    kind = payload if isinstance(payload, str) else payload.get("kind", DEFAULT_OBJECTIVE)
    return int(getattr(OBJECTIVES.get(kind, None), "trainer_version", 1))


def objective_settings(payload: str | Mapping[str, Any]) -> ObjectiveSettings:
    """The settings model back from a run spec's ``objective`` (:func:`objective_payload`'s inverse)."""
    if isinstance(payload, str):
        return OBJECTIVES.get(payload).model_validate({})  # its defaults (= calling it bare)
    return OBJECTIVES.get(payload.get("kind", DEFAULT_OBJECTIVE)).model_validate(dict(payload))


def learning_status(result: Mapping[str, Any]) -> str | None:
    """Why a finished run (its ``result.json``) did not learn, or None: it learned, or nothing tells.

    Its objective's :meth:`ObjectiveSettings.learning_check` on its history (built-in and plug-in
    objectives alike). Not asked of a ``labels: shuffled`` control (chance-level test accuracy is what it
    is for) nor of a run without a trained objective (an imported metric log, a published model).
    """
    run = result.get("run") or {}
    if run.get("labels", "true") == "shuffled" or "objective" not in run or "dataset" not in run:
        return None
    from runners.datasets import num_classes
    from vitstudy_core.errors import StudyError

    try:
        settings = objective_settings(run["objective"])
        # recorded by the run; a run from before it was: its dataset's (an on-disk folder must be here)
        n_classes = result.get("n_classes") or num_classes(run["dataset"])
    except (KeyError, ValueError, TypeError, AssertionError, StudyError):  # not installed, data not here
        return None
    return settings.learning_check(list(result.get("history") or []), n_classes)


S = TypeVar("S", bound=ObjectiveSettings)


@dataclass(frozen=True)
class TrainerSetup(Generic[S]):
    """Everything an objective's trainer is built from, typed (``runners.train`` builds it from a run).

    Attributes:
        objective: the objective's own settings model.
        training: the run's optimisation settings.
        model: the resolved timm model.
        seed: the run seed (the trainer derives its own streams from it, e.g. DINO's crops).
        n_classes, image_size: of the dataset (image side in pixels).
        steps_per_epoch: optimiser steps per epoch (the schedules are laid out per step).
    """

    objective: S
    training: TrainingSpec
    model: TimmModel
    seed: int
    n_classes: int
    image_size: int
    steps_per_epoch: int

    @classmethod
    def from_run(
        cls, run: Mapping[str, Any], n_classes: int, image_size: int, steps_per_epoch: int
    ) -> TrainerSetup[ObjectiveSettings]:
        """Typed settings from a run spec dict (``RunSpec.model_dump()``): of whichever objective it names."""
        return TrainerSetup(
            objective=objective_settings(run["objective"]),
            training=TrainingSpec.model_validate(run["training"]),
            model=TimmModel.model_validate(run["model"]),
            seed=int(run["seed"]),
            n_classes=n_classes,
            image_size=image_size,
            steps_per_epoch=steps_per_epoch,
        )


class Trainer(Protocol):
    """What ``runners.train.train_run`` calls on every objective's trainer (built as
    ``Trainer(setup: TrainerSetup, device: torch.device)``).

    * ``measured``: the network whose layer-wise spectra are measured (supervised: the classifier's ViT;
      DINO: the EMA *teacher* backbone, as in the Inductive Bottleneck paper);
    * ``train_epoch(epoch, xtr, ytr, order, tick) -> dict``: one pass over ``order``; raises
      ``RunFailedError`` on a non-finite loss; calls ``tick(step, loss, n_images)`` after every step,
      with ``loss`` the step's loss as a detached 0-d tensor on the device (reading it, ``float(loss)``,
      waits for the device: a tick that needs the value reads it rarely);
    * ``evaluate(xtr, ytr, xte, yte) -> dict``: held-out quality (test accuracy, or teacher k-NN accuracy);
    * ``state_dict()`` / ``load_state_dict(state)``: everything a resumed run needs, as tensors and plain
      containers only (``resume.pt`` is read with ``torch.load(weights_only=True)``).
    """

    measured: torch.nn.Module
    steps_per_epoch: int

    def train_epoch(
        self,
        epoch: int,
        xtr: torch.Tensor,
        ytr: torch.Tensor,
        order: torch.Tensor,
        tick: Callable[[int, float | torch.Tensor, int], None],  # the loss as a device tensor (read lazily)
    ) -> dict: ...

    def evaluate(
        self, xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor
    ) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def trainer_class(name: str) -> Callable[[TrainerSetup, torch.device], Trainer]:
    """The trainer class of the objective ``name``, imported now (it imports torch)."""
    module, _, attr = OBJECTIVES.get(name).trainer.partition(":")
    return getattr(importlib.import_module(module), attr)
