"""The unit of a claim: what its verdict generalises over, and the test that follows from it.

* ``seeds`` (the default): training runs of one recipe; each seed is a replicate (every kind's own test).
* ``models``: the named published models of a family (``design.source: {kind: pretrained}``) are the
  replicates, tested exactly as seeds are; the verdict is about "models like these".
* ``images``: one fixed model (or, for a comparison across models, each of those fixed models on the
  same probe images); the replicate is the probe image. The verdict is about "this checkpoint, on images
  like these": the population value of the metric, i.e. its value for the covariance of the image
  distribution the probe was drawn from, not its value on these N images.

``unit: images`` runs the claim's own kind on **jackknife pseudo-values over probe blocks**. The probe's K
contiguous image blocks (``design.probe.blocks``; their covariance sums are in ``blocks.npz``) give, per
(model, layer, token set), the metric ``theta`` on all N images and ``theta_(-k)`` on all but block k;
block k's pseudo-value is ``K theta - (K - 1) theta_(-k)`` (Tukey). Their mean is the jackknife
bias-corrected estimate: a plug-in spectral metric (EED%, PR, ...) of N images reads low by ``a / N +
O(N^-2)`` with an ``a`` that depends on the spectrum's shape, and the jackknife removes the ``a / N`` term
whatever ``a`` is, so two layers with equal population values but different spectra are compared
without their finite-probe biases. Their spread gives the jackknife SE. The pseudo-values stand in for
seeds (K "seeds", paired by block across layers and across models): a kind whose test is linear in the
per-seed layer values (a u_shape's region contrasts, a differs' difference of per-seed effects) then runs
the jackknife t test on K - 1 degrees of freedom; only the (kind, metric) pairs whose calibration rows hold
(:data:`CALIBRATED`) are allowed. A kind whose statistic is
not linear in them (a leave-one-seed-out bottleneck, Kendall's tau, a mixed model) is refused for
``unit: images``; so is every kind not calibrated for it (``bench/calibration.py --unit-images``,
docs/statistics.md). The jackknife needs a metric recomputable from covariance sums
(``analysis.probe.resamplable``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.probe import ProbeData, _block_sums, claim_rows, resampled_values

if TYPE_CHECKING:
    import pandas as pd

UNITS = ("seeds", "images", "models")
DEFAULT_UNIT = "seeds"
MIN_BLOCKS = 8  # the jackknife t test on K - 1 df: fewer blocks give a wide, noisy interval
# the smallest probe calibrated (bench/calibration.py --unit-images: 256, 1,024, 4,096 images); at 64
# images the jackknife's interval under-covered (0.87) in the same simulation
MIN_IMAGES = 256


def model_names(source: dict | None) -> list[str]:
    """The model names of a validated source whose settings name its models (``models``: a source that
    declares ``models_are_seeds``, ``runners.sources.base``) in seed order ([] for another source or none)."""
    models = source.get("models") if source else None
    return list(models) if isinstance(models, dict) else []


def _image_kinds() -> dict[str, Any]:
    """``{kind name: ClaimKind}`` of the kinds that allow ``unit: images`` (``ClaimKind.images``)."""
    from analysis.kinds import KINDS

    return {name: kind for name, kind in KINDS.items() if kind.images is not None}


def inner_images_problem(inner: Any) -> str | None:
    """For a compound claim's ``ClaimKind.images``: why its ``inner`` claim's kind cannot test that claim
    on ``unit: images`` (that kind's own ``images``), or None."""
    entry = _image_kinds().get(inner.kind)
    if entry is None:
        return f"its inner {inner.kind} claim is not calibrated for unit: images"
    return entry.images(inner)


def unit_problem(
    claim: Any, n_models: int | None, n_seeds: int, blocks: int, resamplable: bool, n_images: int = MIN_IMAGES
) -> str | None:
    """Why a claim's unit does not fit its design (one phrase), or None.

    Args:
        n_models: the pretrained source's number of models (None: another source).
        n_seeds: the design's seeds; blocks: ``design.probe.blocks``; resamplable: the claim's metric can
            be recomputed from covariance sums; n_images: ``design.probe.size``.
    """
    unit = claim.unit or DEFAULT_UNIT
    if unit == "seeds":
        if n_models is not None:
            return (
                "published models are not seeds of one training recipe: declare unit: images (this "
                "checkpoint, on images like these) or unit: models (models like these)"
            )
        if claim.unit is not None and n_seeds < 2:
            return f"unit: seeds needs >= 2 seeds (the design has {n_seeds}); one fixed model: unit: images"
        return None
    if unit == "models":
        if n_models is None:
            return "unit: models needs a pretrained source (design.source.kind: pretrained) naming the models"
        if n_models < 2:
            return f"unit: models needs >= 2 models (the source names {n_models}); one model: unit: images"
        return None
    kinds = _image_kinds()
    entry = kinds.get(claim.kind)
    if entry is None:
        return f"unit: images is not available for kind {claim.kind} (it is for {sorted(kinds)})"
    problem = entry.images(claim)
    if problem:
        return f"unit: images: {problem}"
    if claim.metric not in entry.images_calibrated:
        calibrated = sorted((k, m) for k, kind in kinds.items() for m in kind.images_calibrated)
        held = ", ".join(f"{k} on {m}" for k, m in calibrated)
        return (
            f"unit: images is not calibrated for {claim.kind} on {claim.metric} (its calibration rows hold "
            f"for {held}; docs/statistics.md)"
        )
    if n_models is None and n_seeds != 1:
        return f"unit: images is about one fixed model: the design has {n_seeds} seeds (keep one)"
    if blocks < MIN_BLOCKS:
        return f"unit: images needs design.probe.blocks >= {MIN_BLOCKS} (e.g. 16): the probe's image blocks are the replicates"
    if n_images < MIN_IMAGES:
        return (
            f"unit: images is calibrated from {MIN_IMAGES} probe images up (design.probe.size is {n_images})"
        )
    if not resamplable:
        return f"unit: images recomputes the metric from covariance sums; {claim.metric!r} is measured on a token subsample"
    return None


# --------------------------------------------------------------------------------------------------
# The jackknife over probe blocks
# --------------------------------------------------------------------------------------------------
def pseudo_values(sums: dict[str, np.ndarray], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Jackknife pseudo-values of ``metric`` from per-block covariance sums (``n`` (C, K), ``s`` (C, K, D),
    ``q`` (C, K, D, D), ``u``, ``w``; ``analysis.probe._block_sums``).

    Returns:
        ((C,) the metric on every block, (C, K) pseudo-values ``K theta - (K - 1) theta_(-k)``).
    """
    k = sums["n"].shape[1]
    full = resampled_values(sums, np.ones(k), metric)
    out = np.empty((len(full), k))
    for j in range(k):
        w = np.ones(k)
        w[j] = 0.0
        out[:, j] = k * full - (k - 1) * resampled_values(sums, w, metric)
    return full, out


def pseudo_table(rows: pd.DataFrame, pseudo: np.ndarray, names: list[str] | None) -> pd.DataFrame:
    """The claim's rows with each (model, layer, ...) row replaced by its K pseudo-values as K "seeds"
    (seed = block index); with ``names`` (a pretrained source's models in seed order) the model's name
    goes in the ``condition`` column, so claims across models pair their blocks."""
    import pandas as pd

    k = pseudo.shape[1]
    parts = []
    for j in range(k):
        part = rows.assign(value=pseudo[:, j], seed=j)
        if names:
            part = part.assign(condition=[names[int(s)] for s in rows.seed])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def images_table(
    table: pd.DataFrame, claim: Any, probe: ProbeData, where: str, names: list[str] | None
) -> pd.DataFrame:
    """The table a ``unit: images`` claim is tested on: its rows as jackknife pseudo-values over blocks."""
    rows = claim_rows(table, claim).reset_index(drop=True)
    if names and "condition" in rows:
        rows = rows.drop(columns="condition")
    keys = [
        (str(r.run_key), int(r.epoch), str(r.layer), str(r.token_set), claim.metric)
        for r in rows[["run_key", "epoch", "layer", "token_set"]].itertuples(index=False)
    ]
    todo = sorted({i for i, k in enumerate(keys) if k not in probe.pseudo})  # each row once per study
    if todo:
        _, fresh = pseudo_values(_block_sums(probe, rows.iloc[todo], where), claim.metric)
        probe.pseudo.update({keys[i]: values for i, values in zip(todo, fresh, strict=True)})
    return pseudo_table(rows, np.stack([probe.pseudo[k] for k in keys]), names)


def population(
    claim: Any, names: list[str] | None, seeds: list[int], n_images: int | None, blocks: int
) -> str:
    """What the verdict is about, in words."""
    unit = claim.unit or DEFAULT_UNIT
    dataset = getattr(claim.subset, "dataset", None) or "the probe dataset"
    if unit == "models":
        used = [names[s] for s in seeds] if names else [str(s) for s in seeds]
        return f"models like these ({', '.join(used)}): the {len(used)} named models are the replicates"
    if unit == "images":
        models = [c for _, c in claim.conditions_named()] or (
            [claim.subset.condition] if claim.subset.condition else (names or [])[:1]
        )
        which = (
            f"this checkpoint ({models[0]})"
            if len(models) == 1
            else f"these checkpoints ({', '.join(models)})"
            if models
            else "this checkpoint"
        )
        probe = f"{n_images} probe images of {dataset}" if n_images else f"the probe images of {dataset}"
        return f"{which}, on images like these ({probe}, jackknife over {blocks} blocks)"
    return f"runs like these: the training recipe, over {len(seeds)} seeds"
