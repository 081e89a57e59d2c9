"""The Slurm executor: each job is one task of a Slurm job array, submitted through submitit.

    python -m study run FILE --executor slurm --slurm-partition gpu --gpus-per-run 1 --out /shared/results

``SlurmExecutor.map_jobs(fn, jobs)`` submits every job as one task of one job array (``sbatch --array``,
at most ``array_parallelism`` running at once), each asking for ``cpus_per_run`` CPUs and
``gpus_per_run`` GPUs, and yields ``(index, result, error)`` as tasks end, like every executor
(``runners.executors.local``). A task runs with the submitting interpreter (``sys.executable``) and
environment (``sbatch`` exports it), so every node needs the same code and venv at the same path, and
``--out`` on a filesystem every node mounts (the job's log folder is ``<out>/slurm/<job id>/``).

* A task sets torch's thread count to its CPUs (``SLURM_CPUS_PER_TASK``), so a run's numbers are those
  of a local run with as many threads (``--workers auto`` on CPU: 1 thread, ``--cpus-per-run 1``).
* Preemption and time limits: a task is a ``submitit.helpers.Checkpointable``; Slurm signals it before
  its time limit (``--signal=USR2@90``) or on preemption, submitit requeues the task with the same job
  function and arguments, and the run resumes from its last complete epoch (``resume.pt``). The lease
  (``runners.leases.store``) the killed task held is released as it exits, so the requeued task takes it.
* A task that raised yields its own exception (it is pickled back); a task that ended without a
  result (cancelled, out of memory, node failure, time limit without a requeue) yields
  :class:`SlurmJobFailed`: its job id, state, node and the last lines of its log.
* A job ``requeue`` sends back (its run leased live elsewhere) is submitted again, as a job of its own,
  after its delay.
* Ctrl-C (``KeyboardInterrupt``) or closing the stream early cancels (``scancel``) every task still
  queued or running; ``stopped`` says how many were running.

Job states come from ``sacct`` when the cluster keeps accounting, else from ``squeue --states=all``
(a controller keeps an ended job there for ``MinJobAge`` seconds, 300 by default). submitit's own log
lines go to ``<out>/slurm/submitit.log``, not to the terminal.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitstudy_core.errors import StudyError

POLL_S = 1.0  # how often the driver looks for ended tasks' result files (cheap: a stat per task)
STATE_POLL_S = 10  # at most this often it asks the controller for states (sacct/squeue: one call)
RESULT_WAIT_S = 15  # how long a COMPLETED task's result file may take to appear on the driver's host
LOG_TAIL = 3  # lines of a failed task's log in its error
SUBMIT_TIMEOUT_S = 60  # a controller that does not answer a submission within this is down
MAX_TIMEOUT_REQUEUES = 3  # submitit's max_num_timeout: requeues after a time limit before a task fails
DEFAULT_TIME_MIN = 24 * 60  # a task's time limit when --slurm-time is not given (a requeue resumes it)


class SlurmJobFailed(RuntimeError):
    """A Slurm task ended without a result (cancelled, out of memory, node failure, time limit)."""


def _call(fn, *job):
    """The job function as a task runs it: torch's threads set to the task's CPUs."""
    threads = int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if threads >= 1 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    elif threads >= 1:  # torch reads these as it is imported: a job that never needs torch never loads it
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    return fn(*job)


def _task_class():
    """:class:`submitit.helpers.Checkpointable` around a job function, made when submitit is imported."""
    import submitit

    class StudyTask(submitit.helpers.Checkpointable):
        """One job: ``fn(*job)``; returns ``(True, result)`` or ``(False, exception)`` so that the driver
        sees the job's own exception (submitit sends back only its traceback as text). On preemption or
        a time limit, submitit calls the inherited ``checkpoint(*job)``: the same call is requeued."""

        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *job):
            try:
                return True, _call(self.fn, *job)
            except Exception as exc:  # noqa: BLE001 - sent back to the driver as the job's error
                import pickle

                try:
                    pickle.dumps(exc)
                except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
                    exc = RuntimeError(f"{type(exc).__name__}: {exc}")
                return False, exc

    return StudyTask


def _sacct_works() -> bool:
    """Whether this cluster keeps accounting (``sacct`` answers; without slurmdbd it says it is disabled)."""
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def _watcher(sacct: bool):
    """A submitit state watcher: sacct where the cluster keeps accounting, else ``squeue --states=all``."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class Watcher(SlurmInfoWatcher):
        def _make_command(self):
            if sacct:
                return super()._make_command()
            ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
            if not ids:
                return None
            return [
                "squeue",
                "--noheader",
                "--array",
                "--states=all",
                "--format=%i|%T|%N",
                "--jobs=" + ",".join(ids),
            ]

        def read_info(self, string):
            if not sacct:
                text = string.decode() if isinstance(string, bytes) else string
                string = "JobID|State|NodeList\n" + text
            return super().read_info(string)

    return Watcher(delay_s=STATE_POLL_S)


