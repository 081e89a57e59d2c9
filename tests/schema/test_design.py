"""Design part of the schema: dataset kinds, objective presets, run keys (stable across versions)."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from runners.objectives.base import objective_names
from runners.objectives.dino_settings import DinoObjective
from runners.objectives.supervised_settings import SupervisedObjective
from study.cli import main
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.errors import StudyError

BASE = yaml.safe_load(TINY_HYPOTHESIS)
# DINO's recipes need crops of at least one patch: 32 px images (5% of 8 px is less than a 4 px patch)
AT32 = {"datasets": [{**BASE["design"]["datasets"][0], "image_size": 32}]}


def _hyp(**design):
    data = copy.deepcopy(BASE)
    data["design"].update(design)
    return parse_hypothesis(data, "h.yaml")


def test_run_keys_are_stable():
    """Pinned keys of hypotheses/u_shape.yaml (protocol version 2): finished runs stay reusable across code
    changes. A change that alters what a run measures must bump PROTOCOL_VERSION and update these."""
    from study.schema import load_hypothesis

    keys = [r.key for r in plan_runs(load_hypothesis("hypotheses/u_shape.yaml"))]
    assert keys[:3] == ["61bc6cb3d3e2ce57", "5a2c236195ed22e9", "05d6ce105b407798"]


def test_dataset_without_kind_is_procedural_and_kinds_are_checked():
    assert _hyp().design.datasets[0].kind == "procedural"
    with pytest.raises(StudyError, match=r"design.datasets\[0\]"):
        _hyp(datasets=[{"name": "x", "kind": "mnist", "path": "/x"}])
    with pytest.raises(StudyError, match=r"design.datasets\[0\].path: required field is missing"):
        _hyp(datasets=[{"name": "x", "kind": "cifar100"}])
    with pytest.raises(StudyError, match="texture_reliance"):
        _hyp(datasets=[{"name": "t", "variant": "textures", "texture_reliance": 0.5}])
    with pytest.raises(StudyError, match="texture_reliance"):
        _hyp(datasets=[{"name": "t", "texture_reliance": 1.5}])


def test_objective_names_presets_and_overrides():
    assert _hyp().design.objective == SupervisedObjective()
    assert _hyp(objective="supervised").design.objective == SupervisedObjective()
    tgo = _hyp(objective="tgo_supervised").design
    assert (tgo.training.label_smoothing, tgo.training.lr, tgo.model.drop_path_rate) == (0.1, 1e-3, 0.1)
    kept = _hyp(objective="tgo_supervised", training={"epochs": 2, "batch_size": 32, "label_smoothing": 0.2})
    assert kept.design.training.label_smoothing == 0.2  # the file's own value wins over the preset
    dino = _hyp(objective={"kind": "dino", "preset": "dino_paper", "n_local_crops": 2}, **AT32).design
    assert isinstance(dino.objective, DinoObjective)
    assert dino.objective.out_dim == 65536 and dino.objective.n_local_crops == 2
    assert dino.training.weight_decay == 0.04 and dino.objective.weight_decay_end == 0.4
    assert _hyp(objective="dino", **AT32).design.objective.out_dim == 1024
    with pytest.raises(StudyError, match="local_crop_size: expected a multiple of the patch size 4"):
        _hyp(objective={"kind": "dino", "local_crop_size": 6}, **AT32)
    names = ", ".join(map(repr, objective_names()))  # every registered objective ('supervised', 'dino', ...)
    with pytest.raises(StudyError, match=f"design.objective: expected {re.escape(names)} or a preset"):
        _hyp(objective="byol")
    with pytest.raises(StudyError, match="design.objective.preset"):
        _hyp(objective={"kind": "supervised", "preset": "dino_small"})
    with pytest.raises(StudyError, match=r"design.objective.out_dim: unknown key"):
        _hyp(objective={"kind": "supervised", "out_dim": 3})


def test_objective_and_compile_in_run_key():
    sup, dino = plan_runs(_hyp())[0], plan_runs(_hyp(objective="dino_small", **AT32))[0]
    assert sup.objective == "supervised" and dino.objective["kind"] == "dino" and sup.key != dino.key
    compiled = plan_runs(_hyp(training={"epochs": 2, "batch_size": 32, "compile": True}))[0]
    assert compiled.key == sup.key  # compiling changes speed, not what is trained
    knob = plan_runs(_hyp(datasets=[{**BASE["design"]["datasets"][0], "clutter": 0.5}]))[0]
    assert knob.key != sup.key


def test_cli_data_root_flag_errors(tmp_path, capsys):
    path = tmp_path / "h.yaml"
    path.write_text(TINY_HYPOTHESIS)
    assert main(["run", str(path), "--out", str(tmp_path), "--data-root", "objects"]) == 2
    assert "--data-root: expected NAME=PATH" in capsys.readouterr().err
    assert main(["run", str(path), "--out", str(tmp_path), "--data-root", "objects=/x"]) == 2
    assert "expected the name of an on-disk dataset" in capsys.readouterr().err


def test_bare_dino_defaults_follow_the_reference_and_preset_keys_stay():
    """main_dino.py: warmup_teacher_temp 0.04, teacher_temp 0.04, warmup_teacher_temp_epochs 0,
    momentum_teacher 0.996, student_temp 0.1, center_momentum 0.9, wd 0.04 -> 0.4, clip 3, freeze 1."""
    o = _hyp(objective="dino", **AT32).design.objective
    assert (o.warmup_teacher_temp, o.teacher_temp, o.warmup_teacher_temp_epochs) == (0.04, 0.04, 0)
    assert (o.momentum_teacher, o.student_temp, o.center_momentum) == (0.996, 0.1, 0.9)
    assert (o.weight_decay_end, o.clip_grad, o.freeze_last_layer_epochs) == (0.4, 3.0, 1)
    # pinned on 32 px images (at 8 px the crops of every DINO recipe hold less than a 4 px patch: refused).
    # DINO's keys moved once, with trainer_version 2 (the lr warmup ending at its peak, as main_dino.py):
    # dino_paper 7120357f6a6c4165 -> 75664ff081c6930f; dino_small also with its new recipe
    # (2add19fe11bf63b6 -> f3ef978d6579fd82); the default objective's keys never moved
    assert plan_runs(_hyp(objective="dino_small", **AT32))[0].key == "f3ef978d6579fd82"
    assert plan_runs(_hyp(objective="dino_paper", **AT32))[0].key == "75664ff081c6930f"


def test_dino_crops_smaller_than_a_patch_are_refused_with_the_field():
    """At 16 px with 4 px patches, a local crop of 5% of the area is 3.6 px: less than one patch."""
    at16 = {"datasets": [{**BASE["design"]["datasets"][0], "image_size": 16}]}
    with pytest.raises(StudyError) as err:
        _hyp(objective={"kind": "dino", "local_crop_scale": [0.05, 0.4]}, **at16)
    msg = str(err.value)
    assert (
        "design.objective.local_crop_scale: dataset objects: the smallest crop (0.05 of the area) is 3.6 px"
        in msg
    )
    assert "expected a lower bound of at least 0.0625" in msg and "\n" not in msg
    with pytest.raises(StudyError, match="design.objective.global_crop_scale"):
        _hyp(
            objective={"kind": "dino", "global_crop_scale": [0.05, 1.0], "local_crop_scale": [0.1, 0.4]},
            **at16,
        )
    assert _hyp(objective="dino_small", **at16).design.objective.local_crop_scale == (0.1, 0.4)
