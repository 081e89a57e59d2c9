"""The job a worker runs: one training run in its own folder (a top-level function, so it pickles)."""

from __future__ import annotations

import sys

from runners.train import train_run


def _progress(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write per line: lines of parallel workers never interleave
    sys.stdout.flush()


def execute_run(run: dict, run_dir: str, data_dir: str) -> dict:
    return train_run(run, run_dir, data_dir, progress=_progress)
