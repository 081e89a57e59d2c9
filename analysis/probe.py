"""Claims beyond one probe set: probe-size sensitivity, token-count matching, seed x probe multibootstrap.

Every seed is measured on the same probe images, so the probe's sampling error is shared by all seeds and
never shows in their spread. Three tools read what the extraction stored beside the spectra
(``vitstudy_core.runfolder``: ``probe.npz`` and, with ``probe.blocks: K``, ``blocks.npz``) and rebuild
the claim's tidy rows from it, then call the claim kind's own ``evaluate`` (nothing here knows a kind):

* :func:`sensitivity`: the claim's effect on the probe's first N/4 and N/2 images, next to all N;
* :func:`matched_table`: the claim's rows at a matched token count: every population with more tokens
  than the smallest one the claim compares is replaced by a seeded subsample of as many tokens
  (``tokens_matched``: as many tokens as probe images, the class token's count) or by the probe prefix
  with that count;
* :func:`multibootstrap`: seeds and probe blocks resampled jointly (Sellam et al. 2022, the
  Multi-Bootstrap): each replicate draws K blocks with replacement (one draw shared by every seed, as the
  probe is) and, for the joint interval, S seeds with replacement; each seed's covariances are the
  weighted block sums, so no pass over the model is repeated.

The verdict interval of ``uncertainty: seeds+probe`` (:func:`joint_interval`) widens each side of the
kind's own seed interval by the probe's: ``effect -/+ sqrt(h_seed^2 + (1.96 sd_probe)^2)``, with
``sd_probe`` the SD of the effect over probe-only replicates (seeds fixed); the percentile interval of
the joint (seed x probe) replicates is reported beside it. Simulation: ``bench/probe_coverage.py``.
This module never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from threadpoolctl import threadpool_limits

from analysis.observables import OBSERVABLES
from analysis.spectral import METRICS, TOKEN_METRICS
from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import BLOCKS, PROBE, RunFolder

if TYPE_CHECKING:
    import pandas as pd

LABELS = {"images_1_4": "N/4", "images_1_2": "N/2"}  # probe.npz labels of the sensitivity table, in order
MATCHED = "tokens_matched"
REPLICATES = 200  # multibootstrap replicates per claim: the interval's Monte Carlo error is ~0.1 sd
BOOT_SEED = 0  # the replicates' seed: a claim's interval is the same every time it is computed
Z975 = 1.959963984540054


def resamplable(metric: str) -> bool:
    """Whether a metric can be recomputed from covariance sums (eigenvalue metrics, covariance observables
    and token-count metrics): a metric of the token subsample (cosine anisotropy, TwoNN) cannot."""
    entry = OBSERVABLES.get(metric) if metric in OBSERVABLES else None
    return metric in METRICS or metric in TOKEN_METRICS or (entry is not None and entry.on == "covariance")


class ProbeData:
    """The probe files of a study's runs, keyed by run key, read once on first use.

    Keyed by the run, not by (dataset, seed): in a design with conditions one (dataset, seed) has a run
    per trained condition, and each row reads the files of the run it came from (its ``run_key``; an
    untrained cell's rows carry its twin's key, whose epoch-0 files they are).

    Args:
        folders: run key -> the run's folder.
    """

    def __init__(self, folders: dict[str, RunFolder]) -> None:
        self.folders = folders
        self._cache: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        # (run key, epoch, layer, token set, metric) -> that covariance's (K,) jackknife pseudo-values:
        # the claims of a file share rows, and each row costs K + 1 eigendecompositions (analysis.units)
        self.pseudo: dict[tuple, np.ndarray] = {}

    @classmethod
    def of_table(cls, table: pd.DataFrame, runs_dir: Path) -> ProbeData:
        """The runs behind a tidy table (its ``run_key`` column) under ``runs_dir``."""
        if "run_key" not in table or table.empty:
            return cls({})
        return cls({str(k): RunFolder(Path(runs_dir) / str(k)) for k in table["run_key"].unique()})

    def read(self, name: str, run_key: str) -> dict[str, np.ndarray]:
        """The file ``name`` of run ``run_key`` as arrays ({} when the run or the file is missing)."""
        key = (name, str(run_key))
        if key not in self._cache:
            folder = self.folders.get(str(run_key))
            self._cache[key] = folder.read_npz(name) if folder is not None else {}
        return self._cache[key]

    def has(self, name: str) -> bool:
        """Every run holds the file ``name`` (``probe.npz`` or ``blocks.npz``)."""
        return bool(self.folders) and all(self.read(name, k) for k in self.folders)


def _rows(df: pd.DataFrame) -> list[Any]:
    """The rows of a frame as named tuples (typed Any: pandas types their fields as any scalar)."""
    return list(df.itertuples())


def metric_of(metric: str, lam: np.ndarray, values: dict[str, float]) -> float:
    """One metric of a smaller probe: an eigenvalue metric of ``lam``, else its stored value."""
    return float(METRICS[metric](lam)) if metric in METRICS else float(values.get(metric, float("nan")))


def _label_value(f: dict[str, np.ndarray], key: str, metric: str) -> tuple[float, int] | None:
    if f"{key}/lam" not in f:
        return None
    values = {k.rsplit("/", 1)[1]: float(v) for k, v in f.items() if k.startswith(f"{key}/m/")}
    return metric_of(metric, f[f"{key}/lam"], values), int(f[f"{key}/n"])


def table_at(table: pd.DataFrame, probe: ProbeData, metric: str, label: str) -> pd.DataFrame:
    """The rows of ``metric`` with each value (and ``n_tokens``) replaced by the probe label's (``probe.npz``);
    a row without that label is dropped. Other metrics' rows are left out."""
    rows = table[table.metric == metric]
    vals, ns, keep = [], [], []
    for r in _rows(rows):
        got = _label_value(
            probe.read(PROBE, str(r.run_key)),
            f"{r.epoch}/{r.layer}/{r.token_set}/{label}",
            metric,
        )
        keep.append(got is not None and math.isfinite(got[0]))
        vals.append(got[0] if got else np.nan)
        ns.append(got[1] if got else -1)
    out = rows.assign(value=vals, n_tokens=ns)
    return out[np.asarray(keep, dtype=bool)] if len(out) else out


