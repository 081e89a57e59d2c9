"""Checks a hypothesis must pass before anything is generated or trained (``validate`` and ``run``).

The schema checks each field alone; these check what only the whole design can tell:

* the model is a timm Vision Transformer (the extraction reads ViT blocks);
* the probe set is no larger than the held-out split it stands for;
* the images fit: ``(n_train + n_test + probe) * image_size^2 * 3`` bytes (uint8) of each dataset against
  the memory available now and the free disk under the output folder;
* every image size is a multiple of the model's patch size (timm would drop the border pixels silently:
  sizes 8 and 10 give the same tokens at patch 4), a sweep's ``image_size`` levels included;
* every claim can be evaluated on a table of the design's shape (a seeded synthetic table with the
  design's datasets, seeds, checkpoint epochs and layers): what ``run`` would refuse after training
  (e.g. a u_shape with no layer between its early and late regions) is refused before it. A sweep's
  claims over a knob are evaluated on a sweep's table (a trial dataset per knob level, the knob's value
  as a column), the others on the design's.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from runners.datasets.base import ImageDatasetSettings
from study.schema import Hypothesis, sweep_of
from vitstudy_core.errors import StudyError
from vitstudy_core.layers import TOKEN_SETS

MEMORY_FRACTION = 0.8  # leave room for the model, the optimiser and the other processes


def check_hypothesis(hyp: Hypothesis, file: str, out_dir: Path | None = None) -> None:
    """Raise a one-line StudyError for the first thing ``run`` would refuse. Writes nothing."""
    if out_dir is not None:
        check_output_folder(Path(out_dir))
    _check_model(hyp, file)
    for i, ds in enumerate(hyp.design.datasets):
        _check_sizes(hyp, i, ds, file, out_dir)
    _check_patch(hyp, file)
    _check_claims(hyp, file)
    _check_environment()


def design_warnings(hyp: Hypothesis) -> list[str]:
    """What ``validate`` passes but ``run`` cannot test, each as ``field: why`` (none stops the study).

    * fewer than 2 seeds where a claim generalises over seeds (``run`` then says "needs >= 2 seeds");
    * two operands of a claim that read the same values (a layer compared with itself): the difference is 0
      in every seed.
    """
    from runners.sources.base import declares

    out = []
    source = hyp.design.source
    models_are_seeds = source is not None and declares(source.kind, "models_are_seeds")
    over_seeds = [c.name for c in hyp.claims if (c.unit or "seeds") == "seeds"]
    if len(hyp.design.seeds) < 2 and over_seeds and not models_are_seeds:
        out.append(
            f"design.seeds: {len(hyp.design.seeds)} seed: a claim over seeds ({over_seeds[0]!r}) needs >= 2 "
            "to be tested (use >= 3, ideally 5+); run will report it INCONCLUSIVE (needs >= 2 seeds)"
        )
    for i, claim in enumerate(hyp.claims):
        seen: dict[tuple, str] = {}
        for fld, j, cond in claim.operands():
            name = fld if j is None else f"{fld}[{j}]"
            key = (
                cond.dataset or claim.subset.dataset,
                cond.token_set or claim.subset.token_set,
                cond.epoch if cond.epoch is not None else claim.subset.epoch,
                tuple(sorted(set(cond.layers))),
                cond.condition or claim.subset.condition,
            )
            first = seen.setdefault(key, name)
            if first != name:
                out.append(
                    f"claims[{i}].{name}: reads the same values as {first} (dataset, token set, epoch, layers "
                    "and condition): their difference is 0 in every seed, so the claim tests nothing"
                )
    return out


def _check_environment() -> None:
    """The periods read from the environment (lease lifetime, parent heartbeat) are numbers of seconds > 0:
    found here, before anything is written, rather than in a worker or a heartbeat thread."""
    from runners.leases.model import lease_ttl
    from study.tracking.cleanup import heartbeat_s

    lease_ttl()
    heartbeat_s()


def check_output_folder(out_dir: Path, option: str = "--out") -> None:
    """The output folder can be a folder: it is one or can be made one (no file in its place or above it)
    and no name in its path is longer than the file system allows. Writes nothing.

    Raises:
        StudyError: one line naming the path and what is wrong with it.
    """
    path = Path(os.path.abspath(out_dir))
    limit = 255  # NAME_MAX of the deepest folder that exists (the one the new names are made in)
    for part in [*reversed(path.parents), path]:
        if len(os.fsencode(part.name)) > limit:
            raise StudyError(
                f"a folder name of {len(os.fsencode(part.name))} bytes ({part.name[:24]}...) is longer than "
                f"the file system's limit of {limit} bytes",
                str(out_dir),
                option,
            )
        if _is_folder(part, out_dir, option, path):  # below a missing folder: its parent's limit holds
            try:
                limit = os.pathconf(part, "PC_NAME_MAX")
            except (OSError, ValueError):
                pass


def _is_folder(part: Path, out_dir: Path, option: str, path: Path) -> bool:
    """Whether ``part`` (``path`` or a folder above it) exists as a folder; a StudyError if it is a file."""
    try:
        st = part.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StudyError(f"cannot use it ({exc.strerror}: {part})", str(out_dir), option) from None
    if not stat.S_ISDIR(st.st_mode):
        what = "the output folder" if part == path else f"a folder above it ({part})"
        raise StudyError(f"expected a folder, but {what} is a file", str(out_dir), option)
    return True


def patch_size(hyp: Hypothesis) -> int | None:
    """The model's patch size: the preset's or the file's, else the one timm builds the named model with.

    timm is asked (the model built on the meta device: no memory, no weights; the answer kept in
    ``runners.model_table``'s cache) because a name need not carry its patch size (``flexivit_small`` is
    patch 16); should timm fail to build it, the size in a name like ``..._patch16_...`` is used (the
    failure itself is the model check's business).
    """
    model = hyp.design.model.resolved()
    if model.get("patch_size"):
        return int(model["patch_size"])
    from runners.model_table import built_shape, patch_in_name  # a table: no timm, no torch
    from runners.models import family

    if family(model["name"]) == "cnn":
        return None  # a CNN takes any image size
    shape = built_shape(model)
    return shape["patch_size"] if shape is not None else patch_in_name(model["name"])


def _check_cnn_sizes(hyp: Hypothesis, file: str) -> None:
    """A CNN takes each dataset's images: its downsampling leaves at least what its last layers need."""
    from runners.model_table import size_problem

    model = hyp.design.model.resolved()
    for i, ds in enumerate(hyp.design.datasets):
        size = ds.image_size if isinstance(ds, ImageDatasetSettings) else None
        problem = size_problem(model, size) if size is not None else None
        if problem is not None:
            raise StudyError(
                f"{model['name']} cannot take {size} px images ({problem}): expected a larger image_size",
                file,
                f"design.datasets[{i}].image_size",
            )


def _check_patch(hyp: Hypothesis, file: str) -> None:
    """Every image size (each dataset's, and each level of a swept ``image_size``) is a multiple of the patch."""
    from runners.models import family

    if family(hyp.design.model.resolved()["name"]) == "cnn":
        _check_cnn_sizes(hyp, file)
        return
    patch = patch_size(hyp)
    if patch is None:
        return
    for i, ds in enumerate(hyp.design.datasets):
        size = ds.image_size if isinstance(ds, ImageDatasetSettings) else None
        if size is not None and size % patch:
            raise StudyError(
                f"expected an image_size divisible by the model's patch size {patch} (timm would drop the "
                f"border pixels), got {size}",
                file,
                f"design.datasets[{i}].image_size",
            )
    values = hyp.sweep.space.get("image_size") if hyp.sweep else None
    if values is None:
        return
    if isinstance(values, list):
        bad = [v for v in values if int(v) % patch]
    else:  # a range's levels: low, low + step, ... (step 1 when none is given)
        bad = [v for v in (values.low, values.step or 1) if int(v) % patch]
    if bad:
        raise StudyError(
            f"expected image sizes divisible by the model's patch size {patch} (timm would drop the border "
            f"pixels), got {bad[0]:g}"
            + ("" if isinstance(values, list) else f" (give low and step as multiples of {patch})"),
            file,
            "sweep.space.image_size",
        )


def _check_model(hyp: Hypothesis, file: str) -> None:
    from runners.models import family  # timm's registry as a cached table: no timm, no torch

    name = hyp.design.model.resolved()["name"]
    if family(name) is None:  # a ViT or a CNN (whose blocks are checked with the design): timm knows it
        vits = "vit_tiny_patch16_224, vit_small_patch16_224, ..., or a CNN: resnet18, convnext_atto, ..."
        raise StudyError(
            f"expected a timm Vision Transformer or CNN ({vits}), got {name!r}", file, "design.model.name"
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
    from runners.datasets import DATASETS

    where = f"design.datasets[{i}]"
    if not isinstance(ds, ImageDatasetSettings):  # no images (an imported table's dataset): nothing to hold
        return
    probe = hyp.design.probe.size
    n_test = ds.n_test
    if n_test is not None and probe > n_test:
        raise StudyError(
            f"expected probe.size <= the held-out split of {ds.name!r} ({n_test} images), got {probe}",
            file,
            "design.probe.size",
        )
    n_train = ds.n_train
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
    if out_dir is not None and DATASETS.get(ds.kind).generated and need > free_disk(out_dir):
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
    cells = hyp.design.cells()
    if cells[0].name is None:
        return df
    # a design with conditions: the rows once per cell, an untrained cell's at epoch 0 only (its twin's)
    return pd.concat(
        [(df[df["epoch"] == 0] if c.untrained else df).assign(condition=c.name) for c in cells],
        ignore_index=True,
    )


def knob_levels(values, integer: bool) -> list[float]:
    """A swept knob's levels for a synthetic sweep table: the list, or a range's low, middle and high."""
    if isinstance(values, list):
        return [float(v) for v in values]
    mid = (values.low * values.high) ** 0.5 if values.log else (values.low + values.high) / 2
    levels = [values.low, mid, values.high]
    return sorted({float(round(v)) if integer else float(v) for v in levels})


def synthetic_sweep_table(hyp: Hypothesis, seed: int = 0) -> pd.DataFrame:
    """A synthetic table of a sweep's shape: the swept dataset as a trial dataset per combination of knob
    levels (named as ``study.sweep.trials.trial_label`` names them), each row carrying the knob values as columns."""
    from vitstudy_core.knobs import INTEGER_KNOBS

    knobs = list(sweep_of(hyp).space)
    grid = itertools.product(*(knob_levels(sweep_of(hyp).space[k], k in INTEGER_KNOBS) for k in knobs))
    base = next(d for d in hyp.design.datasets if d.name == sweep_of(hyp).dataset)
    # per seed a slope along each knob: a curve over the knob with between-seed variation, as real sweeps
    # give (pure noise over two levels can make a random-slopes fit degenerate)
    slopes = np.random.default_rng(seed).normal(1.0, 0.5, (len(hyp.design.seeds), len(knobs)))
    frames = []
    for i, point in enumerate(grid):
        params = dict(zip(knobs, point, strict=True))
        name = base.name + "".join(f"-{k}{v:g}" for k, v in sorted(params.items()))
        ds = base.model_copy(update={"name": name})
        one = hyp.model_copy(update={"design": hyp.design.model_copy(update={"datasets": [ds]})})
        df = synthetic_table(one, seed + i + 1).assign(**params)
        rise = slopes[df.seed.map({s: j for j, s in enumerate(hyp.design.seeds)}).to_numpy()] @ np.asarray(
            point
        )
        frames.append(df.assign(value=df.value + rise))
    return pd.concat(frames, ignore_index=True)


def _with_scalars(table: pd.DataFrame, hyp: Hypothesis, seed: int = 0) -> pd.DataFrame:
    """A synthetic table with seeded noise in a column per per-run scalar the claims adjust for."""
    from study.pipeline.scalars import scalars_named

    rng = np.random.default_rng(seed)
    runs = table.run_key.unique()
    noise = {
        n: dict(zip(runs, rng.uniform(0.2, 0.8, len(runs)), strict=True)) for n in scalars_named(hyp.claims)
    }
    return table.assign(**{n: table.run_key.map(v) for n, v in noise.items()}) if noise else table


def _check_claims(hyp: Hypothesis, file: str) -> None:
    """Each claim on the synthetic table it will meet (a sweep's, for a claim over a knob), in file order;
    an error names the claim by its index in the file. Only the outcomes are computed (the multiplicity
    adjustment and power read no table and cannot fail on one)."""
    from analysis.verdicts import claim_outcomes

    plain = _with_scalars(synthetic_table(hyp), hyp)
    swept = _with_scalars(synthetic_sweep_table(hyp), hyp) if hyp.sweep is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fits on noise warn (singular covariances, ...): nothing to tell
        if swept is None:
            claim_outcomes(hyp, plain, source=file)
            return
        for i, claim in enumerate(hyp.claims):
            one = hyp.model_copy(update={"claims": [claim]})
            try:
                claim_outcomes(one, plain if claim.knob() is None else swept, source=file)
            except StudyError as exc:  # evaluated alone it is claims[0]: name it by its place in the file
                where = (exc.file or "").replace(f"{file}: claims[0]", f"{file}: claims[{i}]")
                raise StudyError(exc.message, where, exc.field) from None
