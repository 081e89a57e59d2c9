"""The ``train`` source: a timm ViT trained with the run's objective, its spectra measured at the design's
checkpoints (``runners.train``). It is the source of every run whose design has no ``source`` section."""

from __future__ import annotations

from pathlib import Path

from runners.sources.base import SOURCES, DataRecord, DesignFacts, ImportedSettings, SourceBase
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest


class TrainingSource(SourceBase):
    """Train a timm ViT with the run's objective and measure its spectra (``runners.train``)."""

    name = "train"
    trains = True
    reads_cnns = True
    settings = None  # no ``design.source`` section: training is what a design without one means
    example = {"checkpoints": [0, 1]}

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """The checkpoint epochs lie within the training (0 = before the first step)."""
        for ep in sorted(set(design.checkpoints or ())):
            if not 0 <= ep <= design.trained_epochs:
                raise StudyError(
                    f"checkpoint epoch {ep} outside 0..{design.trained_epochs} (0 = initialisation, "
                    f"{design.trained_epochs} = training.epochs)",
                    None,
                    "design.checkpoints",
                )

    def check(self, run: dict) -> None:
        from runners.datasets import check_dataset_folder

        check_dataset_folder(run["dataset"])

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        from runners.datasets import load_split, num_classes

        ds = run["dataset"]
        shapes = {split: list(load_split(ds, split, data_dir)[0].shape) for split in ("train", "test")}
        probe = load_split(ds, "probe", data_dir, run["probe"]["size"], run["probe"]["seed"])[0]
        profile = {**shapes, "probe": list(probe.shape), "n_classes": int(num_classes(ds))}
        return DataRecord(ds["name"], ds, digest(ds, 16), profile)

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.train import train_run

        return train_run(run, run_dir, data_dir, progress=progress, bar=bar)


SOURCES.register("train", TrainingSource())
