"""One training run, top to bottom: data -> timm ViT -> supervised loop -> spectra at checkpoints.

    result = train_run(run_spec_dict, run_dir, data_dir)

Supervised cross-entropy with AdamW and linear warmup + cosine decay per step. Every source of
randomness comes from the run's seed: ``torch.manual_seed(seed)`` for the initialisation and a separate
``torch.Generator`` seeded from ``seed`` for the data order. At each checkpoint epoch (0 = at
initialisation) the covariance spectra of the fixed probe set are measured (``runners.extract``).

Files in ``run_dir`` (every write atomic: temp file, then rename):

* ``resume.pt``: model/optimiser/scheduler/generator state, history and spectra so far, after every
  epoch; a killed run started again continues from the last complete epoch.
* ``spectra.npz``: eigenvalues, key ``"{epoch}/{layer}/{token_set}"``; ``result.json``: spec, history,
  token counts, environment. ``result.json`` is written last: its presence marks a finished run.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runners.data import atomic_save_npz, load_split
from runners.extract import extract_spectra, save_covariances, save_observables, snapshot_epochs
from runners.models import build_model
from study.errors import RunFailedError

_MEAN, _STD = 0.5, 0.25  # procedural images are uniform-ish in [0, 1]; this puts inputs near N(0, 1)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float32 (N, 3, H, W)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    return (x - _MEAN) / _STD


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _lr_lambda(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def _atomic_torch_save(obj: dict, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def environment() -> dict:
    """Versions that matter for reproducing a run."""
    import timm

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def _log(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


@torch.no_grad()
def _accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int = 512
) -> float:
    was = model.training
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        logits = model(x[i : i + batch_size].to(device))
        correct += (logits.argmax(-1).cpu() == y[i : i + batch_size]).sum().item()
    model.train(was)
    return correct / x.shape[0]


def train_run(
    run: dict, run_dir: str | Path, data_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
    """Train one run and measure its spectra; resumes from ``run_dir/resume.pt`` if present.

    Args:
        run: a ``RunSpec`` as a dict (key, dataset, model, objective, training, seed, checkpoints, probe).
        run_dir: this run's folder (created).
        data_dir: cache folder for generated datasets.
        progress: called with one human-readable line per epoch.

    Returns:
        The ``result.json`` content (status ``finished`` or ``failed`` with the failing epoch).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tr, ds, seed = run["training"], run["dataset"], run["seed"]
    label = f"{ds['name']}/seed{seed}"
    device = pick_device()

    # ---- data ------------------------------------------------------------------------------------
    xtr, ytr = load_split(ds, "train", data_dir)
    xte, yte = load_split(ds, "test", data_dir)
    xpr, _ = load_split(ds, "probe", data_dir, run["probe"]["size"], run["probe"]["seed"])
    xtr, xte, xpr = to_tensor(xtr), to_tensor(xte), to_tensor(xpr)
    ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)

    # ---- model and optimiser (init seeded from the run seed) ------------------------------------
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    model = build_model(run["model"], ds["image_size"], ds["n_classes"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], weight_decay=tr["weight_decay"])
    steps_per_epoch = math.ceil(xtr.shape[0] / tr["batch_size"])
    if tr.get("max_steps_per_epoch"):
        steps_per_epoch = min(steps_per_epoch, tr["max_steps_per_epoch"])
    total = steps_per_epoch * tr["epochs"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, _lr_lambda(total, round(tr["warmup_epochs"] * steps_per_epoch))
    )
    data_gen = torch.Generator().manual_seed(seed + 7919)  # data order: separate stream from init

    history: list[dict] = []
    spectra: dict[str, np.ndarray] = {}
    n_tokens: dict[str, int] = {}
    start_epoch = 0
    resume_path = run_dir / "resume.pt"
    if resume_path.exists():
        state = torch.load(resume_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        data_gen.set_state(state["data_gen"])
        torch.set_rng_state(state["torch_rng"])
        history, spectra, n_tokens, start_epoch = (
            state["history"],
            state["spectra"],
            state["n_tokens"],
            state["epoch"],
        )
        _log(progress, f"[{label}] resuming after epoch {start_epoch}")

    def measure(epoch: int) -> None:
        t0 = time.perf_counter()
        probe = run["probe"]
        snap = epoch in snapshot_epochs(probe.get("covariance_epochs", "none"), run["checkpoints"])
        sp = extract_spectra(model, xpr, probe["batch_size"], epoch=epoch, covariances=snap)
        for (layer, tset), lam in sp.eigenvalues.items():
            spectra[f"{epoch}/{layer}/{tset}"] = lam
            n_tokens[f"{layer}/{tset}"] = sp.n_tokens[(layer, tset)]
        # observables and covariance snapshots go straight to run_dir (read-merge-write, atomic), so they
        # survive a resume without joining resume.pt; re-measuring an epoch overwrites the same keys
        save_observables(run_dir / "scalars.json", epoch, sp)
        if snap:
            save_covariances(run_dir / "covariances.npz", epoch, sp)
        _log(progress, f"[{label}] spectra at epoch {epoch} ({time.perf_counter() - t0:.1f}s)")

    def fail(msg: str, epoch: int) -> dict:
        result = {"status": "failed", "failed_epoch": epoch, "error": msg, "run": run, "history": history}
        atomic_write_text(run_dir / "result.json", json.dumps(result, indent=1))
        _log(progress, f"[{label}] FAILED at epoch {epoch}: {msg}")
        return result

    try:
        if start_epoch == 0 and 0 in run["checkpoints"] and "0/norm/all" not in spectra:
            measure(0)
        # ---- training loop ---------------------------------------------------------------------------
        model.train()
        for epoch in range(start_epoch + 1, tr["epochs"] + 1):
            t0 = time.perf_counter()
            order = torch.randperm(xtr.shape[0], generator=data_gen)
            loss_sum, seen, correct = 0.0, 0, 0
            for step in range(steps_per_epoch):
                idx = order[step * tr["batch_size"] : (step + 1) * tr["batch_size"]]
                xb, yb = xtr[idx].to(device, non_blocking=True), ytr[idx].to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    logits = model(xb)
                    loss = F.cross_entropy(logits.float(), yb, label_smoothing=tr["label_smoothing"])
                if not torch.isfinite(loss):
                    return fail(f"non-finite loss at step {step}", epoch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                loss_sum += loss.item() * yb.shape[0]
                correct += (logits.argmax(-1) == yb).sum().item()
                seen += yb.shape[0]
            elapsed = time.perf_counter() - t0
            entry = {
                "epoch": epoch,
                "loss": loss_sum / seen,
                "train_acc": correct / seen,
                "test_acc": _accuracy(model, xte, yte, device),
                "images_per_s": seen / elapsed,
                "lr": sched.get_last_lr()[0],
            }
            history.append(entry)
            _log(
                progress,
                f"[{label}] epoch {epoch}/{tr['epochs']} loss {entry['loss']:.3f} "
                f"train_acc {entry['train_acc']:.3f} test_acc {entry['test_acc']:.3f} "
                f"{entry['images_per_s']:.0f} img/s",
            )
            if epoch in run["checkpoints"]:
                measure(epoch)
            _atomic_torch_save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "sched": sched.state_dict(),
                    "data_gen": data_gen.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "history": history,
                    "spectra": spectra,
                    "n_tokens": n_tokens,
                    "epoch": epoch,
                },
                resume_path,
            )
    except RunFailedError as exc:
        return fail(str(exc), exc.epoch if exc.epoch is not None else -1)

    # ---- results (result.json last: it marks the run finished) ---------------------------------------
    atomic_save_npz(run_dir / "spectra.npz", **spectra)
    result = {
        "status": "finished",
        "run": run,
        "history": history,
        "n_tokens": n_tokens,
        "device": device.type,
        "environment": environment(),
    }
    atomic_write_text(run_dir / "result.json", json.dumps(result, indent=1))
    resume_path.unlink(missing_ok=True)
    return result
