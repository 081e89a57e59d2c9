"""A study on a running Ray cluster: submit it as a Ray job, and see what every study is doing.

    python -m study submit hypotheses/u_shape.yaml --address http://HEAD:8265 --out /shared/results \\
        --leases postgresql://study@db/study
    python -m study status --leases postgresql://study@db/study [--address http://HEAD:8265]

``submit`` starts ``python -m study run|sweep FILE --executor ray --address auto`` as a Ray job
(``ray.job_submission.JobSubmissionClient``): the job's driver runs on the head node, so it keeps running
when the submitting terminal closes. The file and ``--out`` must be paths every node reaches (a shared
filesystem); ``MLFLOW_TRACKING_URI`` is passed on to the job when set here. ``status`` reads the lease
store (``runners.leases``): per study, its runs finished, running (a live lease), stalled (a lease past
its time: a dead worker's run, taken over by the next worker that asks), failed and to do.
"""

from __future__ import annotations

import os
import shlex
import time
from collections import Counter
from pathlib import Path

from vitstudy_core.errors import StudyError

COLUMNS = ("finished", "running", "stalled", "failed", "todo")


def submit_command(
    hyp_path: Path,
    out: Path,
    leases: str | None = None,
    storage: str | None = None,
    gpus_per_run: float = 0,
    sweep: bool = False,
) -> list[str]:
    """The job's entrypoint, with absolute paths (the job runs in another folder, on the head node)."""
    cmd = ["python", "-m", "study", "sweep" if sweep else "run", str(Path(hyp_path).resolve())]
    cmd += ["--executor", "ray", "--address", "auto", "--out", str(Path(out).resolve())]
    cmd += ["--gpus-per-run", str(gpus_per_run)]
    if leases:
        cmd += ["--leases", leases]
    if storage and sweep:
        cmd += ["--storage", storage]
    return cmd


def submit(
    hyp_path: Path,
    address: str,
    out: Path,
    leases: str | None = None,
    storage: str | None = None,
    gpus_per_run: float = 0,
) -> str:
    """Submit the study (or sweep, when the file has a ``sweep`` section) as a Ray job; returns its id."""
    from study.schema import load_hypothesis

    hyp = load_hypothesis(hyp_path)
    sweep = hyp.sweep is not None
    cmd = submit_command(hyp_path, out, leases, storage, gpus_per_run, sweep)
    env = {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI",) if os.environ.get(k)}
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise StudyError("submit needs Ray: pip install -e '.[ray]'") from None
    try:
        client = JobSubmissionClient(address)
        return client.submit_job(
            entrypoint=shlex.join(cmd),
            submission_id=f"study-{hyp.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            metadata={"study": hyp.name, "kind": "sweep" if sweep else "run"},
            runtime_env={"env_vars": env} if env else None,
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster is one line
        raise StudyError(
            f"--address: cannot submit to the Ray cluster {address!r} ({type(exc).__name__}: {exc})"
        ) from None


def status_counts(leases: str | Path) -> dict[str, Counter]:
    """Study name -> counts of its runs by :data:`COLUMNS`, from the lease store."""
    from runners.leases import open_lease_store

    try:
        rows = open_lease_store(leases).leases()
    except Exception as exc:  # noqa: BLE001 - an unreachable store is one line
        raise StudyError(
            f"--leases: cannot read the lease store ({type(exc).__name__}: {exc})", str(leases)
        ) from None
    now, out = time.time(), {}
    for lease in rows:
        state = lease.state
        if state == "running" and not lease.live(now):
            state = "stalled"
        out.setdefault(lease.study or "(unnamed)", Counter())[state] += 1
    return out


def format_status(leases: str | Path) -> str:
    """One line per study: runs finished, running, stalled, failed and to do."""
    counts = status_counts(leases)
    if not counts:
        return f"no runs in the lease store {leases}"
    width = max(len(s) for s in counts) + 2
    lines = ["study".ljust(width) + "".join(c.rjust(10) for c in COLUMNS)]
    for study, c in sorted(counts.items()):
        lines.append(study.ljust(width) + "".join(str(c.get(col, 0)).rjust(10) for col in COLUMNS))
    return "\n".join(lines)


def ray_jobs(address: str) -> str:
    """The cluster's study jobs (id, status, study), newest last."""
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(address).list_jobs()
    rows = [
        f"{j.submission_id}  {j.status}  {(j.metadata or {}).get('study', '')}"
        for j in sorted(jobs, key=lambda j: j.start_time or 0)
        if (j.metadata or {}).get("study")
    ]
    return "\n".join(["ray jobs:", *rows]) if rows else "ray jobs: none"
