"""The ``pretrained`` source: published models, named by timm (weights from the Hugging Face cache) or as
a released checkpoint on disk, each measured on the probe set through its own timm preprocessing.

    design:
      source: {kind: pretrained, models: {dino: vit_small_patch16_224.dino,
                                          sup: vit_small_patch16_224.augreg_in21k_ft_in1k}}
      # or a released file: {dino: {timm: vit_small_patch16_224, file: /ckpt/dino_deitsmall16_pretrain.pth}}

Model ``i`` (in the order of ``models``) is the design's seed ``i``: ``design.seeds`` may be left out
(it is then ``[0, ..., M-1]``). What the verdicts take as the replicate is each claim's ``unit``
(``analysis.units``): ``images`` (one fixed model; the models of a claim across models are its
conditions, paired on the same probe images) or ``models`` (the named models are the replicates).

A run's key holds the weights' content fingerprint (sha256 of the file's bytes: the Hugging Face cache's
``model.safetensors`` / ``pytorch_model.bin``, or the file on disk) and the model's preprocessing (timm's
``resolve_data_config`` of its pretrained config: input size, interpolation, crop, mean, std). Nothing is
downloaded when a study is validated or planned: a hub model must be in the cache before ``run``
(``timm.create_model(NAME, pretrained=True)`` once, online, puts it there); with ``HF_HUB_OFFLINE=1``
timm then loads it from the cache. The torch side is ``runners.pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from analysis.units import model_names  # noqa: F401 - re-exported: the models in seed order
from runners.sources.base import (
    SOURCES,
    DataRecord,
    DesignFacts,
    ImportedSettings,
    ImportedSourceBase,
    probe_record,
)
from vitstudy_core.errors import FieldError, StudyError
from vitstudy_core.settings import Strict

_FIELD = "design.source.models"
HUB = "timm:"  # a run's path for a hub model: "timm:<timm name>" (its weights are found in the cache)


class ModelFile(Strict):
    """A released checkpoint on disk: ``timm`` names the architecture (and its default pretrained config's
    preprocessing), ``file`` the weights (a state dict as the ``checkpoints`` source reads it:
    ``.safetensors``, or ``.pth``/``.pt``/``.pth.tar`` loaded without unpickling; DINO's ``teacher``,
    timm's ``state_dict``, ...). A relative ``file`` is taken under ``design.source.path``."""

    timm: str = Field(min_length=1)
    file: str = Field(min_length=1)
    # e.g. {img_size: 224}; a CNN's own arguments ({channels: [16, 32, 64, 128]}) as design.model takes them
    model_args: dict[str, int | float | str | bool | list[int] | list[float] | list[str]] = Field(
        default_factory=dict
    )

    @field_validator("model_args")
    @classmethod
    def _not_set_here(cls, v: dict) -> dict:
        """``timm.create_model`` gets these from the weights (the head's size) and the source (no download):
        given here too, ``run`` failed with "got multiple values for keyword argument"."""
        why = {
            "num_classes": "the head's size is read from the weights file",
            "pretrained": "weights come from file",
        }
        for key in (k for k in why if k in v):
            raise ValueError(f"set by the source ({why[key]}): leave {key} out of model_args")
        return v


class PretrainedSettings(ImportedSettings):
    """Published models: ``models: {NAME: TIMM_NAME | {timm: ARCH, file: PATH}}``; ``path``: an optional
    folder that relative ``file`` entries are under (``${ENV}`` or ``--data-root source=PATH``)."""

    kind: Literal["pretrained"]
    models: dict[str, str | ModelFile] = Field(min_length=1)

    @field_validator("models", mode="before")
    @classmethod
    def _entries(cls, v: object) -> object:
        """A mapping entry is a :class:`ModelFile`, validated as one so that its error names its own key
        (pydantic's union reported the other branch: ``models.a.str: Input should be a valid string``)."""
        if not isinstance(v, dict):
            return v
        out = {}
        for name, entry in v.items():
            if not isinstance(entry, dict):
                out[name] = entry
                continue
            try:
                out[name] = ModelFile.model_validate(entry)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = "".join(f".{p}" for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    what = (
                        "unknown key: a model file takes timm, file and model_args (arguments of the "
                        f"model such as img_size go under model_args: {{{err['loc'][-1]}: ...}})"
                    )
                else:
                    what = err["msg"].removeprefix("Value error, ")
                raise FieldError(f"{_FIELD}.{name}{where}", what) from None
        return out

    @model_validator(mode="after")
    def _one_path(self):  # overrides ImportedSettings': the models name their weights, a path is optional
        if self.paths is not None:
            raise ValueError("a pretrained source names its models under models:, not paths")
        bad = [n for n in self.models if not n or not all(c.isalnum() or c in "_.-" for c in n)]
        if bad:
            raise ValueError(f"model names are letters, digits, '_', '.' and '-', got {bad[0]!r}")
        return self

    def templates(self) -> list[str]:
        return [self.path] if self.path is not None else []


def model_entry(source: dict, seed: int) -> tuple[str, str, str | None, dict]:
    """(name, timm name, file or None, model_args) of design seed ``seed`` (the seed-th model)."""
    name, entry = list(source["models"].items())[seed]
    if isinstance(entry, str):
        return name, entry, None, {}
    file = entry["file"]
    if source.get("path") and not Path(file).is_absolute() and not file.startswith(("$", "~")):
        file = f"{source['path'].rstrip('/')}/{file}"
    return name, entry["timm"], file, dict(entry.get("model_args") or {})


class PretrainedSource(ImportedSourceBase):
    """Published timm models (hub or file), one run per model and dataset (``runners.pretrained``)."""

    name = "pretrained"
    settings = PretrainedSettings
    models_are_seeds = True
    reads_cnns = True
    example = {
        "source": {
            "kind": "pretrained",
            "path": "/weights",
            "models": {"a": {"timm": "vit_tiny_patch16_224", "file": "a.safetensors"}},
        },
        "probe": {"size": 256, "blocks": 8},  # unit: images (one model) resamples the probe's image blocks
    }
    example_claim = {  # one published model: its claims are about its images (unit: images)
        "name": "c",
        "kind": "u_shape",
        "unit": "images",
        "metric": "eed_pct",
        "subset": {"dataset": "objects"},
        "regions": {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["norm"]},
    }
    tag_fields = ("model", "timm", "preprocessing")

    def default_epochs(self, trained_epochs: int) -> list[int]:
        return [0]  # a published model is one checkpoint; its rows are epoch 0

    def check_design(self, settings: ImportedSettings | None, design: DesignFacts) -> None:
        """One seed per model, ``0 .. M-1`` (left out: filled in), and one epoch."""
        assert isinstance(settings, PretrainedSettings)
        n = len(settings.models)
        if list(design.seeds) != list(range(n)):
            raise StudyError(
                f"with a pretrained source the seeds are the models' indices {list(range(n))} (leave "
                f"seeds out), got {list(design.seeds)}",
                None,
                "design.seeds",
            )
        if design.checkpoints not in (None, (0,)):
            raise StudyError(
                "a published model is one checkpoint: leave checkpoints out", None, "design.checkpoints"
            )

    def record(self, source: dict, dataset: str, seed: int, epochs: list[int], n_seeds: int) -> dict:
        """This model's entry (not the others': adding a model keeps every other run's key), its weights'
        fingerprint and its preprocessing (None when the weights are not there yet)."""
        from runners.imported import resolve

        name, arch, file, args = model_entry(source, seed)
        record: dict = {
            "kind": self.name,
            "model": name,
            "timm": arch,
            "model_args": args,
            "dataset": dataset,
        }
        record["shared"] = False
        if file is None:
            record["path"] = HUB + arch
        else:
            path = resolve(file, strict=False)
            record["path"] = str(path) if path is not None else file
        record.update(fingerprint=None, preprocessing=None)
        try:
            from runners.pretrained import preprocessing_of, weights_file
            from vitstudy_core.hashing import file_digest

            weights = weights_file(record)
            if weights is not None:
                record["fingerprint"] = file_digest(weights)[:16]
                record["preprocessing"] = preprocessing_of(record)
        except StudyError:
            pass  # reported by check before anything is recorded
        return record

    def check(self, run: dict) -> None:
        from runners.datasets import check_dataset_folder
        from runners.pretrained import check_pretrained

        check_dataset_folder(run["dataset"])
        check_pretrained(run)

    def prepare(self, run: dict, data_dir: str | Path) -> DataRecord:
        return probe_record(run, data_dir)

    def fill(
        self, run: dict, run_dir: str | Path, data_dir: str | Path, progress=None, bar: bool = False
    ) -> dict:
        from runners.pretrained import import_pretrained

        return import_pretrained(run, run_dir, data_dir, progress=progress)


SOURCES.register("pretrained", PretrainedSource())
