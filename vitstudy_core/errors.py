"""User-facing errors: one line naming the file, the field and what was expected."""

from __future__ import annotations

import errno


class StudyError(Exception):
    """An error caused by user input; the CLI prints ``str(err)`` as one line and exits with status 2.

    Args:
        message: what was expected and what was found.
        file: the file the input came from, if any.
        field: the dotted location inside that file (``claims[0].metric``), if any.
    """

    exit_code = 2

    def __init__(self, message: str, file: str | None = None, field: str | None = None):
        self.message = " ".join(str(message).split())  # always one line
        self.file = file
        self.field = field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ": ".join(p for p in (self.file, self.field) if p)
        return f"{where}: {self.message}" if where else self.message


class RunFailedError(RuntimeError):
    """A training run could not finish (e.g. a NaN/Inf loss or activation); carries where it stopped."""

    def __init__(self, message: str, epoch: int | None = None):
        self.epoch = epoch
        super().__init__(message)


# a write or read the machine refused: its state (disk, quota, mount, permissions), never a run's own fault
MACHINE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO, errno.EACCES, errno.EPERM}
)
# what a sqlite store says when its file, its disk or its folder is gone or full (sqlite3, SQLAlchemy
# and MLflow all carry sqlite's own message)
STORE_LOST = (
    "database or disk is full",
    "disk i/o error",
    "unable to open database file",
    "attempt to write a readonly database",
    "database disk image is malformed",
    "file is not a database",
    "no such table",
)


# how a stopped study goes on, ending every MachineError that stops one (once: a message holding it
# already says how)
RESUME = "rerun the same command to resume"


class MachineError(StudyError):
    """The machine refused a write (disk full, quota, read-only, no permission) or lost the tracking store.

    Not a run's own failure: the study stops (exit 2) instead of testing its claims on fewer seeds, and the
    same command resumes once the machine is fixed. A :class:`StudyError`, so every caller that reports one
    line reports this one too; it pickles whole, so a worker process's reaches the study intact.
    """

    def __reduce__(self) -> tuple[type, tuple[str, str | None, str | None]]:
        return (type(self), (self.message, self.file, self.field))


def machine_fault(exc: BaseException, store: str | None = None) -> MachineError | None:
    """The :class:`MachineError` that ``exc`` (or an exception it was raised from or during) is, or None.

    Recognised: a :class:`MachineError`; an ``OSError`` with an errno in :data:`MACHINE_ERRNOS`; any
    exception whose message carries sqlite's words for a lost or full store (:data:`STORE_LOST`, named
    ``store`` when given). Everything else (a NaN loss, a bug, a bad input) is not the machine's.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, MachineError):
            return e
        if isinstance(e, OSError) and e.errno in MACHINE_ERRNOS:
            why = e.strerror or errno.errorcode.get(e.errno or 0, "refused")
            return MachineError(f"cannot write ({why})", e.filename and str(e.filename))
        text = " ".join(str(e).lower().split())
        hit = next((p for p in STORE_LOST if p in text), None)
        if hit is not None:
            return MachineError(f"the tracking store failed (sqlite: {hit})", store)
        todo += [e.__cause__, e.__context__]
    return None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped an invocation; a ``KeyboardInterrupt``, so no ``except Exception``
    on the way up swallows it.

    Args:
        signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``); the exit status is ``128 + signum``
            (130, 143), the shell's convention for a process a signal ended.
        running: how many runs were stopped mid-training (they resume on the next invocation).
    """

    def __init__(self, signum: int = 2, running: int = 0):
        self.signum, self.running = int(signum), int(running)
        super().__init__(self.signum, self.running)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        """The one line the CLI prints."""
        import signal

        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return (
            f"interrupted ({name}): stopped {self.running} running run(s); rerun the same command to resume"
        )

    def __str__(self) -> str:
        return self.line()


def env_seconds(name: str, default: float) -> float:
    """A period or lifetime in seconds from the environment variable ``name`` (``default`` when unset).

    Raises:
        StudyError: the value is not a finite number > 0 (a zero period would make a heartbeat thread
            spin and write without pause; a negative one would make a live owner look dead).
    """
    import math
    import os

    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise StudyError(f"environment variable {name}={raw!r}: expected a number of seconds > 0")
    return value


class FieldError(ValueError):
    """A schema error that names its field (``study.schema.parse_hypothesis`` makes it one line): raised in
    a pydantic validator, it replaces pydantic's location with ``field`` (as the hypothesis file spells it)."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(message)
