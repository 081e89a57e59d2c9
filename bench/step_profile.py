"""Where a training step's time goes, and the step's images/s against another commit's, side by side.

    PYTHONPATH=. python bench/step_profile.py profile [--objective dino] [--batch 32] [--steps 4]
    PYTHONPATH=. python bench/step_profile.py compare --baseline main [--rounds 3] [--profile]
    PYTHONPATH=. python bench/step_profile.py compare --baseline main --gpu   # ViT-S/16, 224 px, batch 128

``profile`` runs our trainers' own ``train_epoch`` (``runners.objectives``) under ``torch.profiler`` and
splits the wall time of the timed steps into named ranges wrapped around the trainer from outside (so
the same wrapping works on older commits): ``data`` (uint8 batch -> device input), ``augment`` (DINO's
multi-crop; ``augment/draw``, inside it: drawing its random numbers on the host), ``teacher_fwd``,
``student_fwd`` (supervised: ``forward``), ``loss``, ``backward``, ``clip+freeze`` (from the end of
backward to the optimiser step: DINO's gradient clipping and frozen last layer), ``optimiser`` (AdamW
and the lr scheduler), ``ema`` (DINO's teacher update) and ``other``
(the rest: Python, schedules, zero_grad, loss bookkeeping), the FLOPs of a step (``FlopCounterMode``) and
the rate they ran at (GFLOP/s; with both objectives, DINO's rate over the supervised step's: how efficiently
DINO's extra work runs), and the per-epoch evaluation's time (DINO: the teacher's k-NN and collapse
diagnostics). It also counts the host syncs per step:
``aten::_local_scalar_dense`` (``.item()``, ``bool(tensor)``) and ``aten::nonzero``; on CUDA also
``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` and the host-to-device copies (``cudaMemcpyAsync``).

``compare`` times the same configuration with this tree's ``runners/`` and with the ``runners/`` and
``vitstudy_core/`` of ``--baseline`` (a git revision, exported with ``git archive`` to a temporary folder;
or those of the folder ``--baseline-dir``),
each in its own subprocess, alternating ``--rounds`` times so load from other processes affects both
alike, and prints the median images/s of each and their ratio; with ``--profile`` also both breakdowns.
The timed steps are clocked as a whole, the device synchronised before and after only (a sync per
step would hide the overlap of host and device that a sync-free step allows). On CUDA, MFU = FLOPs of
one eager step (``FlopCounterMode``) / step time / the device's peak bf16 rate
(``bench/gpu_check.peak_bf16_tflops``).

The default configuration is small enough for a shared CPU: the spine's ``vit_cpu12`` (D=64, 12 blocks,
patch 4) at 32 px, batch 32, DINO with ``dino_small``'s crops (2 x 32 px + 4 x 16 px); ``--gpu`` is the
README's throughput configuration (ViT-S/16 at 224 px, batch 128; DINO with ``dino_paper``: 2 x 224 +
8 x 96 px, 65536 prototypes), with ``--compile`` for ``torch.compile``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the code under test: this tree, or (compare's children) a baseline exported to a temporary folder
CODE = Path(os.environ.get("STEP_PROFILE_CODE", REPO))
sys.path.insert(0, str(CODE))

import torch  # noqa: E402

RANGES = (
    "data",
    "augment",
    "teacher_fwd",
    "student_fwd",
    "loss",
    "backward",
    "clip+freeze",
    "optimiser",
    "ema",
)
NESTED = {"draw": "augment"}  # ranges inside another: shown under it, not added to the step's sum
SYNC_EVENTS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize")
COPY_EVENTS = ("cudaMemcpyAsync",)


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_spec(objective: str, gpu: bool, batch: int, compile_: bool) -> tuple[dict, int]:
    """(run spec dict, image size) of the benchmark configuration (module docstring)."""
    from runners.models import MODEL_PRESETS
    from runners.objectives.dino_settings import DinoObjective

    preset = "dino_paper" if gpu else "dino_small"
    model = {"name": "vit_small_patch16_224"} if gpu else dict(MODEL_PRESETS["vit_cpu12"])
    model["drop_path_rate"] = 0.1 if gpu else 0.0
    training = {"epochs": 10, "batch_size": batch, "lr": 5e-4, "weight_decay": 0.04, "warmup_epochs": 1.0}
    training["compile"] = compile_
    obj: str | dict = "supervised"
    if objective == "dino":
        obj = DinoObjective(preset=preset).model_dump()
    return {"seed": 0, "model": model, "training": training, "objective": obj}, (224 if gpu else 32)


def build(objective: str, gpu: bool, batch: int, compile_: bool, steps: int):
    """(trainer, uint8 images (batch * steps, S, S, 3), labels): random pixels, seeded."""
    from runners.objectives import make_objective

    spec, size = run_spec(objective, gpu, batch, compile_)
    device = _device()
    torch.manual_seed(0)
    trainer = make_objective(spec, 100, size, steps, device)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch * steps, size, size, 3), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 100, (batch * steps,), generator=g)
    return trainer, x, y


def timed_epoch(trainer, x: torch.Tensor, y: torch.Tensor, steps: int, epoch: int = 1) -> float:
    """Seconds of ``steps`` steps of ``trainer.train_epoch``, the device synchronised before and after only.

    No synchronisation per step: a step that does not wait for the device lets the host prepare the
    next one while the device computes, and a per-step sync in the clock would hide exactly that.
    """
    device = _device()
    trainer.steps_per_epoch = steps
    _sync(device)
    t0 = time.perf_counter()
    order = torch.arange(steps * trainer.tr.batch_size) % len(x)  # every step a full batch
    trainer.train_epoch(epoch, x, y, order, lambda *a: None)
    _sync(device)
    return time.perf_counter() - t0


# ---- named ranges around the trainer, from outside ------------------------------------------------------
def _ranged(name: str, fn: Callable) -> Callable:
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapped


@contextlib.contextmanager
def instrumented(trainer) -> Iterator[None]:
    """Wrap the trainer's parts in ``record_function`` ranges (RANGES) for the duration of the block."""
    import runners.objectives.dino as dino
    import runners.objectives.supervised as sup

    saved: list[tuple[object, str, object]] = []

    def patch(obj: object, attr: str, name: str) -> None:
        if hasattr(obj, attr):
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, _ranged(name, getattr(obj, attr)))

    for mod in (dino, sup):
        for attr in ("to_input", "batch_input"):
            patch(mod, attr, "data")
    patch(dino, "ema_update", "ema")
    if hasattr(trainer, "crops"):  # the CPU-side draws of this tree's MultiCrop (host work by design)
        patch(trainer.crops, "draw", "draw")
    for attr, name in (("crops", "augment"), ("teacher_backbone", "teacher_fwd"), ("loss_fn", "loss")):
        patch(trainer, attr, name)
    patch(trainer, "student_forward" if hasattr(trainer, "student_forward") else "forward", "student_fwd")
    clip: list = []
    opt_step = trainer.opt.step
    backward = torch.Tensor.backward

    def step(*args, **kwargs):
        while clip:  # the clip+freeze range runs from the end of backward to here
            clip.pop().__exit__(None, None, None)
        with torch.profiler.record_function("optimiser"):
            return opt_step(*args, **kwargs)

    def back(self, *args, **kwargs):
        with torch.profiler.record_function("backward"):
            backward(self, *args, **kwargs)
        rf = torch.profiler.record_function("clip+freeze")
        rf.__enter__()
        clip.append(rf)

    trainer.opt.step, torch.Tensor.backward = step, back
    try:
        yield
    finally:
        trainer.opt.step, torch.Tensor.backward = opt_step, backward
        for obj, attr, old in reversed(saved):
            setattr(obj, attr, old)


