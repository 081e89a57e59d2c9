"""Time the statistics of a full-size study: every shipped claim on a synthetic tidy table.

    PYTHONPATH=. python bench/analyze.py [--seeds 5]

The table has seeds x 3 datasets x 15 observation points x 11 checkpoints x 8 metrics x 2 token sets
(``analysis.simulate.simulate_study_table``; datasets named objects, cue_mix, textures). Every file in
``hypotheses/`` is validated and its claims tested with ``evaluate_claims`` exactly as
``python -m study analyze`` does (the table is re-read from Parquet, as ``analyze`` does); a sweep's file
is skipped, since its claims over a knob need a sweep's table; a design with conditions gets the table once
per cell (the ``condition`` column). Prints the
table size, the time per file and the total; the budget is 10 s on 2 CPU cores (over it, the exit status is 3;
an error exits 1).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from analysis.simulate import simulate_study_table
from analysis.table import load_table, save_table
from analysis.verdicts import evaluate_claims
from study.schema import load_hypothesis

ROOT = Path(__file__).resolve().parents[1]


OVER_BUDGET = 3  # the exit status when the total exceeds the budget (an error exits 1)


def _cells_table(hyp, table):
    """The table once per cell of a design with conditions (an untrained cell: its epoch-0 rows), each
    under the cell's name, as ``run`` collects it; the table itself without conditions."""
    import pandas as pd

    cells = hyp.design.cells()
    if cells[0].name is None:
        return table
    frames = [(table[table.epoch == 0] if c.untrained else table).assign(condition=c.name) for c in cells]
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args(argv)
    table = simulate_study_table(n_seeds=args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_table(table, Path(tmp) / "table.parquet")
        t0 = time.perf_counter()
        table = load_table(path)
        t_load = time.perf_counter() - t0
        files = []
        n_claims, lines = 0, []
        for f in sorted((ROOT / "hypotheses").glob("*.yaml")):
            t = time.perf_counter()
            hyp = load_hypothesis(f)
            if hyp.sweep is not None:  # claims over a knob need a sweep's table (knob columns)
                continue
            files.append(f)
            results = evaluate_claims(hyp, _cells_table(hyp, table), source=f.name)
            n_claims += len(results)
            verdicts = ", ".join(r.verdict for r in results)
            lines.append(
                f"  {f.name:22s} {len(results)} claim(s) {time.perf_counter() - t:6.2f} s  [{verdicts}]"
            )
        total = time.perf_counter() - t0
    dims = {c: table[c].nunique() for c in ("seed", "dataset", "layer", "epoch", "metric", "token_set")}
    print(
        f"table: {len(table):,} rows ({' x '.join(f'{v} {k}s' for k, v in dims.items())}); load {t_load:.2f} s"
    )
    print("\n".join(lines))
    print(f"total: {n_claims} claims in {len(files)} files, {total:.2f} s (budget 10 s)")
    return 0 if total <= 10 else OVER_BUDGET


if __name__ == "__main__":
    sys.exit(main())
