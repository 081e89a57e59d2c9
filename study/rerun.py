"""A rerun that nothing new would change: the finished study's outputs are read back, not recomputed.

    python -m study run hypotheses/u_shape.yaml     # again: "unchanged since the last run" in a second

After a study finishes with every run finished, ``run`` stamps its folder (``inputs.json``) with a digest
of everything its verdicts, report and MLflow records are made from:

* the hypothesis (every field, and the file's bytes: the report shows it) and the recorded command line;
* each planned run's key and the size and modification time of every file in its folder;
* ``registration.json`` (post hoc status) and every file of the study folder (``verdicts.json``, the table,
  the report, its figures) by size and modification time: a file edited or removed since is made again;
* the code: every source file of ``study``, ``analysis``, ``runners`` and ``vitstudy_core``, the versions
  of the libraries the statistics and the report use, and the installed plug-ins (name, version, entry);
* where the MLflow records went (the tracking URI, and whether the store is still there).

A rerun whose digest matches (and that asks for nothing the stamped run did not do: MLflow, the report,
``--log-model``) prints the stored verdicts and touches neither the runs nor MLflow; anything else
(a changed claim, changed analysis code, a run retrained elsewhere, ``--force``, ``--until-decided``)
takes the full path, which recomputes and stamps again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from vitstudy_core.hashing import canonical_json

STAMP = "inputs.json"
CODE_PACKAGES = ("study", "analysis", "runners", "vitstudy_core")
# the libraries whose results or files a study's outputs hold (statistics, tables, figures, records)
LIBRARIES = ("numpy", "pandas", "pyarrow", "scipy", "statsmodels", "matplotlib", "mlflow", "pydantic")


@dataclass(frozen=True)
class Asked:
    """What this invocation would record besides the verdicts (``stages.RunOptions``' flags)."""

    track: bool
    report: bool
    log_model: bool
    command: str | None


def _files(folder: Path) -> list[tuple[str, int, int]]:
    """(path below ``folder``, size, mtime in ns) of every file in it, sorted; [] when it is missing."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in names:
            path = Path(root) / name
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((str(path.relative_to(folder)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _package_dir(name: str) -> Path | None:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
        return Path(module.__file__).parent  # type: ignore[arg-type]
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def code_digest() -> str:
    """sha256 of the source of our packages, the libraries' versions and the installed plug-ins."""
    from vitstudy_core.plugins import installed_entry_points

    h = hashlib.sha256()
    for pkg in CODE_PACKAGES:
        root = _package_dir(pkg)
        if root is None:
            continue
        for path in sorted(root.rglob("*.py")):
            h.update(f"{path.relative_to(root)}\0".encode())
            h.update(path.read_bytes())
    for lib in LIBRARIES:
        try:
            h.update(f"{lib}={metadata.version(lib)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{lib}=-\0".encode())
    for group, points in installed_entry_points().items():
        for ep in sorted(points, key=lambda e: (e.name, e.value)):
            dist = ep.dist
            who = f"{dist.name} {dist.version}" if dist is not None else "?"
            h.update(f"{group}:{ep.name}={ep.value} ({who})\0".encode())
    return h.hexdigest()


def _store(out_dir: Path) -> str:
    """Where MLflow records go: the tracking URI, or whether the output folder's sqlite store is there."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    return uri or f"sqlite store present: {(Path(out_dir) / 'mlflow.db').is_file()}"


def digest(hyp, hyp_path: Path, keys: list[str], out_dir: Path, study_dir: Path, asked: Asked) -> str:
    """sha256 of what a study's verdicts, report and MLflow records are made from (the module docstring)."""
    registration = Path(study_dir) / "registration.json"
    parts = {
        "hypothesis": hyp.model_dump(mode="json"),
        "file": hashlib.sha256(Path(hyp_path).read_bytes()).hexdigest() if Path(hyp_path).is_file() else "",
        "command": asked.command,
        "runs": {k: _files(Path(out_dir) / "runs" / k) for k in sorted(keys)},
        "registration": registration.read_text() if registration.is_file() else "",
        "outputs": [f for f in _files(Path(study_dir)) if f[0] != STAMP],
        "code": code_digest(),
        "store": _store(out_dir),
    }
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def unchanged(study_dir: Path, now: str, asked: Asked) -> bool:
    """Whether the stamp in ``study_dir`` holds the digest ``now`` and the stamped run recorded at least
    what this one asks for (MLflow, the report, the weights)."""
    try:
        stamp = json.loads((Path(study_dir) / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("digest") != now:
        return False
    return all(stamp.get(flag) or not getattr(asked, flag) for flag in ("track", "report", "log_model"))


def stamp(study_dir: Path, now: str, asked: Asked) -> None:
    """Record the digest of a finished study and what it recorded (``inputs.json``)."""
    from vitstudy_core.io import atomic_write_json

    atomic_write_json(
        Path(study_dir) / STAMP,
        {"digest": now, "track": asked.track, "report": asked.report, "log_model": asked.log_model},
        indent=1,
    )
