"""``python -m study plugins``: every registry is listed with what is registered and where it came from,
without torch; installed plug-ins load from entry points, and a broken one is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import vitstudy_core.plugins as plugins
from study.cli import main
from study.plugins import TITLES, registries
from vitstudy_core.plugins import GROUPS, load_plugins, origin, registry_of
from vitstudy_core.registry import OWN_PACKAGES as OWN
from vitstudy_core.registry import Registry

ROOT = Path(__file__).parents[2]


def test_every_registry_is_listed_with_its_names(capsys):
    assert main(["plugins", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["registries"]) == set(TITLES) and {g for g, _ in TITLES.values()} == set(GROUPS)
    for title, (module, reg) in registries().items():
        assert isinstance(reg, Registry) and len(reg) > 0
        listed = out["registries"][title]
        assert listed["registry"] == module and listed["names"] == reg.names()
        assert listed["group"] == reg.group and listed["origins"] == {n: origin(reg, n) for n in reg}
        # the module path the listing names is where the registry lives
        mod, _, attr = module.rpartition(".")
        assert getattr(__import__(mod, fromlist=[attr]), attr) is reg
        # built-in: registered by our own packages' code, and nothing else is
        assert all((origin(reg, n) == "built-in") == (reg.module_of(n).split(".")[0] in OWN) for n in reg)
    assert registries()["claim kinds"][1].module_of("compare") == "analysis.kinds.compare"
    assert registries()["eigenvalue metrics"][1].module_of("effective_rank") == "analysis.spectral"


def test_an_entry_registered_outside_a_distribution_names_its_module():
    reg: Registry[int] = Registry("widget")
    reg.register("mine", 1)
    assert reg.module_of("mine") == __name__ and origin(reg, "mine") == f"module {__name__}"


def test_plugins_does_not_import_torch():
    code = "import sys; from study.cli import main; main(['plugins']); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "claim kinds (analysis.kinds.base.KINDS, entry points vitstudy.kinds):" in done.stdout


def _distribution(root: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds it: a ``.dist-info`` folder and modules."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)


def test_a_broken_plugin_is_one_line_and_the_builtins_still_work(tmp_path, monkeypatch, capsys):
    from analysis.kinds import KINDS
    from analysis.spectral import METRICS

    load_plugins()
    before = {g: r.names() for g, r in plugins.registries().items()}
    _distribution(
        tmp_path,
        "broken-plugin",
        "[vitstudy.metrics]\nmissing = no_such_module_here\ntaken = broken_taken\n",
        {
            # registers a metric, then a name that is taken: refused, and its first metric is removed too
            "broken_taken": "from analysis.spectral import register_metric\n"
            "register_metric('fine_so_far')(lambda lam: 0.0)\n"
            "register_metric('effective_rank')(lambda lam: 0.0)\n"
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_state", "unloaded")
    monkeypatch.setattr(plugins, "BROKEN", [])
    assert load_plugins() is True and load_plugins() is False
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "vitstudy: plug-in 'missing' (vitstudy.metrics) of distribution broken-plugin 0.1 not loaded: "
        "ModuleNotFoundError: No module named 'no_such_module_here'",
        "vitstudy: plug-in 'taken' (vitstudy.metrics) of distribution broken-plugin 0.1 not loaded: "
        "ValueError: metric 'effective_rank' is registered twice",
    ]
    assert {g: r.names() for g, r in plugins.registries().items()} == before
    assert "fine_so_far" not in METRICS and METRICS["effective_rank"] is not None and "compare" in KINDS
    assert main(["plugins"]) == 0
    listed = capsys.readouterr().out
    assert listed.strip().splitlines()[-2:] == lines and "effective_rank" in listed


def test_loading_is_once_and_a_lookup_of_an_unknown_name_loads(monkeypatch):
    calls = []
    monkeypatch.setattr(plugins, "_state", "loaded")
    monkeypatch.setattr(
        plugins.metadata, "entry_points", lambda **kw: calls.append(kw) or metadata.EntryPoints([])
    )
    from analysis.spectral import METRICS

    with pytest.raises(Exception, match="unknown metric 'nope'"):
        METRICS.get("nope")
    assert calls == []  # loaded already: no second read of the entry points
    monkeypatch.setattr(plugins, "_state", "unloaded")
    with pytest.raises(Exception, match="unknown metric 'nope'"):
        METRICS.get("nope")
    assert calls == [{}]  # every group from one read of the installed distributions


def test_built_in_names_only_this_distribution_s_entries():
    from vitstudy.testing import built_in, registered

    reg = registry_of("vitstudy.executors")
    reg.register("elsewhere", reg.get("local"))  # registered by this test module, as a plug-in's would be
    try:
        assert "elsewhere" in registered("executors") and "elsewhere" not in built_in("executors")
        assert "local" in built_in("executors")
    finally:
        reg.discard(["elsewhere"])


KIND_IMPORTING_STUDY = """from analysis.kinds.compare import CompareClaim  # allowed: the analysis layer
from study.schema import Hypothesis  # the application layer, whose schema the kinds build
"""
HELPER_IMPORTING_STUDY = "import study_helper_of_plugin\n"
LAZY_AND_TYPING_ONLY = """from typing import TYPE_CHECKING