def _quiet_submitit(folder: Path) -> None:
    """submitit's log lines (sacct warnings, requeue notes) go to ``<folder>/submitit.log`` only."""
    log = logging.getLogger("submitit")
    path = str(folder / "submitit.log")
    if any(getattr(h, "baseFilename", None) == path for h in log.handlers):
        return
    for h in list(log.handlers):  # submitit's own (the terminal), or an earlier study's file
        log.removeHandler(h)
        h.close()
    folder.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.propagate = False


def parse_time(value: str | int | None) -> int:
    """``--slurm-time`` in minutes, read as ``sbatch --time`` reads it: ``90`` (minutes), ``90:30``
    (MM:SS), ``1:30:00`` (H:MM:SS), ``2-00:00:00`` (D-HH:MM:SS); seconds round up to a minute."""
    if value is None or value == "":
        return DEFAULT_TIME_MIN
    text = str(value).strip()
    try:
        days, _, rest = text.rpartition("-")
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 1:
            minutes = parts[0]
        elif len(parts) == 2:
            minutes = parts[0] + (1 if parts[1] else 0)
        elif len(parts) == 3:
            minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
        else:
            raise ValueError
        minutes += int(days) * 24 * 60 if days else 0
    except ValueError:
        raise StudyError(f"--slurm-time: expected minutes or [D-]H:MM:SS, got {text!r}") from None
    if minutes < 1:
        raise StudyError(f"--slurm-time: expected at least 1 minute, got {text!r}")
    return minutes


