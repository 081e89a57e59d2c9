"""Capabilities, not names: production code does not branch on a registered part's name outside that
part's own module. What a kind, source, dataset or executor must tell the core (allows ``unit: images``,
its models are its seeds, it trains, its images are generated, its flags, what ``submit`` calls) is a
property it declares, so a plug-in can declare it too.

The scan reads every module of ``vitstudy_core``, ``analysis``, ``study`` and ``runners`` and finds each
registered name (any registry, the installed plug-ins' included) used as a branch: an operand of a
comparison (``x == "pretrained"``, ``kind in ("ray", "slurm")``), a key of a dict literal (``{"u_shape":
check}``) or an argparse ``choices=``. Docstrings, comments and values (an example claim's ``"kind":
"compare"``) are not branches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from vitstudy_core.plugins import load_plugins, registries

ROOT = Path(__file__).resolve().parents[2]
TREES = ("vitstudy_core", "analysis", "study", "runners")

# (module, name) -> why the word there is not a branch on that registered part
ALLOWED = {
    ("analysis.simulate", "spectral_anisotropy"): "the simulated study's built-in metric falls with training",
    ("analysis.unit_calibration", "u_shape"): "calibration scenarios of the built-in kinds (bench data)",
    ("analysis.unit_calibration", "compare"): "calibration scenarios of the built-in kinds (bench data)",
    ("analysis.unit_calibration", "differs"): "calibration scenarios of the built-in kinds (bench data)",
    ("analysis.unit_calibration", "eed_pct"): "calibration scenarios of the built-in kinds (bench data)",
    ("study.cli.verbs", "table"): "the verb `table`, not the table source",
    ("study.cli._parser", "table"): "the verb `table` in the table of verbs, not the table source",
    ("study.pipeline.outputs", "table"): "the study's table.parquet, not the table source",
    (
        "study.cluster.gpu_cost",
        "supervised",
    ): "a measured rate's key (an objective names it: throughput_key())",
    ("study.runspecs", "checkpoints"): "the run payload's checkpoint epochs, not the checkpoints source",
    ("runners.sources.train", "checkpoints"): "the design field in its example, not the checkpoints source",
    ("study.pipeline.stages", "local"): "a run reused from the runs/ folder, not the local executor",
    (
        "runners.models",
        "pretrained",
    ): "timm.create_model's argument (set by the study), not the pretrained source",
    **{
        (f"runners.datasets.{m}", "train"): "the training split, not the train source"
        for m in ("disk", "imagefolder", "procedural", "tiny_imagenet", "ucmerced")
    },
}


def _literals(node: ast.AST) -> Iterator[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _literals(element)


def branches(source: str) -> Iterator[tuple[int, str]]:
    """``(line, string)`` of every string literal of ``source`` used as a branch (see the docstring)."""
    for node in ast.walk(ast.parse(source)):
        found: list[ast.Constant] = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += _literals(side)
        elif isinstance(node, ast.Dict):
            found += [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.keyword) and node.arg == "choices":
            found += _literals(node.value)
        yield from ((c.lineno, c.value) for c in found)


def _registered() -> dict[str, set[str]]:
    """Registered name -> the modules that registered it (in any registry)."""
    load_plugins()
    owners: dict[str, set[str]] = {}
    for reg in registries().values():
        for name in reg.names():
            owners.setdefault(name, set()).add(reg.module_of(name))
    return owners


def _hits() -> set[tuple[str, str, int]]:
    owners = _registered()
    hits = set()
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for line, text in branches(path.read_text(encoding="utf-8")):
                if text in owners and module not in owners[text]:
                    hits.add((module, text, line))
    return hits


def test_no_registered_name_is_a_branch_outside_its_own_module():
    hits = _hits()
    wrong = sorted(f"{m}:{line}: {name!r}" for m, name, line in hits if (m, name) not in ALLOWED)
    assert not wrong, f"branches on registered names (declare a capability on the part instead): {wrong}"
    stale = sorted(set(ALLOWED) - {(m, name) for m, name, _ in hits})
    assert not stale, f"ALLOWED entries that no longer occur (remove them): {stale}"


def test_the_scan_finds_each_kind_of_branch():
    code = (
        'if source["kind"] == "pretrained": pass\n'
        'ok = executor in ("ray", "slurm")\n'
        'CHECKS = {"u_shape": None}\n'
        'p.add_argument("--x", choices=("local",))\n'
        'example = {"kind": "compare"}\n'  # a value: not a branch
        'def f():\n    """executor == "slurm" in a docstring"""\n'
    )
    assert sorted(branches(code)) == [
        (1, "pretrained"),
        (2, "ray"),
        (2, "slurm"),
        (3, "u_shape"),
        (4, "local"),
        (5, "kind"),  # a key (not a registered name); the value "compare" is not a branch
    ]
