"""bench/gpu_check.py: every step's code path at tiny sizes on the CPU, and a step past its limit killed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # this tree first; what else is on the path stays (a plug-in found there is found by the steps too)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = _cli("--out", str(out), "--cpu-smoke")
    return proc, out, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run; a GPU runs the full check")
def test_cpu_smoke_runs_every_step_and_writes_json_and_table(smoke):
    gc = _module()
    proc, out, summary = smoke
    steps = summary["steps"]
    assert list(steps) == list(gc.SMOKE_STEPS)
    for name, entry in steps.items():
        assert entry["status"] == "passed", (name, entry.get("error"), proc.stdout[-2000:])
        assert entry["limit_s"] == gc.LIMITS_SMOKE[name] and 0 < entry["seconds"] < entry["limit_s"]
    assert proc.returncode == 0 and summary["passed"] and summary["mode"] == "cpu-smoke"
    f = {name: entry["figures"] for name, entry in steps.items()}
    assert f["environment"]["device"] == "cpu" and f["environment"]["torch"] == torch.__version__
    assert f["gpu_tests"]["tests"] >= 1 and f["gpu_tests"]["skipped"] == f["gpu_tests"]["tests"]
    for objective in gc.THROUGHPUT_OBJECTIVES:
        res = f["throughput"][f"{objective}_eager"]
        assert res["images_per_s"] > 0 and res["flops_per_step"] > 0
        assert "skipped" in f["throughput"][f"{objective}_compiled"]  # compile is CUDA-only in our trainers
    assert (
        f["throughput"]["dino_eager"]["flops_per_step"]
        > f["throughput"]["supervised_eager"]["flops_per_step"]
    )
    ext = f["extraction"]["16px_patch4"]
    assert ext["max_rel_err"] < 1e-6 and ext["overhead"] > 0 and ext["t_result_s"] > 0
    from analysis.spectral import METRICS

    assert set(ext["metrics"]) == set(METRICS) and ext["agreement_ok"]
    assert all(m["err"] <= m["tol"] == 1e-6 for m in ext["metrics"].values())
    assert ext["metrics"]["spectral_flatness"]["kind"] == "absolute"
    log = (out / "logs" / "extraction.log").read_text()
    assert "every metric, streaming against the float64 two-pass reference" in log
    assert all(name in log for name in METRICS)  # the per-metric table is printed
    assert f["dino_learns"]["knn_init"] is not None and len(f["dino_learns"]["knn_per_epoch"]) == 1
    assert isinstance(f["dino_learns"]["criterion_met"], bool)
    res = f["resume"]
    assert res["bitwise"] and res["killed_by_sigkill"] and res["resume_file_epoch"] == 1
    assert res["resumed_after_epoch_1"] and res["no_temp_files"]
    assert res["inductor_cache_dir"] == str((out / "work" / "inductor_cache").resolve())
    assert res["fx_graph_cache"] == "1"
    per_gpu = f["runs_per_gpu"]
    assert per_gpu["k1"]["runs"] == per_gpu["k2"]["runs"] == 2 and per_gpu["k2"]["failed"] == 0
    assert per_gpu["k1"]["runs_per_hour"] > 0 and per_gpu["k2"]["runs_per_hour"] > 0
    assert per_gpu["k2"]["per_gpu"][0].startswith("GPU 0 (CUDA_VISIBLE_DEVICES=0): 2 runs, busy ")
    assert per_gpu["final_loss_rel_max"] == 0  # on the CPU the same runs end bitwise alike, whatever K
    table = (out / "gpu_check.txt").read_text()
    assert all(f"{name} " in table for name in gc.SMOKE_STEPS) and "passed" in table


def test_step_past_its_limit_is_recorded_as_timed_out(tmp_path):
    """A 1 s limit on a step that needs more: killed, recorded, the exit status says the check failed."""
    proc = _cli("--out", str(tmp_path), "--cpu-smoke", "--steps", "throughput", "--limit", "throughput=1")
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    entry = summary["steps"]["throughput"]
    assert entry["status"] == "timed_out" and "limit of 1 s" in entry["error"]
    assert entry["seconds"] < 10  # killed at its limit, not left to finish
    assert proc.returncode == 1 and not summary["passed"]
    assert "timed_out" in (tmp_path / "gpu_check.txt").read_text()


def test_bad_arguments_and_peak_table(tmp_path, capsys):
    gc = _module()
    assert gc.main(["--out", str(tmp_path), "--steps", "nope"]) == 2
    assert "--steps: expected names from" in capsys.readouterr().err
    assert gc.main(["--out", str(tmp_path), "--limit", "throughput=x"]) == 2
    assert "--limit: expected STEP=SECONDS" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gc.main(["--out", str(tmp_path)]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "gpu_check.json").exists()  # nothing half-written
    peak = gc.peak_bf16_tflops
    assert peak("NVIDIA H100 80GB HBM3") == 989.0 and peak("NVIDIA H100 PCIe") == 756.0
    assert peak("NVIDIA H200") == 989.0 and peak("NVIDIA A100-SXM4-80GB") == 312.0
    assert (
        peak("NVIDIA L4") == 121.0 and peak("NVIDIA L40S") == 362.0 and peak("Tesla V100-SXM2-16GB") is None
    )


def test_killed_and_resumed_runs_share_inductors_cache(tmp_path, monkeypatch):
    """Every step's process gets TORCHINDUCTOR_CACHE_DIR in the check's work folder (FX graph and AOT
    autograd caches on) before it starts, and so do both runs the resume step starts from it: the run to
    be killed and the resumed one name the same cache folder."""
    import runners.train_driver as driver

    gc = _module()
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.delenv(var, raising=False)
    env = gc.child_env(tmp_path)
    cache = str((tmp_path / "work" / "inductor_cache").resolve())
    assert env["TORCHINDUCTOR_CACHE_DIR"] == cache
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    seen = []
    monkeypatch.setattr(driver.subprocess, "Popen", lambda cmd, env, **kw: seen.append(env))
    for key, value in env.items():  # the resume step's own environment, as run_step starts it
        monkeypatch.setenv(key, value)
    driver.start(tmp_path / "spec.json", tmp_path / "a", tmp_path / "data", pause="2:1")  # to be killed
    driver.start(tmp_path / "spec.json", tmp_path / "a", tmp_path / "data")  # the same command again
    assert [e["TORCHINDUCTOR_CACHE_DIR"] for e in seen] == [cache, cache]
    assert all(e["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" for e in seen)


COMPILE_ONCE = """
import json, sys, torch
from torch._dynamo.utils import counters
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
torch.compile(m)(torch.randn(4, 8)).sum().backward()
print(json.dumps({**counters["inductor"], **counters["aot_autograd"]}))
"""


@pytest.mark.slow  # two CPU compiles in fresh processes (~25 s)
def test_a_second_process_with_the_check_s_environment_hits_inductor_s_caches(tmp_path, monkeypatch):
    """What the resume step relies on, for real: a process started with :func:`child_env` after another
    one compiled the same model finds the FX graph and AOT autograd caches there (no recompilation)."""
    gc = _module()
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = gc.child_env(tmp_path)

    def compile_once() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", COMPILE_ONCE], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first, second = compile_once(), compile_once()
    assert first.get("fxgraph_cache_miss", 0) >= 1 and not first.get("fxgraph_cache_hit")
    assert second.get("fxgraph_cache_hit", 0) >= 1 and not second.get("fxgraph_cache_miss")
    assert second.get("autograd_cache_hit", 0) >= 1
    assert any((tmp_path / "work" / "inductor_cache").rglob("*"))


def test_metric_errors_compare_flatness_absolutely():
    """A floor-dominated flatness (rank 48 of 384) that differs by orders of magnitude relatively is
    within 1e-6 absolutely, and the table names every metric with its rule; a real difference fails."""
    from analysis.spectral import METRICS

    spec = importlib.util.spec_from_file_location("bench_extract", REPO / "bench" / "extract.py")
    bx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bx)
    import numpy as np

    ref = np.zeros(384)
    ref[:48] = np.linspace(2.0, 0.1, 48)
    ours = ref.copy()
    ours[48:] = 3e-10 * ref[0]  # kept by one path: flatness moves from ~1e-9 to ~2e-9
    table, degenerate = bx.metric_errors({("p", "all"): ours}, {("p", "all"): ref})
    flat = table["spectral_flatness"]
    assert set(table) == set(METRICS) and not degenerate
    assert flat["kind"] == "absolute" and flat["err"] < 1e-6 < abs(flat["ours"] - flat["ref"]) / flat["ref"]
    far = ref.copy()
    far[:48] = 1.0  # a different spectrum: flatness and the others fail
    table, _ = bx.metric_errors({("p", "all"): far}, {("p", "all"): ref})
    assert table["effective_rank"]["err"] > 1e-6


def test_gpu_tests_collect_only_the_files_that_mark_tests_gpu():
    """The GPU machine has no MLflow, Ray or optuna: collecting every test module there fails the step
    before any GPU test runs (seen on the H200, 2026-12-04), so only gpu-marked files are collected."""
    gc = _module()
    files = gc.gpu_test_files()
    assert "tests/scale_out/test_gpu.py" in files
    assert all("pytest.mark.gpu" in (REPO / f).read_text() for f in files)
    assert "tests/tracking/test_tracking.py" not in files and len(files) < 5


def test_plan_lists_every_step_and_fits_one_gpu_slot(tmp_path, capsys, monkeypatch):
    """``--plan`` runs nothing (no CUDA needed, no --out): each step with its expected seconds and limit,
    and the limits' total within one command on a lent GPU (its 15 minutes include start and transfers)."""
    gc = _module()
    monkeypatch.chdir(tmp_path)
    assert gc.main(["--plan"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:3] for line in out[1:]}
    assert list(rows) == [*gc.STEPS, "total"]
    assert sum(float(rows[s][1]) for s in gc.STEPS) == float(rows["total"][1]) <= gc.FULL_BUDGET_S <= 540
    assert all(0 < float(rows[s][0]) <= float(rows[s][1]) for s in gc.STEPS)  # expected within its limit
    assert gc.LIMITS_FULL == {s: float(rows[s][1]) for s in gc.STEPS}
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_check_s_gpu_tests_leave_only_the_compiled_dino_resume_to_the_resume_step():
    """The ``-k`` expression of the gpu_tests step, applied by pytest itself to the GPU test files."""
    gc = _module()
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0"]
    cmd += ["-m", "gpu", "-k", gc.GPU_TESTS_LEFT_TO_STEPS, *gc.gpu_test_files()]
    listed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300).stdout
    assert "test_cuda_bf16_compiled_run_resumes_within_tolerance[supervised]" in listed
    assert "compiled_run_resumes_within_tolerance[dino_small]" not in listed
    assert "[dino_small]" in listed  # the other DINO GPU tests stay


def test_wheels_install_only_what_is_missing_offline(tmp_path, capsys, monkeypatch):
    gc = _module()
    assert gc.main(["--out", str(tmp_path / "out"), "--wheels", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == f"gpu_check: --wheels: no such folder: {tmp_path / 'none'}"
    assert not (tmp_path / "out").exists()  # nothing half-written
    ran: list[list[str]] = []
    monkeypatch.setattr(gc.subprocess, "run", lambda cmd, check: ran.append(cmd))
    monkeypatch.setattr(gc, "CARRIED", {"json": ["not-needed"], "surely_absent_module_x": ["absent-dist"]})
    assert gc.install_wheels(tmp_path) == ["surely_absent_module_x"]
    assert ran == [
        [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(tmp_path), "absent-dist"]
    ]
    ran.clear()
    monkeypatch.setattr(gc, "CARRIED", {"json": ["not-needed"]})
    assert gc.install_wheels(tmp_path) == [] and ran == []  # nothing missing: pip is not run
    assert gc.fetch_wheels(tmp_path / "w", "3.12") == ["not-needed"]
    assert ran[0][:6] == [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps"]
    assert ran[0][ran[0].index("--python-version") + 1] == "3.12" and ran[0][-1] == "not-needed"
