"""Every GPU of a node, without a GPU: pinning, spreading and failures against a fake device list.

``runners.executors.gpu_workers.visible_gpus`` is replaced by a list of fake ``CUDA_VISIBLE_DEVICES`` values; the
jobs are stand-ins (``tests/gpu_standin.py``) that say which device their worker saw when their code was
imported, so nothing here imports torch in a worker or trains.
"""

from __future__ import annotations

import pytest

from runners.executors import gpu_workers
from runners.executors.gpu_workers import GpuExecutor, GpuOutOfMemory
from runners.executors.local import InlineExecutor, make_executor
from study.cli import main
from tests import gpu_standin

FAKE = ["4", "5", "6"]  # as if CUDA_VISIBLE_DEVICES=4,5,6: torch's GPUs 0, 1, 2


@pytest.fixture
def three_gpus(monkeypatch):
    monkeypatch.setattr(gpu_workers, "visible_gpus", lambda: list(FAKE))


def _run(executor, fn, jobs):
    return {i: (res, exc) for i, res, exc in executor.map_jobs(fn, jobs)}


def test_auto_runs_one_pinned_worker_per_gpu(three_gpus):
    ex = make_executor("auto", 6, cuda=True)
    assert isinstance(ex, GpuExecutor) and (ex.per_gpu, ex.slots) == (1, 3)
    seen = _run(ex, gpu_standin.record, [(i, 0.05) for i in range(6)])
    assert sorted(seen) == list(range(6)) and all(exc is None for _, exc in seen.values())
    results = [res for res, _ in seen.values()]
    assert all(r["at_import"] == r["now"] for r in results)  # pinned before the job's code was imported
    device_of = {}
    for r in results:
        assert device_of.setdefault(r["pid"], r["now"]) == r["now"]  # a worker keeps its one device
    assert [seen[i][0]["now"] for i in range(3)] == FAKE  # the first wave: one run per GPU
    assert sorted(set(device_of.values())) == FAKE
    assert sum(ex.usage[g].runs for g in range(3)) == 6
    lines = ex.summary_lines()
    assert (
        len(lines) == 3
        and lines[1].startswith("GPU 1 (CUDA_VISIBLE_DEVICES=5): ")
        and " runs, busy " in lines[1]
    )


def test_runs_per_gpu_and_a_chosen_subset(three_gpus):
    ex = make_executor("auto", 8, cuda=True, options={"gpus": "0,2", "runs_per_gpu": "2"})
    assert isinstance(ex, GpuExecutor) and (ex.per_gpu, ex.slots) == (2, 4)
    seen = _run(ex, gpu_standin.record, [(i, 0.05) for i in range(4)])
    devices = [seen[i][0]["now"] for i in range(4)]
    assert devices == ["4", "6", "4", "6"]  # K per GPU, GPU 1 unused
    pids = {}
    for res, _ in seen.values():
        assert pids.setdefault(res["pid"], res["now"]) == res["now"]
    assert (ex.usage[0].runs, ex.usage[2].runs) == (2, 2) and 1 not in ex.usage


def test_one_gpus_out_of_memory_fails_its_runs_with_one_line_and_the_others_finish(three_gpus):
    ex = make_executor("auto", 6, cuda=True, options={"runs_per_gpu": "2"})
    seen = _run(ex, gpu_standin.oom_on, [(i, "5") for i in range(6)])  # jobs 1 and 4 land on GPU 1
    for i in (1, 4):
        res, exc = seen[i]
        assert res is None and isinstance(exc, GpuOutOfMemory)
        assert str(exc) == "ran out of memory on GPU 1 with --runs-per-gpu 2: try --runs-per-gpu 1"
    for i in (0, 2, 3, 5):
        assert seen[i][1] is None and seen[i][0]["now"] in ("4", "6")
    assert ex.usage[1].runs == 2  # failed runs count as the GPU's runs too
    alone = str(GpuOutOfMemory(3, 1))
    assert "GPU 3 with --runs-per-gpu 1" in alone and "\n" not in alone


