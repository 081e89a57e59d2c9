"""``study submit --executor slurm``: the study's driver as a small CPU-only Slurm job, so submit returns at once.

    python -m study submit hypotheses/u_shape.yaml --executor slurm --slurm-partition gpu --gpus-per-run 1 \\
        --out /shared/study_results

The driver job runs ``python -m study run|sweep FILE --executor slurm ...`` (this interpreter, absolute
paths) with one CPU and no GPU; it submits the runs' job array itself and waits for it. Its log is
``<out>/slurm/driver-<job id>.log``. ``sbatch`` gives the job this environment, plus the variables
``study submit`` forwards for any cluster (``study.cluster.jobs.submit_env``: the database URLs as
``STUDY_LEASES`` / ``STUDY_STORAGE``, so none is on the driver's command line).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from vitstudy_core.errors import StudyError

DRIVER_TIME = "7-00:00:00"  # the driver waits for every run; it uses one CPU and no GPU meanwhile


def driver_command(hyp_path: Path, out: Path, opts, options: Mapping[str, str], sweep: bool) -> list[str]:
    """The driver job's command: ``run`` (or ``sweep``) with ``--executor slurm`` and every option given."""
    from study.cluster.jobs import driver_flags

    cmd = [sys.executable, "-m", "study", "sweep" if sweep else "run", str(Path(hyp_path).resolve())]
    cmd += ["--executor", "slurm", "--out", str(Path(out).resolve())]
    cmd += ["--cpus-per-run", f"{opts.cpus_per_run:g}", "--gpus-per-run", f"{opts.gpus_per_run:g}"]
    for key, value in options.items():
        flag = {"partition": "--slurm-partition", "time": "--slurm-time"}.get(key)
        if key == "array_parallelism":
            cmd += ["--slurm-array-parallelism", value]
        else:
            cmd += [flag, value] if flag else ["--slurm-arg", f"{key}={value}"]
    cmd += driver_flags(opts, sweep)
    return cmd


def submit_driver(hyp_path: Path, out: Path, opts, options: Mapping[str, str]) -> tuple[str, Path]:
    """Check the cluster (``runners.executors.slurm.check_cluster``), then ``sbatch`` the driver; returns its job id
    and log. One-line :class:`StudyError` when Slurm refuses or does not answer."""
    from runners.executors.slurm import SUBMIT_TIMEOUT_S, check_cluster, from_options
    from study.cluster.jobs import submit_env
    from study.schema import load_hypothesis

    hyp = load_hypothesis(hyp_path)
    runs = from_options(Path(out) / "slurm", opts.cpus_per_run, opts.gpus_per_run, options)
    check_cluster(runs)  # the runs' jobs, before the driver is queued at all
    logs = Path(out).resolve() / "slurm"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **submit_env(Path(hyp_path).read_text(encoding="utf-8"), opts)}
    cmd = driver_command(hyp_path, out, opts, options, hyp.sweep is not None)
    sbatch = ["sbatch", "--parsable", f"--job-name=study-driver:{hyp.name}", "--cpus-per-task=1"]
    sbatch += [f"--time={DRIVER_TIME}", f"--output={logs}/driver-%j.log", f"--chdir={Path.cwd()}"]
    if runs.partition:
        sbatch.append(f"--partition={runs.partition}")
    sbatch += [f"--{k}={v}" for k, v in runs.sbatch.items() if k in ("account", "qos")]
    try:
        done = subprocess.run(
            [*sbatch, "--wrap", "exec " + shlex.join(cmd)],
            capture_output=True,
            text=True,
            env=env,
            timeout=SUBMIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StudyError(f"--executor slurm: cannot submit the driver job ({exc})") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()] or ["no answer"]
        raise StudyError(f"--executor slurm: sbatch refused the driver job ({lines[-1].strip()})")
    job = done.stdout.strip().split(";")[0]
    return job, logs / f"driver-{job}.log"


def submit_slurm_driver(
    hyp_path: Path, out: Path, opts, options: Mapping[str, str], address: str | None
) -> str:
    """``submit --executor slurm`` (``ExecutorKind.submit`` of ``slurm``): the driver as a Slurm job;
    returns the lines to print (``address`` is not used: Slurm's controller is the one ``sbatch`` asks)."""
    job, log = submit_driver(hyp_path, out, opts, options)
    return f"submitted: Slurm job {job} (the driver)\nfollow:    tail -f {log}"
