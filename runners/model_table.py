"""What the verbs that train nothing need to know about timm's models, without importing timm or torch.

    from runners.model_table import model_module, built_shape
    model_module("vit_small_patch16_224.augreg_in21k")   # "vision_transformer" (None: timm has no such model)
    built_shape({"name": "flexivit_small"})               # {"patch_size": 16, "depth": 12, ...}

``import timm`` takes seconds (it imports torch, torchvision and ``torch._dynamo``), so ``validate`` and
``plan`` read a small table instead: every architecture timm registers, with the module that registers
it (timm's own ``list_modules``, ``list_models(module=...)`` and ``get_deprecated_models``), filled once per installed timm version and
kept in ``$XDG_CACHE_HOME/vitstudy/timm_models.json`` (default ``~/.cache/vitstudy/``). The installed
version is read from the package metadata, not by importing timm; another version refills the table.

A pretrained model's config and the eval preprocessing timm derives from it (``pretrained_cfg``,
``data_config``: what ``validate`` and ``plan`` put in a pretrained run's key) are kept the same way, asked
of timm the first time a name or a config is met.

The first process after installing need not import timm either: the registry of every timm version the
package has been shipped with is a data file of the package (``runners/timm_models.json``: version ->
module -> architectures, written by :func:`ship_table`, ``python -m runners.model_table``, and checked
against the installed timm by ``tests/test_model_table.py``); a timm version it lacks is filled from timm
as before.

What a model looks like once built (patch size, depth, width, heads: timm builds it on the meta device,
no memory, no weights) is asked of timm the first time a model and its overrides are met and then kept
in the same file. A name the table does not know (a model registered after the table was filled, e.g. by
a plug-in) is asked of timm and added when timm knows it. A cache folder that cannot be written only
costs the time: the answers are the same.
"""

from __future__ import annotations

import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