class SlurmExecutor:
    """Runs each job as one task of a Slurm job array (``submitit`` is imported only here).

    Args:
        folder: where the jobs' scripts, logs and results go (``<out>/slurm``: on the shared filesystem).
        partition: ``sbatch --partition`` (None: the cluster's default).
        cpus_per_run, gpus_per_run: ``--cpus-per-task`` and ``--gpus-per-task`` of each task.
        time_min: each task's time limit in minutes (``--time``); a task signalled before it is requeued.
        array_parallelism: most tasks of one array running at once (``--array=0-N%P``).
        sbatch: more ``sbatch`` options (``account``, ``qos``, ``constraint``, ...: ``--KEY=VALUE``).
        job_name: the jobs' name in ``squeue``.
    """

    def __init__(
        self,
        folder: str | Path,
        partition: str | None = None,
        cpus_per_run: int = 1,
        gpus_per_run: int = 0,
        time_min: int = DEFAULT_TIME_MIN,
        array_parallelism: int = 256,
        sbatch: Mapping[str, str] | None = None,
        job_name: str = "study",
    ):
        self.folder, self.partition = Path(folder).resolve(), partition
        self.cpus_per_run, self.gpus_per_run, self.time_min = cpus_per_run, gpus_per_run, time_min
        self.array_parallelism, self.sbatch, self.job_name = array_parallelism, dict(sbatch or {}), job_name
        self.stopped = 0
        self.job_ids: list[str] = []  # every task submitted, in order ("12_3")

    requeues = True

    def parameters(self) -> dict[str, Any]:
        """What submitit's ``SlurmExecutor.update_parameters`` gets."""
        params: dict[str, Any] = {
            "job_name": self.job_name,
            "time": self.time_min,
            "cpus_per_task": self.cpus_per_run,
            "array_parallelism": self.array_parallelism,
            "additional_parameters": dict(self.sbatch),
        }
        if self.partition:
            params["partition"] = self.partition
        if self.gpus_per_run:
            params["gpus_per_task"] = self.gpus_per_run
        return params

    def _executor(self):
        import submitit

        _quiet_submitit(self.folder)
        ex = submitit.SlurmExecutor(folder=self.folder / "%j", max_num_timeout=MAX_TIMEOUT_REQUEUES)
        ex.update_parameters(**self.parameters())
        return ex

    def map_jobs(self, fn, jobs, requeue=None):
        from runners.executors.base import _SentBack

        if not jobs:
            return
        ex, task = self._executor(), _task_class()(fn)
        watcher = _watcher(_sacct_works())
        live: dict[int, Any] = {}  # job index -> its submitit job, not yet seen ended

        def track(i: int, job) -> None:
            job.watcher = watcher  # this executor's state source (sacct or squeue), not submitit's
            watcher.register_job(job.job_id)
            live[i] = job
            self.job_ids.append(job.job_id)
            _record(self.folder, job.job_id, jobs[i])

        back, ended = _SentBack(requeue), False
        try:
            submitted = _submitting(lambda: ex.map_array(task, *zip(*jobs, strict=True)))
            for i, job in enumerate(submitted):
                track(i, job)
            while live or back:
                for i in list(live):
                    job = live[i]
                    if not job.done():
                        continue
                    del live[i]
                    result, exc = _outcome(job)
                    if exc is None and back.back(i, result):
                        continue
                    yield i, result, exc
                for i in back.due():
                    try:
                        track(i, _submitting(lambda i=i: ex.submit(task, *jobs[i])))
                    except Exception as exc:  # noqa: BLE001 - Slurm gone meanwhile: that job fails
                        yield i, None, exc
                time.sleep(POLL_S if live else (back.timeout() or 0.0))
            ended = True
        finally:
            if not ended:  # Ctrl-C, or closed early by the caller: no queued task starts, none goes on
                self.stopped = _cancel(list(live.values()), watcher)


JOBS_FILE = "jobs.jsonl"  # in the log folder: one line per task submitted (``study status`` reads it)


def _record(folder: Path, job_id: str, job: tuple) -> None:
    """Append the task's job id, and the run it fills when its first argument is a run (``runners.executors.jobs``:
    a dict with ``key`` and ``label``), to ``<folder>/jobs.jsonl``."""
    import json

    run = job[0] if job and isinstance(job[0], dict) else {}
    label = None
    if isinstance(run.get("dataset"), dict) and "seed" in run:  # as study.runspecs.RunSpec.label says it
        lead = f"{run['condition']}/" if run.get("condition") is not None else ""
        label = f"{lead}{run['dataset'].get('name')}/seed{run['seed']}"
    line = {"job_id": job_id, "run": run.get("key"), "label": label, "submitted": time.time()}
    with open(folder / JOBS_FILE, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def job_table(folder: str | Path, limit: int = 50) -> str:
    """``study status``'s Slurm section: the latest task of each run submitted from ``folder`` (the log
    folder, ``<out>/slurm``) with its Slurm job id and state (sacct, else squeue); "" when none."""
    import json

    path = Path(folder) / JOBS_FILE
    try:
        lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    latest = {(ln.get("run") or ln["job_id"]): ln for ln in lines}  # a run resubmitted: its newest task
    rows = sorted(latest.values(), key=lambda ln: ln["submitted"])[-limit:]
    states = _states([r["job_id"] for r in rows]) if shutil.which("squeue") else {}
    out = [f"slurm jobs ({path}):"]
    for r in rows:
        state = states.get(r["job_id"], "?")
        out.append(f"  {r['job_id']:<12} {state:<14} {r.get('label') or ''} {r.get('run') or ''}".rstrip())
    return "\n".join(out)


def _states(job_ids: list[str]) -> dict[str, str]:
    """Job id -> state, from sacct where the cluster keeps accounting, else squeue; {} if neither answers."""
    watcher = _watcher(_sacct_works())
    for j in job_ids:
        watcher.register_job(j)
    logging.getLogger("submitit").disabled = True  # a job the controller forgot: no warning on the screen
    try:
        watcher.update()
    finally:
        logging.getLogger("submitit").disabled = False
    return {j: watcher.get_state(j, mode="cache") for j in job_ids}


def _submitting(submit):
    """``submit()``, its failure (sbatch refused, a controller that does not answer) as one line."""
    from submitit.core.utils import FailedJobError

    try:
        return submit()
    except (FailedJobError, subprocess.SubprocessError, OSError) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower()] or [str(exc)]
        raise StudyError(f"sbatch refused the study's jobs: {lines[-1]}") from None


