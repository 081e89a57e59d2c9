"""Every GPU of a node: the local executor's worker processes, each pinned to one GPU.

    python -m study run FILE                       # G visible GPUs: G workers, one per GPU
    python -m study run FILE --runs-per-gpu 2      # two runs at once on every GPU (small models)
    python -m study run FILE --gpus 0,2,3          # only these GPUs (torch's numbering: cuda:0 first)

:func:`visible_gpus` is the one place the GPUs are found (tests replace it with a fake list).
:class:`GpuExecutor` runs each job in a spawned worker process whose ``CUDA_VISIBLE_DEVICES`` names its
one GPU, set by the worker's initializer before the job's code (and so torch) is imported there; one
process pool per GPU of ``runs_per_gpu`` workers, and a job goes to the GPU with the fewest runs going
(the first such GPU), so the GPUs share the runs whatever their lengths. The device never enters a run's
spec or key: a run trained on GPU 3 is the run trained on GPU 0 (``runners.executors.local`` hands every job
the same arguments).

A job that runs out of device memory (``torch.cuda.OutOfMemoryError``) fails with
:class:`GpuOutOfMemory`, one line naming the GPU and K, and its worker goes on with the next runs; a worker
process that dies fails only the runs it held, and a fresh one takes its GPU's next runs.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitstudy_core.errors import StudyError

if TYPE_CHECKING:
    from runners.executors.base import Requeue

GPUS = "gpus"  # the local executor's options (``ExecutorOptions.options``): ``--gpus``
RUNS_PER_GPU = "runs_per_gpu"  # and ``--runs-per-gpu``


def visible_gpus() -> list[str]:
    """The GPUs this process sees, in torch's order (``cuda:0`` first), each as the value that makes it
    a worker's only device (its entry of an existing ``CUDA_VISIBLE_DEVICES``, else its index); empty
    without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()  # counts only what CUDA_VISIBLE_DEVICES leaves visible
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(n)]
    return [part.strip() for part in given.split(",") if part.strip()][:n]


class GpuOutOfMemory(RuntimeError):
    """A run ran out of device memory on its GPU (the run fails; the other runs go on)."""

    def __init__(self, gpu: int, per_gpu: int):
        hint = (
            f"try --runs-per-gpu {max(1, per_gpu // 2)}"
            if per_gpu > 1
            else "the run does not fit on one GPU alone (a smaller batch_size or model)"
        )
        super().__init__(f"ran out of memory on GPU {gpu} with --runs-per-gpu {per_gpu}: {hint}")
        self.gpu, self.per_gpu = gpu, per_gpu

    def __reduce__(
        self,
    ) -> tuple[type, tuple[int, int]]:  # raised in a worker, re-raised in the calling process
        return (type(self), (self.gpu, self.per_gpu))


