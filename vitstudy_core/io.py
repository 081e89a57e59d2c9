"""Atomic writes and cached arrays: a reader never sees half a file, an interrupted write leaves none.

Every writer goes through a temporary file in the target's folder, then ``os.replace`` (atomic on POSIX
within one filesystem); the file gets the mode ``open()`` would give it (the process umask applies). The folder is created when missing. A write refused by the machine (disk full,
read-only filesystem, no permission) raises a one-line ``MachineError`` (a StudyError) naming the target and leaves it as it was.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from vitstudy_core.errors import MachineError

# a write that fails for these reasons is the machine's state (disk full, read-only, no permission)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG})


def _create_temporary(path: Path, suffix: str) -> str:
    """Create an empty ``.<name>.<random><suffix>`` beside ``path`` with the mode ``open()`` gives a new
    file (0o666 less the process umask: 0644 under umask 022), not ``tempfile.mkstemp``'s 0600, which made
    every file a study writes unreadable to the rest of a lab's group on a shared ``--out``."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}{suffix}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block succeeds.

    ``suffix`` ends the temporary name (``np.savez`` appends ``.npz`` unless the name already ends so).
    On an exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _create_temporary(path, suffix)
        yield Path(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise MachineError(f"cannot write ({exc.strerror}); nothing was changed", str(path)) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_json(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """Write ``obj`` as JSON (``json.dumps(obj, **dumps)``) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, **dumps))


def atomic_save_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    """Write ``arrays`` to ``path`` as an uncompressed ``.npz``, atomically."""
    with atomic_path(path, suffix=".tmp.npz") as tmp:
        # numpy's stubs read **arrays as its allow_pickle flag (numpy >= 2.1); numpy 1.x has no such flag
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
    return Path(path)


def cached_arrays(
    path: str | Path, build: Callable[[], dict[str, np.ndarray]], names: tuple[str, ...]
) -> tuple[np.ndarray, ...]:
    """The arrays ``names`` from the ``.npz`` cache at ``path``, built and saved first when needed.

    A cache that cannot be read (truncated, corrupt, lacking a name) is removed and rebuilt, never
    trusted. ``build`` returns every array to store (it may hold more than ``names``).
    """
    path = Path(path)
    if path.exists():
        try:
            with np.load(path) as f:
                return tuple(f[n] for n in names)
        except Exception:  # noqa: BLE001 - any unreadable cache is rebuilt
            path.unlink(missing_ok=True)
    arrays = build()
    atomic_save_npz(path, **arrays)
    return tuple(arrays[n] for n in names)


TEMPORARY_GLOB = ".*.tmp*"  # what atomic_path names its temporaries: '.<name>.<random>.tmp[.npz]'


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete what interrupted atomic writes (:func:`atomic_path`) left anywhere under ``folder``.

    Call it only while holding the folder's lock: a live writer's temporary file looks the same.
    Returns the paths removed.
    """
    folder = Path(folder)
    found = list(folder.rglob(TEMPORARY_GLOB)) if folder.is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return found
