"""``python -m study table`` rebuilds the same tidy table from the same run folders, and the planner gives
the same run keys, as stored in ``tests/fixtures/behaviour/tiny_table.parquet`` and ``tiny_keys.json``
(written by the code before the run-folder contract; rerun with ``--regenerate`` by hand only on purpose).

The run folders are written byte by byte (``tests.conftest.write_runs``) in the on-disk format
(``result.json``, ``spectra.npz`` with keys ``"{epoch}/{layer}/{token_set}"``, ``scalars.json``),
independently of the code under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS, write_runs

FIX = Path(__file__).parent / "fixtures" / "behaviour"


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
    pinned = pd.read_parquet(FIX / "tiny_table.parquet")
    got = pd.read_parquet(to)
    assert set(pinned.metric) <= set(got.metric)
    # the metrics the snapshot pins: a metric registered since (a plug-in's, a new one) adds rows only
    got = got[got.metric.isin(set(pinned.metric))].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pinned, rtol=1e-12)


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