def _outcome(job) -> tuple[object, BaseException | None]:
    """An ended task's ``(result, None)``, its own ``(None, exception)``, or a :class:`SlurmJobFailed`.

    A task Slurm calls COMPLETED whose result file is not there yet (a shared filesystem's attribute
    cache) is given ``RESULT_WAIT_S`` to show it."""
    state = "" if job.paths.result_pickle.exists() else job.watcher.get_state(job.job_id, mode="force")
    deadline = time.monotonic() + RESULT_WAIT_S
    while state == "COMPLETED" and not job.paths.result_pickle.exists() and time.monotonic() < deadline:
        time.sleep(1)
    if job.paths.result_pickle.exists():
        from submitit.core.utils import pickle_load

        outcome, value = pickle_load(job.paths.result_pickle)
        if outcome == "success":
            ok, got = value
            if ok or not _timed_out_too_often(f"{type(got).__name__}: {got}"):
                return (got, None) if ok else (None, got)
            value = f"{type(got).__name__}: {got}"  # submitit's, raised inside the run: see below
        # submitit's own error (the task could not unpickle its function, or was not requeued)
        last = [ln for ln in str(value).strip().splitlines() if ln.strip()]
        why = last[-1] if last else ""
        if _timed_out_too_often(why):  # its last time limit: Slurm's state is FAILED, the cause TIMEOUT
            return None, SlurmJobFailed(_failed_line(job, "TIMEOUT", _timeout_why(why)))
        return None, SlurmJobFailed(_failed_line(job, "FAILED", why))
    return None, SlurmJobFailed(_failed_line(job, state))


def _timed_out_too_often(text: str) -> bool:
    """Whether ``text`` is submitit's ``UncompletedJobError`` for a task past its last requeue (its
    signal handler raises it inside the running job function, so the task may send it back as its own)."""
    return "UncompletedJobError" in text and "timed-out" in text


def _timeout_why(text: str) -> str:
    return (
        f"time limit reached after {MAX_TIMEOUT_REQUEUES} requeues: {text.split(': ', 1)[-1].rstrip('.')}; "
        "a rerun resumes from the last complete epoch, a longer --slurm-time needs fewer requeues"
    )


def _failed_line(job, state: str, why: str = "") -> str:
    """One line: ``Slurm job 12_3 CANCELLED on node n1 (why); log PATH; last lines: ... | ...``."""
    node = job.watcher.get_info(job.job_id, mode="cache").get("NodeList") or "?"
    tail: list[str] = []
    for path in (job.paths.stderr, job.paths.stdout):
        try:
            lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        lines = [ln for ln in lines if "submitit" not in ln]  # submitit's own notes, not the run's
        if lines:
            tail = lines[-LOG_TAIL:]
            break
    head = f"Slurm job {job.job_id} {state.split()[0] if state else 'UNKNOWN'} on node {node}"
    head += f" ({why})" if why else ""
    return f"{head}; log {job.paths.stderr}" + (f"; last lines: {' | '.join(tail)}" if tail else "")


def _cancel(jobs: list, watcher) -> int:
    """``scancel`` every task not yet ended; how many were running."""
    if not jobs:
        return 0
    watcher.update()
    running = sum(watcher.get_state(j.job_id, mode="cache") == "RUNNING" for j in jobs)
    ids = sorted({j.job_id for j in jobs})
    subprocess.run(["scancel", *ids], capture_output=True, timeout=SUBMIT_TIMEOUT_S, check=False)
    return running


