"""``python -m study table`` rebuilds the same tidy table from the same run folders, and the planner gives
the same run keys, as stored in ``tests/fixtures/behaviour/tiny_table.parquet`` and ``tiny_keys.json``
(written by the code before the run-folder contract; rerun with ``--regenerate`` by hand only on purpose).

The run folders are written here byte by byte in the on-disk format (``result.json``, ``spectra.npz`` with
keys ``"{epoch}/{layer}/{token_set}"``, ``scalars.json``), independently of the code under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS

FIX = Path(__file__).parent / "fixtures" / "behaviour"
LAYERS = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "norm"]


def write_runs(tmp: Path) -> tuple[Path, Path]:
    """The tiny hypothesis file and an output folder holding a finished run per planned key."""
    hyp = tmp / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    keys = json.loads((FIX / "tiny_keys.json").read_text())
    rng = np.random.default_rng(7)
    for seed, key in keys.items():
        run = tmp / "out" / "runs" / key
        run.mkdir(parents=True)
        spectra, scalars, n_tokens = {}, {}, {}
        for epoch in (0, 2):
            for layer in LAYERS:
                for tset in ("all", "cls", "patch"):
                    if layer == "patch_embed" and tset == "cls":
                        continue
                    spectra[f"{epoch}/{layer}/{tset}"] = np.sort(rng.gamma(1.0, 1.0, 16))[::-1]
                    scalars[f"{epoch}/{layer}/{tset}/diagonality"] = float(rng.uniform())
                    n_tokens[f"{layer}/{tset}"] = {"all": 16 * 5, "cls": 16, "patch": 16 * 4}[tset]
        np.savez(run / "spectra.npz", **spectra)
        (run / "scalars.json").write_text(json.dumps({"values": scalars}))
        (run / "result.json").write_text(
            json.dumps({"status": "finished", "seed": int(seed), "n_tokens": n_tokens})
        )
    return hyp, tmp / "out"


def test_planned_keys_unchanged(tmp_path):
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis

    hyp, _ = write_runs(tmp_path)
    keys = {str(s.seed): s.key for s in plan_runs(load_hypothesis(hyp))}
    assert keys == json.loads((FIX / "tiny_keys.json").read_text())


def test_table_verb_rebuilds_the_same_table(tmp_path):
    hyp, out = write_runs(tmp_path)
    to = tmp_path / "table.parquet"
    assert main(["table", str(hyp), "--out", str(out), "--to", str(to)]) == 0
    pd.testing.assert_frame_equal(
        pd.read_parquet(to), pd.read_parquet(FIX / "tiny_table.parquet"), rtol=1e-12
    )


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    import yaml

    from study.runspecs import plan_runs
    from study.schema import parse_hypothesis

    spec = plan_runs(parse_hypothesis(yaml.safe_load(TINY_HYPOTHESIS)))
    (FIX / "tiny_keys.json").write_text(json.dumps({str(s.seed): s.key for s in spec}, indent=1) + "\n")
    with tempfile.TemporaryDirectory() as d:
        hyp, out = write_runs(Path(d))
        assert main(["table", str(hyp), "--out", str(out), "--to", str(FIX / "tiny_table.parquet")]) == 0
