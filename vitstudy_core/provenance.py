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


# what decides a run's floating-point arithmetic on the CPU, as a run's ``environment`` records it
# (``runners.train.arithmetic``): two runs that agree on all of these compute the same bits from the same
# inputs; runs that differ in any (AVX-512 vs AVX2 kernels, another BLAS, another thread count) round
# differently, so their numbers differ in the last digits (a verdict should not)
ARITHMETIC = (
    "cpu_model",
    "cpu_flags",
    "torch_cpu_capability",
    "blas",
    "onednn",
    "torch_threads",
    "torch",
    "gpu",
)
NOT_RECORDED = "not recorded"  # a field a run's environment lacks (a run made before it was recorded)


def arithmetic_of(env: dict | None) -> tuple[tuple[str, str], ...]:
    """The :data:`ARITHMETIC` fields of a run's ``environment``, as ``(field, text)`` pairs in that order;
    a field it lacks reads :data:`NOT_RECORDED` (``gpu`` None: ``none``)."""
    env = env or {}
    out = []
    for field in ARITHMETIC:
        if field not in env:
            out.append((field, NOT_RECORDED))
        else:
            value = env[field]
            out.append((field, "none" if value is None else str(value)))
    return tuple(out)


def arithmetic_lines(envs: dict[str, dict | None]) -> list[str]:
    """What the runs' arithmetic was, for the report's reproduction section: one line when every run
    agrees, else a note that the study pools machines whose arithmetic differs and a line per kind.

    Args:
        envs: run key -> its ``environment`` (None: not readable).
    """
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for key, env in envs.items():
        groups.setdefault(arithmetic_of(env), []).append(key)
    if not groups:
        return []

    def text(fields: tuple[tuple[str, str], ...]) -> str:
        return "; ".join(f"{k} {v}" for k, v in fields)

    if len(groups) == 1:
        (fields,) = groups
        return [f"arithmetic of every run ({len(envs)}): {text(fields)}"]
    lines = [
        f"arithmetic differs across the runs: they come from {len(groups)} machines or settings whose "
        "floating-point results differ (a pooled study is legitimate; its numbers are no one machine's)"
    ]
    for fields, keys in sorted(groups.items(), key=lambda g: -len(g[1])):
        lines.append(
            f"arithmetic of {len(keys)} run(s) ({', '.join(sorted(keys)[:3])}{', ...' if len(keys) > 3 else ''}): {text(fields)}"
        )
    return lines
