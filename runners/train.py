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
  epoch, as tensors and plain containers only; a killed run started again continues from the last
  complete epoch. It is read back with ``torch.load(weights_only=True)``, so nothing in it can run code;
  a file that needs more is removed and the run starts over.
* ``checkpoints/epoch_NNN.pt``: the measured network's weights and the run spec, at each checkpoint epoch.
* ``spectra.npz``: eigenvalues, key ``"{epoch}/{layer}/{token_set}"``; ``result.json``: spec, history,
  token counts, environment (seed offsets, package versions, git commit and dirty flag), ``started_at`` (when
  its first attempt began, kept across resumes) and ``finished_at``. ``result.json`` is
  written last: its presence marks a finished run.
"""

from __future__ import annotations

import math
import pickle
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from runners.datasets import LABEL_SEED_OFFSET, load_split, num_classes, shuffled_labels
from runners.executors.local import adopt_thread_budget
from runners.extract import extract_spectra
from runners.inputs import to_tensor
from runners.leases.model import check_lease
from runners.measurement_files import save_covariances, save_observables, save_probe, snapshot_epochs
from runners.objectives import Trainer, TrainerSetup, TrainingSpec, build_trainer
from runners.objectives.dino import AUG_SEED_OFFSET
from vitstudy_core.errors import RunFailedError
from vitstudy_core.faults import fault_point
from vitstudy_core.io import atomic_path
from vitstudy_core.provenance import git_state, package_versions
from vitstudy_core.runfolder import RunFolder, spectrum_key

DATA_ORDER_SEED_OFFSET = 7919
# the per-epoch line's quality figures, where an objective records them
_QUALITY = ("train_acc", "test_acc", "knn_acc", "teacher_entropy")
BAR_LOSS_EVERY_S = 0.5  # the progress bar reads the loss (a host sync on a device) at most this often


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _atomic_torch_save(obj: dict, path: Path) -> None:
    """``torch.save`` through a Python file, atomically (``vitstudy_core.io.atomic_path``).

    Given a path, torch's C++ writer reports a full disk as ``RuntimeError: unexpected pos``, with no
    errno; through a file object the ``OSError`` (ENOSPC, EDQUOT, ...) is raised in Python first, and is
    re-raised here, so a full disk reads as one (``vitstudy_core.errors.machine_fault``).
    """
    with atomic_path(path) as tmp:
        try:
            with open(tmp, "wb") as fh:
                torch.save(obj, fh)
        except RuntimeError as exc:
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise
        fault_point("checkpoint.write", path)


# the CPU flags that choose torch's and the BLAS's kernels (vector width, fused multiply-add, AMX tiles)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_tile", "amx_bf16")  # fmt: skip


def _cpuinfo() -> tuple[str | None, list[str]]:
    """The CPU's model name and flags from ``/proc/cpuinfo`` (Linux); elsewhere ``platform``'s processor."""
    import platform

    model: str | None = None
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
                if model is not None and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or None, flags


def arithmetic() -> dict[str, object]:
    """What decides a run's floating-point results on this machine (``vitstudy_core.provenance.ARITHMETIC``):
    the CPU model and its SIMD flags, torch's CPU capability (the kernels ATen dispatches to, lowered by
    ``ATEN_CPU_CAPABILITY``), the BLAS and oneDNN torch was built with (``torch.__config__.show()``) and the
    thread count. ``torch`` and ``gpu`` are recorded beside them by :func:`environment`."""
    model, flags = _cpuinfo()
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    library = next((ln for ln in config.splitlines() if "Math Kernel Library" in ln or "OpenBLAS" in ln), "")
    version = re.search(r"(?:Version|OpenBLAS)\s+v?([\d.]+)", library)
    onednn = re.search(r"(?:MKL-DNN|oneDNN)\s+(v[\d.]+)", config)
    try:
        capability: str | None = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - a torch without the call: left unrecorded rather than guessed
        capability = None
    return {
        "cpu_model": model,
        "cpu_flags": " ".join(f for f in SIMD_FLAGS if f in flags) or None,
        "torch_cpu_capability": capability,
        "blas": (blas.group(1) if blas else "unknown") + (f" {version.group(1)}" if version else ""),
        "onednn": onednn.group(1) if onednn else None,
        "torch_threads": torch.get_num_threads(),
    }


def environment() -> dict:
    """Versions, device, code state and what decides the arithmetic (:func:`arithmetic`): what matters
    for reproducing a run."""
    versions = package_versions(("torchvision", "timm", "numpy", "pydantic", "pillow"))
    env: dict[str, object] = {
        "python": versions["python"],
        "torch": torch.__version__,  # with its build tag (+cpu, +cu130): metadata drops it
        **{k: versions[k] for k in ("torchvision", "timm", "numpy", "pydantic", "pillow")},
        "platform": versions["platform"],
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **arithmetic(),
    }
    # the run seed s seeds init (s), data order (s + offset) and crops (s + offset): separable streams
    env["seed_offsets"] = {"init": 0, "data_order": DATA_ORDER_SEED_OFFSET, "augment": AUG_SEED_OFFSET}
    return {**env, **git_state()}


@contextmanager
def _epoch_progress(
    label: str, epoch: int, epochs: int, steps: int, bar: bool
) -> Iterator[Callable[[int, float | torch.Tensor, int], None]]:
    """Yield ``tick(step, loss, n_images)``: a tqdm bar (epoch, step, loss, images/s) when ``bar``, else no-op.

    ``loss`` is the step's loss as a 0-d tensor (or a float); the bar reads it at most every
    ``BAR_LOSS_EVERY_S`` seconds (and at the last step), so a bar costs no host sync per step.

    Without a terminal (log files, parallel worker processes) the per-epoch line that
    ``train_run`` passes to ``progress`` is the only output, so lines of workers never interleave.
    """
    if not bar:
        yield lambda step, loss, n: None
        return
    from tqdm.auto import tqdm

    t0, seen, shown = time.perf_counter(), 0, -math.inf
    with tqdm(total=steps, desc=f"{label} epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True) as pbar:

        def tick(step: int, loss: float | torch.Tensor, n: int) -> None:
            nonlocal seen, shown
            seen += n
            now = time.perf_counter()
            if now - shown >= BAR_LOSS_EVERY_S or step == steps - 1:
                # the trainers pass the loss as a device tensor: reading it waits for the device
                shown = now
                pbar.set_postfix(loss=f"{float(loss):.3f}", img_s=f"{seen / (now - t0):.0f}", refresh=False)
            pbar.update(1)

        yield tick


def _load_data(run: dict, data_dir: str | Path) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test, x_probe)``: train/test stay uint8 (N, H, W, 3) and are
    converted per batch on the device (``runners.inputs``); the probe is converted once."""
    ds, probe = run["dataset"], run["probe"]
    xtr, ytr = load_split(ds, "train", data_dir)
    if run.get("labels", "true") == "shuffled":  # the built-in control: labels no longer match images
        ytr = shuffled_labels(ytr, run["seed"])
    xte, yte = load_split(ds, "test", data_dir)
    xpr, _ = load_split(ds, "probe", data_dir, probe["size"], probe["seed"])
    return (
        torch.from_numpy(xtr),
        torch.from_numpy(ytr),
        torch.from_numpy(xte),
        torch.from_numpy(yte),
        to_tensor(xpr),
    )


