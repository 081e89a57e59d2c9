"""The job a worker runs: one run source fills one run folder (a top-level function, so it pickles)."""

from __future__ import annotations

import multiprocessing as mp
import sys

from runners.sources import get_source


def _progress(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write per line: lines of parallel workers never interleave
    sys.stdout.flush()


def execute_run(run: dict, run_dir: str, data_dir: str) -> dict:
    # a bar only for a run in the main process on a terminal; spawned workers print plain lines
    bar = sys.stdout.isatty() and mp.current_process().name == "MainProcess"
    return get_source(run.get("source", "train")).fill(run, run_dir, data_dir, progress=_progress, bar=bar)


def execute_claimed_run(run: dict, run_dir: str, data_dir: str, leases: str, study: str = "") -> dict:
    """:func:`execute_run` under a lease in the store ``leases`` (``runners.leases``): a run finished or
    being filled by another worker is not filled again, so the job is safe to retry or to run twice."""
    from runners.leases import fill_once, open_lease_store

    return fill_once(
        open_lease_store(leases),
        run,
        run_dir,
        lambda: execute_run(run, run_dir, data_dir),
        log=_progress,
        study=study,
    )
