"""Coverage of the seed x probe interval (``uncertainty: seeds+probe``) on planted spectra with known truth.

    PYTHONPATH=. python bench/probe_coverage.py            # --reps 400 studies per row (default)

Each simulated study: S seeds share one probe of N images (T = 4 tokens per image, D = 16). Image i has a
latent ``z_i ~ N(0, diag(lam))`` (lam a power law, i^-1); its tokens are ``z_i + 0.5 e_it``; seed s sees
them through ``A_s = I + tau G_s`` (G_s standard normal / sqrt(D)). The claim's effect is the seed mean of
the participation ratio of the all-token covariance (a claim of one mean, like ``compare``'s difference).
The truth is its expectation over seeds and probe sets of the same size N (what "images of this kind"
means at that probe size), from 4,000 independent (seed, probe) draws. Rows: S = 3, 5, 10 at N = 64 and
N = 512 images, with small seed spread (tau = 0.05: probe noise dominates) and large (tau = 0.5).

Per study the same arrays go through ``analysis.probe``: block sums over K = 16 image blocks,
``resampled_values`` for 200 replicates, ``joint_interval`` (the verdict interval) and the multibootstrap
percentile interval; "seeds only" is the t interval over seeds on the one probe.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from analysis.probe import joint_interval, resampled_values
from analysis.spectral import participation_ratio

D, T, K, R = 16, 4, 16, 200
LAM = 1.0 / np.arange(1, D + 1)


def _probe(n: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.normal(size=(n, 1, D)) * np.sqrt(LAM)
    return (z + 0.5 * rng.normal(size=(n, T, D))).reshape(n * T, D)  # (tokens, D), image-major


def _seed_map(tau: float, rng: np.random.Generator) -> np.ndarray:
    return np.eye(D) + tau * rng.normal(size=(D, D)) / np.sqrt(D)


def _pr(x: np.ndarray) -> float:
    return participation_ratio(np.linalg.eigvalsh(np.cov(x, rowvar=False)))


def truth(n: int, tau: float, rng: np.random.Generator, draws: int = 4000) -> float:
    return float(np.mean([_pr(_probe(n, rng) @ _seed_map(tau, rng).T) for _ in range(draws)]))


def _block_sums(x: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """(K,) block sums of one seed's tokens (image-major), shift: the first token."""
    y = x - x[0]
    edges = [round(n * k / K) * T for k in range(K + 1)]
    parts = [y[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return {
        "n": np.array([len(p) for p in parts], float),
        "s": np.stack([p.sum(0) for p in parts]),
        "q": np.stack([p.T @ p for p in parts]),
        "u": np.stack([p.T @ (p * p).sum(1) for p in parts]),
        "w": np.array([((p * p).sum(1) ** 2).sum() for p in parts]),
    }


def study(s: int, n: int, tau: float, rng: np.random.Generator) -> tuple[float, tuple, tuple, tuple]:
    """One study: (effect, seeds-only t CI, joint interval, multibootstrap percentile interval)."""
    z = _probe(n, rng)
    xs = [z @ _seed_map(tau, rng).T for _ in range(s)]
    values = np.array([_pr(x) for x in xs])
    effect = float(values.mean())
    h = stats.t.ppf(0.975, s - 1) * values.std(ddof=1) / np.sqrt(s)
    ci = (effect - h, effect + h)
    sums = [_block_sums(x, n) for x in xs]
    stacked = {k: np.stack([sm[k] for sm in sums]) for k in sums[0]}
    probe_only, joint = [], []
    for _ in range(R):
        w = rng.multinomial(K, np.full(K, 1.0 / K)).astype(float)
        v = resampled_values(stacked, w, "participation_ratio")
        probe_only.append(v.mean())
        joint.append(v[rng.integers(0, s, s)].mean())
    inter = joint_interval(effect, ci, float(np.std(probe_only, ddof=1)), K)
    pct = tuple(np.percentile(joint, [2.5, 97.5]))
    return effect, ci, inter, pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="", help="only rows 'tau:n:S,...' (e.g. 0.05:64:5); default all 12")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    wanted = set(filter(None, args.rows.split(",")))
    t0 = time.time()
    print(
        "| seed spread | probe images | S | truth | seeds-only t | joint (verdict) | multibootstrap pct | ok |"
    )
    print("|---|---|---|---|---|---|---|---|")
    bad = 0
    for tau, label in ((0.05, "small (probe noise dominates)"), (0.5, "large")):
        for n in (64, 512):
            theta = truth(n, tau, rng)
            for s in (3, 5, 10):
                if wanted and f"{tau:g}:{n}:{s}" not in wanted:
                    continue
                hits = np.zeros(3)
                for _ in range(args.reps):
                    _, *ivs = study(s, n, tau, rng)
                    hits += [lo <= theta <= hi for lo, hi in ivs]
                cov = hits / args.reps
                ok = cov[1] >= 0.93
                bad += not ok
                print(
                    f"| {label} | {n} | {s} | {theta:.3f} | {cov[0]:.3f} | {cov[1]:.3f} | {cov[2]:.3f} | "
                    f"{'yes' if ok else 'NO'} |"
                )
    print(f"({args.reps} studies per row, {time.time() - t0:.0f} s)")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
