"""``plan``'s step and extraction timings: timed once per run configuration and machine, then read from
the user cache (``$XDG_CACHE_HOME/vitstudy/timings.json``), so a second ``plan`` trains nothing."""

from __future__ import annotations

import json
import os

import study.seed_plan as seed_plan


def _timer(seconds: float):
    calls: list[int] = []

    def measure() -> float:
        calls.append(1)
        return seconds

    return measure, calls


def test_a_timing_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    run = {"seed": 0, "model": {"name": "vit_tiny"}, "training": {"batch_size": 32}}
    measure, calls = _timer(0.25)
    assert seed_plan._timed_here("step", run, measure) == 0.25
    assert seed_plan._timed_here("step", {**run, "seed": 3}, measure) == 0.25  # seeds time alike
    assert len(calls) == 1
    assert list(json.loads((tmp_path / "vitstudy" / seed_plan.TIMINGS).read_text()).values()) == [0.25]
    # another configuration, another kind of timing, another machine: each timed anew
    seed_plan._timed_here("step", {**run, "training": {"batch_size": 64}}, measure)
    seed_plan._timed_here("extract", run, measure)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    seed_plan._timed_here("step", run, measure)
    assert len(calls) == 4


def test_an_unreadable_or_unwritable_cache_is_timed_around(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "vitstudy").mkdir()
    (tmp_path / "vitstudy" / seed_plan.TIMINGS).write_text("not json{")
    measure, calls = _timer(0.5)
    assert seed_plan._timed_here("step", {"seed": 0}, measure) == 0.5
    assert seed_plan._timed_here("step", {"seed": 0}, measure) == 0.5 and len(calls) == 1  # rewritten
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "vitstudy").write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert seed_plan._timed_here("step", {"seed": 1}, measure) == 0.5 and len(calls) == 2
