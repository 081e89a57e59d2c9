"""What one checkpoint's extraction writes into the run folder: observables (``scalars.json``), covariance
snapshots (``covariances.npz``, at the epochs :func:`snapshot_epochs` picks), smaller-probe spectra
(``probe.npz``) and block sums (``blocks.npz``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runners.extract import SUBSAMPLE, SUBSAMPLE_SEED, Spectra, extract_spectra
from vitstudy_core.errors import RunFailedError
from vitstudy_core.runfolder import BLOCKS, PROBE, RunFolder, spectrum_key


def snapshot_epochs(covariance_epochs: str | list[int], checkpoints: list[int]) -> list[int]:
    """Checkpoint epochs whose covariances are saved, from ``ProbeSpec.covariance_epochs``.

    ``"first_last"``: the first and last checkpoint; ``"none"``: none; a list: those epochs that are
    checkpoints (the schema rejects any other).
    """
    eps = sorted(set(checkpoints))
    if covariance_epochs == "none" or not eps:
        return []
    if isinstance(covariance_epochs, str):  # "first_last"; any other word (the schema allows none): none
        return sorted({eps[0], eps[-1]}) if covariance_epochs == "first_last" else []
    return sorted(set(covariance_epochs) & set(eps))


def save_observables(run_dir: Path, epoch: int, sp: Spectra) -> None:
    """Merge one checkpoint's observables into the run folder's ``scalars.json`` (atomic write).

    Layout: ``{"subsample": {"size", "seed"}, "n_subsample": {"{layer}/{token_set}": m},
    "values": {"{epoch}/{layer}/{token_set}/{observable}": value}}``; NaN is written as ``null``.
    """
    meta = {
        "subsample": {"size": SUBSAMPLE, "seed": SUBSAMPLE_SEED},
        "n_subsample": {f"{la}/{ts}": m for (la, ts), m in sp.n_subsample.items()},
    }
    values = {f"{epoch}/{layer}/{tset}/{name}": v for (layer, tset, name), v in sp.scalars.items()}
    RunFolder(run_dir).merge_scalars(values, meta)


def save_covariances(run_dir: Path, epoch: int, sp: Spectra) -> None:
    """Merge one checkpoint's float32 covariances of token set ``all`` into ``covariances.npz``.

    Keys ``"{epoch}/{layer}"``, values ``(D, D)`` float32 (centred covariance, as in the module docstring).
    """
    RunFolder(run_dir).merge_covariances(epoch, sp.covariances)


def save_probe(run_dir: Path, epoch: int, sp: Spectra) -> None:
    """Merge one checkpoint's smaller-probe spectra into ``probe.npz`` and, if measured, its block sums
    into ``blocks.npz`` (``vitstudy_core.runfolder``: keys and shapes there)."""
    folder = RunFolder(run_dir)
    if sp.probe_sizes:
        arrays: dict[str, np.ndarray] = {}
        for (layer, tset, label), (lam, n, values) in sp.probe_sizes.items():
            key = f"{int(epoch)}/{layer}/{tset}/{label}"
            arrays[f"{key}/lam"] = lam
            arrays[f"{key}/n"] = np.asarray(n, dtype=np.int64)
            arrays.update({f"{key}/m/{m}": np.asarray(v, dtype=np.float64) for m, v in values.items()})
        folder.merge_npz(PROBE, epoch, arrays)
    if sp.blocks:
        arrays = {}
        for (layer, tset), sums in sp.blocks.items():
            key = f"{int(epoch)}/{layer}/{tset}"
            d = sums["s"].shape[1]
            low = np.tril_indices(d)
            arrays.update({f"{key}/{k}": sums[k] for k in ("n", "s", "u", "w")})
            arrays[f"{key}/qtril"] = sums["q"][:, low[0], low[1]]  # symmetric: the lower triangle only
        folder.merge_npz(BLOCKS, epoch, arrays)


def save_measurements(run_dir: Path, epoch: int, sp: Spectra, snapshot: bool) -> None:
    """One checkpoint's files beside its spectra: observables, smaller-probe spectra and block sums, and
    (``snapshot``) the covariance snapshot."""
    save_observables(run_dir, epoch, sp)
    save_probe(run_dir, epoch, sp)
    if snapshot:
        save_covariances(run_dir, epoch, sp)


def measure_epoch(
    model: Any,
    images: Any,
    run: dict,
    run_dir: Path,
    epoch: int,
    snaps: list[int],
    spectra: dict,
    n_tokens: dict,
) -> Spectra | dict:
    """One imported model's extraction on the probe images (:func:`runners.extract.extract_spectra`, with
    the covariances where ``epoch in snaps``), its spectra and token counts added to ``spectra`` and
    ``n_tokens`` (keys as in ``spectra.npz`` and ``result.json``).

    Returns:
        The :class:`Spectra`, or on a non-finite activation the failed ``result.json`` content (written).
    """
    probe = run["probe"]
    try:
        sp = extract_spectra(
            model, images, probe["batch_size"], epoch, epoch in snaps, blocks=probe.get("blocks", 0)
        )
    except RunFailedError as exc:
        result = {"status": "failed", "failed_epoch": epoch, "error": str(exc), "run": run, "history": []}
        RunFolder(run_dir).write_result(result)
        return result
    for (layer, tset), lam in sp.eigenvalues.items():
        spectra[spectrum_key(epoch, layer, tset)] = lam
        n_tokens[f"{layer}/{tset}"] = sp.n_tokens[(layer, tset)]
    return sp
