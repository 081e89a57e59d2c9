"""What the Slurm executor costs per run against the local executor, on one 4-run tiny study.

    PYTHONPATH=. python bench/slurm_overhead.py [--runs 4] [--epochs 2]

Starts a single-node Slurm on this host (tests/slurm_cluster.py: munged, slurmctld, slurmd; as root,
Debian's ``slurm-wlm`` and ``munge``), runs the same tiny study fresh with the local executor
(``--workers auto``: one process per core, one torch thread each) and with ``--executor slurm``
(``--cpus-per-run 1``: one torch thread), and prints per run, median and max over the runs:

* submission to training: from the study's start to the run's ``started_at`` (its first epoch begins;
  on Slurm: ``sbatch``, scheduling, a fresh interpreter importing torch and the data);
* end to result: from the run's ``finished_at`` to the driver's log line for it (on Slurm: the task
  writing its result pickle, the driver's next poll, ``POLL_S`` = 1 s);
* the study's wall time.

Each executor runs ``--repeat`` times, alternated (local, slurm, local, slurm), each on a fresh ``--out``.

Both executors train the same work with one thread per run on as many cores, so the difference is
placement alone. The tables are checked bitwise equal. On a loaded machine the absolute numbers move
from run to run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import TINY_HYPOTHESIS  # noqa: E402
from tests.slurm_cluster import slurm_cluster  # noqa: E402


def timed_study(hyp_path: Path, out: Path, placement) -> dict:
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import Placement, RunOptions
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis

    hyp = load_hypothesis(hyp_path)
    by_label = {s.label: s.key for s in plan_runs(hyp)}
    seen: dict[str, float] = {}

    def log(line: str) -> None:
        label = line[1:].split("]", 1)[0] if line.startswith("[") else ""
        if label in by_label and "] finished" in line:
            seen[by_label[label]] = time.time()

    t0 = time.time()
    outcome = run_study(
        hyp, hyp_path, out, RunOptions(track=False, report=False, placement=placement or Placement()), log=log
    )
    wall = time.time() - t0
    assert not outcome.failed and len(outcome.trained) == len(by_label), outcome.failed
    start, end = [], []
    for key in outcome.trained:
        result = json.loads((out / "runs" / key / "result.json").read_text())
        start.append(result["started_at"] - t0)
        end.append(seen[key] - result["finished_at"])
    return {"wall": wall, "start": start, "end": end, "table": outcome.table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="studies per executor, alternated (default 2)")
    args = ap.parse_args()
    from study.pipeline.stages import Placement

    seeds = ", ".join(str(s) for s in range(args.runs))
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    hyp_path = tmp / "tiny.yaml"
    hyp_path.write_text(
        TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", f"seeds: [{seeds}]").replace(
            "epochs: 2", f"epochs: {args.epochs}"
        )
    )
    rows = []  # alternated, each on a fresh --out: the first study of a process also pays cold imports
    with slurm_cluster():
        for i in range(args.repeat):
            local = timed_study(hyp_path, tmp / f"local{i}", None)
            slurm = timed_study(
                hyp_path, tmp / f"slurm{i}", Placement("slurm", options=(("partition", "debug"),))
            )
            rows += [(f"local #{i + 1}", local), (f"slurm #{i + 1}", slurm)]
    cols = ["run_key", "epoch", "layer", "token_set", "metric"]
    tables = [r["table"].sort_values(cols).reset_index(drop=True) for _, r in rows]
    same = all(t.equals(tables[0]) for t in tables)
    print(f"{args.runs}-run tiny study, {args.epochs} epochs per run (seconds; median / max over the runs)")
    print(f"{'executor':>9} {'wall':>7} {'submit->train':>15} {'end->result':>13}")
    for name, r in rows:
        print(
            f"{name:>9} {r['wall']:>7.1f} {statistics.median(r['start']):>7.1f} / {max(r['start']):<5.1f} "
            f"{statistics.median(r['end']):>5.2f} / {max(r['end']):<5.2f}"
        )
    print(f"tables bitwise equal across all {len(rows)} studies: {same}")


if __name__ == "__main__":
    main()
