"""Wall time of one 8-run study on a loopback Ray cluster of 1 and of 2 workers, against the local executor.

    PYTHONPATH=. python bench/scale.py [--epochs 2]

Starts a Ray head (and a second 1-CPU node) on 127.0.0.1 in their own process groups, runs the same
8-run tiny study (seeds 0-7) fresh each time with file leases, and prints, side by side:

* local: 1 worker (in this process, 1 torch thread) and 2 workers (``ProcessExecutor``, 1 thread each);
* ray: ``RayExecutor`` on 1 and 2 one-CPU nodes;
* the scheduling overhead per run: (ray wall - local wall) / 8 at the same worker count.

Every run trains the same work, so the ratios compare placement alone. On a shared, loaded machine the
absolute numbers move from run to run; compare the ratios printed together.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.clusters import RayCluster  # noqa: E402
from tests.conftest import TINY_HYPOTHESIS  # noqa: E402

EIGHT = TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2, 3, 4, 5, 6, 7]")


def timed_study(hyp_path: Path, out: Path, workers: int, placement) -> float:
    import torch

    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import RunOptions
    from study.schema import load_hypothesis

    hyp = load_hypothesis(hyp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per run everywhere, as each Ray task gets (OMP_NUM_THREADS=1)
    t0 = time.perf_counter()
    outcome = run_study(
        hyp,
        hyp_path,
        out,
        RunOptions(workers=workers, track=False, report=False, placement=placement),
        log=lambda _: None,
    )
    wall = time.perf_counter() - t0
    torch.set_num_threads(threads)
    assert len(outcome.trained) == 8 and not outcome.failed, outcome.failed
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    from study.pipeline.stages import Placement

    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    hyp_path = tmp / "eight.yaml"
    hyp_path.write_text(EIGHT.replace("epochs: 2", f"epochs: {args.epochs}"))
    local = {w: timed_study(hyp_path, tmp / f"local{w}", w, None) for w in (1, 2)}
    cluster = RayCluster(tmp, {})
    ray_wall = {}
    try:
        cluster.start_node(head=True)
        cluster.wait_for_cpus(1)
        ray_wall[1] = timed_study(hyp_path, tmp / "ray1", 1, Placement("ray", cluster.address))
        cluster.start_node(head=False)
        cluster.wait_for_cpus(2)
        ray_wall[2] = timed_study(hyp_path, tmp / "ray2", 2, Placement("ray", cluster.address))
    finally:
        cluster.stop()
    print(f"8-run tiny study, {args.epochs} epochs per run (wall seconds)")
    print(f"{'workers':>8} {'local':>8} {'ray':>8} {'ray/local':>10} {'overhead/run':>13}")
    for w in (1, 2):
        print(
            f"{w:>8} {local[w]:>8.1f} {ray_wall[w]:>8.1f} {ray_wall[w] / local[w]:>10.2f} "
            f"{(ray_wall[w] - local[w]) / 8:>12.2f}s"
        )
    print(
        f"ray speed-up 1 -> 2 workers: {ray_wall[1] / ray_wall[2]:.2f}x (local: {local[1] / local[2]:.2f}x)"
    )


if __name__ == "__main__":
    main()
