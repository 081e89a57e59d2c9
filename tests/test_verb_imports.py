"""The verbs that train nothing import no torch, timm or torchvision, and no MLflow or matplotlib where
they do not need them: each verb runs in a fresh ``python -m study`` process that prints, as it exits,
every module it imported (issue 49)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import env_for, write_runs

TRAINING = {"torch", "timm", "torchvision"}
HEAVY = TRAINING | {"mlflow", "matplotlib"}
# at exit, the top-level names of every module this process imported, on one line of stderr
PROBE = """\
import atexit, runpy, sys
atexit.register(lambda: print("MODULES", *sorted(sys.modules), file=sys.__stderr__))
sys.argv = ["study", *sys.argv[1:]]
runpy.run_module("study", run_name="__main__", alter_sys=True)
"""


def _imported(
    *args: str, env: dict | None = None, full: bool = False
) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules ``python -m study ARGS`` imported (top-level names; every dotted name with ``full``)."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env or env_for(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES ")]
    assert lines, proc.stderr
    names = set(lines[-1].split()[1:])
    return (names if full else {m.split(".")[0] for m in names}), proc


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The tiny hypothesis with every run finished (with training and measurement times, as ``plan``
    reads them), its study run once (so the next ``run`` is a rerun), and the model table filled."""
    from runners.model_table import table
    from study.cli import main
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis

    table()  # what a first validate after installing timm does, once
    root = tmp_path_factory.mktemp("verbs")
    hyp, out = write_runs(root)
    for spec in plan_runs(load_hypothesis(hyp)):
        path = out / "runs" / spec.key / "result.json"
        result = json.loads(path.read_text())
        result.update(run=spec.model_dump(), history=[{"epoch": 1, "epoch_s": 1.0}], measure_s={"0": 0.5})
        path.write_text(json.dumps(result))
    np.save(root / "spectrum.npy", np.linspace(2.0, 0.1, 16))
    assert main(["run", str(hyp), "--out", str(out)]) == 0  # the command the rerun below repeats
    return hyp, out, root / "spectrum.npy"


