"""Idle cores at the end of a parallel study: N training runs on W one-thread workers, with and without
giving the last running jobs the cores of finished workers.

    PYTHONPATH=. python bench/executor.py [--runs 3] [--workers 2] [--epochs 4] [--n-train 4000]

With 4 runs on 3 workers (or any count that leaves a run alone at the end while others still train) the
static choice gives the last wave's runs the idle cores only at their start; rebalancing also gives them
the cores of workers that finish later. Prints each variant's wall time and the ratio (static / rebalanced), run
side by side in one process, in alternating order over ``--repeats``. Needs an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from runners.executors import ProcessExecutor
from runners.jobs import execute_run
from study.schema import parse_hypothesis
from study.stages import plan, prepare_data


def _design(epochs: int, n_train: int, runs: int) -> dict:
    return {
        "name": "bench_executor",
        "design": {
            "datasets": [{"name": "objects", "n_train": n_train, "n_test": 500, "image_size": 16}],
            "training": {"epochs": epochs, "batch_size": 128},
            "seeds": list(range(runs)),
            "probe": {"size": 128},
        },
        "claims": [
            {
                "name": "c",
                "kind": "compare",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "a": {"layers": ["block_01"]},
                "b": {"layers": ["block_02"]},
            }  # fmt: skip
        ],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    specs = plan(parse_hypothesis(_design(args.epochs, args.n_train, args.runs)))
    times: dict[str, list[float]] = {"static": [], "rebalanced": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare_data(specs, data, log=lambda _: None)
        for r in range(args.repeats):
            order = ("static", "rebalanced") if r % 2 == 0 else ("rebalanced", "static")
            for variant in order:
                runs = Path(tmp) / f"runs-{variant}-{r}"
                jobs = [(s.model_dump(), str(runs / s.key), str(data)) for s in specs]
                ex = ProcessExecutor(args.workers, threads=1, rebalance=variant == "rebalanced")
                t0 = time.perf_counter()
                for _, _, exc in ex.map_jobs(execute_run, jobs):
                    assert exc is None, exc
                times[variant].append(time.perf_counter() - t0)
    s, b = min(times["static"]), min(times["rebalanced"])
    print(
        f"{args.runs} runs x {args.epochs} epochs on {args.workers} one-thread workers (best of {args.repeats}):"
    )
    print(f"  static threads: {s:.1f} s   rebalanced: {b:.1f} s   ratio static/rebalanced: {s / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
