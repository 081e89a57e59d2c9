"""Settings and presets of DINO self-distillation (no torch; the loop is ``runners.objectives.dino``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from runners.models import TimmModel
from runners.objectives.base import OBJECTIVES, ObjectiveSettings, Preset

PRESETS: dict[str, Preset] = {
    # DINO's published ViT-S/16 recipe (main_dino.py defaults + README ViT-S row): 2 global crops at the
    # dataset's image_size (set it to 224) and 8x96 local crops, 65536 prototypes, teacher temp
    # 0.04 -> 0.07 over 30 epochs, momentum 0.996 (the paper's batch was 1024; the reference recommends
    # 0.9995 at 256), wd 0.04 -> 0.4, lr 5e-4 at batch 256 (lr is absolute here: at another batch size
    # set lr = 5e-4 * B / 256, the paper's linear scaling rule).
    "dino_paper": Preset(
        objective={
            "out_dim": 65536,
            "hidden_dim": 2048,
            "bottleneck_dim": 256,
            "norm_last_layer": False,
            "n_local_crops": 8,
            "local_crop_size": 96,
            "teacher_temp": 0.07,
            "warmup_teacher_temp": 0.04,
            "warmup_teacher_temp_epochs": 30,
            "momentum_teacher": 0.996,
            "weight_decay_end": 0.4,
        },
        training={"lr": 5e-4, "weight_decay": 0.04, "warmup_epochs": 10, "batch_size": 256},
        model={"drop_path_rate": 0.1},
    ),
    # Scaled for 16-32 px images and minutes of CPU: crops at the image size and half of it, 4 local
    # crops, 1024 prototypes, a faster EMA (0.99) because runs are hundreds of steps, not 10^5.
    "dino_small": Preset(
        objective={
            "out_dim": 1024,
            "hidden_dim": 256,
            "bottleneck_dim": 64,
            "norm_last_layer": True,
            "n_local_crops": 4,
            "teacher_temp": 0.07,
            "warmup_teacher_temp": 0.04,
            "warmup_teacher_temp_epochs": 2,
            "momentum_teacher": 0.99,
            "weight_decay_end": 0.4,
        },
        training={"lr": 5e-4, "weight_decay": 0.04, "warmup_epochs": 1},
    ),
}


@OBJECTIVES.register("dino")
class DinoObjective(ObjectiveSettings):
    """DINO self-distillation (Caron et al. 2021): student + EMA teacher, multi-crop, centred teacher.

    Global crops are made at the dataset's ``image_size`` (the paper: 224); local crops at
    ``local_crop_size`` (default: half of it, in whole patches; the paper: 96). The teacher
    temperature rises linearly from ``warmup_teacher_temp`` to ``teacher_temp`` over
    ``warmup_teacher_temp_epochs``; the teacher momentum follows a cosine from ``momentum_teacher`` to 1;
    the weight decay a cosine from ``training.weight_decay`` to ``weight_decay_end``.

    ``training.lr`` is the absolute peak learning rate, used as given: it is **not** scaled by
    batch / 256 as DINO's ``main_dino.py`` scales its ``--lr`` (5e-4 there means 5e-4 x B / 256); set
    ``lr = 5e-4 * batch_size / 256`` yourself to follow that rule.
    Defaults without a preset are ``main_dino.py``'s, except the head and crop sizes (set for small
    images and CPUs): teacher temperature 0.04 throughout (warmup 0.04 over 0 epochs; the reference
    warns that above 0.07 training is unstable, and that higher values need a warmup).
    """

    kind: Literal["dino"] = "dino"

    trainer: ClassVar[str] = "runners.objectives.dino:DinoTrainer"

    presets: ClassVar[dict[str, Preset]] = PRESETS
    uses_labels: ClassVar[bool] = False  # self-distillation: labels are read only by the k-NN evaluation
    records: ClassVar[frozenset[str]] = frozenset({"loss", "knn_acc"})
    loss_falls_at_once: ClassVar[bool] = False  # the teacher's temperature warms up: early losses may rise

    out_dim: int = Field(1024, ge=2)  # prototypes K of the DINO head's last layer
    hidden_dim: int = Field(256, ge=2)
    bottleneck_dim: int = Field(64, ge=2)
    norm_last_layer: bool = True  # weight-normed last layer with fixed norm: stabler for small models
    # local-to-global correspondence is DINO's signal; 4 keeps CPU cost ~4x
    n_local_crops: int = Field(4, ge=0)
    local_crop_size: int | None = Field(None, ge=4)
    global_crop_scale: tuple[float, float] = (0.4, 1.0)
    local_crop_scale: tuple[float, float] = (0.05, 0.4)
    student_temp: float = Field(0.1, gt=0)  # DINO's default; the teacher is sharper than the student
    # sharpening, with centring what prevents collapse; main_dino.py's default 0.04 (its 0.07 needs a warmup)
    teacher_temp: float = Field(0.04, gt=0)
    warmup_teacher_temp: float = Field(0.04, gt=0)  # main_dino.py's default start of the warmup
    warmup_teacher_temp_epochs: int = Field(0, ge=0)  # main_dino.py's default: no warmup
    center_momentum: float = Field(0.9, ge=0, lt=1)  # DINO's default EMA of the teacher's batch mean
    # main_dino.py's default, -> 1 by cosine; tuned for batch 1024: the reference recommends 0.9995 at 256
    momentum_teacher: float = Field(0.996, ge=0, le=1)
    weight_decay_end: float = Field(0.4, ge=0)  # DINO raises wd 0.04 -> 0.4 over training
    freeze_last_layer_epochs: int = Field(1, ge=0)  # last layer fixed in the first epoch(s), as in DINO
    clip_grad: float | None = Field(3.0, gt=0)  # DINO's per-parameter gradient-norm clip for ViTs

    def throughput_key(self) -> str | None:
        # measured with the paper's recipe only: crops and head sizes change the step cost
        return "dino_paper" if self.preset == "dino_paper" else None

    def check_model(self, model: TimmModel) -> tuple[str, str] | None:
        """Local crops are made of whole patches."""
        patch = model.patch_size or 16
        if self.local_crop_size is not None and self.local_crop_size % patch:
            return (
                "local_crop_size",
                f"expected a multiple of the patch size {patch}, got {self.local_crop_size}",
            )
        return None

    def local_size(self, image_size: int, patch_size: int) -> int:
        """Side of the local crops in pixels: ``local_crop_size``, else half the image in whole patches."""
        return self.local_crop_size or max(patch_size, round(image_size / 2 / patch_size) * patch_size)
