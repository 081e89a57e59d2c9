"""Wall time of the verbs a researcher types all day, each beside ``python -c "import pandas"``.

    PYTHONPATH=. python bench/cli.py [--out study_results] [--hypothesis hypotheses/u_shape.yaml] [--repeat 5]

Every command runs ``--repeat`` times, each in a fresh process, the commands interleaved round by round
(so a change in the machine's load falls on all of them alike), after one untimed round that fills the
caches a first call fills (the timm model table, ``__pycache__``: the commands run without
``PYTHONDONTWRITEBYTECODE``, see :data:`ENV`). The baseline, ``python -c "import
pandas"``, is measured in the same rounds: the ratio to it says how a verb compares with the cheapest
thing a Python data tool does, on any machine. Prints one markdown table: the median and the fastest wall
time in seconds, the ratio of the median to the baseline's, and the target on an idle 2-core machine.

``plan``, ``status``, ``table``, ``doctor`` and the rerun read the output folder ``--out``: run the study
once first (``python -m study run HYPOTHESIS --out OUT``); without its finished study, the rows that need
it are left out with a note. The rerun row is ``run`` of a study whose runs are all finished and whose
claims and code are unchanged (``study.rerun``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# seconds on an idle 2-core machine (issue 49)
TARGETS = {"validate": 1.0, "plan": 1.5, "plugins": 1.0, "status": 0.5, "run (rerun, unchanged)": 3.0}
BASELINE = "python -c 'import pandas'"


def commands(hypothesis: Path, out: Path, scratch: Path) -> dict[str, list[str]]:
    """Row name -> argv (after the Python executable)."""
    name = _study_name(hypothesis)
    finished = (out / "studies" / name / "verdicts.json").is_file()
    study = ["-m", "study"]
    rows = {
        BASELINE: ["-c", "import pandas"],
        "validate": [*study, "validate", str(hypothesis)],
        # a claim over checkpoints fits a mixed model even on validate's synthetic table (statsmodels)
        "validate (trend claims)": [*study, "validate", str(ROOT / "hypotheses" / "rank_grows.yaml")],
        "plugins": [*study, "plugins"],
        "metrics": [*study, "metrics", str(scratch / "spectrum.npy")],
    }
    if finished:
        rows |= {
            "plan": [*study, "plan", str(hypothesis), "--out", str(out)],
            "status": [*study, "status", "--out", str(out)],
            "table": [
                *study,
                "table",
                str(hypothesis),
                "--out",
                str(out),
                "--to",
                str(scratch / "t.parquet"),
            ],
            "doctor": [*study, "doctor", "--out", str(out)],
            "run (rerun, unchanged)": [*study, "run", str(hypothesis), "--out", str(out)],
        }
    else:
        print(
            f"note: no finished study {name!r} under {out}: plan, status, table, doctor and the rerun left out"
        )
    return rows


def _study_name(hypothesis: Path) -> str:
    import yaml

    return str(yaml.safe_load(hypothesis.read_text())["name"])


# A user's Python writes each module's bytecode to __pycache__ on its first import and reads it from then
# on; PYTHONDONTWRITEBYTECODE (set on some machines and CI images) keeps it from writing, so that every
# call would compile anew each module edited since the cache was last written (measured: 85 of ours in a
# fresh checkout, about 0.2 s of validate). The commands run without it, so the untimed round fills the
# cache as it would for a user.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=ENV)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return took


def measure(rows: dict[str, list[str]], repeat: int) -> dict[str, list[float]]:
    """Row name -> ``repeat`` wall times (s), after one untimed round."""
    for argv in rows.values():
        _time(argv)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeat):
        for name, argv in rows.items():
            times[name].append(_time(argv))
    return times


def table(times: dict[str, list[float]]) -> str:
    base = statistics.median(times[BASELINE])
    lines = [
        "| command | median (s) | fastest (s) | x baseline | target idle (s) |",
        "|---|---|---|---|---|",
    ]
    for name, ts in times.items():
        target = TARGETS.get(name)
        lines.append(
            f"| {name} | {statistics.median(ts):.2f} | {min(ts):.2f} | {statistics.median(ts) / base:.1f} "
            f"| {'' if target is None else f'{target:g}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hypothesis", type=Path, default=ROOT / "hypotheses" / "u_shape.yaml")
    p.add_argument("--out", type=Path, default=ROOT / "study_results")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "spectrum.npy", np.geomspace(1.0, 1e-3, 64))
        rows = commands(args.hypothesis.resolve(), args.out.resolve(), Path(tmp))
        print(table(measure(rows, args.repeat)))


if __name__ == "__main__":
    main()