from analysis.spectral import register_metric

if TYPE_CHECKING:
    from study.schema import Hypothesis


def later():
    from study.schema import Hypothesis  # runs when called, after loading: harmless

    return Hypothesis


register_metric("a_lazy_plugins_metric")(lambda lam: 0.0)
"""
LAYER_LINES = [
    "vitstudy: plug-in 'direct' (vitstudy.kinds) of distribution layered-plugin 0.1 not loaded: ImportError: "
    'imports study ("from study.schema import Hypothesis" (kind_importing_study.py, line 2)); a plug-in module '
    "imports from vitstudy_core, analysis and runners, never study",
    "vitstudy: plug-in 'through' (vitstudy.kinds) of distribution layered-plugin 0.1 not loaded: ImportError: "
    "imports study (through another module: study.schema); a plug-in module imports from vitstudy_core, "
    "analysis and runners, never study",
]


def _layered(root: Path) -> Path:
    _distribution(
        root,
        "layered-plugin",
        "[vitstudy.kinds]\ndirect = kind_importing_study\nthrough = kind_through_helper\n"
        "[vitstudy.metrics]\nlazy = lazy_and_typing_only\n",
        {
            "kind_importing_study": KIND_IMPORTING_STUDY,
            "kind_through_helper": HELPER_IMPORTING_STUDY,
            "study_helper_of_plugin": "from study.schema import load_hypothesis\n",
            "lazy_and_typing_only": LAZY_AND_TYPING_ONLY,
        },
    )
    return root


@pytest.mark.parametrize("verb", ["validate", "plugins", "study.validate"])
def test_a_plugin_importing_study_is_one_line_in_every_verb(tmp_path, verb):
    """Refused alike whether the schema is imported first (``validate``, and the API's ``study.validate``,
    whose import of ``study`` builds the schema: the plug-in's import would meet a half-imported module)
    or last (``plugins``: it would look healthy); a lazy or typing-only import loads."""
    root = _layered(tmp_path)
    args = [verb, str(ROOT / "hypotheses" / "u_shape.yaml")] if "validate" in verb else [verb]
    code = "import sys; from study.cli import main; sys.exit(main(sys.argv[1:]))"
    if verb == "study.validate":
        code = "import sys, study; print(study.validate(sys.argv[2]).message)"
    env = {**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{root}"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[:2] == LAYER_LINES
    if verb == "plugins":  # listed as not loaded, the lazy one loaded
        assert done.stdout.strip().splitlines()[-2:] == LAYER_LINES
        assert "a_lazy_plugins_metric" in done.stdout


def test_the_layer_check_reads_only_what_runs_at_import(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_layered(tmp_path)))
    assert plugins._imports_application("lazy_and_typing_only") is None
    assert plugins._imports_application("kind_through_helper") is None  # the import is seen as it happens
    assert plugins._imports_application("kind_importing_study") == (
        '"from study.schema import Hypothesis" (kind_importing_study.py, line 2)'
    )
    pkg = tmp_path / "layered_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "try:\n    import study.cli as cli\nexcept ImportError:\n    cli = None\n"
    )
    (pkg / "kind.py").write_text("x = 1\n")
    assert (
        plugins._imports_application("layered_pkg.kind") == '"import study.cli as cli" (__init__.py, line 2)'
    )


def test_only_the_loading_thread_s_imports_count_against_a_plugin():
    """A plug-in is refused for the imports of ``study`` it makes as it loads, not for another thread's."""
    import threading

    with plugins._application_imports() as seen:
        other = threading.Thread(target=lambda: __import__("study.rerun"))
        other.start()
        other.join()
        __import__("json")
    assert seen == []
    with plugins._application_imports() as seen:
        __import__("study.rerun")
    assert seen == ["study.rerun"]


def _twin_package(root: Path) -> Path:
    """A distribution whose package registers an observable (entry point ``twin_norm_cv = "twinpkg"``; a name no other
    plug-in of the test environments registers, so the test holds with those installed) and
    whose module below it fails to register (``clash = "twinpkg.clash"``, a taken metric name)."""
    _distribution(
        root,
        "twin-plugin",
        "[vitstudy.observables]\ntwin_norm_cv = twinpkg\n[vitstudy.metrics]\nclash = twinpkg.clash\n",
        {},
    )
    (root / "twinpkg").mkdir()
    (root / "twinpkg" / "__init__.py").write_text(
        "import numpy as np\n"
        "from analysis.observables import register_observable\n\n\n"
        "@register_observable('twin_norm_cv', on='sample', bounds=(0.0, None))\n"
        "def twin_norm_cv(x):\n"
        "    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1)\n"
        "    return float(norms.std() / norms.mean())\n"
    )
    (root / "twinpkg" / "clash.py").write_text(
        "from analysis.spectral import register_metric\n\n"
        "register_metric('clash_so_far')(lambda lam: 0.0)\n"
        "register_metric('effective_rank')(lambda lam: 0.0)\n"
    )
    return root


def test_an_entry_point_s_registrations_stand_when_a_module_below_its_package_fails(tmp_path):
    """Before: importing ``twinpkg.clash`` (the metrics group loads before the observables) ran
    ``twinpkg``'s registration, which was undone with ``clash``'s failure; the later import of ``twinpkg``
    was a no-op, so ``plugins`` named the failure but no longer listed ``twin_norm_cv``, and a claim on it was
    refused as an unknown metric."""
    from tests.conftest import TINY_HYPOTHESIS

    (tmp_path / "site").mkdir()
    root = _twin_package(tmp_path / "site")
    hyp = tmp_path / "h.yaml"
    hyp.write_text(TINY_HYPOTHESIS.replace("metric: eed_pct", "metric: twin_norm_cv"))
    env = {**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{root}"}

    def study(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "study", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    broken = (
        "vitstudy: plug-in 'clash' (vitstudy.metrics) of distribution twin-plugin 0.1 not loaded: "
        "ValueError: metric 'effective_rank' is registered twice"
    )
    listed = study("plugins", "--json")
    assert listed.returncode == 0 and listed.stderr.strip().splitlines() == [broken]
    out = json.loads(listed.stdout)
    observables = next(r for r in out["registries"].values() if r["group"] == "vitstudy.observables")
    metrics = next(r for r in out["registries"].values() if r["group"] == "vitstudy.metrics")
    assert (
        "twin_norm_cv" in observables["names"] and observables["origins"]["twin_norm_cv"] == "twin-plugin 0.1"
    )
    assert "clash_so_far" not in metrics["names"]  # the failing module's parts fall with it
    checked = study("validate", str(hyp), "--out", str(tmp_path / "out"))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"ok: {hyp}: 1 claim(s)")