FILE = "timm_models.json"
SHIPPED = Path(__file__).with_name("timm_models.json")  # timm version -> module -> its architectures
VIT_MODULE = "vision_transformer"  # the timm module whose models the extraction reads (ViT blocks)
_table: dict[str, Any] | None = None  # this process's copy of the file (read once per file and version)
_table_path: Path | None = None


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/vitstudy``, or ``~/.cache/vitstudy`` when the variable is unset, empty or relative
    (as the XDG base directory specification says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "vitstudy"


def timm_version() -> str:
    """The installed timm's version, from its package metadata ("" when timm is not installed)."""
    try:
        return metadata.version("timm")
    except metadata.PackageNotFoundError:
        return ""


def _arch(name: str) -> str:
    """The architecture of a model name: its pretrained tag dropped (``vit_small_patch16_224.augreg``),
    as timm's ``get_arch_name`` does."""
    return name.split(".", 1)[0]


def _read(path: Path, version: str) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("timm") == version
    return (
        data if ok and isinstance(data.get("models"), dict) and isinstance(data.get("built"), dict) else None
    )


def _save(table: dict[str, Any]) -> None:
    """Write the table atomically; a folder that cannot be written is left as it is (the next process
    asks timm again)."""
    from vitstudy_core.io import atomic_write_text

    try:
        atomic_write_text(cache_dir() / FILE, json.dumps(table, sort_keys=True))
    except Exception:  # noqa: BLE001 - a read-only or full cache folder costs only time
        pass


def _fill(version: str) -> dict[str, Any]:
    """The table from timm's registry: architecture -> the module that registers it."""
    import timm
    from timm.models import get_deprecated_models

    models = {
        arch: module
        for module in timm.list_modules()
        # timm's listings leave its deprecated names out, but it still builds them (and is_model knows them)
        for arch in [*timm.list_models(module=module), *get_deprecated_models(module)]
    }
    return {"timm": version, "models": models, "built": {}}


def _registry(version: str) -> dict[str, str]:
    """timm's registry (architecture -> module) as :func:`_fill` builds it, from timm itself."""
    return _fill(version)["models"]


def shipped(version: str) -> dict[str, str] | None:
    """The shipped registry of timm ``version`` (architecture -> module; :data:`SHIPPED`), or None when
    the package holds none for it. Reads a JSON file: no timm, no torch."""
    try:
        modules = json.loads(SHIPPED.read_text(encoding="utf-8")).get(version)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(modules, dict):
        return None
    return {arch: module for module, archs in modules.items() for arch in archs}


def ship_table(path: Path = SHIPPED) -> str:
    """Add the installed timm's registry to the shipped file (``python -m runners.model_table``); the
    other versions it holds are kept. Returns the version added."""
    version = timm_version()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    modules: dict[str, list[str]] = {}
    for arch, module in _registry(version).items():
        modules.setdefault(module, []).append(arch)
    data[version] = {m: sorted(archs) for m, archs in sorted(modules.items())}
    lines = ",\n".join(
        f"{json.dumps(v)}: {{\n"
        + ",\n".join(f"  {json.dumps(m)}: {json.dumps(a)}" for m, a in data[v].items())
        + "\n}"
        for v in sorted(data)
    )
    path.write_text("{\n" + lines + "\n}\n", encoding="utf-8")  # one line per module: readable diffs
    return version


def table() -> dict[str, Any]:
    """``{"timm": version, "models": {architecture: module}, "built": {model key: shape or None}}``: read
    from the cache (once per process); when it is missing, unreadable or of another version, from the
    package's shipped registry of that timm version, else filled from timm."""
    global _table, _table_path
    version, path = timm_version(), cache_dir() / FILE
    if _table is not None and _table["timm"] == version and _table_path == path:
        return _table
    found = _read(path, version)
    if found is None:
        models = shipped(version)
        found = {"timm": version, "models": models, "built": {}} if models is not None else _fill(version)
        _save(found)
    _table, _table_path = found, path
    return found


def _ask_timm(arch: str) -> str | None:
    """The module that registers ``arch`` in timm now (None: timm has no such model)."""
    import timm
    import timm.models

    if not timm.is_model(arch):
        return None
    if timm.models.is_model_in_modules(arch, [VIT_MODULE]):
        return VIT_MODULE
    return next((m for m in timm.list_modules() if timm.models.is_model_in_modules(arch, [m])), "")


def model_module(name: str) -> str | None:
    """The timm module that registers the model ``name`` (a pretrained tag after a dot is ignored, as
    timm ignores it), or None when timm has no such model.

    A name the table lacks is asked of timm; the answer is added to the table when timm knows the name.
    """
    found = table()
    arch = _arch(name)
    if arch in found["models"]:
        return found["models"][arch]
    module = _ask_timm(arch)
    if module is not None:
        found["models"][arch] = module
        _save(found)
    return module


def is_vit(name: str) -> bool:
    """Whether ``name`` is a timm Vision Transformer: registered by timm's ``vision_transformer`` module
    (``timm.is_model(name) and timm.models.is_model_in_modules(name, ["vision_transformer"])``)."""
    return model_module(name) == VIT_MODULE


def family(name: str) -> Literal["vit", "cnn"] | None:
    """``vit`` for a timm Vision Transformer (timm's ``vision_transformer`` module), ``cnn`` for another
    model timm registers (whether it has residual blocks is asked when it is built), None for a name timm
    does not know. From the table: no torch, no timm."""
    module = model_module(name)
    return None if module is None else "vit" if module == VIT_MODULE else "cnn"


def cnn_blocks(model: dict) -> int:
    """The residual blocks of the CNN timm builds from a resolved model (0: timm cannot build it, or it has
    none this package reads; ``validate`` refuses both with one line)."""
    return int((built_shape(model) or {}).get("blocks", 0))


def timm_kwargs(model: dict) -> dict:
    """The ``timm.create_model`` keyword arguments a resolved model (``ModelSpec.resolved()``, a run spec's
    ``model``) sets: all but ``name``, None left out, ``model_args`` merged in with its lists as tuples (as
    timm's signatures declare them)."""
    out = {k: v for k, v in model.items() if k not in ("name", "model_args") and v is not None}
    for key, value in (model.get("model_args") or {}).items():
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def _key(model: dict) -> str:
    return json.dumps(model, sort_keys=True, default=str)


def _build(model: dict) -> dict[str, int] | None:
    """The shape of the model timm builds on the meta device (None: timm cannot build it)."""
    try:
        import timm
        import torch

        from runners.residual import residual_blocks

        with torch.device("meta"):
            built: Any = timm.create_model(model["name"], pretrained=False, **timm_kwargs(model))
        if family(model["name"]) == "cnn":
            found = residual_blocks(built)  # a CNN: its blocks (None: none this package can read)
            return {"blocks": len(found[1])} if found is not None else {"blocks": 0}
        side = built.patch_embed.patch_size  # an int or (h, w)
        shape = {"patch_size": int(side[0] if isinstance(side, tuple | list) else side)}
        for field, value in (
            ("depth", lambda: len(built.blocks)),
            ("embed_dim", lambda: built.embed_dim),
            ("num_heads", lambda: built.blocks[0].attn.num_heads),
        ):
            try:
                shape[field] = int(value())
            except Exception:  # noqa: BLE001 - a ViT variant without the attribute: the field is left out
                pass
        return shape
    except Exception:  # noqa: BLE001 - any failure to build is an answer: "timm cannot build it"
        return None


def built_shape(model: dict) -> dict[str, int] | None:
    """``{"patch_size", "depth", "embed_dim", "num_heads"}`` of the ViT timm builds from a resolved model
    (``ModelSpec.resolved()``: the name and its overrides), ``{"blocks": N}`` of a CNN (its residual blocks,
    ``runners.models.residual_blocks``; 0: none this package reads), or None when timm cannot build it.
    Asked of timm once per model and overrides, then read from the table."""
    found = table()
    key = _key(model)
    if key not in found["built"]:
        found["built"][key] = _build(model)
        _save(found)
    shape = found["built"][key]
    return dict(shape) if shape is not None else None


def _ask_size(model: dict, size: int) -> str | None:
    """Why the model cannot take ``size`` px images (a forward pass on the meta device), or None."""
    import timm
    import torch

    try:
        with torch.device("meta"):
            built: Any = timm.create_model(model["name"], pretrained=False, **timm_kwargs(model))
            built.eval()(torch.empty(1, 3, size, size))
    except Exception as exc:  # noqa: BLE001 - the failure is the answer
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def size_problem(model: dict, size: int) -> str | None:
    """Why a CNN (a resolved model) cannot take ``size`` x ``size`` images, or None: asked of timm once
    per model and size (one forward pass on the meta device: no memory, no weights)."""
    return _remembered("sizes", f"{_key(model)}@{size}", lambda: _ask_size(model, size))


def _remembered(part: str, key: str, ask: Any) -> Any:
    """``table()[part][key]``, asked of timm (``ask()``, a JSON value) and kept the first time."""
    found = table().setdefault(part, {})
    if key not in found:
        found[key] = json.loads(json.dumps(ask()))  # as the file will hold it: tuples read back as lists
        _save(table())
    return found[key]


def _ask_pretrained_cfg(name: str) -> dict | None:
    import timm.models

    try:
        cfg = timm.models.get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:  # noqa: BLE001 - timm raises RuntimeError / KeyError for an unknown name or tag
        return None
    return cfg.to_dict() if cfg is not None else None


def pretrained_cfg(name: str) -> dict | None:
    """timm's pretrained config of a model name with its tag (``get_pretrained_cfg(name).to_dict()``, its
    tuples as lists), or None when timm registers none under that name: asked of timm once per name."""
    return _remembered("pretrained", name, lambda: _ask_pretrained_cfg(name))


def _ask_data_config(cfg: dict) -> dict:
    from timm.data import resolve_data_config

    out = resolve_data_config(pretrained_cfg=cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def data_config(cfg: dict) -> dict:
    """timm's eval data config (``resolve_data_config(pretrained_cfg=cfg)``, tuples as lists) of a
    pretrained config: asked of timm once per config."""
    return _remembered("data_config", _key(cfg), lambda: _ask_data_config(cfg))


def patch_in_name(name: str) -> int | None:
    """The patch size a name like ``..._patch16_...`` carries (None: none)."""
    found = re.search(r"patch(\d+)", name)
    return int(found.group(1)) if found else None


if __name__ == "__main__":
    print(f"{SHIPPED}: added timm {ship_table()}")
