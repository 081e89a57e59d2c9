"""Installed plug-ins reach every process and every key: spawned workers measure a plug-in's observable
and token-count metric, the run key names the plug-in parts that shaped a run (built-ins only: the keys
runs always had), and one namespace holds every name a claim's ``metric:`` can give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vitstudy_core.plugins as plugins
from vitstudy_core.plugins import load_plugins

ROOT = Path(__file__).resolve().parents[2]

MEASURES = '''"""Test plug-in: an observable and a token-count metric.

==============  ==========================================================  ========
name            formula                                                     range
==============  ==========================================================  ========
norm_spread     std / mean of the subsample's token norms                   [0, inf)
trace_per_dim   tr(C) / D of the streamed covariance C                      [0, inf)
==============  ==========================================================  ========
"""

import numpy as np

from analysis.observables import register_observable
from analysis.spectral import register_token_metric


@register_observable("norm_spread", on="sample", bounds=(0.0, None), version=VERSION)
def norm_spread(x):
    """std / mean of the norms of the rows of ``x: (m, D)`` (NaN when every norm is 0)."""
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1)
    return float(norms.std() / norms.mean()) if norms.mean() > 0 else float("nan")


@register_token_metric("trace_per_dim", version=VERSION)
def trace_per_dim(sums):
    """tr(C) / D of the covariance C of the streamed sums ``n``, ``s: (D,)``, ``q: (D, D)``."""
    n, s, q = float(sums["n"]), np.asarray(sums["s"]), np.asarray(sums["q"])
    return float((np.trace(q) - s @ s / n) / (n - 1) / len(s))
'''

TINY = {
    "name": "tiny",
    "design": {
        "datasets": [{"name": "objects", "variant": "objects", "n_train": 32, "n_test": 16, "image_size": 8}],
        "model": {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2},
        "training": {"epochs": 1, "batch_size": 16},
        "seeds": [0, 1],
        "checkpoints": [0, 1],
        "probe": {"size": 16},
    },
    "claims": [
        {
            "name": "norms spread differently",
            "kind": "compare",
            "metric": "norm_spread",
            "subset": {"dataset": "objects", "epoch": 1},
            "a": {"layers": ["block_01"]},
            "b": {"layers": ["block_03"]},
        }
    ],
}


def install(root: Path, version: str = "1") -> Path:
    """A distribution ``measure-plugins 0.1`` as importlib.metadata finds it on ``root``: an observable
    and a token-count metric, each declaring ``version``."""
    info = root / "measure_plugins-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: measure-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vitstudy.observables]\nnorm_spread = measure_plugins\n"
        "[vitstudy.token_metrics]\ntrace_per_dim = measure_plugins\n"
    )
    (root / "measure_plugins.py").write_text(MEASURES.replace("VERSION", repr(version)))
    return root


def _python(args: list[str], plugin_root: Path | None) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh process that finds this tree and (if given) the plug-in on its path."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *([str(plugin_root)] if plugin_root else [])]),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def _plan_keys(hyp: Path, plugin_root: Path | None) -> list[str]:
    """The run keys ``hyp`` plans in a fresh process (with the plug-in installed, or without)."""
    code = (
        "import sys; from study.schema import load_hypothesis; from study.runspecs import plan_runs; "
        "print(' '.join(r.key for r in plan_runs(load_hypothesis(sys.argv[1]))))"
    )
    done = _python(["-c", code, str(hyp)], plugin_root)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture
def hyp(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(TINY))
    return path


@pytest.mark.slow  # two tiny trainings in two spawned workers (~1 min on 2 cores)
def test_spawned_workers_measure_the_plugins_observable_and_token_metric(tmp_path, hyp):
    out = tmp_path / "out"
    args = ["-m", "study", "run", str(hyp), "--out", str(out), "--workers", "2", "--no-mlflow", "--no-report"]
    done = _python(args, install(tmp_path / "plug"))
    assert done.returncode == 0, done.stderr[-3000:]
    scalars = [json.loads(p.read_text())["values"] for p in sorted(out.glob("runs/*/scalars.json"))]
    assert len(scalars) == 2
    for values in scalars:  # every run, every point: the plug-in's values beside the built-ins'
        names = {key.rpartition("/")[2] for key in values}
        assert {"norm_spread", "trace_per_dim", "diagonality", "participation_ratio_bc"} <= names
        assert sum(key.endswith("/norm_spread") for key in values) == sum(
            key.endswith("/diagonality") for key in values
        )
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert verdicts["claims"][0]["seeds_used"] == [0, 1]


def test_a_plugin_part_a_study_uses_is_in_its_run_keys_and_others_keep_theirs(tmp_path, hyp):
    built_in = tmp_path / "built_in_claim.yaml"
    built_in.write_text(json.dumps({**TINY, "claims": [{**TINY["claims"][0], "metric": "eed_pct"}]}))
    plain = _plan_keys(built_in, None)
    assert len(set(plain)) == 2
    assert _plan_keys(built_in, install(tmp_path / "v1", "1")) == plain  # installing it changes no key ...
    with_v1 = _plan_keys(hyp, install(tmp_path / "v1", "1"))  # ... but of a study naming its observable
    assert not set(with_v1) & set(plain)  # the same design: the runs differ by what they must measure
    assert _plan_keys(hyp, install(tmp_path / "v1b", "1")) == with_v1  # same part and version, elsewhere
    assert not set(_plan_keys(hyp, install(tmp_path / "v2", "2"))) & set(with_v1)  # a bumped version


def test_plugin_parts_names_only_what_is_not_built_in(monkeypatch):
    from analysis.observables import OBSERVABLES, Observable
    from study.measured_by import plugin_parts

    load_plugins()
    payload = {"dataset": {"variant": "objects"}, "objective": "supervised"}
    assert plugin_parts(payload, ["eed_pct", "diagonality"]) == {}
    OBSERVABLES.register("a_tests_observable", Observable("sample", lambda x: 0.0), version="3")
    try:
        assert plugin_parts(payload, ["eed_pct"]) == {}  # registered, but not what this study claims
        assert plugin_parts(payload, ["eed_pct", "a_tests_observable"]) == {
            "observables": {"a_tests_observable": {"distribution": f"module {__name__}", "version": "3"}}
        }
    finally:
        OBSERVABLES.discard(["a_tests_observable"])


def test_iterating_a_registry_loads_the_installed_plugins(tmp_path, monkeypatch):
    from analysis.observables import OBSERVABLES
    from analysis.spectral import TOKEN_METRICS

    load_plugins()
    before = (OBSERVABLES.names(), TOKEN_METRICS.names())
    monkeypatch.syspath_prepend(str(install(tmp_path)))
    monkeypatch.setattr(plugins, "_state", "unloaded")
    monkeypatch.setattr(plugins, "BROKEN", [])
    try:
        assert "norm_spread" in list(OBSERVABLES)  # no lookup first: iterating loads
        assert "trace_per_dim" in dict(TOKEN_METRICS.items())
    finally:
        OBSERVABLES.discard(["norm_spread"])
        TOKEN_METRICS.discard(["trace_per_dim"])
        sys.modules.pop("measure_plugins", None)
    assert (OBSERVABLES.names(), TOKEN_METRICS.names()) == before


@pytest.mark.parametrize(
    ("register", "line"),
    [
        ("metric:diagonality", "metric 'diagonality' is registered twice: the name is an observable's"),
        ("metric:participation_ratio_bc", "the name is a token-count metric's"),
        ("token:twonn_id", "token-count metric 'twonn_id' is registered twice: the name is an observable's"),
        ("token:effective_rank", "the name is an eigenvalue metric's"),
        (
            "observable:eed_pct",
            "observable 'eed_pct' is registered twice: the name is an eigenvalue metric's",
        ),
        ("observable:participation_ratio_bc", "the name is a token-count metric's"),
    ],
)
def test_one_namespace_for_every_name_a_claim_can_give(register, line):
    from analysis.observables import OBSERVABLES, register_observable
    from analysis.spectral import METRICS, TOKEN_METRICS, register_metric, register_token_metric

    load_plugins()
    what, _, name = register.partition(":")
    before = {r.what: r.names() for r in (METRICS, TOKEN_METRICS, OBSERVABLES)}
    make = {
        "metric": lambda: register_metric(name),
        "token": lambda: register_token_metric(name),
        "observable": lambda: register_observable(name, on="sample"),
    }[what]
    with pytest.raises(ValueError, match=line.replace("'", ".")) as err:
        make()(lambda x: 0.0)
    assert "\n" not in str(err.value)
    assert {r.what: r.names() for r in (METRICS, TOKEN_METRICS, OBSERVABLES)} == before


NINE_FLAGS = """MISPLACED = "--nine-*: these flags need --executor {name}"