# ---- before anything is written: is the cluster there, and can it run what is asked? -------------------
def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no answer"])[-1]


def check_cluster(executor: SlurmExecutor) -> None:
    """One-line :class:`StudyError` when ``sbatch`` is missing, the controller does not answer, or it
    would refuse the tasks (unknown partition, account or QOS, more GPUs or CPUs than any node has):
    ``sbatch --test-only`` with the tasks' very options, which submits nothing."""
    if shutil.which("sbatch") is None:
        raise StudyError(
            "--executor slurm: sbatch not found on this host; run the study from a Slurm login node "
            "(Slurm's client commands on PATH)"
        )
    try:
        info = subprocess.run(
            ["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise StudyError(
            f"--executor slurm: the Slurm controller did not answer within {SUBMIT_TIMEOUT_S}s (sinfo); "
            "is slurmctld running?"
        ) from None
    except OSError as exc:
        raise StudyError(f"--executor slurm: cannot run sinfo ({exc.strerror or exc})") from None
    if info.returncode != 0:
        raise StudyError(
            f"--executor slurm: the Slurm controller did not answer (sinfo: {_one_line(info.stderr)})"
        )
    partitions = [p.strip().rstrip("*") for p in info.stdout.split()]
    if executor.partition and executor.partition not in partitions:
        raise StudyError(
            f"--slurm-partition: unknown partition {executor.partition!r}; this cluster has {partitions}"
        )
    args = [
        "sbatch",
        "--test-only",
        f"--time={executor.time_min}",
        f"--cpus-per-task={executor.cpus_per_run}",
    ]
    if executor.partition:
        args.append(f"--partition={executor.partition}")
    if executor.gpus_per_run:
        args.append(f"--gpus-per-task={executor.gpus_per_run}")
    args += [f"--{k}={v}" for k, v in executor.sbatch.items()]
    try:
        test = subprocess.run(
            [*args, "--wrap=true"], capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, cwd="/"
        )
    except subprocess.TimeoutExpired:
        raise StudyError(
            f"--executor slurm: the Slurm controller did not answer within {SUBMIT_TIMEOUT_S}s (sbatch --test-only)"
        ) from None
    if test.returncode != 0:
        raise StudyError(
            f"--executor slurm: Slurm would refuse the runs' jobs ({_one_line(test.stderr)}); "
            f"asked per run: {' '.join(args[2:])}"
        )


SLURM_KEYS = ("partition", "time", "array_parallelism")  # the options of their own flags; others: sbatch's


def from_options(folder: str | Path, cpus_per_run: float, gpus_per_run: float, options: Mapping[str, str]):
    """A :class:`SlurmExecutor` from the command line: ``options`` holds ``partition``, ``time``,
    ``array_parallelism`` (``--slurm-partition``, ``--slurm-time``, ``--slurm-array-parallelism``) and
    any ``sbatch`` option (``--slurm-arg KEY=VALUE``); a bad value is a one-line :class:`StudyError`."""
    if cpus_per_run != int(cpus_per_run) or gpus_per_run != int(gpus_per_run):
        raise StudyError(
            f"--cpus-per-run / --gpus-per-run: Slurm allocates whole CPUs and GPUs, got {cpus_per_run:g} / "
            f"{gpus_per_run:g}"
        )
    rest = {k: v for k, v in options.items() if k not in SLURM_KEYS}
    try:
        parallel = int(options.get("array_parallelism") or 256)
    except ValueError:
        parallel = 0
    if parallel < 1:
        raise StudyError(
            f"--slurm-array-parallelism: expected a positive integer, got {options['array_parallelism']!r}"
        )
    return SlurmExecutor(
        folder,
        partition=options.get("partition") or None,
        cpus_per_run=int(cpus_per_run),
        gpus_per_run=int(gpus_per_run),
        time_min=parse_time(options.get("time")),
        array_parallelism=parallel,
        sbatch=rest,
        job_name=f"study@{socket.gethostname()}",
    )
