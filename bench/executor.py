"""Idle cores at the end of a parallel study: N training runs on W one-thread workers, three ways.

    PYTHONPATH=. python bench/executor.py [--runs 3] [--workers 2] [--epochs 4] [--n-train 4000]
    PYTHONPATH=. python bench/executor.py --hypothesis hypotheses/u_shape.yaml   # the default study's runs

* ``fixed`` (the default): every run keeps one thread, so a run left alone at the end leaves cores idle,
  and its numbers do not depend on which other runs are pending;
* ``tail`` (opt-in, ``ProcessExecutor(share_tail=True)``): the runs of the last, partial wave get the idle workers' threads from their
  start (chosen by job index, so the numbers do not depend on timing);
* ``rebalanced`` (opt-in, ``ProcessExecutor(rebalance=True)``): the runs still going also get the cores
  of workers that finish later, adopted at each epoch.

Prints each variant's wall time and its ratio to ``fixed``, run side by side in one process, in rotating
order over ``--repeats`` (best of the repeats). With ``--hypothesis`` the runs are that file's planned
runs, trained into fresh folders. Needs an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from runners.executors.jobs import execute_run
from runners.executors.local import ProcessExecutor
from study.pipeline.stages import prepare_data
from study.pipeline.triage import plan
from study.schema import load_hypothesis, parse_hypothesis

VARIANTS = {  # ProcessExecutor settings of each variant
    "fixed": {"share_tail": False},
    "tail": {"share_tail": True},
    "rebalanced": {"rebalance": True},
}


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
    ap.add_argument("--hypothesis", type=Path, default=None, help="train this file's planned runs instead")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS)
    )
    args = ap.parse_args(argv)
    if args.hypothesis:
        hyp = load_hypothesis(args.hypothesis)
        what = f"{args.hypothesis}: {len(plan(hyp))} runs x {hyp.design.training.epochs} epochs"
    else:
        hyp = parse_hypothesis(_design(args.epochs, args.n_train, args.runs))
        what = f"{args.runs} runs x {args.epochs} epochs"
    specs = plan(hyp)
    variants = [v.strip() for v in args.variants.split(",")]
    times: dict[str, list[float]] = {v: [] for v in variants}
    print(f"{what} on {args.workers} one-thread workers; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare_data(specs, data, log=lambda _: None)
        for r in range(args.repeats):
            for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
                runs = Path(tmp) / f"runs-{variant}-{r}"
                jobs = [(s.model_dump(), str(runs / s.key), str(data)) for s in specs]
                ex = ProcessExecutor(args.workers, threads=1, **VARIANTS[variant])
                t0, ends = time.perf_counter(), []
                for i, _, exc in ex.map_jobs(execute_run, jobs):
                    assert exc is None, exc
                    ends.append(f"{i}@{time.perf_counter() - t0:.0f}s")
                times[variant].append(time.perf_counter() - t0)
                print(
                    f"  round {r + 1} {variant:<10} {times[variant][-1]:7.1f} s  (runs ended: {' '.join(ends)})",
                    flush=True,
                )
    base = min(times[variants[0]])
    print(f"best of {args.repeats}:")
    for v in variants:
        print(f"  {v:<10} {min(times[v]):7.1f} s   {variants[0]}/{v}: {base / min(times[v]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