VERBS = {
    # verb: (its arguments, the heavy modules it may import)
    "validate": (lambda h, o, s: ["validate", str(h)], set()),
    "plan": (lambda h, o, s: ["plan", str(h), "--out", str(o)], set()),
    "plugins": (lambda h, o, s: ["plugins"], set()),
    "status": (lambda h, o, s: ["status", "--out", str(o)], set()),
    "table": (lambda h, o, s: ["table", str(h), "--out", str(o), "--to", str(o / "t.parquet")], set()),
    "metrics": (lambda h, o, s: ["metrics", str(s)], set()),
    "doctor": (lambda h, o, s: ["doctor", "--out", str(o)], {"mlflow"}),  # it checks the MLflow store
    "run (all runs finished, nothing changed)": (lambda h, o, s: ["run", str(h), "--out", str(o)], set()),
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_verb_that_trains_nothing_imports_no_training_stack(finished, verb):
    args, allowed = VERBS[verb]
    loaded, proc = _imported(*args(*finished))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert loaded & HEAVY <= allowed, f"{verb} imported {sorted(loaded & HEAVY - allowed)}"
    if verb.startswith("run"):
        assert "unchanged since the last run" in proc.stdout


def test_the_probe_sees_what_a_verb_imports(finished):
    """The check above can fail: a verb that builds a model (``plan`` with no finished run to time, and
    nothing timed in the user cache) shows torch and timm."""
    hyp, out, _ = finished
    env = env_for(XDG_CACHE_HOME=str(out / "a fresh cache"))  # nothing timed for this design yet
    loaded, proc = _imported("plan", str(hyp), "--out", str(out / "elsewhere"), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert TRAINING <= loaded
    # the step and extraction timed once on this machine are read back from the user cache next time
    loaded, again = _imported("plan", str(hyp), "--out", str(out / "elsewhere"), env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not loaded & TRAINING, loaded & TRAINING
    timed = [line for line in proc.stdout.splitlines() if line.startswith("run time ")]
    assert timed and timed == [line for line in again.stdout.splitlines() if line.startswith("run time ")]


# the statistics stack: validate's dry run of a claim tests on a synthetic table, plan sizes seeds, plugins lists parts
STATS = {"scipy.stats", "statsmodels", "pandas"}
STATS_ALLOWED = {
    "validate": {"pandas"},  # the synthetic table; a t-test claim needs scipy.special only
    "plan": {"pandas"},  # the pilot table; the power is statsmodels' computed from scipy.special
    "plugins": set(),
}


@pytest.mark.parametrize("verb", list(STATS_ALLOWED))
def test_validate_plan_and_plugins_import_no_statistics_stack_they_do_not_use(finished, verb):
    args, _ = VERBS[verb]
    loaded, proc = _imported(*args(*finished), full=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert loaded & STATS <= STATS_ALLOWED[verb], (
        f"{verb} imported {sorted(loaded & STATS - STATS_ALLOWED[verb])}"
    )


def test_validate_of_published_models_asks_timm_once(tmp_path):
    """A pretrained source's run keys hold timm's preprocessing of each model: the first validate asks
    timm (and imports it), the next reads the answer from the model table and imports neither timm nor
    torch; both give the same message."""
    from tests.zoo_cache import DESIGN_MODEL, hub_cache

    hub = hub_cache(tmp_path / "hf", {"tiny_a": 0, "tiny_b": 1})
    hyp = tmp_path / "zoo.yaml"
    hyp.write_text(
        json.dumps(
            {
                "name": "zoo",
                "design": {
                    "datasets": [{"name": "objects", "n_train": 32, "n_test": 256, "image_size": 16}],
                    "model": DESIGN_MODEL,
                    "probe": {"size": 256, "blocks": 8},
                    "source": {
                        "kind": "pretrained",
                        "models": {"a": "hf-hub:timm/tiny_a", "b": "hf-hub:timm/tiny_b"},
                    },
                },
                "claims": [
                    {
                        "name": "c",
                        "kind": "u_shape",
                        "unit": "models",
                        "metric": "eed_pct",
                        "subset": {"dataset": "objects"},
                        "regions": {"early": ["pos_embed"], "bottleneck": ["block_01"], "late": ["norm"]},
                    }
                ],
            }
        )
    )
    env = {**env_for(), "HF_HOME": str(hub), "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first, proc1 = _imported("validate", str(hyp), env=env)
    second, proc2 = _imported("validate", str(hyp), env=env)
    assert proc1.returncode == proc2.returncode == 0, proc1.stderr[-2000:] + proc2.stderr[-2000:]
    assert proc1.stdout == proc2.stdout
    assert "timm" in first  # asked once: the check can see timm
    assert not second & TRAINING, f"the second validate imported {sorted(second & TRAINING)}"


# one argument list per verb, with options set away from their defaults where it has them
ARGV = {
    "validate": ["validate", "h.yaml", "--out", "o"],
    "run": ["run", "h.yaml", "--workers", "2", "--executor", "ray", "--until-decided", "--batch", "3"],
    "plan": ["plan", "h.yaml", "--pilot", "t.parquet", "--json"],
    "sweep": ["sweep", "h.yaml", "--n-trials", "4", "--executor", "slurm", "--storage", "s"],
    "analyze": ["analyze", "h.yaml", "--table", "t.csv", "--json"],
    "metrics": ["metrics", "s.npy"],
    "table": ["table", "h.yaml", "--to", "t.parquet"],
    "report": ["report", "h.yaml", "--out", "o"],
    "ui": ["ui", "--port", "5001", "--no-browser"],
    "plugins": ["plugins", "--json"],
    "doctor": ["doctor", "--repair"],
    "submit": ["submit", "h.yaml", "--address", "http://head:8265", "--ship-code"],
    "status": ["status", "--address", "http://head:8265"],
}


def _verbs(parser) -> dict:
    import argparse

    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_verb_has_an_argument_list_here():
    from study.cli._parser import VERBS as PARSED

    assert list(ARGV) == list(PARSED) == list(_verbs(_full_parser()))


def _full_parser():
    from study.cli._parser import _parser

    return _parser()


@pytest.mark.parametrize("verb", list(ARGV))
def test_the_parser_built_for_one_verb_reads_it_as_the_full_parser_does(verb):
    """``main`` builds only the named verb's options (``run``'s read the executor registry): the help,
    the verb's own help and what its arguments parse to are those of the parser with every verb built."""
    from study.cli._parser import _parser, verb_of

    full, one = _full_parser(), _parser(verb_of(ARGV[verb]))
    assert one.format_help() == full.format_help()
    assert _verbs(one)[verb].format_help() == _verbs(full)[verb].format_help()
    assert vars(one.parse_args(ARGV[verb])) == vars(full.parse_args(ARGV[verb]))
    others = [v for v in ARGV if v != verb]
    assert all(not _verbs(one)[v]._actions[1:] for v in others)  # the others: only their -h
    assert all(_verbs(full)[v]._actions[1:] for v in ARGV)


def test_only_a_first_word_that_is_a_verb_picks_the_parser():
    from study.cli._parser import verb_of

    assert verb_of(["run", "plan"]) == "run"
    assert verb_of(["-h", "run"]) is None and verb_of(["rnu"]) is None and verb_of([]) is None


@pytest.mark.parametrize(
    ("verb", "loads_plugins"), [("validate", True), ("status", False), ("metrics", True)]
)
def test_a_verb_without_executor_options_imports_no_executor_registry(finished, verb, loads_plugins):
    """With no plug-in installed, nothing these verbs do reads the executor registry. With one installed,
    the verbs that load the plug-ins (a claim kind, a dataset or a metric may come from one) import every
    registry (``load_plugins``), the executors' among them; ``status`` loads none (the plug-in
    environment of tests/plugins/test_every_part_plugin.py runs this file with one of each part)."""
    from vitstudy_core.plugins import installed_entry_points

    args, _ = VERBS[verb]
    loaded, proc = _imported(*args(*finished), full=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = loads_plugins and any(installed_entry_points().values())
    assert ("runners.executors.local" in loaded) == expected
