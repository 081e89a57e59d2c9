"""Kill a small study at a random moment, rerun it, and check nothing was lost or recorded twice.

    PYTHONPATH=. python bench/faults.py [--n 10] [--seed 0] [--keep DIR]

A tiny study (3 seeds, a 3-block ViT of width 16, 2 epochs, 8 px images) runs once undisturbed; its
verdicts are the reference. Then ``--n`` times, in a fresh output folder: ``python -m study run`` starts
in its own process group, receives SIGKILL (the whole group, as ``kill -9`` of a shell job) at a moment
drawn uniformly from 5% to 90% of the undisturbed run's wall time, and the same command runs again to the end.

Per round it checks the rerun's exit status, its verdicts (name, verdict, effect, CI, p) against the
reference, and the tracking store: a planned run key with no FINISHED child run is *lost*, one with more
than one is *duplicated*; a parent run still RUNNING after the rerun is *stale*. Goal: N of N completed,
N of N matching, 0 duplicated, 0 lost, 0 stale.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import TINY_HYPOTHESIS  # noqa: E402 - the study the fault tests use
from tests.studyproc import start, store_state, study_cmd, verdicts  # noqa: E402


def _cmd(hyp: Path, out: Path) -> list[str]:
    return study_cmd(hyp, out, report=True)  # the whole study, report included


def _store(out: Path, keys: set[str]) -> dict:
    """Lost (no FINISHED child run), duplicated (more than one) and stale parent runs in the store."""
    state = store_state(out)
    return {
        "lost": sum(state["finished"].get(k, 0) == 0 for k in keys),
        "duplicated": sum(state["finished"].get(k, 0) > 1 for k in keys),
        "stale": state["parents"].get("RUNNING", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="kill-and-rerun rounds")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--keep", type=Path, default=None, help="keep the output folders here")
    args = ap.parse_args()
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis

    rng = random.Random(args.seed)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_faults_"))
    root.mkdir(parents=True, exist_ok=True)
    hyp = root / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    keys = {s.key for s in plan_runs(load_hypothesis(hyp))}

    t0 = time.perf_counter()
    base = start(_cmd(hyp, root / "undisturbed"))
    _, err = base.communicate()
    wall = time.perf_counter() - t0
    if base.returncode:
        sys.exit(f"the undisturbed run failed:\n{err}")
    reference = verdicts(root / "undisturbed")
    print(f"undisturbed run: {wall:.1f}s, verdicts {[v[:2] for v in reference]}")

    completed = matched = landed = 0
    totals = Counter()
    for i in range(args.n):
        out = root / f"round_{i:02d}"
        delay = rng.uniform(0.05, 0.9) * wall  # timings vary under load: most kills land before the end
        proc = start(_cmd(hyp, out))
        time.sleep(delay)
        alive = proc.poll() is None
        if alive:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        landed += alive
        again = start(_cmd(hyp, out))
        _, err = again.communicate()
        ok = again.returncode == 0
        same = ok and verdicts(out) == reference
        state = _store(out, keys) if ok else {"lost": len(keys), "duplicated": 0, "stale": 0}
        completed += ok
        matched += same
        totals.update(state)
        print(
            f"round {i}: kill at {delay:5.1f}s ({'landed' if alive else 'after the end'}), rerun "
            f"{'completed' if ok else 'FAILED'}, verdicts {'match' if same else 'DIFFER'}, "
            f"lost {state['lost']}, duplicated {state['duplicated']}, stale parents {state['stale']}"
            + ("" if ok else f"\n{err.strip().splitlines()[-1] if err.strip() else ''}")
        )
    print(
        f"\nkills landed {landed}/{args.n}; reruns completed {completed}/{args.n}; verdict sets matching the "
        f"undisturbed run {matched}/{args.n}; duplicated runs {totals['duplicated']}; lost runs "
        f"{totals['lost']}; stale parent runs {totals['stale']}"
    )
    print(f"folders: {root}")


if __name__ == "__main__":
    main()
