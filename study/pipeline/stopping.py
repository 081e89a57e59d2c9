"""How a ``run`` or ``sweep`` invocation stops when it must: Ctrl-C, SIGTERM, a full disk, a lost store.

* **Ctrl-C** (SIGINT) and **SIGTERM** stop the workers at once (``runners.executors.local``: no queued run
  starts), mark the parent MLflow run KILLED (``study.tracking.tracker.Tracker``) and leave as one
  :class:`vitstudy_core.errors.Interrupted` (exit status ``128 + signal``: 130, 143); the same command
  resumes every stopped run from its last complete epoch.
* A **full disk or a lost store** (ENOSPC, EDQUOT, EROFS, ..., or sqlite's "database or disk is full")
  is the machine's state, not a run's failure: the study stops with one
  :class:`vitstudy_core.errors.MachineError` line naming the path (exit 2) instead of testing its claims
  on the seeds that happened to be written; the same command resumes once space is free. A run that
  failed on its own (a NaN loss) still fails alone, and the study goes on without it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from vitstudy_core.errors import RESUME, Interrupted, MachineError, StudyError, machine_fault

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _FirstSignal:
    """A signal handler: the first SIGINT or SIGTERM raises :class:`Interrupted`; any later one is ignored,
    so stopping the workers and marking the parent run KILLED is not itself cut short (a second Ctrl-C,
    or each worker's share of a group's signal)."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum, frame) -> None:
        if not self.fired:
            self.fired = True
            raise Interrupted(signum)


@contextmanager
def stopping_cleanly(store: str | None = None) -> Iterator[None]:
    """Around one invocation: SIGINT and SIGTERM raise :class:`Interrupted` (a ``KeyboardInterrupt``), once
    (in the main thread; the handlers before are restored after), a ``KeyboardInterrupt`` leaves as an
    :class:`Interrupted`, and an exception the machine caused leaves as a :class:`MachineError`.

    Args:
        store: the tracking store's path or URI, named when sqlite reports it lost or full.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = _FirstSignal()
    before = {s: signal.signal(s, handler) for s in STOP_SIGNALS} if main else {}
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    except MachineError as exc:
        raise _stopped(exc) from None
    except StudyError:
        raise  # already said as an input error in one line (an optuna storage that does not open, ...)
    except Exception as exc:
        fault = machine_fault(exc, store)
        if fault is None:
            raise
        raise _stopped(fault) from None
    finally:
        for s, old in before.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)


def _stopped(fault: MachineError) -> MachineError:
    """``fault`` saying that the study stopped and how to go on (once)."""
    if RESUME in fault.message:
        return fault
    return type(fault)(
        f"{fault.message}: the study stopped (no seed is left out of a verdict); free space or fix the "
        f"store, then {RESUME}",
        fault.file,
        fault.field,
    )


def stopped_while_filling(fault: MachineError, label: str, key: str, run_dir: str) -> MachineError:
    """The :class:`MachineError` that stops a study when filling run ``label`` met ``fault`` (named by
    the file refused, or by the run's folder when the error does not say which file)."""
    message = f"{fault.message}, while filling run {label} (key {key})"
    return _stopped(type(fault)(message, fault.file or run_dir))
