"""Training scaffolding: resume after SIGKILL in a real subprocess, NaN handling, reproducibility records."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS

REPO = Path(__file__).resolve().parents[2]

DINO = {
    "kind": "dino",
    "preset": "dino_small",
    "out_dim": 32,
    "hidden_dim": 16,
    "bottleneck_dim": 8,
    "n_local_crops": 2,
    "local_crop_scale": [0.25, 0.5],  # at 8 px a smaller crop is under one 4 px patch (refused)
}


def _spec(objective: str | dict, epochs: int = 3) -> dict:
    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["training"].update(epochs=epochs, batch_size=16)  # 64 images: 4 steps per epoch
    data["design"]["checkpoints"] = [0, epochs]
    data["design"]["objective"] = objective
    return plan_runs(parse_hypothesis(data))[0].model_dump()


def _run(spec_file: Path, run_dir: Path, data_dir: Path, pause: str | None = None) -> subprocess.Popen:
    """The shared driver (``runners.train_driver``): one run in its own process, paused at ``pause``."""
    from runners.train_driver import start

    return start(spec_file, run_dir, data_dir, pause)


@pytest.mark.parametrize("objective", ["supervised", pytest.param("dino", marks=pytest.mark.slow)])
def test_sigkill_mid_epoch_then_rerun_equals_uninterrupted(objective, tmp_path):
    """Bitwise on CPU: history, spectra and final weights. (DINO: slow-marked, ~30 s of subprocesses.)"""
    from runners.datasets import load_split

    spec = _spec(DINO if objective == "dino" else "supervised")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    data_dir = tmp_path / "data"
    for split in ("train", "test"):
        load_split(spec["dataset"], split, data_dir)

    # 1) killed with SIGKILL in the middle of epoch 2 (after step 1 of 4)
    proc = _run(spec_file, tmp_path / "a", data_dir, pause="2:1")
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline and "MIDEPOCH" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    assert "MIDEPOCH" in line, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    state = torch.load(tmp_path / "a" / "resume.pt", weights_only=False)
    assert state["epoch"] == 1 and not (tmp_path / "a" / "result.json").exists()
    assert not list((tmp_path / "a").glob("*.tmp*"))  # no half-written file left behind

    # 2) the same command again resumes from epoch 1 and finishes
    proc = _run(spec_file, tmp_path / "a", data_dir)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    resumed = json.loads((tmp_path / "a" / "result.json").read_text())

    # 3) an uninterrupted run of the same spec
    # (in a process of its own as the other two: a test before it in this worker may have set torch's
    # thread count, and another count rounds differently)
    proc = _run(spec_file, tmp_path / "b", data_dir)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    straight = json.loads((tmp_path / "b" / "result.json").read_text())

    timing = ("images_per_s", "epoch_s")  # wall-clock, not results
    assert [{k: v for k, v in h.items() if k not in timing} for h in resumed["history"]] == [
        {k: v for k, v in h.items() if k not in timing} for h in straight["history"]
    ]
    with np.load(tmp_path / "a" / "spectra.npz") as fa, np.load(tmp_path / "b" / "spectra.npz") as fb:
        assert sorted(fa.files) == sorted(fb.files)
        for k in fa.files:
            np.testing.assert_array_equal(fa[k], fb[k])
    wa = torch.load(tmp_path / "a" / "checkpoints" / "epoch_003.pt", weights_only=False)["model"]
    wb = torch.load(tmp_path / "b" / "checkpoints" / "epoch_003.pt", weights_only=False)["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nan_loss_fails_the_run_with_its_epoch(tmp_path, monkeypatch):
    import runners.objectives.supervised as sup
    from runners.train import train_run

    real = sup.F.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] > 5 else loss  # epoch 2 (4 steps per epoch)

    monkeypatch.setattr(sup.F, "cross_entropy", poisoned)
    result = train_run(_spec("supervised"), tmp_path / "run", tmp_path / "data")
    assert result["status"] == "failed" and result["failed_epoch"] == 2
    assert "non-finite loss" in result["error"]
    assert json.loads((tmp_path / "run" / "result.json").read_text())["failed_epoch"] == 2


def test_result_records_environment_and_checkpoints(tmp_path):
    from runners.train import train_run

    spec = _spec("tgo_supervised", epochs=1)
    assert spec["training"]["label_smoothing"] == 0.1 and spec["model"]["drop_path_rate"] == 0.1
    result = train_run(spec, tmp_path / "run", tmp_path / "data")
    env = result["environment"]
    for key in ("torch", "timm", "numpy", "git_commit", "git_dirty", "seed_offsets"):
        assert key in env
    # what decides the arithmetic (issue 66: the default study's numbers differ between AVX-512 and AVX2)
    from vitstudy_core.provenance import ARITHMETIC

    assert set(ARITHMETIC) <= set(env)
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_threads"] == torch.get_num_threads() and env["cpu_model"]
    assert env["blas"].split()[0] in torch.__config__.show()
    assert len(env["git_commit"] or "") == 40 and isinstance(env["git_dirty"], bool)
    assert result["run"] == spec  # the resolved config
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "epoch_000.pt",
        "epoch_001.pt",
    ]
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "epoch_001.pt", weights_only=False)
    assert ckpt["run"] == spec and "blocks.0.attn.qkv.weight" in ckpt["model"]
    assert not (tmp_path / "run" / "resume.pt").exists()


def test_progress_bar_and_plain_lines(tmp_path, capsys):
    from runners.train import train_run

    lines: list[str] = []
    train_run(
        _spec("supervised", epochs=1), tmp_path / "run", tmp_path / "data", progress=lines.append, bar=True
    )
    assert any("epoch 1/1 loss" in ln and "img/s" in ln for ln in lines)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "/4 [" in err  # tqdm's bar: run, epoch, steps


def test_progress_bar_shows_loss_and_images_per_second(capsys):
    from runners.train import _epoch_progress

    with _epoch_progress("ds/seed0", 2, 5, 3, bar=True) as tick:
        for step in range(3):
            time.sleep(0.15)  # past tqdm's refresh interval
            tick(step, 1.234, 32)
    err = capsys.readouterr().err
    assert "ds/seed0 epoch 2/5" in err and "loss=1.234" in err and "img_s=" in err
    with _epoch_progress("ds/seed0", 1, 1, 3, bar=False) as tick:  # no terminal: silent, lines only
        tick(0, 1.0, 32)
    assert capsys.readouterr().err == ""


def test_epoch_meter_reports_the_first_non_finite_step_at_its_next_check():
    """On a device the non-finite flag is read every ``check_every`` steps: the error still names the first
    bad step; sums match Python's float sum of ``loss * n`` bitwise; on the CPU it stops at once."""
    from runners.objectives.meter import EpochMeter
    from vitstudy_core.errors import RunFailedError

    losses = [torch.tensor(v) for v in (1.25, 0.3, float("nan"), 2.0, float("inf"))]
    meter = EpochMeter(torch.device("cpu"), epoch=3, check_every=4)
    for step, loss in enumerate(losses[:3]):
        meter.add(step, loss, 7)  # no raise yet: the next check is after step 3
    with pytest.raises(RunFailedError, match="non-finite loss at step 2") as err:
        meter.add(3, losses[3], 7)
    assert err.value.epoch == 3
    ok = EpochMeter(torch.device("cpu"), epoch=1, check_every=4)
    values = [float(torch.tensor(v)) for v in (1.1, 0.7, 2.3)]  # float32 values, as a loss is
    for step, v in enumerate(values):
        ok.add(step, torch.tensor(v), 5 + step, torch.tensor(step))
    py = 0.0
    for step, v in enumerate(values):
        py += v * (5 + step)
    assert ok.mean_loss() == py / 18 and ok.accuracy() == 3 / 18
    at_once = EpochMeter(torch.device("cpu"), epoch=1)  # the CPU default: stop at that step
    with pytest.raises(RunFailedError, match="step 0"):
        at_once.add(0, losses[4], 1)


def test_the_recorded_cpu_capability_is_the_one_torch_dispatches_to():
    """``ATEN_CPU_CAPABILITY`` lowers the kernels torch uses (the README's numbers were re-measured with
    ``avx2`` on an AVX-512 machine): the run's environment records what torch ran, not what the CPU has."""
    import os
    import sys

    code = "import json; from runners.train import arithmetic; print(json.dumps(arithmetic()))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    from runners.train import arithmetic

    here = arithmetic()
    assert got["torch_cpu_capability"] == "DEFAULT" != here["torch_cpu_capability"]
    assert got["cpu_flags"] == here["cpu_flags"] and got["cpu_model"] == here["cpu_model"]  # the CPU's own
