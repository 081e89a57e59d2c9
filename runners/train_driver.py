"""One training run from a spec file in a process of its own, optionally paused mid-epoch to be killed.

    python -m runners.train_driver SPEC.json RUN_DIR DATA_DIR          # train_run, progress on stdout
    PAUSE=2:1 python -m runners.train_driver SPEC.json RUN_DIR DATA_DIR

With ``PAUSE=EPOCH:STEP`` it prints ``MIDEPOCH`` after that step's optimiser update and sleeps, so a
test (``tests/training/test_train.py``) or the GPU check (``bench/gpu_check.py``, step ``resume``) can SIGKILL it
at a known point in the middle of an epoch, then run the same command again and compare the resumed run
with an uninterrupted one. :func:`start` launches it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parent.parent
PAUSE_ENV = "PAUSE"


def start(
    spec_file: Path, run_dir: Path, data_dir: Path, pause: str | None = None, stderr: int | None = None
) -> subprocess.Popen:
    """Launch the driver on ``spec_file`` (a ``RunSpec`` dict as JSON); stdout (text) is a pipe.

    Args:
        pause: ``"EPOCH:STEP"`` to pause there (see the module docstring); None runs to the end.
        stderr: where the child's stderr goes (default: a pipe of its own; ``subprocess.STDOUT``: stdout).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV] = pause
    cmd = [sys.executable, "-m", "runners.train_driver", str(spec_file), str(run_dir), str(data_dir)]
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
        text=True,
    )


def _pausing_progress(epoch_at: int, step_at: int) -> Callable:
    """A stand-in for ``runners.train._epoch_progress`` whose tick stops the process at (epoch, step)."""

    @contextlib.contextmanager
    def progress(label: str, epoch: int, epochs: int, steps: int, bar: bool) -> Iterator[Callable]:
        def tick(step: int, loss: float | torch.Tensor, n: int) -> None:
            if (epoch, step) == (epoch_at, step_at):
                print("MIDEPOCH", flush=True)
                time.sleep(3600)  # until killed

        yield tick

    return progress


def main(argv: list[str]) -> int:
    import runners.train as T

    spec_file, run_dir, data_dir = argv
    spec = json.loads(Path(spec_file).read_text())
    pause = os.environ.get(PAUSE_ENV)
    if pause:
        T._epoch_progress = _pausing_progress(*map(int, pause.split(":")))
    T.train_run(spec, run_dir, data_dir, progress=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
