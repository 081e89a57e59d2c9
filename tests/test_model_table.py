"""``runners.model_table``: timm's registry as a cached table that answers what timm answers, kept in the
user's cache folder, refilled for another timm version, and asked of timm only for what it lacks."""

from __future__ import annotations

import json

import pytest

import runners.model_table as mt


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's, and no table read yet in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(mt, "_table", None)
    return tmp_path / "vitstudy" / mt.FILE


def test_the_cache_folder_follows_xdg_and_defaults_to_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert mt.cache_dir() == tmp_path / "x" / "vitstudy"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/path"):  # the XDG specification: empty or relative means unset
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert mt.cache_dir() == tmp_path / "home" / ".cache" / "vitstudy"


def test_the_table_answers_what_timm_answers_for_every_name(cache, monkeypatch):
    import timm
    import timm.models

    asked = []
    ask = mt._ask_timm
    monkeypatch.setattr(mt, "_ask_timm", lambda arch: asked.append(arch) or ask(arch))

    names = timm.list_models() + list(timm.models.get_deprecated_models())
    names += ["vit_small_patch16_224.augreg_in21k", "vit_small_patch16_224.no_such_tag", "", "VIT_SMALL"]
    names += ["resnet18", "no_such_model", "eva02_tiny_patch14_224", "vit_small_patch16_224_in21k"]
    for name in names:
        expected = timm.is_model(name) and timm.models.is_model_in_modules(name, ["vision_transformer"])
        assert mt.is_vit(name) == expected, name
    assert json.loads(cache.read_text())["timm"] == mt.timm_version()
    # the filled table holds every name timm knows (its deprecated ones too): only unknown names are asked
    assert sorted(asked) == sorted({"", "VIT_SMALL", "no_such_model"})


def test_a_filled_table_is_read_without_timm(cache, monkeypatch):
    mt.table()  # filled and written
    monkeypatch.setattr(mt, "_table", None)
    monkeypatch.setattr(mt, "_fill", lambda version: pytest.fail("filled again"))
    monkeypatch.setattr(mt, "_ask_timm", lambda arch: pytest.fail(f"asked timm for {arch}"))
    assert mt.is_vit("vit_tiny_patch16_224") and not mt.is_vit("resnet18")


def test_another_timm_version_refills_the_table(cache, monkeypatch):
    mt.table()
    monkeypatch.setattr(mt, "_table", None)
    monkeypatch.setattr(mt, "timm_version", lambda: "0.0.1-other")
    filled = []
    monkeypatch.setattr(mt, "_fill", lambda v: filled.append(v) or {"timm": v, "models": {}, "built": {}})
    mt.table()
    assert filled == ["0.0.1-other"] and json.loads(cache.read_text())["timm"] == "0.0.1-other"


