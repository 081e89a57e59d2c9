"""Training objectives as plug-ins: one readable epoch loop per objective, sharing ``runners.train``'s
scaffolding.

    from runners.objectives import OBJECTIVES, make_objective
    OBJECTIVES.names()                          # ['dino', 'supervised']
    trainer = make_objective(run, n_classes, image_size, steps_per_epoch, device)

Every ``*_settings`` module in this package registers one objective on import: its settings model (what a
hypothesis file's ``design.objective`` sets), its presets and the path of its trainer; none of them
imports torch, so the hypothesis schema builds its ``objective`` union from :data:`OBJECTIVES` without it.
The trainer (``supervised.py``, ``dino.py``: torch) is imported by :func:`make_objective` when a run
trains. Adding an objective is adding ``NAME_settings.py`` and ``NAME.py`` here plus its test
(``runners.objectives.base`` shows the shape; ``tests/plugins/test_objective_contract.py`` checks every entry).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from runners.objectives.base import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    ObjectiveSettings,
    Preset,
    Trainer,
    TrainerSetup,
    TrainingSpec,
    find_preset,
    learning_status,
    objective_names,
    objective_payload,
    objective_settings,
    preset_names,
    trainer_class,
    trainer_version,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_OBJECTIVE",
    "OBJECTIVES",
    "ObjectiveSettings",
    "Preset",
    "Trainer",
    "TrainerSetup",
    "TrainingSpec",
    "build_trainer",
    "find_preset",
    "learning_status",
    "make_objective",
    "objective_names",
    "objective_payload",
    "objective_settings",
    "preset_names",
    "trainer_class",
    "trainer_version",
]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module.endswith("_settings"):
        importlib.import_module(f"{__name__}.{_module}")


def build_trainer(setup: TrainerSetup, device: torch.device) -> Trainer:
    """The trainer of ``setup.objective``'s objective, built on ``device`` (imports its torch module)."""
    return trainer_class(setup.objective.kind)(setup, device)


def make_objective(
    run: dict, n_classes: int, image_size: int, steps_per_epoch: int, device: torch.device
) -> Trainer:
    """Build the trainer of the objective named in ``run["objective"]`` (a name, or settings with ``kind``).

    Args:
        run: a ``RunSpec`` as a dict (objective, training, model, seed).
        n_classes, image_size: of the dataset; steps_per_epoch: optimiser steps per epoch.
    """
    return build_trainer(TrainerSetup.from_run(run, n_classes, image_size, steps_per_epoch), device)