def syncs_by_range(events: list, steps: int) -> dict[str, float]:
    """Host syncs (SYNC_EVENTS) per step, by the innermost named range they happened in ("other": none).

    On the CPU these cost nothing, but each one would stall the host on a device; the ones inside
    ``optimiser`` on the CPU are torch's single-tensor AdamW reading its step count, which the
    foreach / fused AdamW used on CUDA does not do.
    """
    counts: dict[str, float] = {}
    for ev in events:
        if ev.name not in SYNC_EVENTS:
            continue
        parent = ev.cpu_parent
        while parent is not None and parent.name not in RANGES and parent.name not in NESTED:
            parent = parent.cpu_parent
        key = f"{ev.name.split('::')[-1]}@{parent.name if parent is not None else 'other'}"
        counts[key] = counts.get(key, 0) + 1 / steps
    return dict(sorted(counts.items()))


def profile_once(objective: str, gpu: bool, batch: int, compile_: bool, steps: int) -> dict:
    """Breakdown of ``steps`` steps (after warm-up steps): ms per step per range, syncs per step."""
    from torch.profiler import ProfilerActivity

    trainer, x, y = build(objective, gpu, batch, compile_, steps)
    timed_epoch(trainer, x, y, 2)  # warm-up: allocator, kernels, compilation
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _device().type == "cuda" else [])
    with instrumented(trainer), torch.profiler.profile(activities=acts) as prof:
        seconds = timed_epoch(trainer, x, y, steps)
    avg = {e.key: e for e in prof.key_averages()}
    wall_ms = seconds * 1e3 / steps
    ms = {name: avg[name].cpu_time_total / 1e3 / steps if name in avg else 0.0 for name in RANGES}
    ms["other"] = wall_ms - sum(ms.values())
    for name, outer in NESTED.items():
        if name in avg:
            ms[f"{outer}/{name}"] = avg[name].cpu_time_total / 1e3 / steps
    out = {"step_ms": wall_ms, "ms": ms, "images_per_s": batch * steps / seconds}
    out.update(flop_rate(objective, gpu, batch, wall_ms / 1e3))
    out["eval_ms"], out["eval_images"] = eval_ms(trainer, x, y), len(x)
    out["syncs_per_step"] = syncs_by_range(prof.events(), steps)
    out["copies_per_step"] = {k: avg[k].count / steps for k in COPY_EVENTS if k in avg}
    if _device().type == "cuda":
        out["top_kernels"] = prof.key_averages().table(sort_by="self_device_time_total", row_limit=15)
    return out