def parse_gpus(text: str) -> list[int]:
    """``--gpus 0,2,3`` as indices; a one-line ``StudyError`` for anything but distinct integers >= 0."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() for p in parts):
        raise StudyError(f"--gpus: expected GPU numbers separated by commas (0,2,3), got {text!r}")
    gpus = [int(p) for p in parts]
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise StudyError(f"--gpus: GPU {', '.join(map(str, twice))} given more than once in {text!r}")
    return gpus


def parse_runs_per_gpu(text: str | int) -> int:
    """``--runs-per-gpu K`` as an integer >= 1 (one line otherwise)."""
    value = str(text).strip()
    if not value.isdigit() or int(value) < 1:
        raise StudyError(f"--runs-per-gpu: expected a positive integer, got {text!r}")
    return int(value)


def select_gpus(options: Mapping[str, str], visible: Sequence[str]) -> tuple[list[int], int]:
    """(the GPUs to use, runs per GPU) from ``--gpus`` / ``--runs-per-gpu`` against the ``visible``
    ones (:func:`visible_gpus`); one line when a GPU asked for is not visible."""
    k = parse_runs_per_gpu(options.get(RUNS_PER_GPU, "1"))
    if GPUS not in options:
        if RUNS_PER_GPU in options and not visible:
            raise StudyError(
                "--runs-per-gpu: this host has no visible GPU (torch.cuda.is_available() is False)"
            )
        return list(range(len(visible))), k
    gpus = parse_gpus(options[GPUS])
    missing = [g for g in gpus if g >= len(visible)]
    if missing:
        seen = f"GPUs 0-{len(visible) - 1}" if visible else "no GPU"
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={env})" if env is not None else ""
        raise StudyError(
            f"--gpus: GPU {', '.join(map(str, missing))} is not visible; this host sees {seen}{where}"
        )
    return gpus, k


def check_options(options: Mapping[str, str]) -> None:
    """The local executor's check before anything is written: ``--gpus`` / ``--runs-per-gpu`` valid and
    their GPUs visible. Without them nothing is looked up (torch is not imported)."""
    if GPUS in options or RUNS_PER_GPU in options:
        select_gpus(options, visible_gpus())


def from_options(workers: int | str, n_jobs: int, options: Mapping[str, str]) -> GpuExecutor | None:
    """The pinned executor for the local executor's options, or None where it keeps its own (no visible
    GPU, or one worker on ``cuda:0``: one in-process worker, as always).

    ``workers='auto'``: runs per GPU x the GPUs; an integer N: N workers over the GPUs (then
    ``--runs-per-gpu`` is not given). Never more workers than ``n_jobs``.
    """
    visible = visible_gpus()
    gpus, k = select_gpus(options, visible)
    if not gpus:
        return None
    if workers == "auto":
        slots = len(gpus) * k
    elif RUNS_PER_GPU in options:
        raise StudyError(f"--runs-per-gpu: give it with --workers auto, not --workers {workers}")
    else:
        slots, k = int(workers), math.ceil(int(workers) / len(gpus))
    slots = max(1, min(slots, n_jobs))
    if slots == 1 and gpus[0] == 0:
        return None
    threads = max(1, (os.cpu_count() or 1) // slots)
    return GpuExecutor([(g, visible[g]) for g in gpus], k, slots, threads)


def _pin(device: str, threads: int, parent: int) -> None:
    """A worker's initializer: its one GPU, before the job's code (and torch) is imported here."""
    from runners.executors.base import _worker_init

    loaded = sys.modules.get("torch")
    if loaded is not None and loaded.cuda.is_initialized():  # too late to pin: never train on another GPU
        raise RuntimeError("CUDA was initialised in a GPU worker before its device was set")
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)  # read as torch loads
    _worker_init(parent)


def _pinned_call(gpu: int, per_gpu: int, threads: int, fn: Callable, *job: object) -> object:
    """``fn(*job)`` in a pinned worker; device out-of-memory becomes :class:`GpuOutOfMemory`."""
    torch = sys.modules.get("torch")  # loaded when the job's module needs it: a job without it never pays
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        return fn(*job)
    except Exception as exc:
        loaded = sys.modules.get("torch")
        oom = getattr(getattr(loaded, "cuda", None), "OutOfMemoryError", None)
        if loaded is None or oom is None or not isinstance(exc, oom):
            raise
        loaded.cuda.empty_cache()  # the next run on this GPU starts with its memory free
        raise GpuOutOfMemory(gpu, per_gpu) from None


@dataclass
class GpuUsage:
    """One GPU's share of a study: runs ended there and the wall time with at least one run going."""

    runs: int = 0
    busy_s: float = 0.0
    going: int = 0
    since: float = 0.0

    def start(self, now: float) -> None:
        if self.going == 0:
            self.since = now
        self.going += 1

    def end(self, now: float, counted: bool) -> None:
        self.going -= 1
        self.runs += int(counted)
        if self.going == 0:
            self.busy_s += now - self.since