def test_a_damaged_table_is_refilled(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text('{"timm": "1.0", "models": ')
    assert mt.is_vit("vit_tiny_patch16_224")
    assert "vit_tiny_patch16_224" in json.loads(cache.read_text())["models"]


def test_a_name_the_table_lacks_is_asked_of_timm_once_and_added(cache, monkeypatch):
    data = mt.table()
    del data["models"]["vit_tiny_patch16_224"]
    mt._save(data)
    monkeypatch.setattr(mt, "_table", None)
    asked = []
    ask = mt._ask_timm
    monkeypatch.setattr(mt, "_ask_timm", lambda arch: asked.append(arch) or ask(arch))
    assert mt.is_vit("vit_tiny_patch16_224.augreg_in21k") and mt.is_vit("vit_tiny_patch16_224")
    assert asked == ["vit_tiny_patch16_224"]
    assert json.loads(cache.read_text())["models"]["vit_tiny_patch16_224"] == "vision_transformer"
    assert not mt.is_vit("no_such_model") and asked[-1] == "no_such_model"  # unknown to timm: not added
    assert "no_such_model" not in json.loads(cache.read_text())["models"]


def test_a_built_shape_is_asked_of_timm_once_per_model_and_overrides(cache, monkeypatch):
    assert mt.built_shape({"name": "flexivit_small"}) == {
        "patch_size": 16,
        "depth": 12,
        "embed_dim": 384,
        "num_heads": 6,
    }
    small = {"name": "vit_small_patch16_224", "embed_dim": 16, "depth": 3, "num_heads": 2}
    assert mt.built_shape(small) == {"patch_size": 16, "depth": 3, "embed_dim": 16, "num_heads": 2}
    assert mt.built_shape({"name": "no_such_model"}) is None  # timm cannot build it: an answer too
    monkeypatch.setattr(mt, "_table", None)
    monkeypatch.setattr(mt, "_build", lambda model: pytest.fail(f"built {model} again"))
    assert mt.built_shape({"name": "flexivit_small"})["patch_size"] == 16
    assert mt.built_shape({"name": "no_such_model"}) is None


def test_a_cache_folder_that_cannot_be_written_costs_only_time(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache folder would be under a file
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(mt, "_table", None)
    assert mt.is_vit("vit_tiny_patch16_224") and not mt.is_vit("resnet18")
    assert mt.built_shape({"name": "flexivit_small"})["patch_size"] == 16


def test_the_shipped_table_is_the_installed_timm_s_registry():
    """The package's data file (``runners/timm_models.json``) against the live timm build: what
    ``python -m runners.model_table`` writes for the installed version is what timm registers."""
    version = mt.timm_version()
    shipped = mt.shipped(version)
    if shipped is None:
        pytest.skip(f"no shipped table for timm {version}: add it with python -m runners.model_table")
    assert shipped == mt._registry(version)


def test_ship_table_adds_the_installed_version_and_keeps_the_others(tmp_path, monkeypatch):
    path = tmp_path / "shipped.json"
    path.write_text(json.dumps({"0.9.0": {"vision_transformer": ["vit_old"]}}))
    monkeypatch.setattr(mt, "_registry", lambda v: {"vit_b": "vision_transformer", "resnet": "resnet"})
    assert mt.ship_table(path) == mt.timm_version()
    monkeypatch.setattr(mt, "SHIPPED", path)
    assert mt.shipped("0.9.0") == {"vit_old": "vision_transformer"}
    assert mt.shipped(mt.timm_version()) == {"vit_b": "vision_transformer", "resnet": "resnet"}
    assert mt.shipped("0.0.1-other") is None


def test_a_shipped_version_fills_the_cache_without_timm_and_another_falls_back(cache, monkeypatch):
    monkeypatch.setattr(mt, "shipped", lambda v: {"vit_tiny_patch16_224": "vision_transformer"})
    monkeypatch.setattr(mt, "_fill", lambda version: pytest.fail("filled from timm"))
    assert mt.is_vit("vit_tiny_patch16_224")
    assert json.loads(cache.read_text())["models"] == {"vit_tiny_patch16_224": "vision_transformer"}
    monkeypatch.setattr(mt, "_table", None)
    cache.unlink()
    monkeypatch.setattr(mt, "shipped", lambda v: None)  # a timm version without a shipped table: as before
    filled = []
    monkeypatch.setattr(mt, "_fill", lambda v: filled.append(v) or {"timm": v, "models": {}, "built": {}})
    mt.table()
    assert filled == [mt.timm_version()]


def test_the_first_validate_after_installing_imports_neither_timm_nor_torch(tmp_path):
    """Before: the first ``validate`` in an empty user cache built timm's table (5.4-6.2 s: it imported
    torch and timm); every later one took about 1 s."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    if mt.shipped(mt.timm_version()) is None:
        pytest.skip(f"no shipped table for timm {mt.timm_version()}")
    code = (
        "import sys; from study.cli import main; rc = main(['validate', sys.argv[1], '--out', sys.argv[2]]); "
        "print(sorted(m for m in ('torch', 'timm') if m in sys.modules)); sys.exit(rc)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "hypotheses" / "u_shape.yaml"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "cache" / "vitstudy" / mt.FILE).is_file()
