"""Published models measured on the probe set: find their weights, build them with timm, give every probe
image the model's own preprocessing, and measure the spectra as for any run (``runners.extract``).

    path = weights_file(run["imported"])            # the cached or on-disk weights (None: not there)
    cfg = preprocessing_of(run["imported"])         # timm's data config: input size, crop, mean, std
    result = import_pretrained(run, run_dir, data_dir)

A hub model (``timm:<name>``, e.g. ``vit_small_patch16_224.dino`` or ``hf-hub:timm/<repo>``) is found in
the Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: ``HF_HOME`` / ``HF_HUB_CACHE`` as
huggingface_hub reads them; never the network) and built by ``timm.create_model(name, pretrained=True)``
with that very cached file as its weights (``pretrained_cfg_overlay={"file": ...}``), so the weights
measured are the ones fingerprinted. A released file is read by the ``checkpoints`` source's loader
(``runners.checkpoints.importer.read_state_dict``: safetensors, or ``torch.load(weights_only=True)``; DINO's
``teacher``, timm's ``state_dict``, ...) into ``timm.create_model(arch, **model_args)`` and must fit exactly.

Preprocessing: ``timm.data.resolve_data_config`` of the model's pretrained config (for the built model:
``resolve_model_data_config``), then ``timm.data.create_transform(**cfg)`` (eval: resize the shorter side
to ``size / crop_pct``, centre crop, ``ToTensor``, normalise with the model's mean and std), applied to each
probe image as the dataset decodes it (``runners.datasets``: RGB, shorter side at the dataset's
``image_size``, centre-cropped: give an ``image_size`` at least the model's resize size, e.g. 256 for 224).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from runners.models import cnn_blocks, family, residual_blocks
from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import RunFolder

HUB = "timm:"
HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm reads from a hub repo, in its order
_FIELD = "design.source.models"


def _hub_repo(name: str) -> tuple[str, str | None, dict | None]:
    """(repo id, weights file name or None, pretrained config or None) of a timm hub name, from the local
    cache and timm's registry only."""
    if name.startswith("hf-hub:"):
        repo = name.removeprefix("hf-hub:").split("@")[0]
        cfg = _cached_json(repo, "config.json")
        return repo, None, (cfg or {}).get("pretrained_cfg")
    from runners.model_table import pretrained_cfg

    known = pretrained_cfg(name)
    if known is None or not known.get("hf_hub_id"):
        raise StudyError(
            f"timm knows no pretrained weights on the Hugging Face hub named {name!r}", None, _FIELD
        )
    return known["hf_hub_id"].split("@")[0], known.get("hf_hub_filename"), known


