"""One contract over every registered objective (``runners.objectives.OBJECTIVES``): its settings parse
from a hypothesis file by name and by preset, survive the run spec, and its trainer trains, evaluates and
resumes from a ``weights_only=True`` load."""

from __future__ import annotations

import copy
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    ObjectiveSettings,
    Preset,
    find_preset,
    make_objective,
    objective_payload,
    objective_settings,
    preset_names,
    trainer_class,
)
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.errors import StudyError

REPO = Path(__file__).resolve().parent.parent
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


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_settings_parse_by_name_and_survive_the_run_spec(name):
    cls = OBJECTIVES.get(name)
    assert issubclass(cls, ObjectiveSettings) and (cls.__doc__ or "").strip()
    assert cls.model_fields["kind"].default == name
    design = _hyp(name).design
    assert type(design.objective) is cls and design.objective == cls()  # every field has a default
    assert _hyp({"kind": name}).design.objective == cls()
    payload = plan_runs(_hyp(name))[0].objective
    assert payload == (DEFAULT_OBJECTIVE if name == DEFAULT_OBJECTIVE else cls().model_dump())
    assert objective_settings(json.loads(json.dumps(payload))) == cls()  # the trainer sees what was planned
    with pytest.raises(StudyError, match=r"design.objective.no_such_field: unknown key"):
        _hyp({"kind": name, "no_such_field": 1})


@pytest.mark.parametrize(("kind", "preset"), PRESETS)
def test_every_preset_fills_its_sections_and_the_file_wins(kind, preset):
    recipe: Preset = OBJECTIVES[kind].presets[preset]
    assert find_preset(preset) == (kind, recipe) and preset not in OBJECTIVES
    design = _hyp(preset).design
    assert design.objective == _hyp({"kind": kind, "preset": preset}).design.objective
    for field, value in recipe.objective.items():
        assert getattr(design.objective, field) == (tuple(value) if isinstance(value, list) else value)
    for field, value in recipe.training.items():
        assert getattr(design.training, field) == value
    for field, value in recipe.model.items():
        assert getattr(design.model, field) == value
    for field, value in list(recipe.training.items())[:1]:  # the file's own value wins over the preset's
        own = value * 2 if not isinstance(value, bool) else not value
        assert getattr(_hyp(preset, training={field: own}).design.training, field) == own
    settings = design.objective
    assert objective_settings(json.loads(json.dumps(objective_payload(settings)))) == settings


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


def _tiny_run(name: str) -> dict:
    run = plan_runs(_hyp(name, training={"epochs": 2, "batch_size": 8}))[0].model_dump()
    return json.loads(json.dumps(run))  # as a worker receives it


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_trainer_trains_evaluates_and_resumes_from_a_weights_only_state(name):
    run = _tiny_run(name)
    size, n_classes = run["dataset"]["image_size"], 10
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, size, size, 3), dtype=torch.uint8, generator=g)
    y = torch.randint(0, n_classes, (16,), generator=g)
    order = torch.arange(16)
    cpu = torch.device("cpu")

    torch.manual_seed(0)
    a = make_objective(run, n_classes, size, 2, cpu)
    assert isinstance(a, trainer_class(name)) and isinstance(a.measured, torch.nn.Module)
    assert hasattr(a.measured, "forward_features")  # the extraction hooks a timm ViT
    ticks: list[tuple] = []
    stats = a.train_epoch(1, x, y, order, lambda step, loss, n: ticks.append((step, loss, n)))
    assert [t[0] for t in ticks] == [0, 1] and all(t[2] == 8 for t in ticks)
    assert math.isfinite(stats["loss"])
    quality = a.evaluate(x, y, x, y)
    assert quality and all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in quality.values())

    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # what resume.pt is read with: no unpickling code
    torch.manual_seed(123)  # another initialisation: everything must come from the state
    b = make_objective(run, n_classes, size, 2, cpu)
    b.load_state_dict(state)
    torch.manual_seed(1)
    sa = a.train_epoch(2, x, y, order, lambda *t: None)
    torch.manual_seed(1)
    sb = b.train_epoch(2, x, y, order, lambda *t: None)
    assert sa == sb
    for pa, pb in zip(a.measured.state_dict().values(), b.measured.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)
