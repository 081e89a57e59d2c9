"""Nothing the project reads runs code: no unrestricted unpickling anywhere in its own code.

Every Python file of the project's packages (``vitstudy_core``, ``study``, ``runners``, ``analysis``,
``bench``) is parsed and each call that can unpickle is checked:

* ``pickle.load`` / ``pickle.loads`` / ``pickle.Unpickler(...)`` (also ``cPickle``, ``dill``,
  ``cloudpickle``, ``joblib.load``, ``pandas.read_pickle``, ``shelve.open``, ``marshal.load(s)``): refused;
* a subclass of ``pickle.Unpickler`` is allowed only when it overrides ``find_class`` (a restricted
  unpickler: it decides which globals may be built, so a payload cannot name ``os.system``); calling
  ``.load()`` on such an instance is then fine;
* ``torch.load(...)``: only with ``weights_only=True`` written out (tensors and plain containers; any
  other global needs an explicit ``torch.serialization.safe_globals`` allow-list);
* ``np.load(...)``: refused with ``allow_pickle`` set to anything but ``False`` (numpy's default is
  ``False``, so a bare ``np.load`` refuses object arrays);
* the texts ``weights_only=False`` and ``allow_pickle=True`` anywhere (e.g. in a ``**kwargs`` dict).

``ALLOWED`` names the places that are exempt and why; it is empty on purpose: today no place needs it.
On a branch where ``runners/datasets.py`` still reads CIFAR batches with ``pickle.load`` or
``runners/train.py`` reads ``resume.pt`` with ``weights_only=False`` this test fails, naming them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vitstudy_core", "study", "runners", "analysis", "bench")

# (path relative to the repository root, the enclosing function or class) -> why it is safe
ALLOWED: dict[tuple[str, str], str] = {}

_PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle"}
_REFUSED_CALLS = {
    ("joblib", "load"): "joblib.load unpickles",
    ("pd", "read_pickle"): "pandas.read_pickle unpickles",
    ("pandas", "read_pickle"): "pandas.read_pickle unpickles",
    ("shelve", "open"): "shelve unpickles its values",
    ("marshal", "load"): "marshal builds code objects",
    ("marshal", "loads"): "marshal builds code objects",
}


def _dotted(node: ast.AST) -> tuple[str, ...]:
    """``a.b.c`` -> ('a', 'b', 'c'); anything else -> ()."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return (node.id, *reversed(parts))
    return ()


def _kw(call: ast.Call, name: str):
    """The constant value of keyword ``name`` (``...`` when it is absent, None when not a constant)."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else None
    return ...


def _restricted_unpicklers(tree: ast.AST) -> set[str]:
    """Names of classes deriving from ``pickle.Unpickler`` that override ``find_class``."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {_dotted(b)[-1:] for b in node.bases}
        if ("Unpickler",) in bases and any(
            isinstance(f, ast.FunctionDef) and f.name == "find_class" for f in node.body
        ):
            out.add(node.name)
    return out


def _problem(call: ast.Call) -> str | None:
    """Why ``call`` may unpickle untrusted bytes, or None."""
    name = _dotted(call.func)
    if len(name) >= 2 and name[-2] in _PICKLE_MODULES and name[-1] in ("load", "loads", "Unpickler"):
        return (
            f"{'.'.join(name)} runs whatever the file names (use numpy/safetensors or a restricted Unpickler)"
        )
    if name[-2:] in _REFUSED_CALLS:
        return _REFUSED_CALLS[name[-2:]]
    if name[-2:] == ("torch", "load") and _kw(call, "weights_only") is not True:
        return "torch.load without weights_only=True"
    if name[-2:] in (("np", "load"), ("numpy", "load")) and _kw(call, "allow_pickle") not in (..., False):
        return "np.load with allow_pickle other than False"
    return None


def scan_source(text: str, path: str = "<string>") -> list[tuple[str, int, str, str]]:
    """Every unpickling place of one module: (path, line, enclosing function/class, why)."""
    tree = ast.parse(text, path)
    found = []
    scopes: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for sub in ast.walk(node):
                # innermost wins: ast.walk visits outer scopes first
                scopes[id(sub)] = node.name
    restricted = _restricted_unpicklers(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name not in restricted:
            if any(_dotted(b)[-1:] == ("Unpickler",) for b in node.bases):
                found.append((path, node.lineno, node.name, "an Unpickler subclass without find_class"))
        if isinstance(node, ast.Call) and (why := _problem(node)):
            found.append((path, node.lineno, scopes.get(id(node), "<module>"), why))
    for i, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0].replace(" ", "")
        for bad in ("weights_only=False", "allow_pickle=True"):
            if bad in code and not any(f[1] == i for f in found):
                found.append((path, i, "<text>", f"{bad} written out"))
    return found


def project_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_scanner_finds_each_way_in():
    """The scanner itself: every refused form is found, and the safe forms are not."""
    bad = """
import pickle, torch, numpy as np, pandas as pd
def a(f): return pickle.load(f, encoding="bytes")
def b(s): return pickle.loads(s)
def c(p): return torch.load(p, map_location="cpu", weights_only=False)
def d(p): return torch.load(p)
def e(p): return np.load(p, allow_pickle=True)
def f(p): return pd.read_pickle(p)
class Loose(pickle.Unpickler):
    pass
def g(f): return pickle.Unpickler(f).load()
KW = dict(weights_only=False)
"""
    got = scan_source(bad)
    assert sorted({f[2] for f in got}) == ["<text>", "Loose", "a", "b", "c", "d", "e", "f", "g"], got
    safe = """
import pickle, torch, numpy as np
class Only(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(name)
def a(f): return Only(f, encoding="bytes").load()
def b(p): return torch.load(p, map_location="cpu", weights_only=True)
def c(p):
    with np.load(p) as z:
        return dict(z)
def d(p): return np.load(p, allow_pickle=False)
# weights_only=False in a comment is fine
"""
    assert scan_source(safe) == []


@pytest.mark.parametrize("path", project_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unrestricted_unpickling(path):
    rel = str(path.relative_to(ROOT))
    found = [f for f in scan_source(path.read_text(), rel) if (rel, f[2]) not in ALLOWED]
    assert not found, "\n".join(f"{p}:{line} in {scope}: {why}" for p, line, scope, why in found)


def test_allow_list_entries_still_exist():
    """An exemption for a place that no longer unpickles is stale: remove it."""
    for (rel, scope), why in ALLOWED.items():
        assert why.strip(), (rel, scope)
        hits = scan_source((ROOT / rel).read_text(), rel)
        assert any(h[2] == scope for h in hits), f"stale allow-list entry {rel}:{scope}"
