"""``python -m study plan FILE [--pilot TABLE] [--json]``: seeds and run-hours each claim needs. Nothing trains.

Per claim, from ``analysis.power``: the seeds for 80% and 90% power at the smallest effect of interest
(the claim's ``sesoi``, or its kind's ``planning_effect``; without one, the pilot's observed effect), at
the pilot's per-seed SD and at its upper 80% bound; the power of the file's own seeds; and the seed floor
of a randomisation test. The pilot is ``--pilot TABLE`` (a tidy table, e.g. 2-3 seeds of a cheap run), or
the study's own ``table.parquet`` when it has one. Confirmatory claims are planned at the Bonferroni level
``alpha / m`` (m confirmatory claims): the level Holm's first step needs, so the plan holds whatever the
other claims show; exploratory claims at their family's ``alpha / m`` (``none``: alpha).

Run-hours: a run's time comes from finished runs of the same design (``epoch_s`` in their result.json
history, scaled to the design's epochs), otherwise from a short timed training step on this machine
(``runners.timing``) scaled by steps per epoch and epochs. Extraction is added to either: one spectra
extraction of the run's model timed on this machine (``runners.timing.time_extraction``, measured, not
modelled) times the run's checkpoints; measured runs spend 0.40-0.48 of their wall time there, so leaving
it out undercounts by about half. Evaluation is not included.

For designs of the configuration measured on a GPU (ViT-S/16 at 224 px, supervised or ``dino_paper``), the
plan also prints the estimated GPU time of every run on that device (``study.cluster.gpu_cost``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from analysis.kinds import get_kind
from analysis.kinds.base import TableView
from analysis.power import MAX_SEEDS, plan_claim
from analysis.verdicts import families
from study.cluster.gpu_cost import format_estimate, gpu_estimate
from study.pipeline.triage import plan as plan_runs
from study.runspecs import RunSpec
from study.schema import Hypothesis
from vitstudy_core.fmt import fmt_hours, fmt_num

_NOT_IN_KEY = ("key", "seed", "source")


def _design_of(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in _NOT_IN_KEY}


def _finished_results(spec: RunSpec, runs_dir: Path) -> Iterator[dict]:
    """``result.json`` of every finished run of ``spec``'s design (any seed) under ``runs_dir``."""
    want = _design_of(spec.model_dump())
    for path in sorted(Path(runs_dir).glob("*/result.json")) if Path(runs_dir).is_dir() else []:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if result.get("status") == "finished" and _design_of(result.get("run") or {}) == want:
            yield result


def finished_run_seconds(spec: RunSpec, runs_dir: Path) -> float | None:
    """Mean training seconds of a run of ``spec``'s design (any seed) from finished runs' epoch times."""
    times = []
    for result in _finished_results(spec, runs_dir):
        history = result.get("history") or []
        epoch_s = [h["epoch_s"] for h in history if isinstance(h.get("epoch_s"), int | float)]
        if epoch_s:
            times.append(float(np.mean(epoch_s)) * spec.training["epochs"])
    return float(np.mean(times)) if times else None


def finished_measure_seconds(spec: RunSpec, runs_dir: Path) -> float | None:
    """Mean seconds of one checkpoint's measurement in finished runs of ``spec``'s design (any seed), from
    their ``measure_s``; None when none recorded it (runs from before it was recorded, imported runs)."""
    times = []
    for result in _finished_results(spec, runs_dir):
        seconds = result.get("measure_s")
        seconds = (
            [v for v in seconds.values() if isinstance(v, int | float)] if isinstance(seconds, dict) else []
        )
        if seconds:
            times.append(float(np.mean(seconds)))
    return float(np.mean(times)) if times else None


def steps_per_epoch(spec: RunSpec) -> int | None:
    """Optimiser steps per epoch of a run (None when the training set's size is not in the spec)."""
    n_train, tr = spec.dataset.get("n_train"), spec.training
    if not n_train or "batch_size" not in tr:  # an imported run trains nothing
        return None
    steps = math.ceil(n_train / tr["batch_size"])
    return min(steps, tr["max_steps_per_epoch"]) if tr.get("max_steps_per_epoch") else steps


