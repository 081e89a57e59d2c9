"""One training run, top to bottom: data -> timm ViT -> objective's epoch loop -> spectra at checkpoints.

    result = train_run(run_spec_dict, run_dir, data_dir)

The objective (``runners.objectives``: supervised cross-entropy, or DINO) owns its epoch loop; this
module owns what every objective shares: data, device, seeding, resume, checkpoints, progress,
extraction and the result files. Every source of randomness comes from the run's seed:
``torch.manual_seed(seed)`` for the initialisation, a separate ``torch.Generator`` (``seed + 7919``)
for the data order and, for DINO, another (``seed + 104729``) for the crops. At each checkpoint epoch
(0 = at initialisation) the covariance spectra of the fixed probe set are measured
(``runners.extract``) on the objective's ``measured`` network (DINO: the teacher backbone). On CUDA the
forward passes run under bf16 autocast (``training.compile`` adds ``torch.compile``); on CPU in fp32.

Files in ``run_dir`` (every write atomic: temp file, then rename):

* ``resume.pt``: model/optimiser/scheduler/generator state, history and spectra so far, after every
  epoch; a killed run started again continues from the last complete epoch.
* ``checkpoints/epoch_NNN.pt``: the measured network's weights and the run spec, at each checkpoint epoch.
* ``spectra.npz``: eigenvalues, key ``"{epoch}/{layer}/{token_set}"``; ``result.json``: spec, history,
  token counts, environment (seed offsets, package versions, git commit and dirty flag). ``result.json`` is
  written last: its presence marks a finished run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from runners.datasets import load_split, num_classes
from runners.executors import adopt_thread_budget
from runners.extract import extract_spectra, save_covariances, save_observables, snapshot_epochs
from runners.inputs import to_tensor
from runners.leases import check_lease
from runners.objectives import make_objective
from runners.objectives.dino import AUG_SEED_OFFSET
from vitstudy_core.errors import RunFailedError
from vitstudy_core.faults import fault_point
from vitstudy_core.io import atomic_path
from vitstudy_core.provenance import git_state, package_versions
from vitstudy_core.runfolder import RunFolder, spectrum_key

DATA_ORDER_SEED_OFFSET = 7919


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _atomic_torch_save(obj: dict, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
        fault_point("checkpoint.write")


def environment() -> dict:
    """Versions, device and code state that matter for reproducing a run."""
    versions = package_versions(("torchvision", "timm", "numpy", "pydantic", "pillow"))
    env = {
        "python": versions["python"],
        "torch": torch.__version__,  # with its build tag (+cpu, +cu130): metadata drops it
        **{k: versions[k] for k in ("torchvision", "timm", "numpy", "pydantic", "pillow")},
        "platform": versions["platform"],
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
    }
    # the run seed s seeds init (s), data order (s + offset) and crops (s + offset): separable streams
    env["seed_offsets"] = {"init": 0, "data_order": DATA_ORDER_SEED_OFFSET, "augment": AUG_SEED_OFFSET}
    return {**env, **git_state()}


@contextmanager
def _epoch_progress(
    label: str, epoch: int, epochs: int, steps: int, bar: bool
) -> Iterator[Callable[[int, float, int], None]]:
    """Yield ``tick(step, loss, n_images)``: a tqdm bar (epoch, step, loss, images/s) when ``bar``, else no-op.

    Without a terminal (log files, parallel worker processes) the per-epoch line that
    ``train_run`` passes to ``progress`` is the only output, so lines of workers never interleave.
    """
    if not bar:
        yield lambda step, loss, n: None
        return
    from tqdm.auto import tqdm

    t0, seen = time.perf_counter(), 0
    with tqdm(total=steps, desc=f"{label} epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True) as pbar:

        def tick(step: int, loss: float, n: int) -> None:
            nonlocal seen
            seen += n
            pbar.set_postfix(
                loss=f"{loss:.3f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}", refresh=False
            )
            pbar.update(1)

        yield tick


def _log(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _load_data(run: dict, data_dir: str | Path) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test, x_probe)``: train/test stay uint8 (N, H, W, 3) and are
    converted per batch on the device (``runners.inputs``); the probe is converted once."""
    ds, probe = run["dataset"], run["probe"]
    xtr, ytr = load_split(ds, "train", data_dir)
    xte, yte = load_split(ds, "test", data_dir)
    xpr, _ = load_split(ds, "probe", data_dir, probe["size"], probe["seed"])
    return (
        torch.from_numpy(xtr),
        torch.from_numpy(ytr),
        torch.from_numpy(xte),
        torch.from_numpy(yte),
        to_tensor(xpr),
    )


