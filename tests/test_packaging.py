"""A regular install from a built wheel: the distribution ``vitstudy`` installs ``study``, ``runners``,
``analysis`` and ``vitstudy_core`` (nothing else), and ``python -m study`` and the ``study`` console script
work from a folder that holds its own ``analysis/``, ``core/`` and ``runners/`` packages.

The wheel goes into a fresh venv whose dependencies are those of the interpreter running the tests, whatever
it is (a venv, a conda environment, the system Python): a ``.pth`` file in the venv adds that interpreter's
site directories after the venv's own, as ``--system-site-packages`` would for the *base* interpreter (which
lacks the dependencies when the tests run in a venv). The wheel itself is installed with ``--no-deps``, so
the venv's copy must win over any editable install of the repo: checked through ``__file__``. About 15 s,
no network.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("vitstudy_core", "study", "runners", "analysis")
RAISES = 'raise ImportError("the user\'s own {name}/ folder was imported in place of the installed one")\n'


def _copy_source(dst: Path) -> Path:
    """What the wheel is built from, copied so that the build leaves nothing (build/, *.egg-info) in REPO."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (it would put the repo before the venv's site-packages)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of this checkout, as ``pip wheel`` builds it for an install."""
    pytest.importorskip("setuptools", reason="the build backend (pyproject.toml) is setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_source(tmp / "src")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp / "dist",
            src,
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = (tmp / "dist").glob("vitstudy-*.whl")
    return path


def _site_dirs() -> list[str]:
    """This interpreter's site directories, in its own order: the user site (if enabled), then
    site-packages (a venv's own, plus its base's when the venv was made with ``--system-site-packages``)."""
    dirs = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    return [d for d in dict.fromkeys([*dirs, *site.getsitepackages()]) if os.path.isdir(d)]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel, its dependencies taken from this interpreter; returns its folder."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    ).stdout.strip()
    # addsitedir also runs the .pth files there (namespace packages, editable installs), as a site dir would;
    # the venv's own site-packages stays first on sys.path, so its copy of our packages wins
    lines = [f"import site; site.addsitedir({d!r})\n" for d in _site_dirs()]
    (Path(purelib) / "_tests_parent_site.pth").write_text("".join(lines))
    # pip comes from this interpreter's site-packages and installs into the venv (its sys.prefix)
    inst = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert inst.returncode == 0, inst.stderr[-3000:]
    return venv


def test_the_wheel_holds_our_four_packages_and_no_generic_core(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == set(PACKAGES)
    assert "Name: vitstudy" in meta.splitlines()
    assert "study = study.cli:main" in entry
    # every module of the checkout's packages is in the wheel (kinds and objectives sub-packages too)
    expected = {p.relative_to(REPO).as_posix() for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    assert expected <= set(names)
    # the data files the packages read: timm's registry per version (runners.model_table.SHIPPED)
    assert "runners/timm_models.json" in names
    # nothing in the packages reads the hypotheses/ folder at run time, so the wheel needs none of it
    assert not [n for n in names if n.startswith("hypotheses/")]


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """A working folder with its own analysis/, core/ and runners/ packages that raise when imported."""
    work = tmp_path / "work"
    for name in ("analysis", "core", "runners"):
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(RAISES.format(name=name))
    shutil.copy2(REPO / "hypotheses" / "u_shape.yaml", work / "u_shape.yaml")
    return work


def test_installed_copy_is_the_one_imported(installed, tmp_path):
    code = (
        "import study, vitstudy_core, runners, analysis; print(study.__file__); print(vitstudy_core.__file__)"
    )
    out = subprocess.run(
        [installed / "bin" / "python", "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
    )
    assert out.returncode == 0, out.stderr
    for line in out.stdout.split():
        assert Path(line).resolve().is_relative_to(installed.resolve()), line


@pytest.mark.parametrize("how", ["python -m study", "study"])
def test_users_own_folders_do_not_shadow_ours(installed, user_folder, how):
    cmd = [installed / "bin" / "python", "-m", "study"] if how != "study" else [installed / "bin" / "study"]
    out = subprocess.run(
        [*cmd, "validate", "u_shape.yaml"], capture_output=True, text=True, cwd=user_folder, env=_clean_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok: u_shape.yaml: 1 claim(s), 5 run(s) planned"), out.stdout


def test_cwd_entry_is_dropped_only_when_study_does_not_live_there(monkeypatch, tmp_path):
    """``python -m study`` from elsewhere drops the cwd entry; from a checkout's root it keeps it."""
    from study.__main__ import drop_cwd_entry

    home = Path(sys.modules["study"].__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), "/elsewhere"])
    assert drop_cwd_entry() and sys.path == ["/elsewhere"]
    monkeypatch.setattr(sys, "path", ["/elsewhere", str(tmp_path)])  # an entry the user put later stays
    assert not drop_cwd_entry() and sys.path == ["/elsewhere", str(tmp_path)]
    monkeypatch.chdir(home)
    monkeypatch.setattr(sys, "path", [str(home), "/elsewhere"])
    assert not drop_cwd_entry() and sys.path == [str(home), "/elsewhere"]
