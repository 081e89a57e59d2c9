"""``python -m study`` as if on another host, for the two-host tests on one machine (issue 28, case 7).

    python tests/pose_as.py HOST [--hold FILE] [--meet DIR N] sweep|run FILE --out DIR ...

Every host identity the study records (a sweep trial's owner, a run lease's owner, the MLflow parent
run's ``study.host``) comes from ``socket.gethostname``, which this replaces by ``HOST``; with
``--workers 1`` the runs train in this process, so they pose too. ``--hold FILE``: the sweep driver asks
its trials (they are RUNNING, with heartbeats) and waits until ``FILE`` exists before it runs them, so a
test can start a second driver while this one is alive. ``--meet DIR N``: before its first run trains (so
after it looked in the tracking store for runs it can reuse), the invocation writes a file into ``DIR``
and waits until ``N`` invocations have (at most 10 minutes), so a test can have several invocations that
all triaged their runs before any of them finished one.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path


def _held(run_batch, hold: Path):
    def held(*args, **kwargs):
        while not hold.exists():
            time.sleep(0.2)
        return run_batch(*args, **kwargs)

    return held


def _meeting(fill, folder: Path, n: int):
    met = []

    def meet_first(*args, **kwargs):
        if not met:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 600
            while len(list(folder.iterdir())) < n and time.monotonic() < deadline:
                time.sleep(0.2)
            met.append(True)
        return fill(*args, **kwargs)

    return meet_first


def main(argv: list[str]) -> int:
    host, rest = argv[0], argv[1:]
    socket.gethostname = lambda: host
    if rest[:1] == ["--hold"]:
        from study.sweep import loop as sweep

        sweep._run_batch = _held(sweep._run_batch, Path(rest[1]))
        rest = rest[2:]
    if rest[:1] == ["--meet"]:  # each run's job (runners.executors.jobs, in this process with --workers 1)
        import runners.executors.jobs

        runners.executors.jobs.execute_claimed_run = _meeting(
            runners.executors.jobs.execute_claimed_run, Path(rest[1]), int(rest[2])
        )
        rest = rest[3:]
    from study.cli import main as study_main

    return study_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