def _load_resume(path: Path, objective, data_gen: torch.Generator, device: torch.device) -> tuple:
    """Restore the objective, data order and RNG streams from ``resume.pt`` when it exists.

    Returns:
        ``(history, spectra, n_tokens, last complete epoch)``; empty and epoch 0 without a file.
    """
    if not path.exists():
        return [], {}, {}, 0
    # on the CPU first: RNG states must be CPU byte tensors; load_state_dict moves weights to the device
    state = torch.load(path, map_location="cpu", weights_only=False)
    objective.load_state_dict(state["objective"])
    data_gen.set_state(state["data_gen"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["history"], state["spectra"], state["n_tokens"], state["epoch"]


def _save_resume(
    path: Path, objective, data_gen: torch.Generator, device: torch.device, progress: tuple
) -> None:
    """Write ``resume.pt`` (atomic): everything :func:`_load_resume` restores; ``progress`` is its tuple."""
    history, spectra, n_tokens, epoch = progress
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    state = {"objective": objective.state_dict(), "data_gen": data_gen.get_state()}
    state.update(torch_rng=torch.get_rng_state(), cuda_rng=cuda_rng)
    state.update(history=history, spectra=spectra, n_tokens=n_tokens, epoch=epoch)
    _atomic_torch_save(state, path)


def train_run(
    run: dict,
    run_dir: str | Path,
    data_dir: str | Path,
    progress: Callable[[str], None] | None = None,
    bar: bool = False,
) -> dict:
    """Train one run and measure its spectra; resumes from ``run_dir/resume.pt`` if present.

    Args:
        run: a ``RunSpec`` as a dict (key, dataset, model, objective, training, seed, checkpoints, probe).
        run_dir: this run's folder (created).
        data_dir: cache folder for generated datasets.
        progress: called with one human-readable line per epoch.
        bar: also show a tqdm bar per epoch (for a terminal; parallel workers keep plain lines).

    Returns:
        The ``result.json`` content (status ``finished`` or ``failed`` with the failing epoch).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(run_dir)
    tr, ds, seed = run["training"], run["dataset"], run["seed"]
    label = f"{ds['name']}/seed{seed}"
    device = pick_device()

    xtr, ytr, xte, yte, xpr = _load_data(run, data_dir)

    # ---- objective: its networks and optimiser (init seeded from the run seed) ------------------------
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    steps_per_epoch = math.ceil(xtr.shape[0] / tr["batch_size"])
    if tr.get("max_steps_per_epoch"):
        steps_per_epoch = min(steps_per_epoch, tr["max_steps_per_epoch"])
    objective = make_objective(run, num_classes(ds), ds["image_size"], steps_per_epoch, device)
    model = objective.measured  # the network whose spectra are measured
    data_gen = torch.Generator().manual_seed(seed + DATA_ORDER_SEED_OFFSET)  # data order: not the init stream

    resume_path = run_dir / "resume.pt"
    history, spectra, n_tokens, start_epoch = _load_resume(resume_path, objective, data_gen, device)
    if start_epoch:
        _log(progress, f"[{label}] resuming after epoch {start_epoch}")

    def measure(epoch: int) -> None:
        t0 = time.perf_counter()
        probe = run["probe"]
        snap = epoch in snapshot_epochs(probe.get("covariance_epochs", "none"), run["checkpoints"])
        sp = extract_spectra(model, xpr, probe["batch_size"], epoch=epoch, covariances=snap)
        fault_point("extract")
        for (layer, tset), lam in sp.eigenvalues.items():
            spectra[spectrum_key(epoch, layer, tset)] = lam
            n_tokens[f"{layer}/{tset}"] = sp.n_tokens[(layer, tset)]
        # observables and covariance snapshots go straight to run_dir (read-merge-write, atomic), so they
        # survive a resume without joining resume.pt; re-measuring an epoch overwrites the same keys
        save_observables(run_dir, epoch, sp)
        if snap:
            save_covariances(run_dir, epoch, sp)
        _log(progress, f"[{label}] spectra at epoch {epoch} ({time.perf_counter() - t0:.1f}s)")

    def fail(msg: str, epoch: int) -> dict:
        result = {"status": "failed", "failed_epoch": epoch, "error": msg, "run": run, "history": history}
        folder.write_result(result)
        _log(progress, f"[{label}] FAILED at epoch {epoch}: {msg}")
        return result

    def save_weights(epoch: int) -> None:
        """The measured network's weights and the run spec at a checkpoint epoch (atomic write)."""
        path = folder.checkpoints_dir / f"epoch_{epoch:03d}.pt"
        _atomic_torch_save({"model": model.state_dict(), "run": run}, path)

    def checkpoint(epoch: int) -> None:
        measure(epoch)
        save_weights(epoch)

    try:
        if start_epoch == 0 and 0 in run["checkpoints"] and "0/norm/all" not in spectra:
            checkpoint(0)
        # ---- training loop ---------------------------------------------------------------------------
        for epoch in range(start_epoch + 1, tr["epochs"] + 1):
            check_lease()  # taken over by another worker: stop before writing anything more
            threads = adopt_thread_budget()  # a parallel worker takes the cores of finished ones
            t0 = time.perf_counter()
            order = torch.randperm(xtr.shape[0], generator=data_gen)
            with _epoch_progress(label, epoch, tr["epochs"], steps_per_epoch, bar) as tick:
                stats = objective.train_epoch(epoch, xtr, ytr, order, tick)
            elapsed = time.perf_counter() - t0
            seen = min(xtr.shape[0], steps_per_epoch * tr["batch_size"])
            entry = {"epoch": epoch, **stats, **objective.evaluate(xtr, ytr, xte, yte)}
            entry["images_per_s"] = seen / elapsed
            entry["epoch_s"] = elapsed
            entry["threads"] = threads if threads is not None else torch.get_num_threads()
            history.append(entry)
            fault_point("train.epoch")
            quality = " ".join(
                f"{k} {entry[k]:.3f}" for k in ("train_acc", "test_acc", "knn_acc") if k in entry
            )
            _log(
                progress,
                f"[{label}] epoch {epoch}/{tr['epochs']} loss {entry['loss']:.3f} {quality} "
                f"{entry['images_per_s']:.0f} img/s",
            )
            if epoch in run["checkpoints"]:
                checkpoint(epoch)
            _save_resume(resume_path, objective, data_gen, device, (history, spectra, n_tokens, epoch))
    except RunFailedError as exc:
        return fail(str(exc), exc.epoch if exc.epoch is not None else -1)

    # ---- results (result.json last: it marks the run finished) ---------------------------------------
    check_lease()
    folder.write_spectra(spectra)
    result = {
        "status": "finished",
        "run": run,
        "history": history,
        "n_tokens": n_tokens,
        "device": device.type,
        "environment": environment(),
        "finished_at": time.time(),  # seconds since the epoch: when the data existed (pre-registration)
    }
    folder.write_result(result)
    resume_path.unlink(missing_ok=True)
    return result
