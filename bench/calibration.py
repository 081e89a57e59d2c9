"""Calibration of every claim kind: type-I error, power and CI coverage on simulated studies.

    PYTHONPATH=. python bench/calibration.py [--reps 1000] [--power-reps 300] [--seeds 3 5 10] [--alpha 0.05]

For each claim kind (and test variant) and each number of seeds S, simulates ``--reps`` studies under
the kind's least favourable null (``analysis.calibration.CALIBRATION_KINDS``) and reports the rate of
ACCEPTED verdicts (p < alpha in the claimed direction) against the bound alpha + 2 Monte Carlo SE,
then ``--power-reps`` studies at effects of 0.5, 1 and 2 per-seed noise SDs (power) and the 95% CI
coverage of the kind's effect at effect 1. Prints one table (markdown); exits 1 if a bound fails.
Every study goes through the same array cores the table adapters call.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from analysis.calibration import CALIBRATION_KINDS, simulate_claim_study

EFFECTS = (0.5, 1.0, 2.0)  # alternatives, in per-seed noise SDs


def calibrate(label: str, n_seeds: int, reps: int, power_reps: int, alpha: float, seed: int = 0) -> dict:
    """Type-I error, power at EFFECTS and CI coverage (at effect 1) of one kind at one S."""
    rng = np.random.default_rng([seed, n_seeds, sum(map(ord, label))])
    null = [simulate_claim_study(label, n_seeds, 0.0, rng) for _ in range(reps)]
    p_null = np.array([r["p"] for r in null])
    row = {
        "kind": label,
        "S": n_seeds,
        "type1": float(np.mean(p_null < alpha)),  # NaN p (no test possible) never accepts
        "bound": alpha + 2 * math.sqrt(alpha * (1 - alpha) / reps),
        "warned": float(np.mean([r["warned"] for r in null])),
    }
    for eff in EFFECTS:
        alt = [simulate_claim_study(label, n_seeds, eff, rng) for _ in range(power_reps)]
        row[f"power@{eff:g}"] = float(np.mean([r["p"] < alpha for r in alt]))
        if eff == 1.0:
            cov = [r["covered"] for r in alt if r["covered"] is not None]
            row["coverage"] = float(np.mean(cov)) if cov else float("nan")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=1000, help="null studies per kind and S (default 1000)")
    ap.add_argument("--power-reps", type=int, default=300, help="studies per alternative (default 300)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 5, 10])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--kinds", nargs="+", default=list(CALIBRATION_KINDS), choices=list(CALIBRATION_KINDS))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [calibrate(k, s, args.reps, args.power_reps, args.alpha) for k in args.kinds for s in args.seeds]
    head = "| kind | least favourable null | S | type-I | bound | ok | power d=0.5 | d=1 | d=2 | CI coverage (d=1) | warned fits |"
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    ok_all = True
    for r in rows:
        ok = r["type1"] <= r["bound"]
        ok_all &= ok
        cov = "n/a" if math.isnan(r["coverage"]) else f"{r['coverage']:.3f}"
        print(
            f"| {r['kind']} | {CALIBRATION_KINDS[r['kind']][1]} | {r['S']} | {r['type1']:.3f} | {r['bound']:.3f} | "
            f"{'yes' if ok else 'NO'} | {r['power@0.5']:.2f} | {r['power@1']:.2f} | {r['power@2']:.2f} | {cov} | "
            f"{r['warned']:.2f} |"
        )
    print(
        f"\nalpha {args.alpha}; {args.reps} null studies and {args.power_reps} per alternative per row; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