class GpuExecutor:
    """Runs jobs in worker processes pinned to GPUs: ``per_gpu`` workers per GPU, ``slots`` in all.

    Args:
        devices: (GPU number as torch numbers it here, its ``CUDA_VISIBLE_DEVICES`` value) per GPU used.
        per_gpu: most jobs at once on one GPU (``--runs-per-gpu``).
        slots: most jobs at once in all.
        threads: torch CPU threads of each worker (the host's cores over the slots; CPU threads do not
            enter the GPU's arithmetic).
    """

    requeues = True

    def __init__(self, devices: Sequence[tuple[int, str]], per_gpu: int, slots: int, threads: int = 1):
        self.devices, self.per_gpu, self.slots, self.threads = list(devices), per_gpu, slots, threads
        self.usage = {gpu: GpuUsage() for gpu, _ in self.devices}
        self.stopped = 0

    def _pool(self, device: str) -> ProcessPoolExecutor:
        ctx = mp.get_context("spawn")  # a forked child would inherit the parent's CUDA state
        return ProcessPoolExecutor(
            self.per_gpu, mp_context=ctx, initializer=_pin, initargs=(device, self.threads, os.getpid())
        )

    def map_jobs(
        self, fn: Callable, jobs: Sequence[tuple], requeue: Requeue | None = None
    ) -> Iterator[tuple[int, object, BaseException | None]]:
        from runners.executors.base import _SentBack, _stop_pool

        pools = {gpu: self._pool(device) for gpu, device in self.devices}
        going: dict[Future, tuple[int, int, ProcessPoolExecutor]] = {}  # future -> (job, GPU, its pool)
        ready, back, ended = list(range(len(jobs))), _SentBack(requeue), False
        ready.reverse()  # popped from the end: job 0 first

        def free_gpu() -> int | None:
            if len(going) >= self.slots:
                return None
            load = {gpu: 0 for gpu, _ in self.devices}
            for _, gpu, _ in going.values():
                load[gpu] += 1
            gpu = min(load, key=lambda g: (load[g], list(load).index(g)))
            return gpu if load[gpu] < self.per_gpu else None

        def renew(gpu: int, broken: ProcessPoolExecutor) -> None:
            """A worker of ``broken`` died (its pool fails every job it held): a fresh pool for the GPU."""
            if pools[gpu] is broken:
                broken.shutdown(wait=False)
                pools[gpu] = self._pool(dict(self.devices)[gpu])

        def submit(i: int, gpu: int) -> None:
            call = (_pinned_call, gpu, self.per_gpu, self.threads, fn, *jobs[i])
            try:
                fut = pools[gpu].submit(*call)
            except BrokenProcessPool:  # it broke since its last job ended: the job goes to a fresh one
                renew(gpu, pools[gpu])
                fut = pools[gpu].submit(*call)
            going[fut] = (i, gpu, pools[gpu])
            self.usage[gpu].start(time.monotonic())

        try:
            while ready or going or back:
                gpu = free_gpu()
                while ready and gpu is not None:
                    submit(ready.pop(), gpu)
                    gpu = free_gpu()
                if going:
                    done, _ = wait(list(going), timeout=back.timeout(), return_when=FIRST_COMPLETED)
                else:  # only jobs sent back
                    done = set()
                    time.sleep(back.timeout() or 0.0)
                for fut in done:
                    i, gpu, pool = going.pop(fut)
                    exc = fut.exception()
                    sent_back = exc is None and back.back(i, fut.result())
                    self.usage[gpu].end(time.monotonic(), counted=not sent_back)
                    if sent_back:
                        continue
                    if isinstance(exc, BrokenProcessPool):
                        renew(gpu, pool)
                    yield i, (None if exc else fut.result()), exc
                ready.extend(reversed(back.due()))
            ended = True
        finally:
            # interrupted, or closed early by the caller: no queued job starts and no worker goes on
            for gpu, pool in pools.items():
                if ended:
                    pool.shutdown(wait=True)
                else:
                    held = {f: i for f, (i, g, _) in going.items() if g == gpu}
                    self.stopped += _stop_pool(pool, held, self.per_gpu)

    def summary_lines(self) -> list[str]:
        """One line per GPU: its runs and busy time (the end-of-study summary)."""
        return [
            f"GPU {gpu} (CUDA_VISIBLE_DEVICES={device}): {self.usage[gpu].runs} runs, "
            f"busy {_duration(self.usage[gpu].busy_s)}"
            for gpu, device in self.devices
        ]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"
