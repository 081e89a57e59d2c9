"""The ``checkpoints`` source: saved weights of the design's timm ViT, one folder per seed, measured on the
probe set exactly as a trained run is (``runners.checkpoints.importer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from runners.sources.base import (
    SOURCES,
    DataRecord,
    DesignFacts,
    ImportedSettings,
    ImportedSourceBase,
    probe_record,
)
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest


class CheckpointsSettings(ImportedSettings):
    """Checkpoints of a timm ViT (``design.model``), one folder per seed, spectra measured on the probe set.

    A folder holds ``epoch_NNN.pt`` / ``.pth`` / ``.safetensors`` files, facebookresearch/dino's
    ``checkpointNNNN.pth`` / ``checkpoint.pth`` or timm's ``checkpoint-N.pth.tar`` / ``last.pth.tar`` /
    ``model_best.pth.tar`` (``design.checkpoints`` names the epochs imported), or one un-numbered checkpoint
    when ``design.checkpoints`` lists one epoch. A file is a state dict, or holds one under ``model``,
    ``state_dict``, ``model_state_dict`` or ``teacher``.
    """

    kind: Literal["checkpoints"]


class CheckpointSource(ImportedSourceBase):
    """Saved checkpoints of the design's timm ViT, one folder per seed (``runners.checkpoints.importer``)."""

    name = "checkpoints"
    settings = CheckpointsSettings
    example = {"source": {"kind": "checkpoints", "path": "/ckpt/{dataset}/seed{seed}"}, "checkpoints": [2]}
    tag_fields = ("state_dict_key",)

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """The epochs to import are named; each seed and dataset has a folder of its own."""
        if not design.checkpoints:
            raise StudyError(
                "required with a checkpoints source (the epochs to import)", None, "design.checkpoints"
            )
        super().check_design(settings, design)
        if settings is None:
            return
        if settings.path is not None and len(design.seeds) > 1 and "{seed}" not in settings.path:
            raise StudyError(
                f"expected {{seed}} in the path (one folder per seed), got {settings.path!r}",
                None,
                "design.source.path",
            )
        if len(design.datasets) > 1 and any("{dataset}" not in t for t in settings.templates()):
            raise StudyError("expected {dataset} in the path (several datasets)", None, "design.source.path")

    def fingerprint(self, settings: dict, path: Path, epochs: list[int]) -> dict:
        """sha256 of the (file name, sha256 of its bytes) list of the epochs imported."""
        from runners.checkpoints.files import checkpoint_files
        from vitstudy_core.hashing import file_digest

        files = checkpoint_files(path, epochs)
        return {"fingerprint": digest([(p.name, file_digest(p)) for p in files.values()], 16)}

    def check(self, run: dict) -> None:
        from runners.checkpoints.importer import check_checkpoints
        from runners.datasets import check_dataset_folder

        check_dataset_folder(run["dataset"])
        check_checkpoints(run)

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        return probe_record(run, data_dir)

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.checkpoints.importer import import_checkpoints

        return import_checkpoints(run, run_dir, data_dir, progress=progress)


SOURCES.register("checkpoints", CheckpointSource())
