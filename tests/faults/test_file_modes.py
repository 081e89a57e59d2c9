"""Files a study writes get the mode ``open()`` gives a new file (0o666 less the umask), folders
``mkdir``'s (0o777 less the umask): under umask 022 a lab's group reads a study on a shared ``--out``
(every file was 0600: ``tempfile.mkstemp`` in ``vitstudy_core/io.py``), under umask 077 nobody else does."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from study.cli import main
from tests.planted import DIFF, U
from tests.planted import write_planted as _write
from vitstudy_core.io import atomic_path, atomic_write_json, cached_arrays


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _modes(root: Path) -> dict[str, set[str]]:
    """Per mode (octal text), the paths under ``root`` (relative) that have it, files and folders apart."""
    out: dict[str, set[str]] = {}
    for p in root.rglob("*"):
        kind = "dir" if p.is_dir() else "file"
        out.setdefault(f"{kind} {oct(stat.S_IMODE(p.stat().st_mode))}", set()).add(str(p.relative_to(root)))
    return out


def test_atomic_writes_and_caches_follow_the_umask(tmp_path, umask):
    atomic_write_json(tmp_path / "a" / "verdicts.json", {"x": 1})
    cached_arrays(tmp_path / "cache" / "data.npz", lambda: {"x": np.zeros(3)}, ("x",))
    with atomic_path(tmp_path / "b.bin") as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o666 & ~umask  # the temporary already has it
        tmp.write_bytes(b"1")
    assert _modes(tmp_path) == {
        f"file {oct(0o666 & ~umask)}": {"a/verdicts.json", "cache/data.npz", "b.bin"},
        f"dir {oct(0o777 & ~umask)}": {"a", "cache"},
    }


def test_a_study_s_run_folders_tables_and_report_follow_the_umask(tmp_path, planted, umask):
    """A whole study (planted runs, the report on): every file and folder under ``--out`` has the mode
    the umask gives, none 0600 under umask 022."""
    planted(0.5)
    out = tmp_path / "out"
    args = ["run", _write(tmp_path, [DIFF, U]), "--out", str(out), "--no-mlflow", "--workers", "1"]
    assert main(args) == 0
    modes = _modes(out)
    assert set(modes) == {f"file {oct(0o666 & ~umask)}", f"dir {oct(0o777 & ~umask)}"}, modes
    files = modes[f"file {oct(0o666 & ~umask)}"]
    for name in ("table.parquet", "verdicts.json", "verdicts.txt", "report.html", "registration.json"):
        assert f"studies/tiny/{name}" in files, sorted(files)
    assert any(f.startswith("runs/") and f.endswith("result.json") for f in files)
