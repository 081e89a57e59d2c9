"""The ``--slurm-*`` flags of ``run`` and ``sweep`` (``--executor slurm``), read into the executor's options.

    python -m study run FILE --executor slurm --slurm-partition gpu --gpus-per-run 1 --slurm-time 4:00:00 \\
        --slurm-arg account=lab --slurm-arg qos=normal

``runners.executors.slurm.from_options`` reads the options: ``partition``, ``time``, ``array_parallelism``, and every
``--slurm-arg KEY=VALUE`` as the ``sbatch`` option ``--KEY=VALUE``.
"""

from __future__ import annotations

import argparse

from vitstudy_core.errors import StudyError

# the one line for these flags given with another executor (study.cluster.executor_flags)
MISPLACED = "--slurm-*: these flags need --executor {name}"


def add_flags(p: argparse.ArgumentParser) -> None:
    """Slurm's own flags (``ExecutorKind.flags`` of ``slurm``)."""
    p.add_argument(
        "--slurm-partition", default=None, help="Slurm partition of the runs' jobs (default: the cluster's)"
    )
    p.add_argument(
        "--slurm-time",
        default=None,
        help="time limit of each run's job: minutes or [D-]H:MM:SS (default 24:00:00); a job signalled at its "
        "limit is requeued and resumes from its last complete epoch",
    )
    p.add_argument(
        "--slurm-array-parallelism",
        type=int,
        default=None,
        help="most runs of one job array at once (default 256)",
    )
    p.add_argument(
        "--slurm-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other sbatch option for the runs' jobs, e.g. account=lab, qos=normal, constraint=a100 (repeat)",
    )


def read_flags(args: argparse.Namespace) -> dict[str, str]:
    """The ``--slurm-*`` flags given, as the executor's options; a ``--slurm-arg`` without ``=`` is one line."""
    opts: dict[str, str] = {}
    for item in args.slurm_arg:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not eq or not key:
            raise StudyError(f"--slurm-arg: expected KEY=VALUE (an sbatch option), got {item!r}")
        opts[key] = value
    for key in ("partition", "time", "array_parallelism"):
        value = getattr(args, f"slurm_{key}")
        if value is not None:
            opts[key] = str(value)
    return opts
