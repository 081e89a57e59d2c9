"""Where results came from: the code's git commit and dirty flag, and the versions of what ran."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("numpy", "pandas", "scipy", "statsmodels", "matplotlib", "mlflow", "torch", "timm", "pydantic")


def git_state(repo: Path | None = None) -> dict:
    """``{"git_commit": sha, "git_dirty": bool}`` of the code's checkout; None values outside git."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(repo or CODE_ROOT), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Python, platform and each package's installed version, read from metadata (nothing imported)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out