def test_without_a_visible_gpu_the_cpu_executor_stays_and_gpu_flags_are_one_line(monkeypatch):
    from vitstudy_core.errors import StudyError

    monkeypatch.setattr(gpu_workers, "visible_gpus", lambda: [])
    assert isinstance(make_executor("auto", 5, cuda=True), InlineExecutor)
    with pytest.raises(StudyError, match="--gpus: GPU 0 is not visible; this host sees no GPU"):
        make_executor("auto", 5, cuda=False, options={"gpus": "0"})
    with pytest.raises(StudyError, match="--runs-per-gpu: this host has no visible GPU"):
        gpu_workers.check_options({"runs_per_gpu": "2"})


def test_one_gpu_auto_is_in_process_and_workers_n_spread(monkeypatch):
    monkeypatch.setattr(gpu_workers, "visible_gpus", lambda: ["0"])
    assert isinstance(make_executor("auto", 5, cuda=True), InlineExecutor)
    monkeypatch.setattr(gpu_workers, "visible_gpus", lambda: list(FAKE))
    ex = make_executor(4, 5, cuda=True)
    assert isinstance(ex, GpuExecutor) and (ex.slots, ex.per_gpu) == (4, 2)
    ex = make_executor("auto", 2, cuda=True)  # no more workers than runs
    assert isinstance(ex, GpuExecutor) and ex.slots == 2


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--gpus", "0,x"], "--gpus: expected GPU numbers separated by commas (0,2,3), got '0,x'"),
        (["--gpus", "0,2,0"], "--gpus: GPU 0 given more than once in '0,2,0'"),
        (["--gpus", "1,3,7"], "--gpus: GPU 3, 7 is not visible; this host sees GPUs 0-2"),
        (["--runs-per-gpu", "0"], "--runs-per-gpu: expected a positive integer, got '0'"),
        (["--runs-per-gpu", "2", "--workers", "3"], "--runs-per-gpu: give it with --workers auto"),
        (
            ["--gpus", "0", "--executor", "ray"],
            "--gpus / --runs-per-gpu: these flags are for --executor local",
        ),
    ],
)
def test_bad_gpu_flags_are_one_line_exit_2_before_anything_is_written(
    flags, line, three_gpus, tmp_path, capsys
):
    out = tmp_path / "out"
    assert main(["run", "hypotheses/u_shape.yaml", "--out", str(out), "--no-mlflow", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow  # two tiny studies of 3 runs each (81 s on 2 cores shared with other jobs)
def test_a_study_on_two_fake_gpus_gives_the_cpu_executor_s_table_bit_for_bit(
    monkeypatch, tiny_yaml, tmp_path
):
    """Through ``study.api.run``: the same run keys and the same table whether two pinned GPU workers (fake
    devices: on the CPU their runs train on the CPU, one thread each) or the CPU's own workers trained
    them; the per-GPU lines follow the runs."""
    import pandas as pd

    from study import api

    monkeypatch.setattr(gpu_workers, "visible_gpus", lambda: ["0", "1"])
    lines: list[str] = []
    kw = {"track": False, "report": False, "progress": False}
    pinned = api.run(tiny_yaml, tmp_path / "gpus", executor_options={"gpus": "0,1"}, log=lines.append, **kw)
    plain = api.run(tiny_yaml, tmp_path / "cpu", log=lambda line: None, **kw)
    per_gpu = [ln for ln in lines if ln.startswith("GPU ")]
    assert [ln.split(":")[0] for ln in per_gpu] == [
        "GPU 0 (CUDA_VISIBLE_DEVICES=0)",
        "GPU 1 (CUDA_VISIBLE_DEVICES=1)",
    ]
    assert sum(int(ln.split(": ")[1].split(" runs")[0]) for ln in per_gpu) == 3  # the tiny study's 3 runs
    assert sorted(p.name for p in (tmp_path / "gpus" / "runs").iterdir()) == sorted(
        p.name for p in (tmp_path / "cpu" / "runs").iterdir()
    )
    a = pd.read_parquet(pinned.folder / "table.parquet")
    b = pd.read_parquet(plain.folder / "table.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
