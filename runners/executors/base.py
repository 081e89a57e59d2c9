"""The executor interface every executor implements (:class:`Executor`, one method), the heap of jobs
an executor sends back to run again later (:class:`_SentBack`), and the worker-pool helpers the process
executors share (a worker's initializer, stopping a pool): the local, GPU, Ray and Slurm executors build
on them.
"""

from __future__ import annotations

import heapq
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Protocol

Requeue = Callable[[int, object, int], "float | None"]  # (job index, result, times sent back) -> delay


class Executor(Protocol):
    def map_jobs(
        self, fn: Callable, jobs: Sequence[tuple], requeue: Requeue | None = None
    ) -> Iterator[tuple[int, object, BaseException | None]]:
        """Call ``fn(*job)`` for every job; yield (job index, result or None, exception or None).

        ``requeue(index, result, times)``, called here as a job returns: a number of seconds sends the job
        again after that delay instead of yielding it (a run leased live elsewhere), holding no worker
        meanwhile; None yields it. An executor without it is driven by :func:`map_requeued`.
        """
        ...


class _SentBack:
    """The jobs ``requeue`` sent back, each due again after its delay (a heap by due time)."""

    def __init__(self, requeue: Requeue | None):
        self.requeue = requeue
        self.heap: list[tuple[float, int]] = []
        self.times: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.heap)

    def back(self, i: int, result: object) -> bool:
        """True when job ``i``'s ``result`` sends it back (it is then due after requeue's delay)."""
        delay = None if self.requeue is None else self.requeue(i, result, self.times.get(i, 0))
        if delay is None:
            return False
        self.times[i] = self.times.get(i, 0) + 1
        heapq.heappush(self.heap, (time.monotonic() + delay, i))
        return True

    def due(self) -> list[int]:
        """The jobs due now, taken off the heap."""
        now, out = time.monotonic(), []
        while self.heap and self.heap[0][0] <= now:
            out.append(heapq.heappop(self.heap)[1])
        return out

    def timeout(self) -> float | None:
        """Seconds until the next job is due (None: none sent back)."""
        return max(0.0, self.heap[0][0] - time.monotonic()) if self.heap else None


def _worker_init(parent: int) -> None:
    """In each worker process: ignore SIGINT (the calling process stops every worker at once), and exit
    when the calling process is gone (killed with SIGKILL, it cannot stop its workers itself)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="study-parent-watch", daemon=True).start()


def _stop_pool(pool: ProcessPoolExecutor, futures: dict[Future, int], workers: int) -> int:
    """Terminate every worker process, so no queued job starts; how many jobs were running.

    The pool then sees its workers gone and fails every job left (``BrokenProcessPool``); cancelling
    them first instead would race its own clean-up (Python 3.11 then raises in its manager thread).
    """
    running = min(workers, sum(f.running() for f in futures))
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public way to stop a worker
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    pool.shutdown(wait=True)
    return running
