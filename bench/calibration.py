"""Calibration of every claim kind: type-I error, power and CI coverage on simulated studies.

    PYTHONPATH=. python bench/calibration.py --unit-images [--reps 300] [--sizes 256 1024 4096] [--metrics eed_pct]

``--unit-images``: ``unit: images`` (``analysis.unit_calibration``): simulated probes with known population
spectra per layer, through the jackknife over probe blocks and the kind's own test.

    PYTHONPATH=. python bench/calibration.py [--reps 1000] [--power-reps 300] [--seeds 3 5 10] [--alpha 0.05]

For each claim kind (and test variant) and each number of seeds S, simulates ``--reps`` studies under
the kind's least favourable null (``analysis.calibration.CALIBRATION_KINDS``) and reports the rate of
ACCEPTED verdicts (p < alpha in the claimed direction) against the bound alpha + 2 Monte Carlo SE
(a ``reference`` row, another test shown on a kind's null for comparison, is printed but not checked),
then ``--power-reps`` studies at effects of 0.5, 1 and 2 per-seed noise SDs (power) and the 95% CI
coverage of the kind's effect at effect 1, then ``--reps`` studies at the REJECTED rule's least
favourable case (the claim just true: every contrast it needs at 0; ``Scenario.boundary``) and the rate
of REJECTED against its bound 0.025 + 2 Monte Carlo SE. Prints one table (markdown); exits 1 if a bound
fails.
Every study goes through the same array cores the table adapters call.

    PYTHONPATH=. python bench/calibration.py --sequential [--reps 1000] [--looks 4 6 8 10] [--alpha 0.05]

``--sequential``: group-sequential rows (``analysis.sequential``), as ``run --until-decided`` tests. Each
simulated study is drawn once at the largest look and its kind's test run on its first n seeds at every
look; a look ACCEPTS when its stage p is below the look's nominal level (Lan-DeMets O'Brien-Fleming and
Pocock type spending over the maximum), and the study stops at the first look that accepts or REJECTS
(the CI excludes the claimed effect). Per kind and spending function: type-I error over all looks on the
least favourable null (against alpha + 2 MC SE), the expected seeds under the null and at effects 0.5, 1
and 2, and power, beside the fixed design with the same maximum (every seed, one test at alpha) and the
seeds saved. ``--reps`` studies per row and effect. A look's nominal levels are the t-calibrated ones the
verdicts use (``analysis.sequential.nominal_levels`` with the looks' seeds).

    PYTHONPATH=. python bench/calibration.py --sequential --t-grid [--reps 100000] [--alpha 0.05]

``--t-grid``: the type-I error of one-sample t tests at every look on null normal seeds (vectorised), for
every design of K = 2..5 equally spaced looks from 3 seeds to a maximum of K + 2..10 seeds, with both
spending functions: with the t-calibrated levels (against alpha + 2 MC SE) and, for comparison, with the z
reference levels ``1 - Phi(c_k)`` (the rule before the t calibration).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from scipy import stats

from analysis.calibration import CALIBRATION_KINDS, scenario, simulate_claim_study
from analysis.kinds.base import REJECT_LEVEL
from analysis.sequential import SPENDING_FUNCTIONS, nominal_levels

EFFECTS = (0.5, 1.0, 2.0)  # alternatives, in per-seed noise SDs


def calibrate(label: str, n_seeds: int, reps: int, power_reps: int, alpha: float, seed: int = 0) -> dict:
    """Type-I error, power at EFFECTS, CI coverage (at effect 1) and the REJECTED rule's rate at its
    boundary of one kind at one S."""
    rng = np.random.default_rng([seed, n_seeds, sum(map(ord, label))])
    null = [simulate_claim_study(label, n_seeds, 0.0, rng) for _ in range(reps)]
    p_null = np.array([r["p"] for r in null])
    row = {
        "kind": label,
        "S": n_seeds,
        "type1": float(np.mean(p_null < alpha)),  # NaN p (no test possible) never accepts
        "bound": alpha + 2 * math.sqrt(alpha * (1 - alpha) / reps),
        "warned": float(np.mean([r["warned"] for r in null])),
        "fallback": float(np.mean([r.get("fallback", False) for r in null])),
    }
    for eff in EFFECTS:
        alt = [simulate_claim_study(label, n_seeds, eff, rng) for _ in range(power_reps)]
        row[f"power@{eff:g}"] = float(np.mean([r["p"] < alpha for r in alt]))
        if eff == 1.0:
            cov = [r["covered"] for r in alt if r["covered"] is not None]
            row["coverage"] = float(np.mean(cov)) if cov else float("nan")
    # drawn after the others, so the type-I, power and coverage numbers keep their random streams
    sc = scenario(label)
    row["rejected"] = float(np.mean([sc.rejected_at_boundary(n_seeds, rng) for _ in range(reps)]))
    row["reject_bound"] = REJECT_LEVEL + 2 * math.sqrt(REJECT_LEVEL * (1 - REJECT_LEVEL) / reps)
    return row


def sequential_outcomes(looks: list[int], p: np.ndarray, contradicted: np.ndarray, noms: np.ndarray) -> dict:
    """Where each simulated study stops and whether it accepted.

    Args:
        looks: (K,) seeds at each look; p, contradicted: (reps, K) stage p-values and REJECT flags;
        noms: (K,) nominal levels of the looks.

    Returns:
        dict with ``accepted`` (reps,) bool (a crossing at a look no later than the first REJECT) and
        ``seeds`` (reps,) the seeds at the look the study stopped (the last look if it never decided).
    """
    k = len(looks)
    cross = np.nan_to_num(p, nan=2.0) < noms[None, :]
    first_cross = np.where(cross.any(1), cross.argmax(1), k)
    first_rej = np.where(contradicted.any(1), contradicted.argmax(1), k)
    accepted = first_cross < k
    accepted &= first_cross <= first_rej
    stop = np.minimum(np.minimum(first_cross, first_rej), k - 1)
    return {"accepted": accepted, "seeds": np.asarray(looks)[stop]}


CHUNK = 50  # studies per task: results do not depend on how many workers share the tasks


def _looked_studies(label: str, looks: tuple[int, ...], effect: float, chunk: int, n: int, seed: int):
    """(n, K) stage p-values and REJECT flags of ``n`` studies, each tested at every look."""
    sc = scenario(label)
    rng = np.random.default_rng([seed, len(looks), sum(map(ord, label)), round(effect * 1000), chunk])
    studies = [sc.at_looks(list(looks), effect, rng) for _ in range(n)]
    p = np.array([[r["p"] for r in s] for s in studies], dtype=np.float64)
    c = np.array([[bool(r.get("contradicted", False)) for r in s] for s in studies])
    return p, c


def simulate_looks(labels, looks: list[int], reps: int, workers: int = 1, seed: int = 0) -> dict:
    """(label, effect) -> (p (reps, K), contradicted (reps, K)), for the null and every EFFECTS entry."""
    tasks = [
        (label, tuple(looks), eff, i, min(CHUNK, reps - i * CHUNK), seed)
        for label in labels
        for eff in (0.0, *EFFECTS)
        for i in range(math.ceil(reps / CHUNK))
    ]
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_looked_studies, *zip(*tasks, strict=True), chunksize=1))
    else:
        parts = [_looked_studies(*t) for t in tasks]
    out: dict = {}
    for t, (p, c) in zip(tasks, parts, strict=True):
        out.setdefault((t[0], t[2]), []).append((p, c))
    return {k: (np.vstack([x[0] for x in v]), np.vstack([x[1] for x in v])) for k, v in out.items()}


def calibrate_sequential(label: str, looks: list[int], sims: dict, alpha: float) -> list[dict]:
    """Sequential rows of one kind (one per spending function): type-I, expected seeds and power.

    ``sims``: :func:`simulate_looks` output holding this label.
    """
    fractions = [n / looks[-1] for n in looks]
    rows = []
    for spending in SPENDING_FUNCTIONS:
        noms = nominal_levels(fractions, alpha, spending, looks)  # t-calibrated, as the verdicts use
        row = {"kind": label, "spending": spending, "looks": looks, "noms": noms}
        for eff in (0.0, *EFFECTS):
            p, c = sims[(label, eff)]
            got = sequential_outcomes(looks, p, c, noms)
            row[f"accept@{eff:g}"] = float(got["accepted"].mean())
            row[f"seeds@{eff:g}"] = float(got["seeds"].mean())
            row[f"fixed@{eff:g}"] = float(np.mean(np.nan_to_num(p[:, -1], nan=2.0) < alpha))
        row["bound"] = alpha + 2 * math.sqrt(alpha * (1 - alpha) / len(p))
        rows.append(row)
    return rows


def print_sequential(rows: list[dict], reps: int, alpha: float, seconds: float) -> bool:
    head = (
        "| kind | spending | type-I (any look) | bound | ok | fixed type-I | E[seeds] null | E[seeds] d=0.5 | d=1 | d=2 "
        "| power d=0.5 seq / fixed | d=1 | d=2 | seeds saved null / d=1 |"
    )
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    ok_all = True
    for r in rows:
        ok = r["accept@0"] <= r["bound"]
        ok_all &= ok
        n_max = r["looks"][-1]
        power = " | ".join(f"{r[f'accept@{e:g}']:.2f} / {r[f'fixed@{e:g}']:.2f}" for e in EFFECTS)
        print(
            f"| {r['kind']} | {r['spending']} | {r['accept@0']:.3f} | {r['bound']:.3f} | {'yes' if ok else 'NO'} | "
            f"{r['fixed@0']:.3f} | {r['seeds@0']:.2f} | "
            + " | ".join(f"{r[f'seeds@{e:g}']:.2f}" for e in EFFECTS)
            + f" | {power} | {n_max - r['seeds@0']:.2f} / {n_max - r['seeds@1']:.2f} |"
        )
    looks = rows[0]["looks"] if rows else []
    print(
        f"\nlooks at {looks} seeds (fixed design: {looks[-1] if looks else '-'} seeds); one-sided alpha {alpha}; "
        f"t-calibrated nominal levels obf {np.round(nominal_levels([n / looks[-1] for n in looks], alpha, 'obf', looks), 5).tolist()}, "
        f"pocock {np.round(nominal_levels([n / looks[-1] for n in looks], alpha, 'pocock', looks), 5).tolist()}; "
        f"{reps} studies per row and effect; {seconds:.0f} s"
    )
    return ok_all


def t_grid_designs(first: int = 3, last: int = 10, ks=(2, 3, 4, 5)) -> list[list[int]]:
    """Every design of K equally spaced looks (rounded) from ``first`` seeds to a maximum in ``last``."""
    designs = []
    for k in ks:
        for s_max in range(first + k - 1, last + 1):
            looks = sorted({int(round(x)) for x in np.linspace(first, s_max, k)})
            if len(looks) == k:
                designs.append(looks)
    return designs


def t_type1(looks: list[int], reps: int, alpha: float, spending: str, seed: int = 0) -> dict:
    """Type-I error of one-sample t tests at every look on null N(0, 1) seeds (vectorised).

    Each study draws its ``looks[-1]`` seeds one by one (independent of the boundary rule's own draws)
    and crosses where a look's t(S_k - 1) p-value is below the look's nominal level. Returns the rate
    with the t-calibrated levels (``t``), with the z reference levels (``z``, the old rule), and the bound
    alpha + 2 MC SE.
    """
    rng = np.random.default_rng([seed, *looks, sum(map(ord, spending))])
    n = np.asarray(looks)
    fractions = n / looks[-1]
    got = {"t": 0, "z": 0}
    noms = {
        "t": nominal_levels(fractions, alpha, spending, looks),
        "z": nominal_levels(fractions, alpha, spending),
    }
    for start in range(0, reps, 50_000):  # chunks keep memory flat on a shared machine
        x = rng.standard_normal((min(50_000, reps - start), looks[-1]))
        cs, cq = np.cumsum(x, 1)[:, n - 1], np.cumsum(x**2, 1)[:, n - 1]
        sd = np.sqrt((cq - cs**2 / n) / (n - 1))
        p = stats.t.sf(cs / n / (sd / np.sqrt(n)), n - 1)
        for rule in got:
            got[rule] += int((p < noms[rule]).any(1).sum())
    return {
        "looks": looks,
        "spending": spending,
        "t": got["t"] / reps,
        "z": got["z"] / reps,
        "bound": alpha + 2 * math.sqrt(alpha * (1 - alpha) / reps),
    }


def print_t_grid(rows: list[dict], reps: int, alpha: float, seconds: float) -> bool:
    """The t-test type-I table of every design (markdown); True when every t-calibrated row holds."""
    print(
        "| looks (seeds) | K | spending | type-I, t-calibrated levels | bound | ok | type-I, z levels (old) |"
    )
    print("|---|---|---|---|---|---|---|")
    ok_all = True
    for r in rows:
        ok = r["t"] <= r["bound"]
        ok_all &= ok
        print(
            f"| {', '.join(map(str, r['looks']))} | {len(r['looks'])} | {r['spending']} | {r['t']:.4f} | "
            f"{r['bound']:.4f} | {'yes' if ok else 'NO'} | {r['z']:.4f} |"
        )
    worst = max(rows, key=lambda r: r["t"]) if rows else None
    if worst:
        print(
            f"\none-sided alpha {alpha}; {reps} null studies per row; {len(rows)} rows; worst t-calibrated "
            f"{worst['t']:.4f} at looks {worst['looks']} ({worst['spending']}); worst z-level rule "
            f"{max(r['z'] for r in rows):.4f}; {seconds:.0f} s"
        )
    return ok_all


def unit_images(
    sizes: list[int], reps: int, alpha: float, t0: float, metrics: list[str], only: list[str] | None = None
) -> int:
    """``unit: images`` rows: per kind, metric and probe size, the rate of p < alpha (type-I on a null,
    power on ``compare_alt``) and the 95% CI's coverage of the population effect (0.93-0.97 required),
    beside the naive test's (plug-in values, same spread: a reference, not checked)."""
    from threadpoolctl import threadpool_limits

    from analysis.unit_calibration import calibrate_unit, scenarios

    threadpool_limits(1)  # small matrices: one BLAS thread each is fastest, and no spinning on a shared host

    head = "| scenario | metric | N images | rate p < alpha | bound | CI coverage | ok | naive rate | naive coverage |"
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    ok_all = True
    for metric in metrics:
        for label, sc in scenarios(metric).items():
            if only and label not in only:
                continue
            for n in sizes:
                r = calibrate_unit(label, metric, n, reps, alpha)
                ok = (not sc.null or r["rate"] <= r["bound"]) and 0.93 <= r["coverage"] <= 0.97
                ok_all &= ok
                bound = f"{r['bound']:.3f}" if sc.null else "(power)"
                print(
                    f"| {label} | {metric} | {n} | {r['rate']:.3f} | {bound} | {r['coverage']:.3f} | "
                    f"{'yes' if ok else 'NO'} | {r['naive_rate']:.3f} | {r['naive_coverage']:.3f} |",
                    flush=True,
                )
    print(f"\n{reps} simulated probes per row, {time.perf_counter() - t0:.0f}s")
    return 0 if ok_all else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequential", action="store_true", help="group-sequential rows (see the docstring)")
    ap.add_argument("--looks", type=int, nargs="+", default=[4, 6, 8, 10], help="seeds at each look")
    ap.add_argument(
        "--t-grid",
        action="store_true",
        help="with --sequential: type-I of one-sample t tests over K = 2..5 looks from 3 to 10 seeds",
    )
    ap.add_argument(
        "--workers", type=int, default=1, help="processes for --sequential (results do not change)"
    )
    ap.add_argument("--reps", type=int, default=1000, help="null studies per kind and S (default 1000)")
    ap.add_argument("--power-reps", type=int, default=300, help="studies per alternative (default 300)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 5, 10])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--kinds", nargs="+", default=list(CALIBRATION_KINDS), choices=list(CALIBRATION_KINDS))
    ap.add_argument(
        "--unit-images", action="store_true", help="unit: images rows (analysis.unit_calibration)"
    )
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=[256, 1024, 4096], help="probe images (--unit-images)"
    )
    ap.add_argument(
        "--metrics", nargs="+", default=["eed_pct", "participation_ratio"], help="metrics (--unit-images)"
    )
    ap.add_argument("--scenarios", nargs="+", default=None, help="scenarios (--unit-images; default all)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.unit_images:
        return unit_images(args.sizes, args.reps, args.alpha, t0, args.metrics, args.scenarios)
    if args.sequential and args.t_grid:
        rows = [
            t_type1(lk, args.reps, args.alpha, sp) for lk in t_grid_designs() for sp in SPENDING_FUNCTIONS
        ]
        return 0 if print_t_grid(rows, args.reps, args.alpha, time.perf_counter() - t0) else 1
    if args.sequential:
        looks = sorted(set(args.looks))
        sims = simulate_looks(args.kinds, looks, args.reps, args.workers)
        rows = [r for k in args.kinds for r in calibrate_sequential(k, looks, sims, args.alpha)]
        return 0 if print_sequential(rows, args.reps, args.alpha, time.perf_counter() - t0) else 1
    rows = [calibrate(k, s, args.reps, args.power_reps, args.alpha) for k in args.kinds for s in args.seeds]
    head = (
        "| kind | least favourable null | S | type-I | bound | ok | power d=0.5 | d=1 | d=2 | CI coverage (d=1) "
        "| warned fits | fallback | REJECTED at boundary | bound | ok |"
    )
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    ok_all = True
    for r in rows:
        ok = r["type1"] <= r["bound"]
        ok_rej = r["rejected"] <= r["reject_bound"]
        reference = scenario(r["kind"]).reference  # another test on this null, shown for comparison
        ok_all &= reference or (ok and ok_rej)
        cov = "n/a" if math.isnan(r["coverage"]) else f"{r['coverage']:.3f}"
        verdict = "reference" if reference else ("yes" if ok else "NO")
        print(
            f"| {r['kind']} | {CALIBRATION_KINDS[r['kind']][1]} | {r['S']} | {r['type1']:.3f} | {r['bound']:.3f} | "
            f"{verdict} | {r['power@0.5']:.2f} | {r['power@1']:.2f} | {r['power@2']:.2f} | {cov} | "
            f"{r['warned']:.2f} | {r['fallback']:.3f} | {r['rejected']:.3f} | {r['reject_bound']:.3f} | "
            f"{'yes' if ok_rej else 'NO'} |"
        )
    print(
        f"\nalpha {args.alpha}; {args.reps} null studies and {args.power_reps} per alternative per row; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
