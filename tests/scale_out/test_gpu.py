"""CUDA path (bf16 autocast, torch.compile): run with ``pytest -m gpu`` on a machine with a GPU.

Not run in this project's CPU CI; written without a GPU at hand, so the first GPU run is its first run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("objective", ["supervised", "dino_small"])
def test_cuda_bf16_compiled_run_resumes_within_tolerance(objective, tmp_path):
    from runners.train import train_run

    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["objective"] = objective
    data["design"]["training"].update(compile=True, epochs=2)
    spec = plan_runs(parse_hypothesis(data))[0].model_dump()

    class Stop(Exception):
        pass

    def stop(line: str) -> None:
        if "epoch 2/2" in line:
            raise Stop

    with pytest.raises(Stop):
        train_run(spec, tmp_path / "a", tmp_path / "data", progress=stop)
    resumed = train_run(spec, tmp_path / "a", tmp_path / "data")
    straight = train_run(spec, tmp_path / "b", tmp_path / "data")
    assert resumed["status"] == straight["status"] == "finished" and resumed["device"] == "cuda"
    assert np.isclose(resumed["history"][-1]["loss"], straight["history"][-1]["loss"], rtol=1e-2)
    with np.load(tmp_path / "a" / "spectra.npz") as fa, np.load(tmp_path / "b" / "spectra.npz") as fb:
        for k in fa.files:
            np.testing.assert_allclose(fa[k].sum(), fb[k].sum(), rtol=5e-2)


def test_dino_crops_on_cuda_equal_the_cpu_crops_of_the_same_draws():
    """MultiCrop.apply on CUDA (draws moved in one packed copy) against the CPU, TF32 off for the blur."""
    from runners.objectives.multicrop import MultiCrop

    crops = MultiCrop(32, 16, 2, (0.4, 1.0), (0.05, 0.4), torch.Generator().manual_seed(0))
    x = (torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(1)) - 0.5) / 0.25
    draws = crops.draw(64, 32, 32)
    cpu = crops.apply(x, draws)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        gpu = crops.apply(x.cuda(), crops.to_device(draws, torch.device("cuda")))
    for a, b in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=0, atol=1e-4)


@pytest.mark.parametrize("objective", ["supervised", "dino_small"])
def test_cuda_training_steps_do_not_synchronise(objective):
    """After a warm-up epoch, an epoch of 4 steps synchronises only at its end (reading its sums):
    counted with ``torch.cuda.set_sync_debug_mode("warn")``."""
    import warnings

    from runners.objectives import make_objective

    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["objective"] = objective
    spec = plan_runs(parse_hypothesis(data))[0].model_dump()
    torch.manual_seed(0)
    size = spec["dataset"]["image_size"]
    trainer = make_objective(spec, 10, size, 4, torch.device("cuda"))
    x = torch.randint(0, 256, (4 * spec["training"]["batch_size"], size, size, 3), dtype=torch.uint8)
    y, order = torch.zeros(len(x), dtype=torch.long), torch.arange(len(x))
    trainer.train_epoch(1, x, y, order, lambda *a: None)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train_epoch(2, x, y, order, lambda *a: None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= (3 if objective == "supervised" else 2), [str(w.message) for w in syncs]


def test_every_gpu_gets_pinned_workers_and_an_out_of_memory_run_is_one_line():
    """``runners.executors.gpu_workers`` on the real GPUs: K = 2 workers per visible GPU, each seeing exactly one
    device (the one its CUDA_VISIBLE_DEVICES names), and a run asking for more memory than its GPU has
    fails with the one line naming that GPU and K while the others finish."""
    from runners.executors import gpu_workers
    from runners.executors.local import make_executor
    from tests import gpu_standin

    visible = gpu_workers.visible_gpus()
    g = len(visible)
    ex = make_executor("auto", 2 * g, cuda=True, options={"runs_per_gpu": "2"})
    assert isinstance(ex, gpu_workers.GpuExecutor) and ex.slots == 2 * g
    seen = {i: (r, e) for i, r, e in ex.map_jobs(gpu_standin.cuda_probe, [(i,) for i in range(2 * g)])}
    assert all(e is None for _, e in seen.values()), seen
    results = [r for r, _ in seen.values()]
    assert all(r["count"] == 1 and r["at_import"] == r["now"] and r["sum"] == 1024 for r in results)
    assert sorted({r["now"] for r in results}) == sorted(visible)
    assert len({r["uuid"] for r in results}) == g  # one distinct device per GPU
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    ex = make_executor("auto", 3, cuda=True, options={"gpus": "0", "runs_per_gpu": "2"})
    jobs = [(2 * total,), (0.001,), (0.001,)]
    seen = {i: (r, e) for i, r, e in ex.map_jobs(gpu_standin.allocate, jobs)}
    assert isinstance(seen[0][1], gpu_workers.GpuOutOfMemory)
    assert str(seen[0][1]) == "ran out of memory on GPU 0 with --runs-per-gpu 2: try --runs-per-gpu 1"
    assert seen[1] == (None, None) and seen[2] == (None, None)
    assert ex.summary_lines()[0].startswith(f"GPU 0 (CUDA_VISIBLE_DEVICES={visible[0]}): 3 runs, busy ")
