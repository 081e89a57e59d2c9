"""A run source that plants a known per-seed effect: synthetic run folders, no training, for tests of
looks, pre-registration and verdicts through the real CLI (``planted`` fixture in conftest.py)."""

from __future__ import annotations

import time

import numpy as np
import yaml

from tests.conftest import TINY_HYPOTHESIS
from vitstudy_core.runfolder import RunFolder

LAYERS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]


class PlantedSource:
    """Fills a run folder with random spectra and a ``diagonality`` observable: block_01 minus block_02 is
    ``effect``, every other layer 1.0 above block_02, plus N(0, 0.02) noise drawn from the run's seed."""

    name = "train"

    def __init__(self, effect: float):
        self.effect = effect
        self.filled: list[int] = []

    def check(self, run):
        return None

    def prepare(self, run, data_dir):
        return None

    def fill(self, run, run_dir, data_dir, progress=None, bar=False):
        rng = np.random.default_rng(run["seed"])
        folder = RunFolder(run_dir)
        spectra, scalars = {}, {}
        for layer in LAYERS:
            spectra[f"2/{layer}/all"] = np.sort(rng.gamma(1.0, 1.0, 16))[::-1]
        base = rng.normal(0.5, 0.1)
        for layer in LAYERS:  # every layer well above block_02, and block_01 above it by the effect
            scalars[f"2/{layer}/all/diagonality"] = base + 1.0 + rng.normal(0, 0.02)
        scalars["2/block_01/all/diagonality"] = base + self.effect + rng.normal(0, 0.02)
        scalars["2/block_02/all/diagonality"] = base + rng.normal(0, 0.02)
        folder.write_spectra(spectra)
        folder.merge_scalars(scalars)
        result = {"status": "finished", "run": run, "n_tokens": {}, "finished_at": time.time()}
        folder.write_result(result)
        self.filled.append(run["seed"])
        return result


def write_planted(tmp_path, claims: list[dict], seeds=(0, 1, 2)) -> str:
    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["seeds"] = list(seeds)
    data["design"]["checkpoints"] = [2]
    data["claims"] = claims
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


DIFF = {
    "name": "higher",
    "kind": "compare",
    "metric": "diagonality",
    "subset": {"dataset": "objects"},
    "a": {"layers": ["block_01"]},
    "b": {"layers": ["block_02"]},
}
U = {
    "name": "dip",
    "kind": "u_shape",
    "metric": "diagonality",
    "subset": {"dataset": "objects"},
    "regions": {"early": ["pos_embed"], "bottleneck": ["block_02"], "late": ["block_03"]},
}


def plant(monkeypatch, effect: float) -> PlantedSource:
    """Make the registered ``train`` source fill its runs with a :class:`PlantedSource` of ``effect``."""
    import runners.sources

    src = PlantedSource(effect)
    train = runners.sources.SOURCES["train"]  # the registry is read-only: stand in for its runs only
    for method in ("check", "prepare", "fill"):
        monkeypatch.setattr(train, method, getattr(src, method))
    return src
