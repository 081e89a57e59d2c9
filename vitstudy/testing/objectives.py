"""Contract checks of the training objectives (:data:`runners.objectives.OBJECTIVES`).

An objective passes when its settings parse from a hypothesis file by name and as a mapping, survive the
run spec a worker receives, each of its presets fills its sections (the file's own values winning), and
its trainer trains two steps, evaluates, and resumes bitwise from a ``weights_only=True`` load (torch).
"""

from __future__ import annotations

import copy
import io
import json
import math
from typing import Any

from runners.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    ObjectiveSettings,
    find_preset,
    make_objective,
    objective_payload,
    objective_settings,
    trainer_class,
)
from vitstudy_core.errors import StudyError

# a seconds-long design: 32 px images (the smallest at which every built-in preset's crops hold a 4 px
# patch: DINO's 5% local crops are 7 px there), a 3-block ViT of width 16
BASE: dict = {
    "name": "tiny",
    "design": {
        "datasets": [
            {"name": "objects", "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 32}
        ],
        "model": {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2},
        "seeds": [0, 1, 2],
        "checkpoints": [0, 2],
        "probe": {"size": 16},
    },
    "claims": [
        {
            "name": "u",
            "kind": "u_shape",
            "metric": "eed_pct",
            "subset": {"dataset": "objects"},
            "regions": {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]},
        }
    ],
}


def hypothesis(objective: object, **design: object):  # -> study.schema.Hypothesis
    """The tiny hypothesis with ``design.objective = objective`` (and ``design`` keys on top)."""
    from study.schema import parse_hypothesis

    data = copy.deepcopy(BASE)
    data["design"].update(objective=objective, **design)
    return parse_hypothesis(data, "h.yaml")


def check_objective_settings(name: str) -> None:
    """Settings: a documented ``ObjectiveSettings`` whose ``kind`` defaults to its name; by name or as a
    mapping it validates with every default; the planned run's payload reads back the same settings;
    an unknown key is a one-line error naming it."""
    from study.runspecs import plan_runs

    cls = OBJECTIVES.get(name)
    assert issubclass(cls, ObjectiveSettings) and (cls.__doc__ or "").strip(), f"{name}: undocumented"
    assert cls.model_fields["kind"].default == name
    design = hypothesis(name).design
    assert type(design.objective) is cls and design.objective == cls(), f"{name}: a field without a default"
    assert hypothesis({"kind": name}).design.objective == cls()
    payload = plan_runs(hypothesis(name))[0].objective
    assert payload == (DEFAULT_OBJECTIVE if name == DEFAULT_OBJECTIVE else objective_payload(cls()))
    assert objective_settings(json.loads(json.dumps(payload))) == cls()  # the trainer sees what was planned
    try:
        hypothesis({"kind": name, "no_such_field": 1})
    except StudyError as err:
        assert "design.objective.no_such_field: unknown key" in str(err), str(err)
    else:
        raise AssertionError(f"{name}: an unknown key was accepted")


def check_objective_presets(name: str) -> None:
    """Every preset of the objective: found by its name (not an objective's), fills its objective,
    training and model fields, the file's own training value wins, and its payload reads back."""
    for preset, recipe in OBJECTIVES[name].presets.items():
        assert find_preset(preset) == (name, recipe) and preset not in OBJECTIVES, f"{name}/{preset}"
        design = hypothesis(preset).design
        assert design.objective == hypothesis({"kind": name, "preset": preset}).design.objective
        for field, value in recipe.objective.items():
            assert getattr(design.objective, field) == (tuple(value) if isinstance(value, list) else value)
        for field, value in recipe.training.items():
            assert getattr(design.training, field) == value, f"{name}/{preset}: training.{field}"
        for field, value in recipe.model.items():
            assert getattr(design.model, field) == value, f"{name}/{preset}: model.{field}"
        for field, value in list(recipe.training.items())[:1]:  # the file's own value wins
            own = value * 2 if not isinstance(value, bool) else not value
            assert getattr(hypothesis(preset, training={field: own}).design.training, field) == own
        settings = design.objective
        assert objective_settings(json.loads(json.dumps(objective_payload(settings)))) == settings


