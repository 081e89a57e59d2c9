"""The job a worker runs: one run source fills one run folder (a top-level function, so it pickles)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from runners.shared_out import check_token, lease_key
from runners.sources import get_source
from vitstudy_core.errors import RESUME, MachineError, machine_fault
from vitstudy_core.io import remove_temporaries
from vitstudy_core.locks import file_lock, run_lock_path
from vitstudy_core.plugins import missing_parts
from vitstudy_core.runfolder import RunFolder


def _progress(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write per line: lines of parallel workers never interleave
    sys.stdout.flush()


def _labelled(run: dict, label: str) -> Callable[[str], None]:
    """The progress callable of a run whose study names it ``label`` (``shuffled/objects/seed3``): a
    source leads its lines with the run's own ``[dataset/seedN]``, which says nothing of the condition; the
    study's label replaces that lead (a run is shared by files, so the condition is not part of the run)."""
    own = f"[{run['dataset']['name']}/seed{run['seed']}]"
    if not label or f"[{label}]" == own:
        return _progress
    return lambda line: _progress(f"[{label}]{line[len(own) :]}" if line.startswith(own) else line)


def execute_run(run: dict, run_dir: str, data_dir: str, label: str = "") -> dict:
    """Fill one run folder under its run-key lock (``runs/<key>.lock``).

    Another invocation on the same output folder that holds the lock is filling the same run: this waits,
    then returns that run's result if it finished instead of training it again. Temporary files a killed
    writer left in the folder are removed first (only the lock holder writes there). ``label``: the run's
    name in the study (``RunSpec.label``), which leads its progress lines.

    A worker that lacks a plug-in part the run's key names (``run["plugins"]``: installed where the study
    was planned, not here, or in another version) refuses before it writes anything: a
    :class:`~vitstudy_core.errors.MachineError`, which stops the study (its runs would lack the part's
    values, or hold another version's) until the plug-in is installed where runs execute.
    """
    lacking = missing_parts(run.get("plugins") or {})
    if lacking:
        raise MachineError(
            f"this worker (host {socket.gethostname()}) lacks a plug-in part the run's key names: "
            f"{'; '.join(lacking)}: install the plug-in where the runs execute, then {RESUME}"
        )
    folder = RunFolder(run_dir)
    with file_lock(run_lock_path(Path(run_dir).parent, Path(run_dir).name)):
        if folder.is_finished():
            result = folder.read_result()
            assert result is not None  # is_finished just read it, and only the lock holder writes here
            return result
        remove_temporaries(folder.path)  # only the lock holder writes here: these are a dead writer's
        # a bar only for a run in the main process on a terminal; spawned workers print plain lines
        bar = sys.stdout.isatty() and mp.current_process().name == "MainProcess"
        return get_source(run.get("source", "train")).fill(
            run, run_dir, data_dir, progress=_labelled(run, label), bar=bar
        )


def execute_claimed_run(
    run: dict, run_dir: str, data_dir: str, leases: str, study: str = "", token: str = "", label: str = ""
) -> dict:
    """:func:`execute_run` under a lease in the store ``leases`` (``runners.leases.store``): a run finished or
    being filled by another worker is not filled again, so the job is safe to retry or to run twice.

    ``token``: the output folder's (``runners.shared_out``); a worker that does not see it there fails
    before it trains, naming its host. It also scopes the run's lease to this folder (``lease_key``):
    another output folder sharing the store trains its own copy under a lease of its own. The result
    says which ``host`` ran the job.

    A run leased live by another worker is not waited for here (that would hold this task's CPUs and
    GPUs): the result is ``runners.leases.store.waiting_result()`` at once, and the executor sends the job again
    after a backoff (``runners.leases.store.requeue_waiting``)."""
    from runners.leases.store import fill_once, open_lease_store

    if token:
        check_token(Path(run_dir).parent.parent, token)
    try:
        result = fill_once(
            open_lease_store(leases),
            {**run, "key": lease_key(run["key"], token)},  # the lease's key; the run itself keeps its own
            run_dir,
            lambda: execute_run(run, run_dir, data_dir, label),
            log=_progress,
            study=study,
            wait=False,
        )
    except Exception as exc:
        # a full disk or a lost store is the machine's state, not this run's failure: said as one here,
        # where the whole chain of exceptions is still known (a worker process sends only the last one)
        fault = machine_fault(exc)
        if fault is None or fault is exc:
            raise
        raise fault from exc
    return {**result, "host": socket.gethostname()}
