"""Decoding an ImageFolder dataset into the data cache: throughput and peak memory, side by side.

    PYTHONPATH=. nice python bench/data.py [--images 20000] [--size 224] [--repeats 1] [--json out.json]

Generates ``--images`` JPEGs once (ImageNet-like: 300-500 x 250-400 px, colour waves with shapes and
noise, quality 90) in 100 class folders under ``--data`` (default ``~/.cache/study-bench``), then
loads the train split with ``runners.datasets.load_disk_split`` into a fresh cache, each load in a fresh
subprocess (timed from listing the files to the finished cache), for these settings:

* ``thread x1`` and ``thread x2``: the loader as used (a pool of threads writing into the ``.npy``);
* ``process x2``: the same with a pool of processes (``write_images(pool="process")``);
* ``in-RAM x2`` (baseline): the former design, every image decoded into one in-memory array.

For each it prints images/s and the peak resident set size (``ru_maxrss`` of the child, plus the largest
pool process, counted twice, for ``process x2``) next to the size of the decoded data, and the CPU
seconds the load used per wall second ("cores busy": below 2 with two workers means other processes
held the cores). Targets: peak under 25% of the
data size, and ``thread x2`` at least 1.6x the images/s of ``thread x1``. Settings alternate within each
of ``--repeats`` rounds, so load from other processes falls on all alike; the median is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

N_CLASSES = 100  # ImageNet-100's class count
SETTINGS = {
    "thread x1": ("thread", 1),
    "thread x2": ("thread", 2),
    "process x2": ("process", 2),
    "in-RAM x2": ("ram", 2),
}


def _write_class(args: tuple[Path, int, int]) -> None:
    """Write ``n`` JPEGs of one class folder (seeded by the class index)."""
    from PIL import Image, ImageDraw

    folder, c, n = args
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(c)
    for i in range(n):
        w, h = int(rng.integers(300, 501)), int(rng.integers(250, 401))
        # separable colour waves (cheap to make) plus pixel noise: JPEGs of ImageNet-like entropy
        cols = 60 * np.sin(
            np.arange(w, dtype=np.float32)[:, None] / rng.uniform(10, 60, 3) + rng.uniform(0, 6, 3)
        )
        rows = 40 * np.cos(np.arange(h, dtype=np.float32)[:, None] / rng.uniform(10, 60, 3))
        base = rng.uniform(40, 215, 3).astype(np.float32) + rows[:, None, :] + cols[None, :, :]
        base += rng.integers(-12, 13, base.shape, dtype=np.int16)
        img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 60)), int(rng.integers(0, h - 60))
            box = (x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120)))
            draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        img.save(folder / f"img_{c:03d}_{i:05d}.JPEG", quality=90)


def make_dataset(root: Path, n_images: int) -> Path:
    """``root/train/<class>/*.JPEG`` (``n_images`` in all) and a 1-image-per-class ``val/``; made once."""
    done = root / "complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    per = [n_images // N_CLASSES + (c < n_images % N_CLASSES) for c in range(N_CLASSES)]
    jobs = [(root / "train" / f"n{c:08d}", c, per[c]) for c in range(N_CLASSES)]
    jobs += [(root / "val" / f"n{c:08d}", 1000 + c, 1) for c in range(N_CLASSES)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        list(ex.map(_write_class, jobs))
    done.write_text("")
    print(f"generated {n_images} JPEGs in {root} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return root


def _child(data: Path, size: int, pool: str, workers: int, cache: Path) -> dict:
    """One load in this (fresh) process: seconds, images, peak RSS of this process and of its pool."""
    from runners.datasets import cache as decoded
    from runners.datasets import imagefolder, load_disk_split

    spec = {"name": "bench", "kind": "imagefolder", "path": str(data), "image_size": size}
    t0 = time.perf_counter()
    if pool == "ram":  # the former design: decode into one array held in memory
        splits, _ = imagefolder.read(spec, data)
        paths = splits["train"][0]
        from concurrent.futures import ThreadPoolExecutor

        out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
        with ThreadPoolExecutor(workers) as ex:
            for i, arr in enumerate(ex.map(lambda p: decoded.decode_file(p, size), paths)):
                out[i] = arr
        n = len(out)
    else:
        if pool == "process":  # the loader with the process pool swapped in
            write = decoded.write_images
            decoded.write_images = lambda out, items, size, workers=None: write(
                out, items, size, workers, "process"
            )
        images, _ = load_disk_split(spec, "train", cache, workers=workers, log=None)
        n = len(images)
    seconds = time.perf_counter() - t0
    kib = 1024  # ru_maxrss is in KiB on Linux
    own, pool_ = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": seconds,
        "cpu_seconds": own.ru_utime + own.ru_stime + pool_.ru_utime + pool_.ru_stime,
        "images": n,
        "rss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
        "rss_pool_max": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib,
    }


def _load_in_subprocess(data: Path, size: int, pool: str, workers: int) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="bench_data_cache_"))
    try:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            pool,
            str(workers),
            "--data",
            str(data),
            "--size",
            str(size),
        ]
        cmd += ["--cache", str(cache)]
        out = subprocess.run(
            cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=20_000)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--data", type=Path, default=Path.home() / ".cache" / "study-bench")
    p.add_argument(
        "--settings", default=",".join(SETTINGS), help="comma-separated subset of: " + ", ".join(SETTINGS)
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.data, args.size, args.child[0], int(args.child[1]), args.cache)))
        return

    data = make_dataset(args.data / f"imagefolder_{args.images}", args.images)
    names = [s.strip() for s in args.settings.split(",")]
    data_bytes = args.images * args.size * args.size * 3
    print(
        f"decoded data: {args.images} images x {args.size}^2 x 3 = {data_bytes / 2**30:.2f} GiB; "
        f"cores usable: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names:
            res = _load_in_subprocess(data, args.size, *SETTINGS[name])
            res["peak"] = res["rss_self"] + (2 * res["rss_pool_max"] if SETTINGS[name][0] == "process" else 0)
            results[name].append(res)
            print(
                f"  round {r + 1} {name:10s} {res['images'] / res['seconds']:7.1f} images/s  "
                f"peak RSS {res['peak'] / 2**20:7.1f} MiB  CPU {1000 * res['cpu_seconds'] / res['images']:.1f} "
                f"ms/image ({res['cpu_seconds'] / res['seconds']:.2f} cores busy)",
                flush=True,
            )
    summary = {}
    for name in names:
        rate = statistics.median(x["images"] / x["seconds"] for x in results[name])
        peak = statistics.median(x["peak"] for x in results[name])
        summary[name] = {
            "images_per_s": rate,
            "peak_rss_bytes": peak,
            "peak_fraction_of_data": peak / data_bytes,
            "cores_busy": statistics.median(x["cpu_seconds"] / x["seconds"] for x in results[name]),
        }
    print(
        f"\n{'setting':12s} {'images/s':>9s} {'vs thread x1':>13s} {'peak RSS':>10s} {'of data':>8s} {'cores busy':>11s}"
    )
    base = summary.get("thread x1", {}).get("images_per_s")
    for name, s in summary.items():
        ratio = f"{s['images_per_s'] / base:.2f}x" if base else "-"
        print(
            f"{name:12s} {s['images_per_s']:9.1f} {ratio:>13s} {s['peak_rss_bytes'] / 2**20:7.0f} MiB "
            f"{100 * s['peak_fraction_of_data']:7.1f}% {s['cores_busy']:11.2f}"
        )
    if "thread x1" in summary and "thread x2" in summary:
        speedup = summary["thread x2"]["images_per_s"] / summary["thread x1"]["images_per_s"]
        frac = summary["thread x2"]["peak_fraction_of_data"]
        print(
            f"\nthread x2 / thread x1 = {speedup:.2f} (target >= 1.6); "
            f"peak RSS of the loader = {100 * frac:.1f}% of the data (target < 25%)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "images": args.images,
                    "size": args.size,
                    "data_bytes": data_bytes,
                    "summary": summary,
                    "rounds": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