def _cached(repo: str, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    got = try_to_load_from_cache(repo, filename)
    return Path(got) if isinstance(got, str) else None


def _cached_json(repo: str, filename: str) -> dict | None:
    path = _cached(repo, filename)
    return json.loads(path.read_text()) if path is not None else None


def weights_file(record: dict) -> Path | None:
    """The weights a run measures: the cached hub file, or the file on disk (None: not there yet)."""
    path = str(record["path"])
    if not path.startswith(HUB):
        return Path(path) if Path(path).is_file() else None
    repo, filename, _ = _hub_repo(path.removeprefix(HUB))
    for name in (filename,) if filename else HUB_FILES:
        found = _cached(repo, name)
        if found is not None:
            return found
    return None


def data_config(pretrained_cfg: dict | None, model_args: dict) -> dict:
    """timm's eval data config (``resolve_data_config``) of a pretrained config, as plain JSON values; an
    ``img_size`` in ``model_args`` sets the input size (timm keeps the config's otherwise)."""
    from runners import model_table

    cfg = dict(pretrained_cfg or {})
    size = model_args.get("img_size")
    if size is not None:
        cfg["input_size"] = (3, int(size), int(size))
    return model_table.data_config(cfg)


def _pretrained_cfg(record: dict) -> dict | None:
    path = str(record["path"])
    if path.startswith(HUB):
        return _hub_repo(path.removeprefix(HUB))[2]
    from runners.model_table import pretrained_cfg

    return pretrained_cfg(record["timm"])


def preprocessing_of(record: dict) -> dict:
    """The model's preprocessing (its run key holds it): timm's data config of its pretrained config."""
    return data_config(_pretrained_cfg(record), record.get("model_args") or {})


def _missing(record: dict) -> StudyError:
    path = str(record["path"])
    if path.startswith(HUB):
        name = path.removeprefix(HUB)
        return StudyError(
            f"model {record['model']!r} ({name}) is not in the Hugging Face cache; cache it once, online: "
            f"python -c \"import timm; timm.create_model('{name}', pretrained=True)\"",
            None,
            _FIELD,
        )
    return StudyError(f"model {record['model']!r}: no such file", path, _FIELD)


def build(record: dict):
    """The timm model with its weights (eval mode) and the key its state dict came from."""
    import timm

    path = str(record["path"])
    weights = weights_file(record)
    if weights is None:
        raise _missing(record)
    if path.startswith(HUB):
        # A hub file is a timm state dict (.safetensors / .bin). Configs whose original weights were JAX
        # .npz files (the augreg ViTs) say custom_load=True, and timm then hands any local file to
        # model.load_pretrained, which in timm 1.0.29 reads only .npz: read it as a state dict.
        overlay = {"file": str(weights), "custom_load": weights.suffix == ".npz"}
        try:
            model = timm.create_model(path.removeprefix(HUB), pretrained=True, pretrained_cfg_overlay=overlay)
        except Exception as exc:  # noqa: BLE001 - any timm failure is the user's model or file
            why = " ".join(str(exc).split())[:300]
            raise StudyError(
                f"timm cannot build {path.removeprefix(HUB)!r}: {why}", str(weights), _FIELD
            ) from None
        return model.eval(), "(timm)"
    from runners.checkpoints.importer import check_fit, read_state_dict

    sd, key, _ = read_state_dict(weights)
    # the classifier's weight: a ViT's head, a ResNet's fc, a ConvNeXt's head.fc (none: a headless file)
    head = next((sd[k] for k in ("head.weight", "fc.weight", "head.fc.weight") if k in sd), None)
    n_classes = int(head.shape[0]) if head is not None and head.ndim == 2 else 0
    args = dict(record["model_args"])
    if family(record["timm"]) == "cnn":
        args.pop("img_size", None)  # the preprocessing's size (data_config); a CNN takes any size
    try:
        model = timm.create_model(record["timm"], pretrained=False, num_classes=n_classes, **args)
    except Exception as exc:  # noqa: BLE001
        why = " ".join(str(exc).split())[:300]
        raise StudyError(f"timm cannot build {record['timm']!r}: {why}", None, _FIELD) from None
    check_fit(model, sd, str(weights), key)
    model.load_state_dict(sd)
    return model.eval(), key


def check_pretrained(run: dict) -> None:
    """The weights are there, build, and the model is a ViT of the design's depth, or a CNN with as many
    residual blocks as the design's CNN (whose layers the claims name)."""
    record = run["imported"]
    if record.get("fingerprint") is None:
        raise _missing(record)
    model, _ = build(record)
    if family(run["model"]["name"]) == "cnn":
        found = residual_blocks(model)
        want = cnn_blocks(run["model"])
        if found is None:
            raise StudyError(f"model {record['model']!r} is no CNN of residual blocks", None, _FIELD)
        if len(found[1]) != want:
            raise StudyError(
                f"model {record['model']!r} has {len(found[1])} residual blocks and design.model {want}: "
                "name a design.model of its architecture (the claims' layers are named from it)",
                None,
                "design.model",
            )
        return
    blocks = getattr(model, "blocks", None)
    depth = run["model"].get("depth")
    if blocks is None or not hasattr(model, "patch_embed"):
        raise StudyError(f"model {record['model']!r} is no timm VisionTransformer", None, _FIELD)
    if depth is not None and len(blocks) != int(depth):
        raise StudyError(
            f"model {record['model']!r} has {len(blocks)} blocks; set design.model.depth: {len(blocks)} "
            "(the claims' layers are named from it)",
            None,
            "design.model.depth",
        )


def preprocess(images: np.ndarray, cfg: dict, batch: int = 256):
    """uint8 (N, H, W, 3) probe images -> float32 (N, 3, h, w) through ``timm.data.create_transform(**cfg)``."""
    import torch
    from PIL import Image
    from timm.data import create_transform

    tf = create_transform(
        input_size=tuple(cfg["input_size"]),
        interpolation=cfg["interpolation"],
        mean=tuple(cfg["mean"]),
        std=tuple(cfg["std"]),
        crop_pct=cfg["crop_pct"],
        crop_mode=cfg.get("crop_mode", "center"),
        is_training=False,
    )
    return torch.stack([tf(Image.fromarray(np.ascontiguousarray(img))) for img in images])


def import_pretrained(
    run: dict, run_dir: str | Path, data_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
    """Measure one published model on the probe set through its own preprocessing; write a finished run
    folder (epoch 0) and return its ``result.json`` content (``failed`` on a non-finite activation)."""
    from timm.data import resolve_model_data_config

    from runners.datasets import load_split
    from runners.measurement_files import measure_epoch, save_measurements, snapshot_epochs
    from runners.train import environment, pick_device

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    folder, ds, probe, record = RunFolder(run_dir), run["dataset"], run["probe"], run["imported"]
    t0 = time.perf_counter()
    model, key = build(record)
    cfg = dict(resolve_model_data_config(model))
    if record["model_args"].get("img_size"):
        cfg = data_config(model.pretrained_cfg, record["model_args"])
    cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    t1 = time.perf_counter()
    images = load_split(ds, "probe", data_dir, probe["size"], probe["seed"])[0]
    xpr = preprocess(images, cfg)
    t2 = time.perf_counter()
    device = pick_device()
    model.to(device)
    epoch = 0
    snaps = snapshot_epochs(probe.get("covariance_epochs", "none"), [epoch])
    spectra: dict = {}
    n_tokens: dict = {}
    sp = measure_epoch(model, xpr, run, run_dir, epoch, snaps, spectra, n_tokens)
    if isinstance(sp, dict):  # failed
        return sp
    t3 = time.perf_counter()
    save_measurements(run_dir, epoch, sp, epoch in snaps)
    folder.write_spectra(spectra)
    if progress is not None:
        progress(
            f"[{ds['name']}/{record['model']}] {record['timm']} on {len(images)} probe images at "
            f"{cfg['input_size'][1]} px (mean {cfg['mean']}, std {cfg['std']}): load {t1 - t0:.1f}s, "
            f"preprocessing {t2 - t1:.1f}s, forward + extraction {t3 - t2:.1f}s"
        )
    result = {
        "status": "finished",
        "run": run,
        "history": [],
        "n_tokens": n_tokens,
        "device": device.type,
        "environment": environment(),
        "timing": {"load_s": t1 - t0, "preprocessing_s": t2 - t1, "extraction_s": t3 - t2},
        "source": {
            "kind": "pretrained",
            "path": record["path"],
            "fingerprint": record["fingerprint"],
            "format": Path(str(weights_file(record))).suffix.lstrip(".") or "file",
            "model": record["model"],
            "timm": record["timm"],
            "state_dict_key": key,
            "preprocessing": cfg,
        },
    }
    folder.write_result(result)
    return result
