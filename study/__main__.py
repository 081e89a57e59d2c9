"""Entry point for ``python -m study``.

``python -m`` puts the current directory first on ``sys.path``, so a user's own ``analysis/``,
``runners/`` or ``core/`` folder there would be imported in place of ours. When ``study`` itself was not
loaded from the current directory (an installed copy, or a checkout on ``PYTHONPATH``), that entry is
dropped before anything else is imported. Run from the root of a checkout, the current directory is
where the packages are, so it stays. The console script ``study`` never has the current directory on
``sys.path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _same_dir(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def drop_cwd_entry() -> bool:
    """Remove the current directory that ``python -m`` put at ``sys.path[0]``, unless ``study`` lives in
    it. Returns whether an entry was removed. With ``python -P`` (safe path) there is none to remove."""
    if not sys.path or getattr(sys.flags, "safe_path", False):
        return False
    cwd = os.getcwd()
    home = Path(__file__).resolve().parents[1]  # the folder that holds the study package
    if _same_dir(sys.path[0] or os.curdir, cwd) and not _same_dir(home, cwd):
        del sys.path[0]
        return True
    return False


if __name__ == "__main__":
    # only in the process started as `python -m study`: spawned workers inherit the cleaned sys.path
    drop_cwd_entry()
    from study.cli import main

    sys.exit(main())
