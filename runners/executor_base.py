"""The executor interface every executor implements (:class:`Executor`, one method) and the heap of jobs
an executor sends back to run again later (:class:`_SentBack`), shared by the local, Ray and Slurm
executors.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence
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
