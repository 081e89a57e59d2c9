"""Settings and presets of DINO self-distillation (no torch; the loop is ``runners.objectives.dino``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from runners.models import TimmModel
from runners.objectives.base import OBJECTIVES, ObjectiveSettings, Preset

# a teacher whose mean target entropy reaches this share of ln K gives (near) uniform targets: collapsed
UNIFORM_SHARE = 0.97

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
    # Scaled for 16-32 px generated images and minutes of CPU (bench/dino_learns.py; bench/README.md "DINO
    # at CPU scale" has every variant tried). The colour distortion is what makes it learn there: the
    # generated objects and textures are painted in random colours that carry no label, and with DINO's
    # ColorJitter(0.4, 0.4, 0.2, 0.1) the teacher matched views by colour (sharp, image-specific targets,
    # k-NN at chance); hue over the whole circle, saturation 0.2-1.8 and grayscale half the time leave
    # shape or texture as what two crops share. Teacher temperature 0.04 throughout (main_dino.py's
    # default; warming up to 0.07 drove the teacher to uniform targets in two epochs), lr 1e-3 at batch
    # 64 (more steps in minutes; 5e-4 learnt slower), a faster EMA (0.99: runs are ~10^3 steps, not 10^5),
    # local crops of at least 10% of the image (a 5% crop of 16 px is less than one 4 px patch).
    "dino_small": Preset(
        objective={
            "out_dim": 1024,
            "hidden_dim": 256,
            "bottleneck_dim": 64,
            "norm_last_layer": True,
            "n_local_crops": 4,
            "local_crop_scale": (0.1, 0.4),
            "color_jitter": (0.4, 0.4, 0.8, 0.5),
            "grayscale_p": 0.5,
            "teacher_temp": 0.04,
            "warmup_teacher_temp": 0.04,
            "warmup_teacher_temp_epochs": 0,
            "momentum_teacher": 0.99,
            "weight_decay_end": 0.4,
        },
        training={"lr": 1e-3, "weight_decay": 0.04, "warmup_epochs": 1, "batch_size": 64},
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
    records: ClassVar[frozenset[str]] = frozenset(
        {"loss", "knn_acc", "teacher_entropy", "teacher_kl_mean", "feature_spread"}
    )
    added_later: ClassVar[frozenset[str]] = frozenset({"color_jitter", "grayscale_p"})
    # 2: the lr warmup ends at the peak, as main_dino.py's cosine_scheduler (version 1 stopped one step short)
    trainer_version: ClassVar[int] = 2
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
    # colour distortion, None: DINO's ColorJitter(0.4, 0.4, 0.2, 0.1) and grayscale p 0.2. Unset, they are
    # left out of the run key (``added_later``), so runs trained before they existed keep their keys.
    color_jitter: tuple[float, float, float, float] | None = None  # brightness, contrast, saturation, hue
    grayscale_p: float | None = Field(None, ge=0, le=1)
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

    def learning_check(self, history: Sequence[Mapping[str, Any]], n_classes: int) -> str | None:
        """Untrained (the base rule on ``knn_acc``), or collapsed to uniform targets: the teacher's mean
        entropy at the last epoch is within ``UNIFORM_SHARE`` of ln K, the entropy of uniform targets."""
        why = super().learning_check(history, n_classes)
        entropy = history[-1].get("teacher_entropy") if history else None
        if why is None and isinstance(entropy, int | float):
            ln_k = math.log(self.out_dim)
            if entropy >= UNIFORM_SHARE * ln_k:
                why = (
                    f"teacher entropy {entropy:.2f} nats at epoch {history[-1].get('epoch')} is within "
                    f"{1 - UNIFORM_SHARE:.0%} of ln K = {ln_k:.2f} (uniform targets: collapsed)"
                )
        return why

    def throughput_key(self) -> str | None:
        # measured with the paper's recipe only: crops and head sizes change the step cost
        return "dino_paper" if self.preset == "dino_paper" else None

    def check_model(self, model: TimmModel) -> tuple[str, str] | None:
        """A ViT (one student takes the crops of both sizes through its patch embedding), and local crops
        are made of whole patches."""
        from runners.models import family

        if family(model.name) == "cnn":
            return (
                "kind",
                f"dino trains a timm Vision Transformer here, got the CNN {model.name}: "
                "train a CNN with objective supervised",
            )
        patch = model.patch_size or 16
        if self.local_crop_size is not None and self.local_crop_size % patch:
            return (
                "local_crop_size",
                f"expected a multiple of the patch size {patch}, got {self.local_crop_size}",
            )
        return None

    @field_validator("color_jitter")
    @classmethod
    def _jitter_in_range(
        cls, v: tuple[float, float, float, float] | None
    ) -> tuple[float, float, float, float] | None:
        """torchvision's ranges: brightness, contrast and saturation in [0, 1], hue in [0, 0.5]."""
        if v is not None and not (all(0 <= f <= 1 for f in v[:3]) and 0 <= v[3] <= 0.5):
            raise ValueError(
                f"expected brightness, contrast, saturation in [0, 1] and hue in [0, 0.5], got {list(v)}"
            )
        return v

    def jitter(self) -> tuple[float, float, float, float]:
        """The colour jitter's (brightness, contrast, saturation, hue): ``color_jitter`` or DINO's."""
        return self.color_jitter or (0.4, 0.4, 0.2, 0.1)

    def gray_p(self) -> float:
        """The grayscale probability: ``grayscale_p`` or DINO's 0.2."""
        return 0.2 if self.grayscale_p is None else self.grayscale_p

    def check_data(self, model: TimmModel, image_size: int) -> tuple[str, str] | None:
        """Every crop holds at least one patch of the image: the smallest crop's side in source pixels,
        ``sqrt(scale_min) * image_size`` (a square crop), is at least the patch; a smaller one is less
        than one patch of image blown up to the crop's size, with nothing for the student to match."""
        patch = model.patch_size or 16
        for name, scale in (
            ("global_crop_scale", self.global_crop_scale),
            ("local_crop_scale", self.local_crop_scale),
        ):
            side = math.sqrt(scale[0]) * image_size
            if side < patch:
                least = (patch / image_size) ** 2
                return name, (
                    f"the smallest crop ({scale[0]:g} of the area) is {side:.1f} px of a {image_size} px image, "
                    f"less than one {patch} px patch: expected a lower bound of at least {least:.4g}"
                )
        return None

    def local_size(self, image_size: int, patch_size: int) -> int:
        """Side of the local crops in pixels: ``local_crop_size``, else half the image in whole patches."""
        return self.local_crop_size or max(patch_size, round(image_size / 2 / patch_size) * patch_size)
