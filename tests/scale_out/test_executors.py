"""One shared suite every executor passes: results by job index, errors reported per job, nothing lost."""

from __future__ import annotations

import re

import pytest

from runners.executors.local import (
    EXECUTORS,
    ExecutorOptions,
    InlineExecutor,
    ProcessExecutor,
    RayExecutor,
    make_executor,
)
from runners.executors.slurm import SlurmExecutor, check_cluster, from_options, parse_time
from study.pipeline.stages import Placement
from vitstudy.testing import parametrize_with_checks
from vitstudy.testing.runs import square_or_fail
from vitstudy_core.errors import StudyError


@parametrize_with_checks("executors")
def test_shipped_executor_contract(name, check):
    """vitstudy.testing.runs on every executor (one that needs a cluster: skipped there, run below)."""
    check(name)


def _params():
    """(name, workers) per registered executor that needs a cluster; one other than Ray (whose loopback
    cluster the default suite starts anyway) is slow: starting its cluster costs more than the budget."""
    for name in EXECUTORS.names():
        if not EXECUTORS.get(name).needs_cluster:
            continue  # a local executor: the shipped check above runs it
        marks = [pytest.mark.slow] if name != "ray" else []
        for w in (1, 2):
            yield pytest.param((name, w), id=f"{name}-{w}", marks=marks)


@pytest.fixture(params=list(_params()))
def executor(request, tmp_path, monkeypatch):
    """Every registered executor that needs a cluster, built through its registry entry with 1 and with 2
    workers. It gets its cluster from the fixture ``<name>_address``
    (Ray: a real loopback cluster, tests/clusters.py: a head and a worker node; Slurm: a single-node
    cluster, tests/slurm_cluster.py; each skips without its binaries) and keeps its logs in ``tmp_path``."""
    name, workers = request.param
    kind = EXECUTORS.get(name)
    address = request.getfixturevalue(f"{name}_address") if kind.needs_cluster else "auto"
    monkeypatch.chdir(tmp_path)  # a cluster executor's job logs, without an --out
    opts = ExecutorOptions(workers=workers, n_jobs=5, cuda=False, address=address, cpus_per_run=1)
    return kind.make(opts)


def test_executor_contract(executor):
    jobs = [(i,) for i in range(5)]
    seen = {i: (res, exc) for i, res, exc in executor.map_jobs(square_or_fail, jobs)}
    assert sorted(seen) == list(range(5))
    for i in (0, 1, 2, 4):
        assert seen[i] == (i * i, None)
    assert seen[3][0] is None and isinstance(seen[3][1], ValueError)


def test_unknown_executor_names_are_one_line():
    expected = re.escape(str(EXECUTORS.names()))
    with pytest.raises(StudyError, match=rf"unknown executor 'no_such'; expected one of {expected}"):
        make_executor(1, 5, cuda=False, kind="no_such")
    with pytest.raises(StudyError, match="unknown executor 'no_such'"):
        Placement("no_such")


def test_make_executor_choices():
    assert isinstance(make_executor("auto", 5, cuda=True), InlineExecutor)
    assert isinstance(make_executor(1, 5, cuda=False), InlineExecutor)
    assert isinstance(make_executor(2, 1, cuda=False), InlineExecutor)
    assert isinstance(make_executor(2, 5, cuda=False), ProcessExecutor)
    ray_ex = make_executor(1, 5, cuda=False, kind="ray", address="127.0.0.1:1", gpus_per_run=1)
    assert isinstance(ray_ex, RayExecutor) and (ray_ex.num_gpus, ray_ex.max_retries) == (1, 3)
    slurm = make_executor(
        1, 5, False, "slurm", gpus_per_run=2, out="/o", options={"partition": "p", "qos": "hi"}
    )
    assert isinstance(slurm, SlurmExecutor) and str(slurm.folder) == "/o/slurm"
    assert slurm.parameters() == {
        "job_name": slurm.job_name,
        "time": 24 * 60,
        "cpus_per_task": 1,
        "array_parallelism": 256,
        "additional_parameters": {"qos": "hi"},
        "partition": "p",
        "gpus_per_task": 2,
    }


