"""Executors run training jobs; one small interface, local, Ray and Slurm implementations, registered by name.

    executor = EXECUTORS.get("local").make(ExecutorOptions(workers="auto", n_jobs=12, cuda=False))
    for index, result, error in executor.map_jobs(fn, jobs): ...

``--executor NAME`` (``study.cli.verbs``) and ``study.pipeline.stages.Placement`` accept every name in :data:`EXECUTORS`;
adding an executor is one class and one ``EXECUTORS.register(NAME, ExecutorKind(...))`` here plus its test
(``tests/scale_out/test_executors.py`` runs its shared contract over every entry).

An executor takes a picklable job function and a list of job argument tuples and yields
``(index, result, error)`` as jobs finish. ``InlineExecutor`` runs in this process (tests, one GPU);
``runners.executors.gpu_workers``' ``GpuExecutor`` one spawned worker per GPU of the host (or K per GPU);
``ProcessExecutor`` runs jobs in spawned worker processes (on 2 CPU cores, two 1-thread processes nearly
double throughput on small images); ``RayExecutor`` runs them as Ray tasks, and ``runners.executors.slurm``'s
``SlurmExecutor`` as tasks of Slurm job arrays.

A run's torch thread count is fixed by the host and ``--workers`` alone (:func:`run_threads`: the cores
divided by the workers asked for; ``auto`` is one worker per core, so one thread), never by how many
runs are still to do: float reductions differ with the thread count, so a run resumed beside other
pending runs, or alone, gives the same numbers bit for bit as one trained in an undisturbed study. Two
opt-ins trade that for speed: ``share_tail=True`` gives the jobs of the last, partial wave the idle
workers' threads from their start, and ``rebalance=True`` also gives the jobs still running the cores of
workers that finish (each job reads its budget from a small file, ``THREADS_FILE_ENV``, that the executor
rewrites, adopted at each epoch: :func:`adopt_thread_budget`).

Stopping: Ctrl-C or SIGTERM in the calling process (a ``KeyboardInterrupt`` there) stops the workers at
once (terminated: a run resumes from its last complete epoch) and starts no queued job; the executor's
``stopped`` then says how many jobs were running. Workers ignore SIGINT (the caller decides, for all of
them) and exit on their own when the calling process is gone (a ``kill -9`` of it leaves none behind).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from runners.executors.base import Executor, Requeue, _SentBack, _stop_pool, _worker_init
from vitstudy_core.registry import Registry

THREADS_FILE_ENV = "STUDY_THREADS_FILE"  # per job: the file holding its current torch thread budget


def map_requeued(
    executor: Executor, fn: Callable, jobs: Sequence[tuple], requeue: Requeue
) -> Iterator[tuple[int, object, BaseException | None]]:
    """``executor.map_jobs(fn, jobs, requeue=requeue)``; an executor that does not take ``requeue`` (a
    plug-in's) runs the jobs sent back in further rounds of ``map_jobs``, each after its delay."""
    if getattr(executor, "requeues", False):
        yield from executor.map_jobs(fn, jobs, requeue=requeue)
        return
    back, todo = _SentBack(requeue), list(range(len(jobs)))
    while todo:
        for j, result, exc in executor.map_jobs(fn, [jobs[i] for i in todo]):
            if exc is not None or not back.back(todo[j], result):
                yield todo[j], result, exc
        if back:
            time.sleep(back.timeout() or 0.0)
        todo = back.due()


def run_threads(workers: int | str, cores: int, cuda: bool = False) -> int | None:
    """The torch thread count of every local run: ``cores // workers`` (``auto``: one worker per core, so 1),
    whatever else is pending; None on a GPU with ``auto`` (one in-process worker keeps torch's default:
    the CPU threads do not enter the GPU's arithmetic).

    Args:
        workers: ``--workers`` (``auto`` or a positive integer), as asked, not as many as there are jobs.
        cores: the host's CPU cores.
        cuda: this host trains on a GPU.
    """
    if workers == "auto":
        return None if cuda else 1
    return max(1, cores // max(1, int(workers)))


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
    """Runs jobs one after another in the calling process, each with ``threads`` torch threads (None: as
    the process has them); the process's thread count is restored after each job."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.stopped = 0

    requeues = True

    def map_jobs(self, fn, jobs, requeue=None):
        back, ready = _SentBack(requeue), deque(range(len(jobs)))
        while ready or back:
            if not ready:  # only jobs sent back: the calling process waits, it holds nothing else
                time.sleep(back.timeout() or 0.0)
                ready.extend(back.due())
                continue
            i = ready.popleft()
            try:
                result = self._call(fn, jobs[i])
            except KeyboardInterrupt:
                self.stopped = 1
                raise
            except Exception as exc:  # noqa: BLE001 - reported per job, the study goes on
                yield i, None, exc
                continue
            if not back.back(i, result):
                yield i, result, None
            ready.extend(back.due())

    def _call(self, fn: Callable, job: tuple) -> object:
        if self.threads is None:
            return fn(*job)
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return fn(*job)
        finally:
            torch.set_num_threads(before)


class ProcessExecutor:
    """Runs jobs in ``workers`` spawned processes with ``threads`` torch threads each (see the module
    docstring: the thread count does not depend on how many jobs there are).

    ``share_tail=True`` gives the jobs of the last, partial wave the idle workers' threads from their start
    (by job index: the same every time for the same jobs, but a job's thread count then depends on which
    other jobs are pending, so a resumed run may differ bit for bit); ``rebalance=True`` also gives a job
    the cores of workers that finish while it runs (adopted at each epoch: its thread count then depends on
    timing). Both off by default; ``bench/executor.py`` measures what they buy.
    """

    def __init__(self, workers: int, threads: int = 1, rebalance: bool = False, share_tail: bool = False):
        self.workers, self.threads, self.rebalance, self.share_tail = workers, threads, rebalance, share_tail
        self.stopped = 0

    requeues = True

    def map_jobs(self, fn, jobs, requeue=None):
        ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        n = len(jobs)
        tail = n % self.workers if self.share_tail else 0  # the last, partial wave gets the idle threads too
        cores = self.workers * self.threads
        with tempfile.TemporaryDirectory(prefix="study-threads-") as tmp:
            pool = ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
            )
            futures: dict[Future, int] = {}  # the jobs submitted and not yet seen back
            ended = False
            try:
                budget = [Path(tmp) / f"job{i}" for i in range(n)]
                threads = [
                    max(1, cores // tail) if tail and i >= n - tail else self.threads for i in range(n)
                ]

                def submit(i: int) -> None:
                    futures[pool.submit(_call_with_threads, threads[i], str(budget[i]), fn, *jobs[i])] = i

                for i in range(n):
                    budget[i].write_text(str(threads[i]))
                    submit(i)
                yield from self._collect(futures, submit, _SentBack(requeue), budget, cores)
                ended = True
            finally:
                # interrupted (KeyboardInterrupt here), or closed early by the caller (GeneratorExit): no
                # queued job starts and no worker goes on training
                if ended:
                    pool.shutdown(wait=True)
                else:
                    self.stopped = _stop_pool(pool, futures, self.workers)

    def _collect(self, futures: dict[Future, int], submit: Callable[[int], None], back, budget, cores):
        """Yield the jobs as they end; a job sent back (``back``) is submitted again when due, holding no
        worker meanwhile; with ``rebalance``, the jobs still to end share the cores once fewer than the
        workers remain."""
        pending = set(futures.values())
        while futures or back:
            if futures:
                done, _ = wait(list(futures), timeout=back.timeout(), return_when=FIRST_COMPLETED)
            else:  # only jobs sent back (wait() of no futures returns at once)
                done = set()
                time.sleep(back.timeout() or 0.0)
            for fut in done:
                i = futures.pop(fut)
                exc = fut.exception()
                if exc is None and back.back(i, fut.result()):
                    continue
                pending.discard(i)
                if self.rebalance and 0 < len(pending) < self.workers:  # nothing waits: share the cores
                    for j in pending:
                        budget[j].write_text(str(max(1, cores // len(pending))))
                yield i, (None if exc else fut.result()), exc
            for i in back.due():
                try:
                    submit(i)
                except Exception as exc:  # noqa: BLE001 - a broken pool (a worker died): that job fails, as the rest
                    pending.discard(i)
                    yield i, None, exc


def _drop(index: dict) -> None:
    """Cancel the tasks of ``index`` (object ref -> job) whose results the study no longer reads, and read
    what they ended with: Ray prints the traceback of every failed task whose result is never read
    ("Unhandled error ...") after the study's own one-line error."""
    if not index:
        return
    import ray

    refs = list(index)
    for ref in refs:
        try:
            ray.cancel(ref)
        except Exception:  # noqa: BLE001 - finished already, or Ray is gone: nothing to cancel
            pass
    try:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=10)
    except Exception:  # noqa: BLE001 - Ray is gone
        return
    for ref in done:
        try:
            ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - a failed or cancelled task: read, so never printed
            pass
    index.clear()


def _ray_call(fn: Callable, *job) -> object:
    """Runs on a Ray worker: Ray sets OMP_NUM_THREADS to the task's CPUs; torch follows it."""
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads >= 1:
        torch.set_num_threads(threads)
    return fn(*job)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # the colour codes of Ray's task tracebacks


def ray_job_error(exc: BaseException) -> BaseException:
    """What a Ray task's failure is for the study. A ``RayTaskError``: the job's own exception (its own
    type and one-line message, as the local executors report it; an ``OutNotShared`` names its host),
    without Ray's traceback and its colour codes. One of Ray's own errors (a worker lost beyond its
    retries), or a job's error Ray could not rebuild here: a ``RuntimeError`` of one line naming the node.
    Anything else is returned as it is."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, Exception) and not _from_ray(cause):
        return cause
    if not _from_ray(exc):
        return exc
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    # a task's traceback ends with its exception's line; Ray's own errors say what happened first
    why = (lines[-1] if hasattr(exc, "traceback_str") else lines[0]) if lines else ""
    ip = getattr(exc, "ip", None)
    node = f" on node {ip}" if ip else ""
    return RuntimeError(f"a Ray task{node} failed: {type(exc).__name__}" + (f": {why}" if why else ""))


def _from_ray(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "ray"


class RayExecutor:
    """Runs each job as a Ray task on a running cluster (``ray`` is imported only here).

    Args:
        address: the cluster (``auto``: the one this host belongs to; ``HOST:6379``; ``ray://HOST:10001``).
        num_cpus, num_gpus: what each task requests; Ray places it on a node that has them free.
        max_retries: how often Ray re-runs a task whose worker process or node died (Ray's default is 3;
            set here on purpose). Application errors are not retried: they are reported per job. A job
            must be idempotent (``runners.leases.store.fill_once``): a retry, or Ray re-running a finished
            task whose result object was lost, finds its run claimed or finished and does nothing twice.
    """

    def __init__(self, address: str = "auto", num_cpus: float = 1, num_gpus: float = 0, max_retries: int = 3):
        self.address, self.num_cpus, self.num_gpus, self.max_retries = (
            address,
            num_cpus,
            num_gpus,
            max_retries,
        )

    requeues = True

    def map_jobs(self, fn, jobs, requeue=None):
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
        try:
            yield from self._results(index, task, fn, jobs, requeue)
        finally:  # stopped early (a machine fault, Ctrl-C): no task is left behind, no error unread
            _drop(index)

    def _results(self, index: dict, task, fn, jobs, requeue):
        import ray

        back = _SentBack(requeue)
        while index or back:
            if index:  # a job sent back is a new task when due: it holds no CPU or GPU meanwhile
                done, _ = ray.wait(list(index), num_returns=1, timeout=back.timeout())
            else:
                done = []
                time.sleep(back.timeout() or 0.0)
            for ref in done:
                i = index.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the job's own exception, as its own type
                    yield i, None, ray_job_error(exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - a worker lost beyond its retries: reported per job
                    yield i, None, ray_job_error(exc)
                    continue
                if not back.back(i, result):
                    yield i, result, None
            for i in back.due():
                try:
                    index[task.remote(fn, *jobs[i])] = i
                except Exception as exc:  # noqa: BLE001 - Ray gone meanwhile: that job fails, reported per job
                    yield i, None, exc


@dataclass(frozen=True)
class ExecutorOptions:
    """What the command line says about where runs execute (``study.pipeline.stages.Placement`` plus the plan).

    Attributes:
        workers: local worker processes (``"auto"``: one per core on CPU, one per visible GPU).
        n_jobs: how many jobs there are (no more workers than jobs).
        cuda: whether this host trains on a GPU.
        address: a cluster's address (``auto``: the one this host belongs to).
        cpus_per_run, gpus_per_run: what each job asks a cluster for.
        out: the study's output folder (a cluster executor keeps its job logs under it; empty: the
            working folder).
        options: an executor's own options (Slurm: ``partition``, ``time``, ``sbatch`` options), from
            ``--slurm-*`` flags.
    """

    workers: int | str = "auto"
    n_jobs: int = 1
    cuda: bool = False
    address: str = "auto"
    cpus_per_run: float = 1
    gpus_per_run: float = 0
    out: str = ""
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecutorKind:
    """A registered executor: ``make(options) -> Executor``.

    Attributes:
        make: builds the executor from the command line's options.
        needs_cluster: it runs jobs on a cluster at ``options.address`` (the shared contract test gets
            one from the pytest fixture ``<name>_address``).
        summary: one line for ``--help``.
        check: called before anything is written (``study.cluster.jobs.check_reachable``): a one-line
            ``StudyError`` when the executor cannot run what is asked (its cluster is down or refuses).
        flags: the module declaring the executor's own command-line flags (imported by the CLI only):
            ``add_flags(parser)``, ``read_flags(args) -> dict[str, str]`` (the flags given, as the
            options ``make`` reads) and ``MISPLACED``, the one line for those flags given with another
            executor (``{name}``: this executor's name). None: no flags of its own.
        submit: ``"module:function"`` that ``python -m study submit --executor NAME`` calls to start the
            driver on the cluster: ``function(hypothesis, out, submit_options, executor_options, address)
            -> str`` (the lines to print). None: the executor cannot be submitted to.
        dials_address: ``--address`` is a ``HOST:PORT`` it connects to (checked reachable before anything
            is written, unless ``auto``).
    """

    make: Callable[[ExecutorOptions], Executor]
    needs_cluster: bool = False
    summary: str = ""
    check: Callable[[ExecutorOptions], None] | None = None
    flags: str | None = None
    submit: str | None = None
    dials_address: bool = False


def _local(opts: ExecutorOptions) -> Executor:
    """``workers='auto'`` is one worker per visible GPU (``runners.executors.gpu_workers``: ``--runs-per-gpu`` K per
    GPU, ``--gpus`` to pick them; one GPU: one in-process worker); on CPU one process per core, 1 thread
    each. Every CPU run's thread count is :func:`run_threads` (the workers asked for, not as many as there
    are jobs)."""
    if opts.cuda or opts.options:
        from runners.executors import gpu_workers

        pinned = gpu_workers.from_options(opts.workers, opts.n_jobs, opts.options)
        if pinned is not None:
            return pinned
    cores = os.cpu_count() or 1
    threads = run_threads(opts.workers, cores, opts.cuda)
    workers = opts.workers
    if workers == "auto":
        workers = 1 if opts.cuda else min(opts.n_jobs, cores)
    workers = max(1, min(int(workers), max(1, opts.n_jobs)))
    if workers == 1:
        return InlineExecutor(threads)
    return ProcessExecutor(workers, threads=threads or max(1, cores // workers))


def _ray(opts: ExecutorOptions) -> Executor:
    return RayExecutor(opts.address, num_cpus=opts.cpus_per_run, num_gpus=opts.gpus_per_run)


def _slurm(opts: ExecutorOptions) -> Executor:
    from runners.executors.slurm import from_options

    return from_options(Path(opts.out or ".") / "slurm", opts.cpus_per_run, opts.gpus_per_run, opts.options)


def _slurm_check(opts: ExecutorOptions) -> None:
    from runners.executors.slurm import check_cluster

    check_cluster(_slurm(opts))  # type: ignore[arg-type]


EXECUTORS: Registry[ExecutorKind] = Registry("executor", group="vitstudy.executors")


def _local_check(opts: ExecutorOptions) -> None:
    from runners.executors.gpu_workers import check_options

    check_options(opts.options)


EXECUTORS.register(
    "local",
    ExecutorKind(
        _local,
        summary="processes on this host, one per GPU",
        check=_local_check,
        flags="study.cluster.gpu_flags",
    ),
)
EXECUTORS.register(
    "ray",
    ExecutorKind(
        _ray,
        needs_cluster=True,
        summary="tasks on a Ray cluster",
        submit="study.cluster.jobs:submit_ray_driver",
        dials_address=True,
    ),
)
EXECUTORS.register(
    "slurm",
    ExecutorKind(
        _slurm,
        needs_cluster=True,
        summary="tasks of Slurm job arrays (submitit)",
        check=_slurm_check,
        flags="study.cluster.slurm_flags",
        submit="study.cluster.slurm_submit:submit_slurm_driver",
    ),
)


def make_executor(
    workers: int | str,
    n_jobs: int,
    cuda: bool,
    kind: str = "local",
    address: str = "auto",
    cpus_per_run: float = 1,
    gpus_per_run: float = 0,
    out: str | Path = "",
    options: Mapping[str, str] | None = None,
) -> Executor:
    """The executor registered as ``kind`` (:data:`EXECUTORS`), built from these options.

    ``kind='ray'``: a :class:`RayExecutor` on ``address`` (each run asks for ``cpus_per_run`` CPUs and
    ``gpus_per_run`` GPUs). ``'slurm'``: a ``runners.executors.slurm.SlurmExecutor`` logging under ``<out>/slurm``
    (``options``: its ``--slurm-*`` flags). ``'local'``: ``workers='auto'`` is one worker per visible GPU
    (``runners.executors.gpu_workers``; ``options``: ``gpus``, ``runs_per_gpu``); on CPU one process per core, 1
    thread each. An unknown ``kind`` is a one-line ``StudyError`` naming the known ones.
    """
    opts = ExecutorOptions(
        workers, n_jobs, cuda, address, cpus_per_run, gpus_per_run, str(out), dict(options or {})
    )
    return EXECUTORS.get(kind).make(opts)