def add_flags(p):
    p.add_argument("--nine-queue", default=None)


def read_flags(args):
    return {"queue": args.nine_queue} if args.nine_queue else {}


def submit(hypothesis, out, opts, options, address):
    return f"nine took {hypothesis} with {options}"
"""


def test_a_plugin_executor_is_a_choice_of_run_and_submit_with_its_own_flags(tmp_path, monkeypatch):
    from dataclasses import replace

    from runners.executors.local import EXECUTORS
    from study.cli._parser import _parser
    from study.cluster.executor_flags import executor_flags, submit_driver
    from vitstudy_core.errors import StudyError

    (tmp_path / "nine_flags.py").write_text(NINE_FLAGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    EXECUTORS.register("nine", replace(EXECUTORS["local"], flags="nine_flags", submit="nine_flags:submit"))
    try:
        p = _parser()
        args = p.parse_args(["run", "h.yaml", "--executor", "nine", "--nine-queue", "q"])
        assert args.executor == "nine" and executor_flags(args) == {"queue": "q"}
        with pytest.raises(StudyError, match=r"^--nine-\*: these flags need --executor nine$"):
            executor_flags(p.parse_args(["run", "h.yaml", "--nine-queue", "q"]))
        with pytest.raises(StudyError, match=r"^--slurm-\*: these flags need --executor slurm$"):
            executor_flags(p.parse_args(["run", "h.yaml", "--executor", "nine", "--slurm-time", "5"]))
        args = p.parse_args(["submit", "h.yaml", "--executor", "nine", "--nine-queue", "q"])
        assert submit_driver(args, None) == "nine took h.yaml with {'queue': 'q'}"
    finally:
        EXECUTORS.discard(["nine"])
        sys.modules.pop("nine_flags", None)
    with pytest.raises(SystemExit):  # gone from the registry: no longer a choice
        _parser().parse_args(["run", "h.yaml", "--executor", "nine"])


def test_metrics_verb_lists_a_plugin_metric(tmp_path, capsys):
    import numpy as np

    from analysis.spectral import METRICS, register_metric
    from study.cli import main

    load_plugins()
    np.save(tmp_path / "lam.npy", np.array([3.0, 2.0, 1.0]))
    register_metric("a_tests_top", bounds=(0.0, 1.0))(lambda lam: float(np.max(lam) / np.sum(lam)))
    try:
        assert main(["metrics", str(tmp_path / "lam.npy")]) == 0
    finally:
        METRICS.discard(["a_tests_top"])
    out = json.loads(capsys.readouterr().out)
    assert out["a_tests_top"] == 0.5 and "effective_rank" in out


def test_claimed_metrics_reads_inner_claims_too():
    from types import SimpleNamespace

    from study.measured_by import claimed_metrics
    from vitstudy.testing.kinds import example_hypothesis

    assert claimed_metrics(example_hypothesis("differs", metric="participation_ratio").claims) == {
        "participation_ratio"
    }
    nested = {"metric": "eed_pct", "claim": {"metric": "norm_spread"}, "all": [{"metric": "trace_per_dim"}]}
    claim = SimpleNamespace(model_dump=lambda: nested)
    assert claimed_metrics([claim]) == {"eed_pct", "norm_spread", "trace_per_dim"}


def test_a_worker_lacking_a_part_the_run_key_names_refuses_before_writing(tmp_path):
    from analysis.observables import OBSERVABLES, Observable
    from runners.executors.jobs import execute_run
    from study.runspecs import plan_runs
    from study.schema import parse_hypothesis
    from vitstudy_core.errors import MachineError

    load_plugins()
    doc = {**TINY, "claims": [{**TINY["claims"][0], "metric": "a_tests_norms"}]}
    OBSERVABLES.register("a_tests_norms", Observable("sample", lambda x: 0.0), version="3")
    try:
        run = plan_runs(parse_hypothesis(doc))[0]
        dumped = run.model_dump()
        want = {"observables": {"a_tests_norms": {"distribution": f"module {__name__}", "version": "3"}}}
        assert run.plugins == want and dumped["plugins"] == want  # the parts its key holds, for the worker
        OBSERVABLES.discard(["a_tests_norms"])
        OBSERVABLES.register("a_tests_norms", Observable("sample", lambda x: 0.0), version="4")
        with pytest.raises(MachineError, match=r"is module .* \(version 4\) here") as other:
            execute_run(dumped, str(tmp_path / "runs" / run.key), str(tmp_path / "data"))
        OBSERVABLES.discard(["a_tests_norms"])
        with pytest.raises(MachineError) as err:  # the worker's registries lack it altogether
            execute_run(dumped, str(tmp_path / "runs" / run.key), str(tmp_path / "data"))
    finally:
        OBSERVABLES.discard(["a_tests_norms"])
    assert "\n" not in str(err.value) and "\n" not in str(other.value)
    assert (
        f"lacks a plug-in part the run's key names: observable 'a_tests_norms' of module {__name__} (version 3) "
        "is not installed: install the plug-in where the runs execute, then rerun the same command to resume"
        in str(err.value)
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()  # nothing written


def test_a_run_of_built_ins_dumps_without_plugins():
    from study.runspecs import plan_runs
    from study.schema import parse_hypothesis

    built_in = {**TINY, "claims": [{**TINY["claims"][0], "metric": "eed_pct"}]}
    run = plan_runs(parse_hypothesis(built_in))[0]
    assert run.plugins == {} and "plugins" not in run.model_dump()