def flop_rate(objective: str, gpu: bool, batch: int, step_s: float) -> dict:
    """FLOPs of one eager step (``FlopCounterMode``: matmuls and convolutions, forward and backward; DINO's
    crops, EMA and loss count nearly nothing) and the rate they ran at, GFLOP/s = FLOPs / ``step_s``."""
    from torch.utils.flop_counter import FlopCounterMode

    trainer, x, y = build(objective, gpu, batch, False, 1)
    with FlopCounterMode(display=False) as fc:
        timed_epoch(trainer, x[:batch], y[:batch], 1)
    flops = float(fc.get_total_flops())
    return {"flops_per_step": flops, "gflop_per_s": flops / step_s / 1e9}


def eval_ms(trainer, x: torch.Tensor, y: torch.Tensor) -> float:
    """Milliseconds of the trainer's per-epoch evaluation (DINO: the teacher's k-NN and collapse
    diagnostics; supervised: test accuracy) with the benchmark's images as both splits."""
    t0 = time.perf_counter()
    trainer.evaluate(x, y, x, y)
    _sync(_device())
    return (time.perf_counter() - t0) * 1e3


def measure_once(objective: str, gpu: bool, batch: int, compile_: bool, steps: int) -> dict:
    """Seconds per step over ``steps`` steps after 2 warm-up steps; on CUDA the FLOPs of one eager step."""
    from torch.utils.flop_counter import FlopCounterMode

    trainer, x, y = build(objective, gpu, batch, compile_, steps)
    timed_epoch(trainer, x, y, 2)
    step_s = timed_epoch(trainer, x, y, steps) / steps
    out = {"step_s": step_s, "images_per_s": batch / step_s}
    if _device().type == "cuda":
        trainer, x, y = build(objective, gpu, batch, False, 1)
        with FlopCounterMode(display=False) as fc:
            timed_epoch(trainer, x[:batch], y[:batch], 1)
        out["flops_per_step"] = float(fc.get_total_flops())
    return out


