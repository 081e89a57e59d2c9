"""Executors run training jobs; one small interface, local and Ray implementations, registered by name.

    executor = EXECUTORS.get("local").make(ExecutorOptions(workers="auto", n_jobs=12, cuda=False))
    for index, result, error in executor.map_jobs(fn, jobs): ...

``--executor NAME`` (``study.cli``) and ``study.stages.Placement`` accept every name in :data:`EXECUTORS`;
adding an executor is one class and one ``EXECUTORS.register(NAME, ExecutorKind(...))`` here plus its test
(``tests/test_executors.py`` runs its shared contract over every entry).

An executor takes a picklable job function and a list of job argument tuples and yields
``(index, result, error)`` as jobs finish. ``InlineExecutor`` runs in this process (tests, GPU);
``ProcessExecutor`` runs jobs in spawned worker processes, each with a number of torch threads (on 2 CPU
cores, two 1-thread processes nearly double throughput on small images); the jobs of the last, partial
wave get the idle workers' threads from their start. With ``rebalance=True`` the cores of workers that
finish also go to the jobs still running: each job reads its thread budget from a small file
(``THREADS_FILE_ENV`` names it) that the executor rewrites, and a training run adopts it at the start of
each epoch (:func:`adopt_thread_budget`). That is off by default because it makes a run's thread count,
and so its float rounding, depend on timing.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vitstudy_core.registry import Registry

THREADS_FILE_ENV = "STUDY_THREADS_FILE"  # per job: the file holding its current torch thread budget


class Executor(Protocol):
    def map_jobs(
        self, fn: Callable, jobs: Sequence[tuple]
    ) -> Iterator[tuple[int, object, BaseException | None]]:
        """Call ``fn(*job)`` for every job; yield (job index, result or None, exception or None)."""
        ...


def _call_with_threads(threads: int, budget_file: str, fn: Callable, *job) -> object:
    import torch

    os.environ[THREADS_FILE_ENV] = budget_file
    torch.set_num_threads(threads)
    return fn(*job)


def adopt_thread_budget() -> int | None:
    """Set torch's thread count to this job's current budget (see the module docstring); returns it, or
    None outside a ProcessExecutor job or when the budget cannot be read."""
    path = os.environ.get(THREADS_FILE_ENV)
    if not path:
        return None
    try:
        threads = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
    import torch

    if threads >= 1 and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return threads


class InlineExecutor:
    """Runs jobs one after another in the calling process."""

    def map_jobs(self, fn, jobs):
        for i, job in enumerate(jobs):
            try:
                yield i, fn(*job), None
            except Exception as exc:  # noqa: BLE001 - reported per job, the study goes on
                yield i, None, exc


class ProcessExecutor:
    """Runs jobs in ``workers`` spawned processes with ``threads`` torch threads each.

    The jobs of the last, partial wave get the idle workers' threads from their start: a deterministic
    choice (by job index), so a study gives the same numbers every time. ``rebalance=True`` also gives a
    job the cores of workers that finish while it runs (its budget is adopted at each epoch): faster, but a
    run's thread count then depends on timing, and float reductions differ with the thread count, so its
    results are no longer reproducible bit for bit. Off by default. ``share_tail=False`` keeps every job
    at ``threads`` (the baseline that ``bench/executor.py`` compares against).
    """

    def __init__(self, workers: int, threads: int = 1, rebalance: bool = False, share_tail: bool = True):
        self.workers, self.threads, self.rebalance, self.share_tail = workers, threads, rebalance, share_tail

    def map_jobs(self, fn, jobs):
        ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        n = len(jobs)
        tail = n % self.workers if self.share_tail else 0  # the last, partial wave gets the idle threads too
        cores = self.workers * self.threads
        with (
            tempfile.TemporaryDirectory(prefix="study-threads-") as tmp,
            ProcessPoolExecutor(self.workers, mp_context=ctx) as pool,
        ):
            budget = [Path(tmp) / f"job{i}" for i in range(n)]
            futures = {}
            for i, job in enumerate(jobs):
                threads = max(1, cores // tail) if tail and i >= n - tail else self.threads
                budget[i].write_text(str(threads))
                futures[pool.submit(_call_with_threads, threads, str(budget[i]), fn, *job)] = i
            pending = set(futures.values())
            for fut in as_completed(futures):
                i = futures[fut]
                pending.discard(i)
                if self.rebalance and 0 < len(pending) < self.workers:  # nothing waits: share the cores
                    for j in pending:
                        budget[j].write_text(str(max(1, cores // len(pending))))
                exc = fut.exception()
                yield i, (None if exc else fut.result()), exc


def _ray_call(fn: Callable, *job) -> object:
    """Runs on a Ray worker: Ray sets OMP_NUM_THREADS to the task's CPUs; torch follows it."""
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads >= 1:
        torch.set_num_threads(threads)
    return fn(*job)


