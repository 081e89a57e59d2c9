"""Training-loop benchmarks, side by side in one process.

    PYTHONPATH=. python bench/train.py [--steps 6] [--repeats 5] [--batch-size 128] [--threads 1] [--json out.json]

Three ratios on the spine's CPU model (``vit_cpu12``: timm ViT, 16 px images, patch 4, D=64, 12 blocks,
4 heads) and the same batches of procedural images:

1. ``loop_ratio`` = images/s of our supervised loop (``SupervisedTrainer.train_epoch``) / images/s of a
   bare PyTorch loop (forward, cross-entropy, backward, AdamW step, LambdaLR step) on the same model,
   batches and optimiser. Target >= 0.95.
2. ``extract_ratio`` = time of one spectra extraction on the default probe (512 images) / time of one
   training epoch on the default dataset (10,000 images; measured per step x steps per epoch).
   Target <= 0.10.
3. ``dino_ratio`` = seconds per DINO step (``dino_small``: 2 global + 4 local crops) / seconds per
   supervised step, same model and batch size. DINO's reference ratio is ~3.5-4.4.

Timings alternate between the two loops being compared and report the median of ``--repeats`` rounds
(each round times ``--steps`` steps after one warm-up step), so load from other processes affects both
sides alike. On CUDA the same script times bf16 autocast forward passes (synchronising before each clock).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runners.datasets.procedural import generate  # noqa: E402
from runners.extract import extract_spectra  # noqa: E402
from runners.inputs import to_input, to_tensor  # noqa: E402
from runners.models import MODEL_PRESETS, build_model  # noqa: E402
from runners.objectives import make_objective  # noqa: E402
from runners.objectives.dino_settings import DinoObjective  # noqa: E402
from runners.objectives.supervised import lr_lambda  # noqa: E402
from runners.train import pick_device  # noqa: E402

IMAGE_SIZE, N_CLASSES = 16, 10
DEFAULT_N_TRAIN, DEFAULT_PROBE = 10_000, 512  # the defaults of ProceduralDataset / ProbeSpec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _run_spec(batch_size: int, objective: str | dict = "supervised") -> dict:
    model = {k: v for k, v in MODEL_PRESETS["vit_cpu12"].items()}
    model["drop_path_rate"] = 0.0
    training = {
        "epochs": 10,
        "batch_size": batch_size,
        "lr": 1e-3,
        "weight_decay": 0.05,
        "warmup_epochs": 1.0,
        "label_smoothing": 0.0,
        "compile": False,
    }
    return {"seed": 0, "model": model, "training": training, "objective": objective}


def _bare_loop(model: torch.nn.Module, batches: list, steps: int, device: torch.device) -> float:
    """A plain PyTorch loop, the reference: seconds for ``steps`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1000, 10))
    model.train()
    for i in range(steps + 1):
        if i == 1:  # the first step warms up allocator and kernels
            _sync(device)
            t0 = time.perf_counter()
        xb, yb = batches[i % len(batches)]
        xb, yb = to_input(xb, device), yb.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = F.cross_entropy(model(xb).float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    _sync(device)
    return time.perf_counter() - t0


def _our_loop(trainer, x: torch.Tensor, y: torch.Tensor, batch_size: int, steps: int, device) -> float:
    """``trainer.train_epoch`` over ``steps + 1`` batches; seconds for the last ``steps`` (first: warm-up)."""
    times: list[float] = []

    def tick(step: int, loss: float, n: int) -> None:
        _sync(device)
        times.append(time.perf_counter())

    trainer.steps_per_epoch = steps + 1
    order = torch.arange(batch_size * (steps + 1)) % x.shape[0]
    trainer.train_epoch(1, x, y, order, tick)
    return times[-1] - times[0]


def _median_rounds(repeats: int, *timers) -> list[float]:
    """Median seconds of each timer over ``repeats`` rounds, the timers alternating within a round."""
    rounds = [[timer() for timer in timers] for _ in range(repeats)]
    return [statistics.median(r[i] for r in rounds) for i in range(len(timers))]


def _extract_s(model: torch.nn.Module, repeats: int, device: torch.device) -> float:
    """Median seconds of one spectra extraction of ``model`` on the default probe (512 images)."""
    probe = to_tensor(generate("objects", DEFAULT_PROBE, IMAGE_SIZE, N_CLASSES, seed=1)[0])

    def once() -> float:
        _sync(device)
        t0 = time.perf_counter()
        extract_spectra(model, probe, 256, epoch=1)
        _sync(device)
        return time.perf_counter() - t0

    return _median_rounds(repeats, once)[0]


def _print_table(out: dict) -> None:
    print(
        f"device {out['device']} ({out['torch_threads']} threads), {out['model']}, batch {out['batch_size']}"
    )
    print(f"{'benchmark':<44}{'value':>10}  target")
    print(f"{'loop: ours / bare images/s':<44}{out['loop_ratio']:>10.3f}  >= 0.95"
          f"   ({out['ours_images_per_s']:.0f} vs {out['bare_images_per_s']:.0f} img/s)")  # fmt: skip
    print(f"{'extraction (512 probe) / training epoch':<44}{out['extract_ratio']:>10.3f}  <= 0.10"
          f"   ({out['extract_s']:.2f} s vs {out['epoch_s']:.1f} s)")  # fmt: skip
    print(f"{'DINO step / supervised step':<44}{out['dino_ratio']:>10.2f}  ~3.5-4.4 (reference)"
          f"   ({out['dino_step_s'] * 1e3:.0f} vs {out['supervised_step_s'] * 1e3:.0f} ms)")  # fmt: skip
    print(f"total {out['wall_s']:.0f} s")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)  # the default training batch
    # one thread, as each CPU worker process of a study runs (runners.executors.local); on a shared machine
    # more threads than free cores slow every step several-fold and swamp the ratios with noise
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    device = pick_device()
    if args.threads:
        torch.set_num_threads(args.threads)
    bs, steps = args.batch_size, args.steps
    t_start = time.perf_counter()

    images, labels = generate("objects", bs * 4, IMAGE_SIZE, N_CLASSES, seed=0)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)  # uint8 (N, H, W, 3), as train_run holds them
    batches = [(x[i * bs : (i + 1) * bs], y[i * bs : (i + 1) * bs]) for i in range(4)]

    # ---- 1. our supervised loop vs a bare loop -----------------------------------------------------
    torch.manual_seed(0)
    trainer = make_objective(_run_spec(bs), N_CLASSES, IMAGE_SIZE, steps + 1, device)
    torch.manual_seed(0)
    bare = build_model(_run_spec(bs)["model"], IMAGE_SIZE, N_CLASSES).to(device)
    bare_s, ours_s = _median_rounds(
        args.repeats,
        lambda: _bare_loop(bare, batches, steps, device),
        lambda: _our_loop(trainer, x, y, bs, steps, device),
    )
    ours_ips, bare_ips = bs * steps / ours_s, bs * steps / bare_s

    # ---- 2. extraction at a checkpoint vs one training epoch ----------------------------------------
    extract_s = _extract_s(trainer.measured, args.repeats, device)
    epoch_s = ours_s / steps * math.ceil(DEFAULT_N_TRAIN / bs)

    # ---- 3. DINO step vs supervised step -------------------------------------------------------------
    spec = _run_spec(bs, DinoObjective(preset="dino_small").model_dump())
    spec["training"].update(DinoObjective.presets["dino_small"].training)
    torch.manual_seed(0)
    dino = make_objective(spec, N_CLASSES, IMAGE_SIZE, steps + 1, device)
    sup_s, dino_s = _median_rounds(
        args.repeats,
        lambda: _our_loop(trainer, x, y, bs, steps, device),
        lambda: _our_loop(dino, x, y, bs, steps, device),
    )
    out = {
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(0),
        "torch_threads": torch.get_num_threads(),
        "model": "vit_cpu12 (16 px, patch 4, D=64, 12 blocks, 4 heads)",
        "batch_size": bs,
        "steps": steps,
        "repeats": args.repeats,
        "ours_images_per_s": ours_ips,
        "bare_images_per_s": bare_ips,
        "loop_ratio": ours_ips / bare_ips,
        "extract_s": extract_s,
        "epoch_s": epoch_s,
        "extract_ratio": extract_s / epoch_s,
        "dino_step_s": dino_s / steps,
        "supervised_step_s": sup_s / steps,
        "dino_ratio": dino_s / sup_s,
        "wall_s": time.perf_counter() - t_start,
    }
    _print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