def claim_token_sets(claim: Any) -> set[str]:
    """Every token set the claim reads: its subset's and those of its conditions."""
    sets = {claim.subset.token_set}
    for fld in ("a", "b", "target"):
        cond = getattr(claim, fld, None)
        if cond is not None and getattr(cond, "token_set", None):
            sets.add(cond.token_set)
    for cond in getattr(claim, "competitors", None) or []:
        if cond.token_set:
            sets.add(cond.token_set)
    return sets


def claim_rows(table: pd.DataFrame, claim: Any) -> pd.DataFrame:
    """The rows a claim can read: its metric, in the datasets and token sets it names (all datasets if it
    names none)."""
    rows = table[(table.metric == claim.metric) & table.token_set.isin(claim_token_sets(claim))]
    named = claim.datasets_named()
    return rows[rows.dataset.isin(named)] if named else rows


def matched_table(table: pd.DataFrame, claim: Any, probe: ProbeData, where: str) -> tuple[pd.DataFrame, int]:
    """The table with the claim's rows at one token count: the smallest count among them.

    Every row with more tokens takes the value of the stored smaller probe with exactly that count (the
    seeded ``tokens_matched`` subsample, or the probe's first N/4 or N/2 images).

    Returns:
        (the table, the matched count).

    Raises:
        StudyError: the runs hold no smaller probe (a metric log, or runs measured before it existed), or
            none with the matched count.
    """
    rows = claim_rows(table, claim)
    counts = sorted({int(n) for n in rows.n_tokens if n >= 0})
    if not counts:
        raise StudyError(
            "match_tokens needs the token counts behind the rows; this table has none", where, "match_tokens"
        )
    target = counts[0]
    if len(counts) == 1:
        return table, target
    if not probe.has(PROBE):
        raise StudyError(
            "match_tokens needs each run's smaller-probe spectra (probe.npz); these runs have none "
            "(a metric log, or runs measured before it existed: rerun with --force)",
            where,
            "match_tokens",
        )
    vals = rows.value.to_numpy(dtype=np.float64).copy()
    ns = rows.n_tokens.to_numpy().copy()
    for i, r in enumerate(_rows(rows)):
        if int(r.n_tokens) <= target:
            continue
        f = probe.read(PROBE, str(r.run_key))
        for label in (MATCHED, *LABELS):
            got = _label_value(f, f"{r.epoch}/{r.layer}/{r.token_set}/{label}", claim.metric)
            if got is not None and got[1] == target:
                vals[i], ns[i] = got[0], got[1]
                break
        else:
            raise StudyError(
                f"cannot match {r.token_set} at {r.layer} ({r.n_tokens} tokens) down to {target}: the run "
                "stores no subsample of that size (matched counts: as many tokens as probe images, or N/4, N/2)",
                where,
                "match_tokens",
            )
    out = table.copy()
    out.loc[rows.index, "value"] = vals
    out.loc[rows.index, "n_tokens"] = ns
    return out, target


