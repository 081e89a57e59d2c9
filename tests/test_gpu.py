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
