"""The ``--gpus`` and ``--runs-per-gpu`` flags of ``run`` and ``sweep``, read into the local executor's options.

    python -m study run FILE --runs-per-gpu 2 --gpus 0,2,3

``runners.executors.gpu_workers`` reads the options (``gpus``, ``runs_per_gpu``) and checks the GPUs are visible
before anything is written; here only their form is checked (no torch import).
"""

from __future__ import annotations

import argparse

from runners.executors.gpu_workers import GPUS, RUNS_PER_GPU, parse_gpus, parse_runs_per_gpu
from vitstudy_core.errors import StudyError

# the one line for these flags given with another executor (study.cluster.executor_flags)
MISPLACED = "--gpus / --runs-per-gpu: these flags are for --executor {name} (one host's GPUs)"


def add_flags(p: argparse.ArgumentParser) -> None:
    """The local executor's own flags (``ExecutorKind.flags`` of ``local``)."""
    p.add_argument(
        "--gpus",
        default=None,
        help="the GPUs the local executor trains on, as torch numbers them (0,2,3; default: every visible one)",
    )
    p.add_argument(
        "--runs-per-gpu",
        default=None,
        metavar="K",
        help="runs at once on each GPU with --workers auto (default 1; 2+ for models that leave a GPU idle)",
    )


def read_flags(args: argparse.Namespace) -> dict[str, str]:
    """The ``--gpus`` / ``--runs-per-gpu`` given, as the executor's options; bad ones are one line."""
    opts: dict[str, str] = {}
    if args.gpus is not None:
        opts[GPUS] = ",".join(map(str, parse_gpus(args.gpus)))
    if args.runs_per_gpu is not None:
        opts[RUNS_PER_GPU] = str(parse_runs_per_gpu(args.runs_per_gpu))
        if str(args.workers) != "auto":
            raise StudyError(f"--runs-per-gpu: give it with --workers auto, not --workers {args.workers}")
    return opts