Evaluate = Callable[["pd.DataFrame"], Any]  # a table -> the kind's Outcome (effect, ci, p_value)


def sensitivity(
    table: pd.DataFrame, claim: Any, probe: ProbeData, evaluate: Evaluate
) -> list[dict[str, Any]]:
    """The claim's effect at N/4, N/2 and N probe images (one dict per size: ``probe``, ``n_tokens`` of the
    subset's token set at the layers the claim reads, ``effect``, ``ci``, ``p``); [] when the runs hold no
    smaller probe."""
    if not probe.has(PROBE) or claim.metric not in set(table.metric) or not resamplable(claim.metric):
        return []
    base = claim_rows(table, claim)
    layers = {str(v) for _, what, v in claim.named() if what == "layer"}
    out = []
    for label, name in (*LABELS.items(), ("", "N")):
        rows = base if not label else table_at(base, probe, claim.metric, label)
        try:
            o = evaluate(rows)
        except StudyError:
            continue
        read = rows[rows.token_set == claim.subset.token_set]
        if layers:  # the layers the claim reads: patch_embed (no class token) is in no region
            read = read[read.layer.isin(layers)]
        n = sorted({int(v) for v in read.n_tokens if v >= 0})
        out.append({"probe": name, "n_tokens": n, "effect": o.effect, "ci": list(o.ci), "p": o.p_value})
    return out