def run_hours(
    specs: list[RunSpec],
    runs_dir: Path,
    time_step: Callable[[dict], float] | None,
    time_extract: Callable[[dict], float] | None = None,
) -> dict:
    """:func:`run_group` -> {"hours": one run's hours (None: unknown), "source": where they came from}.

    ``time_extract``: seconds of one checkpoint's extraction (added once per checkpoint), asked only when
    no finished run recorded it (``measure_s``); None: left out, and the source says so.
    """
    out = _training_hours(specs, runs_dir, time_step)
    by_name = {run_group(s): s for s in specs}
    for name, h in out.items():
        if h["hours"] is None:
            continue
        if time_extract is None:
            h["source"] += "; extraction not included"
            continue
        spec = by_name[name]
        per = finished_measure_seconds(spec, runs_dir)
        where = "from finished runs"
        if per is None:
            per, where = time_extract(spec.model_dump()), "timed here"
        n = len(spec.checkpoints)
        h["hours"] += per * n / 3600
        h["source"] += f" + extraction {where} ({per:.2f} s x {n} checkpoints)"
        h["extract_hours"] = per * n / 3600
    return out


def run_group(spec: RunSpec) -> str:
    """The runs that share a duration: a dataset's (``condition/dataset`` in a design with conditions)."""
    return f"{spec.condition}/{spec.dataset['name']}" if spec.condition is not None else spec.dataset["name"]


def _training_hours(specs: list[RunSpec], runs_dir: Path, time_step: Callable[[dict], float] | None) -> dict:
    """:func:`run_group` -> {"hours": one run's training hours (None: unknown), "source": where it came from}."""
    out = {}
    for spec in specs:
        name = run_group(spec)
        if name in out:
            continue
        seconds = finished_run_seconds(spec, runs_dir)
        if seconds is not None:
            out[name] = {"hours": seconds / 3600, "source": "finished runs (epoch_s)"}
            continue
        steps = steps_per_epoch(spec)
        if time_step is None or steps is None:
            out[name] = {"hours": None, "source": "unknown (no finished run, no timed step)"}
            continue
        per_step = time_step(spec.model_dump())
        hours = per_step * steps * spec.training["epochs"] / 3600
        out[name] = {
            "hours": hours,
            "source": f"timed step here ({per_step * 1000:.0f} ms x {steps} x epochs)",
        }
    return out


def _pilot_table(hyp: Hypothesis, out_dir: Path, pilot: Path | None):
    from analysis.table import load_table

    if pilot is not None:
        return load_table(pilot), str(pilot)
    own = Path(out_dir) / "studies" / hyp.name / "table.parquet"
    return (load_table(own), str(own)) if own.is_file() else (None, None)


def plan_claims(hyp: Hypothesis, table, source: str = "pilot") -> list[dict]:
    """One plan row per claim (``analysis.power.plan_claim`` plus the claim's name, kind and level)."""
    view = TableView.of(table) if table is not None else None
    level = families(hyp).first_step_levels
    rows = []
    for i, claim in enumerate(hyp.claims):
        kind = get_kind(claim.kind)
        outcome = kind.evaluate(view, claim, f"{source}: claims[{i}]", {}) if view is not None else None
        values = np.asarray(outcome.effect_values if outcome else [], dtype=np.float64)
        effect, effect_from = kind.planning_effect(claim), "declared"
        shown = effect
        if effect is None and outcome is not None and values.size >= 2:
            effect, effect_from = float(outcome.std_effect * values.std(ddof=1)), "pilot"
            # printed with the verdict's sign: a u_shape's verdict effect is minus its contrast (a dip < 0)
            shown = -effect if outcome.effect * effect < 0 else effect
        row = plan_claim(
            effect,
            values,
            level[i],
            len(hyp.design.seeds),
            two_sided=bool(outcome and outcome.two_sided),
            labellings=kind.labellings_per_seed(claim),
            contrasts=kind.holm_contrasts(claim),
        )
        rows.append(
            {"claim": claim.name, "kind": claim.kind, "effect": effect, "effect_from": effect_from}
            | {"effect_shown": shown}
            | {"alpha": level[i], **row}
        )
    return rows


