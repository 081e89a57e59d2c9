"""The modules, checked from the source: no import cycles between modules (function-level imports included)
and no function anywhere in the tree over 80 lines. The layering of the packages is tests/test_layout.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("vitstudy_core", "study", "runners", "analysis")
MAX_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Project modules ``name`` imports anywhere in its source (``from pkg import mod`` counts as mod)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_no_import_cycles():
    # a package's __init__ importing its own submodules is how registries load, not a cycle
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d) :] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_function_anywhere_is_over_80_lines():
    # the whole tree: the packages, the bench scripts and the tests
    long = []
    for folder in (*PACKAGES, "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long


def test_the_checks_see_real_imports():
    # guards against a graph that is empty because parsing found nothing
    assert (
        "vitstudy_core.errors" in GRAPH["study.cli.verbs"]
        and "analysis.kinds._parts.selection" in GRAPH["analysis.kinds.u_shape"]
    )


def test_every_test_file_that_starts_a_cluster_shares_the_cluster_worker():
    """A test file that asks for a cluster (Ray, PostgreSQL, Slurm) is in conftest's ``CLUSTER_FILES``, so
    that under pytest-xdist its tests run on the one worker that holds the session's clusters and no two
    clusters start at once."""
    import re

    from tests.conftest import CLUSTER_FILES

    asks = re.compile(r"\b(ray_address|postgres_url|slurm_cluster|slurm_address|ray_cluster|job_cluster)\b")
    here = Path(__file__).name  # this test names them all
    files = {
        p.name for p in (ROOT / "tests").rglob("test_*.py") if p.name != here and asks.search(p.read_text())
    }
    assert files, "no test file asks for a cluster: the pattern is stale"
    assert files <= CLUSTER_FILES, sorted(files - CLUSTER_FILES)


def test_under_pytest_xdist_a_file_s_tests_share_their_group(request):
    """pyproject's ``--dist loadgroup`` with conftest's marks: this test runs in its file's group (pytest 9.2
    with pytest-xdist 3.8 ignored every mark, and the cluster tests ran on both workers at once)."""
    import os

    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not under pytest-xdist (-n 0)")
    assert request.node.nodeid.endswith("@tests/test_architecture.py"), request.node.nodeid
