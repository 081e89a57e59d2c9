"""Checkpoint files: which file of a seed's folder holds which epoch, and reading one without running code.

    files = checkpoint_files(folder, epochs=[0, 2])   # epoch -> file
    obj = load_checkpoint(files[2])                   # what torch.save wrote (tensors, containers, ...)

Epochs count as a trained run counts them: epoch N is the model after N epochs of training (0: before the
first step). The names recognised, from the tools that write them:

* ``*epoch_NNN.{pt,pth,safetensors}`` (also ``epochNNN``, ``epoch-NNN``): epoch N (``runners.train``'s own).
* facebookresearch/dino's ``checkpointNNNN.pth`` and timm's ``checkpoint-N.pth.tar``: both tools name the
  file by the 0-based index of the epoch just trained, so it holds epoch N + 1 (DINO's ``epoch`` field says
  N + 1; timm's says N, with ``version: 2``, and timm resumes at N + 1).
* DINO's ``checkpoint.pth`` (its latest) and timm's ``last.pth.tar`` / ``model_best.pth.tar``: no number;
  the epoch their ``epoch`` field gives (read only for an epoch no numbered file holds: a numbered file
  wins, and two that agree give the first in this order).

Other files beside them are ignored; a folder of one unrecognised file serves a single requested epoch.
A ``.pt``/``.pth``/``.pth.tar`` file is read with ``torch.load(weights_only=True)``: tensors, plain containers
and the few classes of :data:`SAFE_GLOBALS` (``argparse.Namespace``: DINO and timm store their command line
as ``args``) are built, anything else is refused before it is built, so nothing in a file runs. Importing
this module never imports torch.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from vitstudy_core.errors import StudyError

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".safetensors", ".pth.tar")
# name pattern -> epochs trained from the number in the name
_NUMBERED: tuple[tuple[re.Pattern, Callable[[int], int]], ...] = (
    (re.compile(r"epoch[_-]?(\d+)\.(?:pt|pth|safetensors)$", re.IGNORECASE), lambda n: n),
    (re.compile(r"^checkpoint(\d+)\.pth$", re.IGNORECASE), lambda n: n + 1),  # dino: f"checkpoint{epoch:04}"
    (
        re.compile(r"^checkpoint-(\d+)\.pth\.tar$", re.IGNORECASE),
        lambda n: n + 1,
    ),  # timm: "checkpoint-{epoch}"
)


def _dino_epoch(obj: dict) -> int:
    return int(obj["epoch"])  # main_dino.py saves 'epoch': epoch + 1, the epochs trained


def _timm_epoch(obj: dict) -> int:
    # CheckpointSaver saves the 0-based index of the epoch just trained with 'version': 2; before version 2
    # the epoch was incremented before saving
    return int(obj["epoch"]) + (1 if int(obj.get("version", 1)) >= 2 else 0)


# un-numbered training checkpoints, in order of preference -> epochs trained from the file's content
LATEST: dict[str, Callable[[dict], int]] = {
    "checkpoint.pth": _dino_epoch,
    "last.pth.tar": _timm_epoch,
    "model_best.pth.tar": _timm_epoch,
}
# classes these formats hold besides tensors and plain containers; each builds an inert value
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)
_FIELD = "design.source.path"


def is_checkpoint(path: Path) -> bool:
    """Whether the file's name ends like a checkpoint (:data:`CHECKPOINT_SUFFIXES`)."""
    return path.name.lower().endswith(CHECKPOINT_SUFFIXES)


def checkpoint_format(path: Path) -> str:
    """The file's format as recorded in ``result.json``: ``pt``, ``pth``, ``pth.tar`` or ``safetensors``."""
    name = path.name.lower()
    return "pth.tar" if name.endswith(".pth.tar") else path.suffix.lstrip(".").lower()


def numbered_epoch(name: str) -> int | None:
    """The epoch a file's name says it holds (epochs trained), or None for a name without one."""
    for pattern, epochs_trained in _NUMBERED:
        m = pattern.search(name)
        if m is not None:
            return epochs_trained(int(m.group(1)))
    return None