def plan_study(
    hyp: Hypothesis,
    out_dir: Path,
    pilot: Path | None = None,
    time_step: Callable[[dict], float] | None = None,
    time_extract: Callable[[dict], float] | None = None,
) -> dict:
    """The whole plan: claims, per-run hours per dataset (training, plus extraction when ``time_extract``
    times it), and run-hours per seed of the design."""
    table, source = _pilot_table(hyp, out_dir, pilot)
    specs = plan_runs(hyp)
    hours = run_hours(specs, Path(out_dir) / "runs", time_step, time_extract)
    per_seed = (
        None if any(h["hours"] is None for h in hours.values()) else sum(h["hours"] for h in hours.values())
    )
    claims = plan_claims(hyp, table, source or "pilot")
    for row in claims:
        for key in ("seeds_80", "seeds_90", "seeds_80_upper", "seeds_90_upper"):
            row[f"run_hours_{key.removeprefix('seeds_')}"] = (
                None if per_seed is None or row[key] is None else row[key] * per_seed
            )
    cells = [c for c in hyp.design.cells() if c.name is not None]
    return {
        "hypothesis": hyp.name,
        "cells": len(cells),
        "trained_cells": sum(1 for c in cells if not c.untrained),
        "runs": len(specs),
        "run_hours": None if per_seed is None else per_seed * len(hyp.design.seeds),
        "file_seeds": len(hyp.design.seeds),
        "pilot": source,
        "run_hours_per_seed": per_seed,
        "per_run": hours,
        "claims": claims,
        "gpu_estimate": gpu_estimate(specs),
    }