# --------------------------------------------------------------------------------------------------
# The seed x probe multibootstrap
# --------------------------------------------------------------------------------------------------
def _block_sums(probe: ProbeData, rows: pd.DataFrame, where: str) -> dict[str, Any]:
    """Stacked per-block sums of every row's covariance: ``n`` (C, K), ``s``/``u`` (C, K, D), ``q``
    (C, K, D, D), ``w`` (C, K), in the rows' order. Where the rows' widths D differ (a CNN's layers), ``s``,
    ``q`` and ``u`` are lists of each row's ``(K, ...)`` arrays instead (:func:`resampled_values` takes both)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("n", "s", "q", "u", "w")}
    for r in _rows(rows):
        f = probe.read(BLOCKS, str(r.run_key))
        key = f"{r.epoch}/{r.layer}/{r.token_set}"
        if f"{key}/qtril" not in f:
            raise StudyError(
                f"run {r.dataset}/seed{r.seed} has no block sums for {key} (blocks.npz); set "
                "design.probe.blocks and rerun the runs",
                where,
                "uncertainty",
            )
        tril = f[f"{key}/qtril"]
        d = f[f"{key}/s"].shape[1]
        low = np.tril_indices(d)
        q = np.zeros((tril.shape[0], d, d))
        q[:, low[0], low[1]] = tril
        q = q + np.triu(q.transpose(0, 2, 1), 1)
        for k in ("n", "s", "u", "w"):
            parts[k].append(f[f"{key}/{k}"])
        parts["q"].append(q)
    ragged = len({a.shape for a in parts["s"]}) > 1
    return {k: list(v) if ragged and k in ("s", "q", "u") else np.stack(v) for k, v in parts.items()}


def resampled_values(sums: dict[str, Any], weights: np.ndarray, metric: str) -> np.ndarray:
    """The metric of each covariance rebuilt from block sums weighted by ``weights: (K,)`` (block counts
    of a bootstrap draw): ``n = sum w_k n_k``, ``s``, ``q``, ``u``, ``w`` likewise; returns (C,).

    The linear algebra runs on one BLAS thread: a D ~ 384 ``eigvalsh`` is too small to split, and with
    OpenBLAS's default of one thread per core a jackknife of 6 covariances (16 blocks) took 37.7 s instead
    of 1.1 s on a 2-core machine with one other busy process (threads spinning against each other)."""
    n = sums["n"] @ weights
    if isinstance(sums["s"], list):  # rows of different widths: each row on its own
        s = [weights @ x for x in sums["s"]]
        q = [np.einsum("k,kde->de", weights, x) for x in sums["q"]]
    else:
        s = np.einsum("k,ckd->cd", weights, sums["s"])
        q = np.einsum("k,ckde->cde", weights, sums["q"])
    out = np.empty(len(n))
    with threadpool_limits(limits=1, user_api="blas"):
        for c in range(len(n)):
            if metric in TOKEN_METRICS:
                one = {
                    "n": n[c],
                    "s": s[c],
                    "q": q[c],
                    "u": weights @ sums["u"][c],
                    "w": weights @ sums["w"][c],
                }
                out[c] = TOKEN_METRICS[metric](one)
                continue
            cov = (q[c] - np.outer(s[c], s[c]) / n[c]) / max(n[c] - 1, 1)
            cov = 0.5 * (cov + cov.T)
            if metric in METRICS:
                out[c] = METRICS[metric](np.linalg.eigvalsh(cov)[::-1])
            else:
                out[c] = OBSERVABLES[metric].fn(cov)
    return out


def multibootstrap(
    table: pd.DataFrame,
    claim: Any,
    probe: ProbeData,
    evaluate: Evaluate,
    effect: float,
    ci: tuple[float, float],
    where: str,
    replicates: int = REPLICATES,
    seed: int = BOOT_SEED,
) -> dict[str, Any]:
    """The claim's seed x probe intervals from its runs' block sums.

    Args:
        evaluate: the kind's evaluation of a table (its ``Outcome``).
        effect, ci: the claim's effect and the kind's own 95% seed interval, on the full probe.

    Returns:
        ``interval`` (the verdict interval, :func:`joint_interval`), ``percentile`` (2.5/97.5% of the
        joint seed x probe replicates), ``sd_probe`` (SD of the effect over probe-only replicates),
        ``replicates`` and ``blocks`` (K).
    """
    rows = claim_rows(table, claim).reset_index(drop=True)
    sums = _block_sums(probe, rows, where)
    k = sums["n"].shape[1]
    rng = np.random.default_rng(seed)
    seeds = sorted(int(s) for s in rows.seed.unique())
    probe_only, joint = [], []
    for _ in range(replicates):
        w = rng.multinomial(k, np.full(k, 1.0 / k)).astype(np.float64)
        rep = rows.assign(value=resampled_values(sums, w, claim.metric))
        rep = rep[np.isfinite(rep.value)]
        probe_only.append(_effect(evaluate, rep))
        draw = rng.choice(seeds, size=len(seeds), replace=True)
        joint.append(_effect(evaluate, _relabel(rep, draw)))
    po, jo = np.asarray(probe_only), np.asarray(joint)
    sd = float(np.nanstd(po, ddof=1)) if np.isfinite(po).sum() >= 2 else float("nan")
    pct = tuple(np.nanpercentile(jo, [2.5, 97.5])) if np.isfinite(jo).sum() >= 2 else (np.nan, np.nan)
    return {
        "interval": list(joint_interval(effect, ci, sd, int(k))),
        "percentile": [float(pct[0]), float(pct[1])],
        "sd_probe": sd,
        "replicates": replicates,
        "blocks": int(k),
    }


def _effect(evaluate: Evaluate, rows: pd.DataFrame) -> float:
    try:
        return float(evaluate(rows).effect)
    except StudyError:
        return float("nan")


def _relabel(rows: pd.DataFrame, draw: np.ndarray) -> pd.DataFrame:
    """A table of seeds ``draw`` (with repeats): draw j's rows become seed j."""
    import pandas as pd

    by_seed = dict(tuple(rows.groupby("seed")))
    return pd.concat([by_seed[int(s)].assign(seed=j) for j, s in enumerate(draw)], ignore_index=True)


def joint_interval(
    effect: float, ci: tuple[float, float], sd_probe: float, blocks: int | None = None
) -> tuple[float, float]:
    """The seed x probe 95% interval: each side of the seed interval ``ci`` widened by the probe's,
    ``effect -/+ sqrt((effect - ci_low)^2 + h^2)`` (and likewise above), ``h = q sd_probe``.

    With ``blocks`` = K the probe half-width is small-sample corrected as the seed's is: the bootstrap
    over K blocks estimates the probe variance on K - 1 degrees of freedom and low by (K - 1) / K, so
    ``q = t_{K-1}(0.975) sqrt(K / (K - 1))`` (2.20 at K = 16) instead of the normal 1.96 (``blocks`` None).
    """
    if blocks is not None and blocks >= 2:
        from scipy import stats

        h = float(stats.t.ppf(0.975, blocks - 1)) * math.sqrt(blocks / (blocks - 1)) * sd_probe
    else:
        h = Z975 * sd_probe
    lo = effect - math.sqrt((effect - ci[0]) ** 2 + h * h)
    hi = effect + math.sqrt((ci[1] - effect) ** 2 + h * h)
    return float(lo), float(hi)


def excludes_zero(interval: tuple[float, float] | list[float], effect: float) -> bool:
    """The interval lies entirely on the effect's side of 0."""
    lo, hi = interval
    return bool((effect > 0 and lo > 0) or (effect < 0 and hi < 0))