def checkpoint_files(folder: Path, epochs: list[int]) -> dict[int, Path]:
    """epoch -> checkpoint file of a seed's folder, for every epoch asked for (see the module docstring).

    Raises:
        StudyError: the folder is missing, an epoch has two numbered files, or an asked-for epoch has none.
    """
    if not folder.is_dir():
        raise StudyError(
            "folder not found (expected one folder of checkpoints per seed)", str(folder), _FIELD
        )
    files = sorted(p for p in folder.iterdir() if p.is_file() and is_checkpoint(p))
    numbered: dict[int, Path] = {}
    for path in files:
        epoch = numbered_epoch(path.name)
        if epoch is None:
            continue
        if epoch in numbered:
            raise StudyError(f"duplicate epoch {epoch} (also in {numbered[epoch].name})", str(path))
        numbered[epoch] = path
    latest = [folder / name for name in LATEST if (folder / name) in files]
    if not numbered and not latest and len(files) == 1 and len(epochs) == 1:
        return {epochs[0]: files[0]}
    missing = [e for e in epochs if e not in numbered]
    for path in latest if missing else ():
        numbered.setdefault(stored_epoch(path), path)
    missing = [e for e in epochs if e not in numbered]
    if missing:
        raise StudyError(
            f"no checkpoint for epoch {missing[0]} (expected epoch_{missing[0]:03d}.pt, .pth or .safetensors; "
            f"found epochs {sorted(numbered)}{_counting_note(files)})",
            str(folder),
        )
    return {e: numbered[e] for e in sorted(epochs)}


def _counting_note(files: list[Path]) -> str:
    """Why a DINO or timm file's epoch is one more than its name's number (when the folder has one)."""
    if any(p.name.lower().startswith("checkpoint") for p in files):
        return (
            "; DINO's checkpointNNNN.pth and timm's checkpoint-N.pth.tar hold epoch N + 1, the epochs trained"
        )
    return ""


def stored_epoch(path: Path) -> int:
    """The epochs trained of an un-numbered training checkpoint (:data:`LATEST`), from its ``epoch`` field."""
    obj = load_checkpoint(path, mmap=True)
    if (
        not isinstance(obj, dict)
        or isinstance(obj.get("epoch"), bool)
        or not isinstance(obj.get("epoch"), int)
    ):
        found = sorted(map(str, obj))[:8] if isinstance(obj, dict) else type(obj).__name__
        raise StudyError(f"expected an integer 'epoch' field (the epoch it holds); found {found}", str(path))
    return LATEST[path.name.lower()](obj)


def load_checkpoint(path: Path, mmap: bool = False) -> object:
    """What ``torch.save`` wrote to ``path``, read with ``weights_only=True`` and :data:`SAFE_GLOBALS`.

    Args:
        mmap: map the tensors' storage instead of reading it (cheap when only a small field is needed).

    Raises:
        StudyError: the file cannot be read, or it holds an object of another class (named in the message;
            it was not built, nothing in the file ran).
    """
    import warnings

    import torch

    if _is_torchscript(path):  # torch.load would warn, then refuse it under weights_only
        raise StudyError(
            "a TorchScript archive (torch.jit.save), not a state dict; nothing in it was run (re-save the "
            "model's state_dict() with torch.save, or as .safetensors)",
            str(path),
        )
    with torch.serialization.safe_globals(list(SAFE_GLOBALS)), warnings.catch_warnings():
        # The file is loaded as weights or refused in one line: torch's own hints on the way (call
        # torch.jit.load; "Detected pickle protocol 4 in the checkpoint" for a legacy file, which the
        # weights-only unpickler then refuses) are library chatter above that line, not news to the user.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(\.|$)")
        try:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError:
                if not mmap:
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)  # a pre-zip (legacy) file
        except Exception as exc:  # noqa: BLE001 - any loader failure is a user-facing input error
            raise StudyError(
                f"cannot load a state dict ({_load_failure(path, exc)}); .pt/.pth must hold tensors and "
                "plain containers only (re-save the state dict alone, or as .safetensors)",
                str(path),
            ) from None


def _is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive: a zip with a ``constants.pkl`` record (torch's own test)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(name.rpartition("/")[2] == "constants.pkl" for name in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _load_failure(path: Path, exc: Exception) -> str:
    """The cause of a failed load: the classes torch refused to build, else the error itself (its cause
    first: torch's weights-only message puts it after ~600 characters of advice)."""
    import torch

    text = " ".join(str(exc).split())
    if "Weights only load failed" in text:
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in SAFE_GLOBALS}
        try:
            refused = [
                g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in allowed
            ]
        except Exception:  # noqa: BLE001 - the listing is a courtesy; the error below still names the cause
            refused = []
        if refused:
            return (
                f"it holds {', '.join(refused)}, which torch.load(weights_only=True) does not build; "
                "nothing in the file was run"
            )
        for marker in ("WeightsUnpickler error:", "Trying to load"):
            if marker in text:
                text = text[text.index(marker) :]
                break
    return f"{type(exc).__name__}: {text[:300]}"
