"""One shared suite every executor passes: results by job index, errors reported per job, nothing lost."""

from __future__ import annotations

import pytest

from runners.executors import InlineExecutor, ProcessExecutor, make_executor


def square_or_fail(x: int) -> int:
    if x == 3:
        raise ValueError("job 3 fails")
    return x * x


@pytest.mark.parametrize(
    "executor", [InlineExecutor(), ProcessExecutor(2, threads=1)], ids=["inline", "process"]
)
def test_executor_contract(executor):
    jobs = [(i,) for i in range(5)]
    seen = {i: (res, exc) for i, res, exc in executor.map_jobs(square_or_fail, jobs)}
    assert sorted(seen) == list(range(5))
    for i in (0, 1, 2, 4):
        assert seen[i] == (i * i, None)
    assert seen[3][0] is None and isinstance(seen[3][1], ValueError)


def test_make_executor_choices():
    assert isinstance(make_executor("auto", 5, cuda=True), InlineExecutor)
    assert isinstance(make_executor(1, 5, cuda=False), InlineExecutor)
    assert isinstance(make_executor(2, 1, cuda=False), InlineExecutor)
    assert isinstance(make_executor(2, 5, cuda=False), ProcessExecutor)
