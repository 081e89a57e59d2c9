"""``python -m study plugins``: every registry is listed with what is registered, without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from study.cli import main
from study.plugins import registries
from vitstudy_core.registry import Registry

ROOT = Path(__file__).parents[1]


def test_every_registry_is_listed_with_its_names(capsys):
    assert main(["plugins", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for title, (module, reg) in registries().items():
        assert isinstance(reg, Registry) and len(reg) > 0
        assert out[title] == {"registry": module, "names": reg.names()}
        # the module path the listing names is where the registry lives
        mod, _, attr = module.rpartition(".")
        assert getattr(__import__(mod, fromlist=[attr]), attr) is reg
    assert {"u_shape", "trend"} <= set(out["claim kinds"]["names"])
    assert {"train", "checkpoints", "table"} == set(out["run sources"]["names"])


def test_plugins_does_not_import_torch():
    code = "import sys; from study.cli import main; main(['plugins']); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "claim kinds (analysis.kinds.base.KINDS):" in done.stdout
