"""A real third-party plug-in: the example package of docs/plugins.md, built as a wheel, installed in a
fresh virtual environment beside ours, validated and run through ``python -m study``, and checked with the
shipped contract suite (slow: a wheel build, a tiny study and the contract's two training steps)."""

from __future__ import annotations

import json
import os
import re
import shlex
import site
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins.md"
FENCE = re.compile(r"```[a-z]*\n# file: (?P<path>\S+)\n(?P<body>.*?)```", re.S)


def example_files() -> dict[str, str]:
    """``{relative path: text}`` of every fenced block of docs/plugins.md that starts ``# file: PATH``."""
    return {m["path"]: m["body"] for m in FENCE.finditer(DOC.read_text())}


def test_the_docs_example_is_complete():
    files = example_files()
    assert {
        "pyproject.toml",
        "vitstudy_example/metric.py",
        "vitstudy_example/kind.py",
        "vitstudy_example/objective.py",
        "vitstudy_example/trainer.py",
        "tests/test_contract.py",
        "example.yaml",
    } <= set(files)
    for group in ("vitstudy.metrics", "vitstudy.kinds", "vitstudy.objectives"):
        assert f'[project.entry-points."{group}"]' in files["pyproject.toml"]


def build_commands() -> list[str]:
    """The ``python -m pip`` lines of docs/plugins.md's "Build and try it" block, as written."""
    block = DOC.read_text().split("Build and try it:", 1)[1].split("\n\n")[1]
    lines = [line.strip().split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("python -m pip ")]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def make_venv(env_dir: Path) -> tuple[Path, dict[str, str]]:
    """(its python, the environment to run it in): a fresh venv whose ``.pth`` puts this tree and the
    running interpreter's site-packages on its path (no download, no ``--system-site-packages``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [str(ROOT), *site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    (Path(purelib) / "_vitstudy_outer.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return py, env


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory):
    """(venv python, package folder, env): the example wheel installed in a fresh venv (:func:`make_venv`)."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "vitstudy-example"
    for rel, text in example_files().items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    py, env = make_venv(root / "venv")
    # the doc's build and install lines as written, in the venv (offline here: --no-index, so pip takes
    # setuptools from what the venv sees instead of downloading it)
    commands = build_commands()
    assert [c.split()[3] for c in commands] == ["install", "wheel", "install"], commands
    for line in commands:
        _run([str(py), *shlex.split(line)[1:], "--no-index"], pkg, env)
    (wheel,) = (pkg / "dist").glob("vitstudy_example-0.1.0-*.whl")
    assert wheel.name == commands[-1].rsplit("/", 1)[1]
    return py, pkg, env


@pytest.mark.slow
def test_plugins_names_the_distribution(plugin_venv):
    py, pkg, env = plugin_venv
    done = _run([str(py), "-m", "study", "plugins", "--json"], pkg, env)
    out = json.loads(done.stdout)
    regs = out["registries"]
    assert out["broken"] == []
    for title, name in (
        ("eigenvalue metrics", "top_share"),
        ("claim kinds", "higher"),
        ("objectives", "mirrored"),
    ):
        assert regs[title]["origins"][name] == "vitstudy-example 0.1.0"
    assert regs["claim kinds"]["origins"]["compare"] == "built-in"
    text = _run([str(py), "-m", "study", "plugins"], pkg, env).stdout
    assert "higher [vitstudy-example 0.1.0]" in text


@pytest.mark.slow
def test_a_study_using_the_three_parts_validates_and_runs(plugin_venv):
    py, pkg, env = plugin_venv
    _run([str(py), "-m", "study", "validate", "example.yaml"], pkg, env)
    _run(
        [str(py), "-m", "study", "run", "example.yaml", "--out", "out", "--workers", "1", "--no-report"],
        pkg,
        env,
    )
    verdicts = json.loads((pkg / "out" / "studies" / "example" / "verdicts.json").read_text())
    (claim,) = verdicts["claims"]
    assert claim["kind"] == "higher" and claim["verdict"] in {"ACCEPTED", "REJECTED", "INCONCLUSIVE"}
    assert claim["seeds_used"] == [0, 1, 2]


@pytest.mark.slow
def test_the_shipped_contract_suite_runs_on_the_plugins_parts(plugin_venv):
    py, pkg, env = plugin_venv
    done = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], pkg, env)
    assert re.search(r"\b12 passed\b", done.stdout), done.stdout[
        -2000:
    ]  # 3 metric, 5 kind, 4 objective checks
