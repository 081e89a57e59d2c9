"""Settings and presets of the supervised objective (no torch; the loop is ``runners.objectives.supervised``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from runners.objectives.base import OBJECTIVES, ObjectiveSettings, Preset


@OBJECTIVES.register("supervised")
class SupervisedObjective(ObjectiveSettings):
    """Cross-entropy on the dataset labels (``label_smoothing`` lives in ``training``)."""

    kind: Literal["supervised"] = "supervised"

    trainer: ClassVar[str] = "runners.objectives.supervised:SupervisedTrainer"

    def throughput_key(self) -> str | None:
        return "supervised"  # measured with the default settings; a preset changes no step cost

    presets: ClassVar[dict[str, Preset]] = {
        # TGO-I's supervised ViT recipe: AdamW 1e-3, wd 0.05, label smoothing 0.1, drop path 0.1, cosine.
        "tgo_supervised": Preset(
            training={"lr": 1e-3, "weight_decay": 0.05, "label_smoothing": 0.1},
            model={"drop_path_rate": 0.1},
        ),
    }
