"""The folders, checked from the source: docs/architecture.md's tree is the packages on disk, the layers
import downwards only, nothing imports a package's private module from outside it, and no folder grows
back into a flat list of name-prefixed families."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# bottom up: a package may import only the packages before it
LAYERS = ("vitstudy_core", "analysis", "runners", "study", "vitstudy")
MAX_MODULES = 20  # modules directly in one folder
MAX_PREFIX = 2  # modules of one folder sharing a name prefix


def _package_dirs() -> set[str]:
    return {
        str(init.parent.relative_to(ROOT)) for layer in LAYERS for init in (ROOT / layer).rglob("__init__.py")
    }


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every absolute import of ``path`` (function-level ones included), as dotted targets; ``from a import
    b`` gives ``a.b`` (a module or a name in ``a``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def _tree_in_docs() -> set[str]:
    """The folders named by the ``text`` block under "## The folders" in docs/architecture.md (two spaces
    of indent per level)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"## The folders\n.*?```text\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md: no ```text block under '## The folders'"
    found, stack = set(), []
    for line in block.group(1).splitlines():
        m = re.match(r"( *)(\w+)/ {2,}\S", line)
        assert m, f"docs/architecture.md: {line!r}: expected '<indent><folder>/  <its job>'"
        depth = len(m.group(1)) // 2
        stack[depth:] = [m.group(2)]
        found.add("/".join(stack))
    return found


def test_the_tree_in_architecture_md_is_the_packages_on_disk():
    docs, disk = _tree_in_docs(), _package_dirs()
    assert docs == disk, f"only in the docs: {sorted(docs - disk)}; only on disk: {sorted(disk - docs)}"


def test_the_docs_tree_parser_sees_every_level():
    # guards against a parser that reads nothing or flattens the nesting
    assert {"study", "study/schema", "analysis/kinds/_parts"} <= _tree_in_docs()


def _owner(target: str) -> str | None:
    """The package a private module belongs to: the dotted prefix before its first ``_``-named part
    (``study.schema._design`` -> ``study.schema``); None for a public path."""
    parts = target.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


MODULES = {_module_name(p) for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}


def _module_of(target: str) -> str | None:
    """The project module an import target names or lies in (``a.b._name`` -> ``a.b``); None: not ours."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_no_module_imports_a_private_module_from_outside_its_package():
    # the packages and bench/; tests may reach into private modules to test them. A private name in a
    # public module (``from a.b import _helper``) is not a private module.
    bad = []
    for folder in (*LAYERS, "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            here = _module_name(path)
            for target in filter(None, map(_module_of, _imports(path))):
                owner = _owner(target)
                if owner and not (here == owner or here.startswith(owner + ".")):
                    bad.append(f"{path.relative_to(ROOT)}: {target}")
    assert not bad, "\n".join(sorted(set(bad)))


@pytest.mark.parametrize(
    ("target", "owner"),
    [
        ("study.schema._design", "study.schema"),
        ("analysis.kinds._parts.claim", "analysis.kinds"),
        ("study.api", None),
    ],
)
def test_owner_of_a_private_module(target, owner):
    assert _owner(target) == owner


def test_each_layer_imports_only_the_layers_below_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            for target in _imports(path):
                top = target.split(".")[0]
                if top in rank and rank[top] > rank[layer]:
                    bad.append(f"{path.relative_to(ROOT)}: {target}")
    assert not bad, "\n".join(sorted(set(bad)))


def _prefix(module: str) -> str:
    """A module's family: its first word, singular (``checkpoint_files`` and ``checkpoints``: checkpoint)."""
    return module.lstrip("_").split("_")[0].removesuffix("s")


def test_no_folder_is_a_flat_list_of_families():
    bad = []
    for folder in sorted(_package_dirs()):
        modules = [p.stem for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"]
        if len(modules) > MAX_MODULES:
            bad.append(f"{folder}: {len(modules)} modules (at most {MAX_MODULES})")
        crowded = {k: n for k, n in Counter(map(_prefix, modules)).items() if n > MAX_PREFIX}
        if crowded:
            bad.append(f"{folder}: modules sharing a prefix {crowded} (a subpackage?)")
    assert not bad, "\n".join(bad)


def test_every_test_folder_is_named_in_architecture_md():
    # the tests' folders, as the docs' `tests/` paragraph lists them (`tests/<folder>/`), and the disk's
    text = (ROOT / "docs" / "architecture.md").read_text()
    docs = set(re.findall(r"`tests/(\w+)/`", text))
    disk = {p.parent.name for p in (ROOT / "tests").glob("*/__init__.py")}
    assert docs == disk, f"only in the docs: {sorted(docs - disk)}; only on disk: {sorted(disk - docs)}"


def test_the_tree_tracks_no_third_party_build_and_a_test_s_dependency_is_in_the_test_extra():
    """Before: a 554 KB mpmath wheel was tracked at the repository's root, for a test whose dependency the
    test extra did not name."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "*.whl", "*.tar.gz", "*.egg", "*.zip"], cwd=ROOT, capture_output=True, text=True
    )
    assert tracked.returncode == 0 and tracked.stdout.split() == []
    extra = re.search(r"^test = \[\n(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert extra and re.search(r'^ *"mpmath\b', extra.group(1), re.M)
