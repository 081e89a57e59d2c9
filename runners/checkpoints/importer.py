"""Imported checkpoints: load a seed's weights per epoch into the design's timm ViT and measure them.

    result = import_checkpoints(run_spec_dict, run_dir, data_dir)

Each checkpoint file (``runners.checkpoints.files``: our ``epoch_NNN.pt``, DINO's ``checkpointNNNN.pth``,
timm's ``checkpoint-N.pth.tar``, ...) is a state dict in ``.pt``/``.pth``/``.pth.tar`` (``torch.load`` with
``weights_only=True``: tensors, plain containers and ``argparse.Namespace`` only, nothing executes) or
``.safetensors``, either bare or under one of :data:`WRAPPERS` (the project's own checkpoints:
``{"model": state_dict, "run": spec}``; timm's training checkpoints: ``state_dict``, the weights trained,
not ``state_dict_ema``; DINO's: ``teacher``, the network DINO evaluates). A ``module.`` prefix
(DistributedDataParallel) is removed, and when keys sit under ``backbone.`` (a DINO teacher) only those
are kept. The model is
``timm.create_model`` of the design's model at the dataset's image size, with as many classes as the
state dict's ``head.weight`` has rows (0 without a head); the state dict must fit it exactly.

Spectra, observables and covariance snapshots are measured exactly as for a trained run
(``runners.extract``: the same probe set, the same code), so a claim over imported checkpoints and the same
claim over the runs that wrote them agree. ``result.json`` records, per epoch, the file and the key its
state dict came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from runners.checkpoints.files import checkpoint_files, checkpoint_format, load_checkpoint
from runners.imported import resolve
from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import RunFolder

if TYPE_CHECKING:
    import numpy as np

WRAPPERS = ("model", "state_dict", "model_state_dict", "teacher")
TOP_LEVEL = "(top level)"


def _is_state_dict(obj: object) -> bool:
    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], str, str]:
    """A checkpoint file's state dict, the key it was found under and the key prefix removed.

    Returns:
        (name -> tensor on the CPU, ``(top level)`` or one of :data:`WRAPPERS`, removed prefix or "").

    Raises:
        StudyError: unreadable file, or no state dict at the top level or under a wrapper key.
    """
    file = str(path)
    obj: object  # a state dict, or what holds one (checked below)
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import load_file

        try:
            obj = load_file(path, device="cpu")
        except Exception as exc:  # noqa: BLE001 - any loader failure is a user-facing input error
            why = " ".join(str(exc).split())[:300]
            raise StudyError(
                f"cannot load a state dict ({type(exc).__name__}: {why}); .pt/.pth must hold tensors and "
                "plain containers only (re-save the state dict alone, or as .safetensors)",
                file,
            ) from None
    else:
        obj = load_checkpoint(path)
    key = TOP_LEVEL
    if not _is_state_dict(obj):
        key = next((k for k in WRAPPERS if isinstance(obj, dict) and _is_state_dict(obj.get(k))), "")
        if not key:
            found = sorted(map(str, obj))[:8] if isinstance(obj, dict) else type(obj).__name__
            raise StudyError(
                f"expected a state dict (name -> tensor), bare or under one of {list(WRAPPERS)}; found {found}",
                file,
            )
        assert isinstance(obj, dict)  # a wrapper key was found in it
        obj = obj[key]
    assert isinstance(obj, dict)  # _is_state_dict of the top level or of obj[key]
    sd: dict[str, torch.Tensor] = dict(obj)
    prefix = ""
    if all(k.startswith("module.") for k in sd):
        sd, prefix = {k.removeprefix("module."): v for k, v in sd.items()}, "module."
    if any(k.startswith("backbone.") for k in sd):
        sd = {k.removeprefix("backbone."): v for k, v in sd.items() if k.startswith("backbone.")}
        prefix += "backbone."
    return sd, key, prefix


def build_for(run: dict, sd: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The design's timm ViT at the dataset's image size, with the state dict's number of classes."""
    from runners.models import build_model

    head = sd.get("head.weight")
    n_classes = int(head.shape[0]) if head is not None and head.ndim == 2 else 0
    return build_model(run["model"], run["dataset"]["image_size"], n_classes)