def format_plan(plan: dict) -> str:
    """The plan as a text table, one line per claim, then the cost basis and the seed floors."""
    head: tuple[str, ...] = (
        "claim",
        "effect",
        "sd (80% bound)",
        "alpha",
        "80%: seeds (bound)",
        "90%: seeds (bound)",
    )
    head += (f"power @{plan['file_seeds']}", "run-h 80% (bound)")

    def seeds(row, k):
        a, b = row[f"seeds_{k}"], row[f"seeds_{k}_upper"]
        return f"{_seeds_cell(a, row['d'])} ({_seeds_cell(b, row['d_upper'])})"

    def hours(row):  # ?: no run time known for the design; n/a: no seeds to multiply it by
        a, b = row["run_hours_80"], row["run_hours_80_upper"]
        na, nb = ("?" if row[k] is not None else "n/a" for k in ("seeds_80", "seeds_80_upper"))
        return f"{fmt_num(a, 2) if a is not None else na} ({fmt_num(b, 2) if b is not None else nb})"

    rows: list[tuple[str, ...]] = [head]
    for r in plan["claims"]:
        shown = r.get("effect_shown", r["effect"])  # the verdict's sign (plans written before: the effect)
        effect = "-" if r["effect"] is None else f"{fmt_num(shown, 3)} ({r['effect_from']})"
        sd = f"{fmt_num(r['sd'], 3)} ({fmt_num(r['sd_upper80'], 3)}), n={r['n_pilot']}"
        rows.append(
            (r["claim"], effect, sd, f"{r['alpha']:.3g}", seeds(r, 80), seeds(r, 90))
            + (fmt_num(r["power_file"], 2), hours(r))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(f"pilot: {plan['pilot'] or 'none (give --pilot TABLE for the per-seed SD)'}")
    if plan.get("cells"):
        total = "?" if plan["run_hours"] is None else fmt_num(plan["run_hours"], 3)
        lines.append(
            f"design: {plan['cells']} cell(s) ({plan['trained_cells']} trained), {plan['runs']} runs, "
            f"{total} run-hours at the file's {plan['file_seeds']} seeds"
        )
    for name, h in plan["per_run"].items():
        lines.append(f"run time {name}: {fmt_hours(h['hours'])} ({h['source']})")
    if plan.get("gpu_estimate"):
        lines.append(format_estimate(plan["gpu_estimate"]))
    for r in plan["claims"]:
        if r["floor"] > plan["file_seeds"]:
            lines.append(
                f"! {r['claim']}: its randomisation test cannot accept at any effect with fewer than {r['floor']} "
                f"seeds (p >= labellings^-S); the file plans {plan['file_seeds']}"
            )
        if r["effect"] is None:
            lines.append(f"! {r['claim']}: no smallest effect of interest (declare sesoi, or give a pilot)")
        elif (why := _no_seeds_reason(r)) is not None:
            lines.append(f"! {r['claim']}: {why}")
    return "\n".join(lines)


def _seeds_cell(n: int | None, d: float) -> str:
    """A seeds cell: the number, ``>MAX_SEEDS`` when the power is reached beyond the plan's count (a
    positive effect too small), or ``n/a`` (no effect, no SD, or an effect against the claim: said below)."""
    if n is not None:
        return str(n)
    return f">{MAX_SEEDS}" if math.isfinite(d) and d > 0 else "n/a"


def _no_seeds_reason(row: dict) -> str | None:
    """Why a claim with an effect has no seeds for 80% power (None: it has them)."""
    if row["seeds_80"] is not None:
        return None
    d = row["d"]
    if not math.isfinite(row["sd"]):
        return f"seeds n/a: no per-seed SD (a pilot of >= 2 seeds gives it; this one has {row['n_pilot']})"
    if row["sd"] == 0:
        return "seeds n/a: the pilot's per-seed values do not vary (SD 0)"
    if not (math.isfinite(d) and d > 0):
        return f"seeds n/a: the effect points away from the claim (d = {fmt_num(d, 3)}): no number of seeds"
    return (
        f"80% power needs more than {MAX_SEEDS} seeds at d = {fmt_num(d, 3)} (effect / per-seed SD); the "
        f"plan counts up to {MAX_SEEDS}"
    )


def _timed_step(run: dict) -> float:
    def measure() -> float:
        from runners.timing import time_training_step  # torch only when neither runs nor the cache have it

        return time_training_step(run)

    return _timed_here("step", run, measure)


def _timed_extract(run: dict) -> float:
    def measure() -> float:
        from runners.timing import time_extraction

        return time_extraction(run)

    return _timed_here("extract", run, measure)


TIMINGS = "timings.json"  # in runners.model_table.cache_dir(), beside timm's model table


def _timed_here(what: str, run: dict, measure: Callable[[], float]) -> float:
    """``measure()``'s seconds for this run on this machine, timed once and kept in the user cache
    (``$XDG_CACHE_HOME/vitstudy/timings.json``): keyed by the run without its seed (seeds time alike) and
    by the host, its CPU count and the installed torch and timm, so another machine or another torch
    times again. A cache that cannot be read or written is timed around, never an error."""
    import os
    import platform
    from importlib import metadata

    from runners.model_table import cache_dir, timm_version
    from vitstudy_core.hashing import digest
    from vitstudy_core.io import atomic_write_json

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    here = [platform.node(), os.cpu_count(), torch_version, timm_version()]
    key = digest({"what": what, "run": {k: v for k, v in run.items() if k != "seed"}, "here": here}, 16)
    path = cache_dir() / TIMINGS
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    seconds = cached.get(key)
    if isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0:
        return float(seconds)
    seconds = float(measure())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**cached, key: seconds})
    except OSError:
        pass
    return seconds