def _tiny_run(name: str) -> dict:
    from study.runspecs import plan_runs

    run = plan_runs(hypothesis(name, training={"epochs": 2, "batch_size": 8}))[0].model_dump()
    return json.loads(json.dumps(run))  # as a worker receives it


def check_objective_trains_and_resumes(name: str) -> None:
    """The trainer (on CPU): a timm ViT to measure, two steps of 8 images with progress ticks, a finite
    loss, quality in [0, 1], and a resume from a ``weights_only`` state that trains bitwise the same."""
    import torch

    run = _tiny_run(name)
    size, n_classes = run["dataset"]["image_size"], 10
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, size, size, 3), dtype=torch.uint8, generator=g)
    y = torch.randint(0, n_classes, (16,), generator=g)
    order = torch.arange(16)
    cpu = torch.device("cpu")

    torch.manual_seed(0)
    a = make_objective(run, n_classes, size, 2, cpu)
    cls: Any = trainer_class(name)
    assert isinstance(a, cls) and isinstance(a.measured, torch.nn.Module)
    assert hasattr(a.measured, "forward_features"), f"{name}: the measured model is not a timm ViT"
    ticks: list[tuple] = []
    stats = a.train_epoch(1, x, y, order, lambda step, loss, n: ticks.append((step, loss, n)))
    assert [t[0] for t in ticks] == [0, 1] and all(t[2] == 8 for t in ticks), ticks
    assert math.isfinite(stats["loss"])
    quality = a.evaluate(x, y, x, y)
    accuracies = {k: v for k, v in quality.items() if k.endswith("_acc")}
    assert accuracies and all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in accuracies.values()), quality
    assert all(isinstance(v, int | float) and math.isfinite(v) for v in quality.values()), quality
    n = quality.get("eval_images")  # what the learning check's binomial SE is of
    assert isinstance(n, int) and 1 <= n <= len(x), f"{name}: eval_images {n!r}, expected 1..{len(x)}"
    history = [{"epoch": 1, **stats, **quality}]
    why = objective_settings(run["objective"]).learning_check(history, n_classes)
    assert why is None or (isinstance(why, str) and why and "\n" not in why), (
        f"{name}: learning_check {why!r}"
    )

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
    assert sa == sb, f"{name}: resumed training differs"
    for pa, pb in zip(a.measured.state_dict().values(), b.measured.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), f"{name}: resumed weights differ"


def learnable_batch(size: int, n: int = 16):  # -> (x uint8 (n, S, S, 3), y int64 (n,))
    """A batch a classifier separates at once: class 0 dark noise, class 1 bright noise."""
    import torch

    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.rand(n, size, size, 3, generator=g) * 60 + y[:, None, None, None] * 150
    return x.to(torch.uint8), y


def check_objective_learns(name: str) -> None:
    """Training learns (on CPU, two epochs of two steps on :func:`learnable_batch`): the measured
    model's weights move, the loss changes, and (``loss_falls_at_once``, the default) the last epoch's
    mean loss is below the first step's. A trainer that never steps (a learning rate of 0) fails."""
    import torch

    run = _tiny_run(name)
    size = run["dataset"]["image_size"]
    x, y = learnable_batch(size)
    torch.manual_seed(0)
    trainer = make_objective(run, 2, size, 2, torch.device("cpu"))
    before = [p.detach().clone() for p in trainer.measured.parameters()]
    losses: list[list[float]] = []
    for epoch in (1, 2):
        losses.append([])
        trainer.train_epoch(
            epoch, x, y, torch.arange(len(y)), lambda s, loss, n: losses[-1].append(float(loss))
        )
    flat = [v for epoch in losses for v in epoch]
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.measured.parameters(), strict=True))
    assert moved, f"{name}: training left every weight of the measured model as it was (losses {flat})"
    assert len(set(flat)) > 1, f"{name}: the loss stayed at {flat[0]} over {len(flat)} steps"
    if OBJECTIVES[name].loss_falls_at_once:
        last = sum(losses[-1]) / len(losses[-1])
        assert last < flat[0], (
            f"{name}: the loss did not fall on a learnable batch ({flat}); expected the last epoch's "
            f"mean below the first step's"
        )


CHECKS = {
    "objectives": [
        check_objective_settings,
        check_objective_presets,
        check_objective_trains_and_resumes,
        check_objective_learns,
    ]
}
