"""One contract over every registered objective (``runners.objectives.OBJECTIVES``, the shipped
``vitstudy.testing.objectives``): its settings parse from a hypothesis file by name and by preset, survive
the run spec, and its trainer trains, evaluates and resumes from a ``weights_only=True`` load; here also
what the registry refuses and the one-line errors of unknown names."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    ObjectiveSettings,
    objective_settings,
    preset_names,
)
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy.testing import parametrize_with_checks
from vitstudy_core.errors import StudyError

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load(TINY_HYPOTHESIS)
PRESETS = [(kind, name) for kind, cls in OBJECTIVES.items() for name in cls.presets]


def _hyp(objective: object, **design: object):
    data = copy.deepcopy(BASE)
    data["design"].pop("training")  # the file's own training keys would win over a preset's
    data["design"].update(objective=objective, **design)
    return parse_hypothesis(data, "h.yaml")


def test_the_schema_and_the_registry_import_without_torch():
    code = "import study.schema, runners.objectives, sys; assert 'torch' not in sys.modules, 'torch'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@parametrize_with_checks("objectives")
def test_objective_contract(name, check):
    """The shipped contract (vitstudy.testing.objectives) on every registered objective."""
    check(name)


def test_unknown_names_and_mismatched_presets_are_one_line():
    with pytest.raises(
        StudyError, match=r"design.objective: expected 'supervised', .* or a preset \["
    ) as err:
        _hyp("no_such_objective")
    assert "\n" not in str(err.value) and all(p in str(err.value) for p in preset_names())
    if len(OBJECTIVES) > 1:
        kind, preset = next((k, p) for k, p in PRESETS if k != DEFAULT_OBJECTIVE)
        with pytest.raises(StudyError, match=rf"preset {preset!r} is a {kind} preset"):
            _hyp({"kind": DEFAULT_OBJECTIVE, "preset": preset})
    with pytest.raises(StudyError, match="unknown objective 'nope'"):
        objective_settings("nope")


def test_the_registry_refuses_entries_that_break_the_shape():
    class Wrong(ObjectiveSettings):
        """kind defaults to another name."""

        kind: str = "other"

    with pytest.raises(ValueError, match="kind must default to 'wrong'"):
        OBJECTIVES.register("wrong", Wrong)
    with pytest.raises(ValueError, match="expected an ObjectiveSettings subclass"):
        OBJECTIVES.register("wrong", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="registered twice"):
        OBJECTIVES.register(DEFAULT_OBJECTIVE, OBJECTIVES[DEFAULT_OBJECTIVE])
    assert "wrong" not in OBJECTIVES
