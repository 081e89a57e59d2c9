"""User-facing errors: one line naming the file, the field and what was expected."""

from __future__ import annotations


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