class RayExecutor:
    """Runs each job as a Ray task on a running cluster (``ray`` is imported only here).

    Args:
        address: the cluster (``auto``: the one this host belongs to; ``HOST:6379``; ``ray://HOST:10001``).
        num_cpus, num_gpus: what each task requests; Ray places it on a node that has them free.
        max_retries: how often Ray re-runs a task whose worker process or node died (Ray's default is 3;
            set here on purpose). Application errors are not retried: they are reported per job. A job
            must be idempotent (``runners.leases.fill_once``): a retry, or Ray re-running a finished
            task whose result object was lost, finds its run claimed or finished and does nothing twice.
    """

    def __init__(self, address: str = "auto", num_cpus: float = 1, num_gpus: float = 0, max_retries: int = 3):
        self.address, self.num_cpus, self.num_gpus, self.max_retries = (
            address,
            num_cpus,
            num_gpus,
            max_retries,
        )

    def map_jobs(self, fn, jobs):
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=True, configure_logging=False)
        task = ray.remote(
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            max_retries=self.max_retries,
            retry_exceptions=False,
        )(_ray_call)
        index = {task.remote(fn, *job): i for i, job in enumerate(jobs)}
        pending = list(index)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                yield index[ref], ray.get(ref), None
            except ray.exceptions.RayTaskError as exc:  # the job's own exception, as its own type
                yield index[ref], None, exc.as_instanceof_cause()
            except Exception as exc:  # noqa: BLE001 - a worker lost beyond its retries: reported per job
                yield index[ref], None, exc


@dataclass(frozen=True)
class ExecutorOptions:
    """What the command line says about where runs execute (``study.stages.Placement`` plus the plan).

    Attributes:
        workers: local worker processes (``"auto"``: one per core on CPU, one in-process on a GPU).
        n_jobs: how many jobs there are (no more workers than jobs).
        cuda: whether this host trains on a GPU.
        address: a cluster's address (``auto``: the one this host belongs to).
        cpus_per_run, gpus_per_run: what each job asks a cluster for.
    """

    workers: int | str = "auto"
    n_jobs: int = 1
    cuda: bool = False
    address: str = "auto"
    cpus_per_run: float = 1
    gpus_per_run: float = 0


@dataclass(frozen=True)
class ExecutorKind:
    """A registered executor: ``make(options) -> Executor``.

    Attributes:
        make: builds the executor from the command line's options.
        needs_cluster: it runs jobs on a cluster at ``options.address`` (the shared contract test gets
            one from the pytest fixture ``<name>_address``).
        summary: one line for ``--help``.
    """

    make: Callable[[ExecutorOptions], Executor]
    needs_cluster: bool = False
    summary: str = ""


def _local(opts: ExecutorOptions) -> Executor:
    """``workers='auto'`` is one in-process worker on a GPU; on CPU one process per core, 1 thread each."""
    cores = os.cpu_count() or 1
    workers = opts.workers
    if workers == "auto":
        workers = 1 if opts.cuda else min(opts.n_jobs, cores)
    workers = max(1, int(workers))
    if workers == 1 or opts.n_jobs <= 1:
        return InlineExecutor()
    return ProcessExecutor(workers, threads=max(1, cores // workers))


def _ray(opts: ExecutorOptions) -> Executor:
    return RayExecutor(opts.address, num_cpus=opts.cpus_per_run, num_gpus=opts.gpus_per_run)


EXECUTORS: Registry[ExecutorKind] = Registry("executor")
EXECUTORS.register("local", ExecutorKind(_local, summary="processes on this host"))
EXECUTORS.register("ray", ExecutorKind(_ray, needs_cluster=True, summary="tasks on a Ray cluster"))


def make_executor(
    workers: int | str,
    n_jobs: int,
    cuda: bool,
    kind: str = "local",
    address: str = "auto",
    cpus_per_run: float = 1,
    gpus_per_run: float = 0,
) -> Executor:
    """The executor registered as ``kind`` (:data:`EXECUTORS`), built from these options.

    ``kind='ray'``: a :class:`RayExecutor` on ``address`` (each run asks for ``cpus_per_run`` CPUs and
    ``gpus_per_run`` GPUs). ``'local'``: ``workers='auto'`` is one in-process worker on a GPU; on CPU one
    process per core, 1 thread each. An unknown ``kind`` is a one-line ``StudyError`` naming the known ones.
    """
    opts = ExecutorOptions(workers, n_jobs, cuda, address, cpus_per_run, gpus_per_run)
    return EXECUTORS.get(kind).make(opts)
