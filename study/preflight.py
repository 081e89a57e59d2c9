"""Checks a hypothesis must pass before anything is generated or trained (``validate`` and ``run``).

The schema checks each field alone; these check what only the whole design can tell:

* the model is a timm Vision Transformer (the extraction reads ViT blocks);
* the probe set is no larger than the held-out split it stands for;
* the images fit: ``(n_train + n_test + probe) * image_size^2 * 3`` bytes (uint8) of each dataset against
  the memory available now and the free disk under the output folder;
* every claim can be evaluated on a table of the design's shape (a seeded synthetic table with the
  design's datasets, seeds, checkpoint epochs and layers): what ``run`` would refuse after training
  (e.g. a u_shape with no layer between its early and late regions) is refused before it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from study.schema import Hypothesis
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import TOKEN_SETS

MEMORY_FRACTION = 0.8  # leave room for the model, the optimiser and the other processes


def check_hypothesis(hyp: Hypothesis, file: str, out_dir: Path | None = None) -> None:
    """Raise a one-line StudyError for the first thing ``run`` would refuse. Writes nothing."""
    _check_model(hyp, file)
    for i, ds in enumerate(hyp.design.datasets):
        _check_sizes(hyp, i, ds, file, out_dir)
    _check_claims(hyp, file)


def _check_model(hyp: Hypothesis, file: str) -> None:
    import timm
    import timm.models

    name = hyp.design.model.resolved()["name"]
    if not timm.is_model(name) or not timm.models.is_model_in_modules(name, ["vision_transformer"]):
        vits = "vit_tiny_patch16_224, vit_small_patch16_224, ..."
        raise StudyError(
            f"expected a timm Vision Transformer ({vits}), got {name!r}", file, "design.model.name"
        )


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (``MemAvailable``; free pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_disk(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _check_sizes(hyp: Hypothesis, i: int, ds, file: str, out_dir: Path | None) -> None:
    where = f"design.datasets[{i}]"
    probe = hyp.design.probe.size
    n_test = getattr(ds, "n_test", None)
    if n_test is not None and probe > n_test:
        raise StudyError(
            f"expected probe.size <= the held-out split of {ds.name!r} ({n_test} images), got {probe}",
            file,
            "design.probe.size",
        )
    n_train = getattr(ds, "n_train", None)
    if n_train is None or n_test is None:  # an on-disk dataset read whole: its folder sets the size
        return
    need = (n_train + n_test + probe) * ds.image_size**2 * 3
    have = int(available_memory() * MEMORY_FRACTION)
    if need > have:
        raise StudyError(
            f"{ds.name!r} needs {need / 2**30:.1f} GiB of images in memory; {have / 2**30:.1f} GiB available "
            "(lower n_train, n_test or image_size)",
            file,
            f"{where}.n_train",
        )
    if out_dir is not None and ds.kind == "procedural" and need > free_disk(out_dir):
        raise StudyError(
            f"{ds.name!r} needs {need / 2**30:.1f} GiB of disk for its image cache; "
            f"{free_disk(out_dir) / 2**30:.1f} GiB free under {out_dir}",
            file,
            f"{where}.n_train",
        )


def _named_values(obj: object, key: str, out: set) -> set:
    """Every value of a field called ``key`` anywhere in a claim's dumped fields."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key and isinstance(v, str):
                out.add(v)
            _named_values(v, key, out)
    elif isinstance(obj, list):
        for v in obj:
            _named_values(v, key, out)
    return out


def synthetic_table(hyp: Hypothesis, seed: int = 0) -> pd.DataFrame:
    """A tidy table of the design's shape holding seeded noise: datasets x seeds x checkpoint epochs x
    layers x (the token sets and metrics the claims name). Only its shape matters (no verdict is read)."""
    dumped = [c.model_dump() for c in hyp.claims]
    metrics = sorted(set().union(*(_named_values(d, "metric", set()) for d in dumped)))
    token_sets = sorted(
        set(TOKEN_SETS) & set().union(*(_named_values(d, "token_set", set()) for d in dumped))
    )
    layers = hyp.design.layers
    idx = pd.MultiIndex.from_product(
        [
            [d.name for d in hyp.design.datasets],
            hyp.design.seeds,
            hyp.design.checkpoint_epochs,
            range(len(layers)),
            token_sets or ["all"],
            metrics,
        ],
        names=["dataset", "seed", "epoch", "layer_index", "token_set", "metric"],
    )
    df = idx.to_frame(index=False)
    df["layer"] = np.asarray(layers)[df["layer_index"].to_numpy()]
    df["run_key"] = df["dataset"] + "-" + df["seed"].astype(str)
    df["n_tokens"] = 64
    df["value"] = np.random.default_rng(seed).normal(50.0, 1.0, len(df))
    return df


def _check_claims(hyp: Hypothesis, file: str) -> None:
    from analysis.verdicts import evaluate_claims

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fits on noise warn (singular covariances, ...): nothing to tell
        evaluate_claims(hyp, synthetic_table(hyp), source=file)