# ---- baseline vs this tree, each in its own process -------------------------------------------------------
def export_baseline(rev: str, into: Path) -> Path:
    """``runners/`` and ``vitstudy_core/`` of git revision ``rev`` under ``into`` (``git archive``)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "runners", "vitstudy_core"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _child(code: Path, job: str, args: argparse.Namespace, objective: str) -> dict:
    """One ``job`` (measure / profile) of one objective in a subprocess running the code under ``code``."""
    cmd = [sys.executable, __file__, job, "--objective", objective, "--batch", str(args.batch)]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads), "--json", "-"]
    cmd += ["--gpu"] * args.gpu + ["--compile"] * args.compile
    env = {**os.environ, "STEP_PROFILE_CODE": str(code), "PYTHONPATH": str(code)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def _peak_tflops() -> float | None:
    if not torch.cuda.is_available():
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)  # type: ignore[union-attr]
    return gc.peak_bf16_tflops(torch.cuda.get_device_name(0))


def compare(args: argparse.Namespace) -> dict:
    """Median images/s (and MFU on a known GPU) of baseline and this tree, alternating in subprocesses."""
    peak, out = _peak_tflops(), {}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.baseline_dir or export_baseline(args.baseline, Path(tmp))
        for objective in args.objective:
            runs: dict[str, list[dict]] = {"baseline": [], "new": []}
            for _ in range(args.rounds):
                runs["baseline"].append(_child(base, "measure", args, objective))
                runs["new"].append(_child(REPO, "measure", args, objective))
            row = {}
            for side, rs in runs.items():
                ips = statistics.median(r["images_per_s"] for r in rs)
                row[side] = {"images_per_s": ips, "rounds": [r["images_per_s"] for r in rs]}
                flops = rs[0].get("flops_per_step")
                if peak and flops:
                    row[side]["mfu"] = flops * ips / args.batch / (peak * 1e12)
            row["ratio"] = row["new"]["images_per_s"] / row["baseline"]["images_per_s"]
            if args.profile:
                for side, code in (("baseline", base), ("new", REPO)):
                    row[side]["profile"] = _child(code, "profile", args, objective)
            out[objective] = row
    return out


# ---- output ---------------------------------------------------------------------------------------------
def print_profile(title: str, prof: dict) -> None:
    rate = f", {prof['gflop_per_s']:.1f} GFLOP/s" if "gflop_per_s" in prof else ""
    print(f"{title}: {prof['step_ms']:.1f} ms/step, {prof['images_per_s']:.0f} img/s{rate}")
    for name, ms in prof["ms"].items():
        print(f"  {name:<12}{ms:>9.2f} ms  {100 * ms / prof['step_ms']:>5.1f} %")
    syncs = ", ".join(f"{k} {v:g}" for k, v in {**prof["syncs_per_step"], **prof["copies_per_step"]}.items())
    print(f"  per step: {syncs or 'no syncs'}")
    if "eval_ms" in prof:
        print(
            f"  evaluation (per epoch; {prof.get('eval_images')} images as both splits): {prof['eval_ms']:.0f} ms"
        )
    if "top_kernels" in prof:
        print(prof["top_kernels"])


def print_compare(out: dict, args: argparse.Namespace) -> None:
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({args.threads} threads)"
    print(
        f"device {dev}; baseline {args.baseline_dir or args.baseline}; batch {args.batch}; "
        f"{args.rounds} rounds of {args.steps} steps"
    )
    print(
        f"{'objective':<12}{'baseline img/s':>16}{'new img/s':>12}{'new/base':>10}"
        f"{'MFU base':>10}{'MFU new':>9}"
    )
    for objective, row in out.items():
        b, n = row["baseline"], row["new"]
        mfu = "".join(f"{r['mfu']:>9.3f} " if "mfu" in r else f"{'-':>9} " for r in (b, n))
        print(
            f"{objective:<12}{b['images_per_s']:>16.1f}{n['images_per_s']:>12.1f}{row['ratio']:>10.2f} {mfu}"
        )
        for side in ("baseline", "new"):
            if "profile" in row[side]:
                print_profile(f"{objective} {side}", row[side]["profile"])


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("job", choices=("profile", "compare", "measure"))
    p.add_argument("--objective", nargs="+", default=["dino", "supervised"], choices=("dino", "supervised"))
    p.add_argument("--batch", type=int, default=None, help="default 32 (CPU), 128 (--gpu)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", default="main", help="git revision to compare against")
    p.add_argument(
        "--baseline-dir",
        type=Path,
        default=None,
        help="a folder holding the baseline's runners/ and vitstudy_core/ (instead of --baseline; "
        "for a copy of the tree without its git history)",
    )
    p.add_argument("--gpu", action="store_true", help="the README's ViT-S/16 224 px configuration")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--profile", action="store_true", help="compare: also both breakdowns")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", default=None, help="write the result as JSON here ('-': last stdout line)")
    args = p.parse_args(argv)
    args.batch = args.batch or (128 if args.gpu else 32)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.job == "compare":
        out = compare(args)
        print_compare(out, args)
    else:
        job = profile_once if args.job == "profile" else measure_once
        out = {o: job(o, args.gpu, args.batch, args.compile, args.steps) for o in args.objective}
        if args.job == "profile" and args.json != "-":
            for objective, prof in out.items():
                print_profile(objective, prof)
            if {"dino", "supervised"} <= set(out):
                d, sup = out["dino"]["gflop_per_s"], out["supervised"]["gflop_per_s"]
                print(f"FLOP rate, DINO / supervised (same model, batch and threads): {d / sup:.2f}")
        if len(args.objective) == 1:
            out = out[args.objective[0]]
    if args.json == "-":
        print(json.dumps(out))
    elif args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