@pytest.mark.parametrize(
    "value, minutes", [("90", 90), ("90:30", 91), ("1:30:00", 90), ("2-00:00:00", 2880), ("0:00:01", 1)]
)
def test_slurm_time_is_read_as_sbatch_reads_it(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize(
    "cpus, gpus, options, expected",
    [
        (1, 0, {"time": "soon"}, "--slurm-time: expected minutes or"),
        (1, 0, {"time": "0"}, "--slurm-time: expected at least 1 minute"),
        (1, 0.5, {}, "Slurm allocates whole CPUs and GPUs, got 1 / 0.5"),
        (1, 0, {"array_parallelism": "0"}, "--slurm-array-parallelism: expected a positive integer"),
    ],
)
def test_bad_slurm_options_are_one_line(cpus, gpus, options, expected):
    with pytest.raises(StudyError, match=expected):
        from_options("/o", cpus, gpus, options)


def test_slurm_without_sbatch_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm client here
    with pytest.raises(
        StudyError, match="sbatch not found on this host; run the study from a Slurm login node"
    ):
        check_cluster(from_options(tmp_path, 1, 0, {}))


def die_once(marker: str) -> int:
    """Kills its own worker process the first time it runs (a worker lost mid-task), returns 7 after."""
    import os
    from pathlib import Path

    if not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return 7


@pytest.mark.parametrize("max_retries", [0, 1])
def test_ray_retries_a_lost_worker_only_as_often_as_asked(ray_address, tmp_path, max_retries):
    executor = RayExecutor(ray_address, num_cpus=1, max_retries=max_retries)
    [(i, result, exc)] = list(executor.map_jobs(die_once, [(str(tmp_path / "marker"),)]))
    if max_retries == 0:
        assert result is None and exc is not None and "died" in (tmp_path / "marker").read_text()
    else:
        assert (result, exc) == (7, None)


def report_budget(wait_for_two: bool) -> int:
    """A job that reads its thread budget as a training run does each epoch; returns the largest seen."""
    import time

    from runners.executors.local import adopt_thread_budget

    seen = adopt_thread_budget() or 0
    deadline = time.monotonic() + (30 if wait_for_two else 0.5)
    while time.monotonic() < deadline and not (wait_for_two and seen >= 2):
        time.sleep(0.05)
        seen = max(seen, adopt_thread_budget() or 0)
    return seen


def test_rebalancing_gives_the_last_running_job_the_free_cores():
    # rebalance=True, 2 workers x 1 thread, 2 jobs: once the short one ends nothing waits, so the long one gets 2 threads
    ex = ProcessExecutor(2, threads=1, rebalance=True)
    out = {i: (r, e) for i, r, e in ex.map_jobs(report_budget, [(False,), (True,)])}
    assert out[0] == (1, None) and out[1] == (2, None)


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_threads_are_fixed_unless_the_tail_is_shared():
    # 3 jobs on 2 one-thread workers: by default every job keeps its one thread (a run's numbers do not
    # depend on what else is pending); with share_tail the third (the last, partial wave) gets both
    out = {i: r for i, r, _ in ProcessExecutor(2, threads=1).map_jobs(report_budget, [(False,)] * 3)}
    assert out == {0: 1, 1: 1, 2: 1}
    shared = ProcessExecutor(2, threads=1, share_tail=True).map_jobs(report_budget, [(False,)] * 3)
    assert {i: r for i, r, _ in shared} == {0: 1, 1: 1, 2: 2}


def test_a_job_outside_an_executor_has_no_budget(monkeypatch):
    from runners.executors.local import THREADS_FILE_ENV, adopt_thread_budget

    monkeypatch.delenv(THREADS_FILE_ENV, raising=False)
    assert adopt_thread_budget() is None
