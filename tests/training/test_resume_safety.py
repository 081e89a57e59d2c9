"""``resume.pt`` runs no code: it is read with ``weights_only=True``; a planted pickle payload is refused
(the run starts over and gives the uninterrupted result), and a real one still resumes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import vitstudy_core.faults as faults
from runners.train import train_run
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from tests.conftest import TINY_HYPOTHESIS

TIMING = ("images_per_s", "epoch_s")  # wall-clock, not results


class Canary:
    """Unpickled, it runs code: it creates the file ``path`` (what a planted ``resume.pt`` would do)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def _spec() -> dict:
    data = yaml.safe_load(TINY_HYPOTHESIS)  # 2 epochs of 2 steps, checkpoints at 0 and 2
    return plan_runs(parse_hypothesis(data))[0].model_dump()


def _same_result(run_dir: Path, reference: Path) -> None:
    a, b = (json.loads((d / "result.json").read_text()) for d in (run_dir, reference))
    assert a["status"] == b["status"] == "finished"
    strip = [[{k: v for k, v in h.items() if k not in TIMING} for h in r["history"]] for r in (a, b)]
    assert strip[0] == strip[1]
    with np.load(run_dir / "spectra.npz") as fa, np.load(reference / "spectra.npz") as fb:
        assert sorted(fa.files) == sorted(fb.files)
        for k in fa.files:
            np.testing.assert_array_equal(fa[k], fb[k])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, Path, Path]:
    """An uninterrupted run: (spec, its folder, the data folder)."""
    tmp = tmp_path_factory.mktemp("reference")
    spec = _spec()
    train_run(spec, tmp / "run", tmp / "data")
    return spec, tmp / "run", tmp / "data"


def test_a_planted_resume_file_runs_no_code_and_the_run_starts_over(reference, tmp_path):
    spec, ref_dir, data = reference
    canary, run_dir = tmp_path / "canary", tmp_path / "run"
    run_dir.mkdir()
    torch.save({"epoch": 1, "objective": Canary(canary)}, run_dir / "resume.pt")
    # the payload is live: an unsafe load creates the canary (so the assertion below can fail)
    torch.load(run_dir / "resume.pt", weights_only=False)
    assert canary.read_text() == "pwned"
    canary.unlink()

    lines: list[str] = []
    result = train_run(spec, run_dir, data, progress=lines.append)
    assert not canary.exists()
    refused = [ln for ln in lines if "resume.pt: not loaded, starting over" in ln]
    assert len(refused) == 1 and "\n" not in refused[0], lines
    assert not any("resuming after" in ln for ln in lines)
    assert result["status"] == "finished" and [h["epoch"] for h in result["history"]] == [1, 2]
    _same_result(run_dir, ref_dir)  # started over cleanly: the uninterrupted run's numbers
    assert not (run_dir / "resume.pt").exists()


def test_a_real_resume_file_is_tensors_only_and_resumes(reference, tmp_path, monkeypatch):
    spec, ref_dir, data = reference
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "train.epoch@2:raise")  # stop in epoch 2, after epoch 1's resume.pt
    monkeypatch.setattr(faults, "_hits", {})
    with pytest.raises(faults.InjectedFault):
        train_run(spec, run_dir, data)
    monkeypatch.delenv(faults.ENV)

    state = torch.load(run_dir / "resume.pt", map_location="cpu", weights_only=True)  # no unpickling code
    assert state["epoch"] == 1 and len(state["history"]) == 1
    assert state["spectra"] and all(isinstance(v, torch.Tensor) for v in state["spectra"].values())
    assert state["torch_rng"].dtype == torch.uint8 and state["data_gen"].dtype == torch.uint8

    lines: list[str] = []
    train_run(spec, run_dir, data, progress=lines.append)
    assert any("resuming after epoch 1" in ln for ln in lines), lines
    assert not any("starting over" in ln for ln in lines)
    _same_result(run_dir, ref_dir)


def test_a_truncated_resume_file_starts_over(reference, tmp_path):
    spec, ref_dir, data = reference
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "resume.pt").write_bytes(b"PK\x03\x04 not a whole archive")
    lines: list[str] = []
    train_run(spec, run_dir, data, progress=lines.append)
    assert sum("not loaded, starting over" in ln for ln in lines) == 1
    _same_result(run_dir, ref_dir)