def check_fit(model: torch.nn.Module, sd: dict[str, torch.Tensor], file: str, key: str) -> None:
    """Raise a one-line StudyError naming the first missing and first unexpected key, or a shape mismatch."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    name = f"state dict ({key})"
    if missing or unexpected:
        raise StudyError(
            f"does not fit the design's model: first missing key {missing[0] if missing else None!r}, "
            f"first unexpected key {unexpected[0] if unexpected else None!r} "
            f"({len(missing)} missing, {len(unexpected)} unexpected)",
            file,
            name,
        )
    for k, v in expected.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise StudyError(
                f"key {k!r} has shape {tuple(sd[k].shape)}, the design's model expects {tuple(v.shape)}",
                file,
                name,
            )


def _files(run: dict) -> dict[int, Path]:
    return checkpoint_files(resolve(run["imported"]["path"], strict=True), run["checkpoints"])


def check_checkpoints(run: dict) -> None:
    """Every checkpoint of the run loads and fits the design's model (before anything is recorded)."""
    model = None
    for path in _files(run).values():
        sd, key, _ = read_state_dict(path)
        if model is None:
            model = build_for(run, sd)
        check_fit(model, sd, str(path), key)


def import_checkpoints(
    run: dict, run_dir: str | Path, data_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
    """Measure every imported checkpoint of one run on the probe set; write a finished run folder.

    Args:
        run: a ``RunSpec`` as a dict (``imported`` holds the resolved folder and fingerprint).
        run_dir: this run's folder (created; a partial one is measured again from the start).
        data_dir: dataset cache folder (the probe set).
        progress: called with one line per checkpoint.

    Returns:
        The ``result.json`` content (``failed`` on a non-finite activation).
    """
    from runners.datasets import load_split
    from runners.inputs import to_tensor
    from runners.measurement_files import measure_epoch, save_measurements, snapshot_epochs
    from runners.train import environment, pick_device

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    folder, ds, probe = RunFolder(run_dir), run["dataset"], run["probe"]
    label = f"{ds['name']}/seed{run['seed']}"
    device = pick_device()
    xpr = to_tensor(load_split(ds, "probe", data_dir, probe["size"], probe["seed"])[0])
    snaps = snapshot_epochs(probe.get("covariance_epochs", "none"), run["checkpoints"])
    spectra: dict[str, np.ndarray] = {}  # "{epoch}/{layer}/{token_set}" -> eigenvalues (spectra.npz)
    n_tokens: dict[str, int] = {}  # "{layer}/{token_set}" -> tokens (result.json)
    files, model = {}, None
    for epoch, path in _files(run).items():
        t0 = time.perf_counter()
        sd, key, prefix = read_state_dict(path)
        if model is None:
            model = build_for(run, sd)
        check_fit(model, sd, str(path), key)
        model.load_state_dict(sd)
        model.to(device)
        sp = measure_epoch(model, xpr, run, run_dir, epoch, snaps, spectra, n_tokens)
        if isinstance(sp, dict):  # failed
            return sp
        save_measurements(run_dir, epoch, sp, epoch in snaps)
        files[str(epoch)] = {"file": path.name, "state_dict_key": key, "prefix_removed": prefix}
        if progress is not None:
            progress(
                f"[{label}] imported {path} (state dict {key}{', prefix ' + prefix if prefix else ''}): "
                f"spectra at epoch {epoch} ({time.perf_counter() - t0:.1f}s)"
            )
    folder.write_spectra(spectra)
    keys = sorted({f["state_dict_key"] for f in files.values()})
    result = {
        "status": "finished",
        "run": run,
        "history": [],
        "n_tokens": n_tokens,
        "device": device.type,
        "environment": environment(),
        "source": {
            "kind": "checkpoints",
            "path": run["imported"]["path"],
            "fingerprint": run["imported"]["fingerprint"],
            "format": "/".join(sorted({checkpoint_format(Path(f["file"])) for f in files.values()})),
            "state_dict_key": ", ".join(keys),
            "files": files,
        },
    }
    folder.write_result(result)
    return result