@dataclass
class _Done:
    """What a run has done so far: the part of ``resume.pt`` besides the trainer's and the RNGs' states.

    Attributes:
        history: one entry per finished epoch (loss, quality, throughput).
        spectra: eigenvalues (D,) per ``"{epoch}/{layer}/{token_set}"``.
        n_tokens: tokens per ``"{layer}/{token_set}"``.
        epoch: the last complete epoch (0: none).
        started_at: when training began (unix seconds; kept across resumes; None: not begun).
        measure_s: seconds each checkpoint's measurement took, by epoch (``result.json``'s ``measure_s``:
            ``plan`` reads the extraction time from finished runs instead of timing one).
        initial: the objective's ``evaluate`` at initialisation, before the first step (``result.json``'s
            ``initial``: the epoch-0 k-NN or test accuracy and, for DINO, its collapse diagnostics; None
            for a run resumed from a ``resume.pt`` written before it was recorded).
    """

    history: list[dict] = field(default_factory=list)
    spectra: dict[str, np.ndarray] = field(default_factory=dict)
    n_tokens: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    started_at: float | None = None
    measure_s: dict[str, float] = field(default_factory=dict)
    initial: dict | None = None


def _load_resume(
    path: Path,
    objective: Trainer,
    data_gen: torch.Generator,
    device: torch.device,
    log: Callable[[str], None],
) -> _Done:
    """Restore the objective, data order and RNG streams from ``resume.pt`` when it exists.

    The file is read with ``weights_only=True``: tensors and plain containers only, so a planted or
    foreign ``resume.pt`` cannot run code. One that holds anything else (or is not a torch file) is
    removed and the run starts over from its initialisation, which gives the same result as resuming.
    """
    if not path.exists():
        return _Done()
    try:  # on the CPU first: RNG states must be CPU byte tensors; load_state_dict moves weights
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]  # one line; torch's refusal is many
        log(f"{path}: not loaded, starting over ({type(exc).__name__}: {reason})")
        path.unlink(missing_ok=True)
        return _Done()
    objective.load_state_dict(state["objective"])
    data_gen.set_state(state["data_gen"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    spectra = {k: v.numpy() for k, v in state["spectra"].items()}
    # a resume.pt from before started_at was kept has none: the run's start is then this attempt's
    done = _Done(state["history"], spectra, state["n_tokens"], state["epoch"], state.get("started_at"))
    done.measure_s = dict(state.get("measure_s") or {})  # none in a resume.pt from before it was kept
    done.initial = state.get("initial")  # none in a resume.pt from before it was recorded
    return done


def _save_resume(
    path: Path, objective: Trainer, data_gen: torch.Generator, device: torch.device, done: _Done
) -> None:
    """Write ``resume.pt`` (atomic): everything :func:`_load_resume` restores, as tensors and plain
    containers (eigenvalues as tensors: a numpy array would need unpickling code to read back)."""
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    state = {"objective": objective.state_dict(), "data_gen": data_gen.get_state()}
    state.update(torch_rng=torch.get_rng_state(), cuda_rng=cuda_rng)
    spectra = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in done.spectra.items()}
    state.update(history=done.history, spectra=spectra, n_tokens=done.n_tokens, epoch=done.epoch)
    state.update(started_at=done.started_at, measure_s=done.measure_s, initial=done.initial)
    _atomic_torch_save(state, path)


def steps_per_epoch(n_train: int, training: TrainingSpec) -> int:
    """Optimiser steps per epoch: every batch of the training split, capped by ``max_steps_per_epoch``."""
    steps = math.ceil(n_train / training.batch_size)
    return min(steps, training.max_steps_per_epoch) if training.max_steps_per_epoch else steps


class _Run:
    """One run being trained: its data, trainer, generators and progress, and the steps of
    :func:`train_run` that write to its folder."""

    def __init__(
        self,
        run: dict,
        run_dir: Path,
        data_dir: str | Path,
        progress: Callable[[str], None] | None,
        bar: bool,
    ) -> None:
        self.run, self.folder, self.bar = run, RunFolder(run_dir), bar
        self.log = (lambda msg: None) if progress is None else progress
        ds, seed = run["dataset"], run["seed"]
        self.label, self.device = f"{ds['name']}/seed{seed}", pick_device()
        self.xtr, self.ytr, self.xte, self.yte, self.xpr = _load_data(run, data_dir)
        # ---- objective: its networks and optimiser (init seeded from the run seed) --------------------
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        training = TrainingSpec.model_validate(run["training"])
        steps = steps_per_epoch(self.xtr.shape[0], training)
        self.setup = TrainerSetup.from_run(run, num_classes(ds), ds["image_size"], steps)
        self.objective = build_trainer(self.setup, self.device)
        self.model = self.objective.measured  # the network whose spectra are measured
        # data order: a stream of its own, not the init stream
        self.data_gen = torch.Generator().manual_seed(seed + DATA_ORDER_SEED_OFFSET)
        self.resume_path = run_dir / "resume.pt"
        self.done = _load_resume(self.resume_path, self.objective, self.data_gen, self.device, self._say)
        if self.done.epoch:
            self._say(f"resuming after epoch {self.done.epoch}")
        if self.done.started_at is None:
            self.done.started_at = time.time()

    def _say(self, msg: str) -> None:
        self.log(f"[{self.label}] {msg}")

    def measure(self, epoch: int) -> None:
        """Spectra (and observables, covariance snapshots) of the measured network at ``epoch``."""
        t0, probe = time.perf_counter(), self.run["probe"]
        snap = epoch in snapshot_epochs(probe.get("covariance_epochs", "none"), self.run["checkpoints"])
        sp = extract_spectra(
            self.model,
            self.xpr,
            probe["batch_size"],
            epoch=epoch,
            covariances=snap,
            blocks=probe.get("blocks", 0),
        )
        fault_point("extract")
        for (layer, tset), lam in sp.eigenvalues.items():
            self.done.spectra[spectrum_key(epoch, layer, tset)] = lam
            self.done.n_tokens[f"{layer}/{tset}"] = int(sp.n_tokens[(layer, tset)])
        # observables and covariance snapshots go straight to run_dir (read-merge-write, atomic), so they
        # survive a resume without joining resume.pt; re-measuring an epoch overwrites the same keys
        save_observables(self.folder.path, epoch, sp)
        save_probe(self.folder.path, epoch, sp)
        if snap:
            save_covariances(self.folder.path, epoch, sp)
        self.done.measure_s[str(epoch)] = time.perf_counter() - t0
        self._say(f"spectra at epoch {epoch} ({self.done.measure_s[str(epoch)]:.1f}s)")

    def evaluate_initial(self) -> None:
        """The objective's held-out evaluation at initialisation (epoch 0): what a run's learning is judged
        against. It draws no random numbers, so training goes on exactly as without it."""
        self.done.initial = {
            "epoch": 0,
            **self.objective.evaluate(self.xtr, self.ytr, self.xte, self.yte),
        }
        quality = " ".join(f"{k} {v:.3f}" for k, v in self.done.initial.items() if k in _QUALITY)
        self._say(f"epoch 0 (initialisation) {quality}")

    def checkpoint(self, epoch: int) -> None:
        """Measure, then save the measured network's weights and the run spec (atomic write)."""
        self.measure(epoch)
        path = self.folder.checkpoints_dir / f"epoch_{epoch:03d}.pt"
        _atomic_torch_save({"model": self.model.state_dict(), "run": self.run}, path)

    def train_epoch(self, epoch: int) -> None:
        """One epoch of the objective, its history entry and progress line, checkpoint and resume file."""
        tr, n = self.setup.training, self.xtr.shape[0]
        check_lease()  # taken over by another worker: stop before writing anything more
        threads = adopt_thread_budget()  # a parallel worker takes the cores of finished ones
        t0 = time.perf_counter()
        order = torch.randperm(n, generator=self.data_gen)
        with _epoch_progress(self.label, epoch, tr.epochs, self.setup.steps_per_epoch, self.bar) as tick:
            stats = self.objective.train_epoch(epoch, self.xtr, self.ytr, order, tick)
        elapsed = time.perf_counter() - t0
        seen = min(n, self.setup.steps_per_epoch * tr.batch_size)
        entry = {"epoch": epoch, **stats, **self.objective.evaluate(self.xtr, self.ytr, self.xte, self.yte)}
        entry["images_per_s"] = seen / elapsed
        entry["epoch_s"] = elapsed
        entry["threads"] = threads if threads is not None else torch.get_num_threads()
        self.done.history.append(entry)
        fault_point("train.epoch")
        quality = " ".join(f"{k} {entry[k]:.3f}" for k in _QUALITY if k in entry)
        self._say(
            f"epoch {epoch}/{tr.epochs} loss {entry['loss']:.3f} {quality} {entry['images_per_s']:.0f} img/s"
        )
        if epoch in self.run["checkpoints"]:
            self.checkpoint(epoch)
        self.done.epoch = epoch
        _save_resume(self.resume_path, self.objective, self.data_gen, self.device, self.done)

    def fail(self, msg: str, epoch: int) -> dict:
        result = {"status": "failed", "failed_epoch": epoch, "error": msg, "run": self.run}
        result.update(history=self.done.history, started_at=self.done.started_at, failed_at=time.time())
        self.folder.write_result(result)
        self._say(f"FAILED at epoch {epoch}: {msg}")
        return result

    def finish(self) -> dict:
        """The result files (``result.json`` last: it marks the run finished); ``resume.pt`` removed."""
        check_lease()
        self.folder.write_spectra(self.done.spectra)
        result = {
            "status": "finished",
            "run": self.run,
            "history": self.done.history,
            "n_tokens": self.done.n_tokens,
            "device": self.device.type,
            "environment": environment(),
            "started_at": self.done.started_at,  # seconds since the epoch: when training began
            "finished_at": time.time(),  # seconds since the epoch: when the data existed (pre-registration)
            "measure_s": self.done.measure_s,  # seconds per checkpoint's measurement (``plan``'s run-hours)
            "initial": self.done.initial,  # the objective's evaluation before the first step
            "n_classes": self.setup.n_classes,  # the chance level of its accuracies (learning_status)
        }
        if self.run.get("labels", "true") == "shuffled":
            result["labels"] = {"kind": "shuffled", "seed": self.run["seed"] + LABEL_SEED_OFFSET}
        self.folder.write_result(result)
        self.resume_path.unlink(missing_ok=True)
        return result


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
    r = _Run(run, run_dir, data_dir, progress, bar)
    try:
        if r.done.epoch == 0 and r.done.initial is None:
            r.evaluate_initial()
        if r.done.epoch == 0 and 0 in run["checkpoints"] and "0/norm/all" not in r.done.spectra:
            r.checkpoint(0)
        for epoch in range(r.done.epoch + 1, r.setup.training.epochs + 1):
            r.train_epoch(epoch)
    except RunFailedError as exc:
        return r.fail(str(exc), exc.epoch if exc.epoch is not None else -1)
    return r.finish()
