"""The command line's argument parser: every verb of ``python -m study`` and its options (:func:`_parser`);
what each verb does is in ``study.cli.verbs``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``error: run: the following arguments ...``."""

    def error(self, message: str):
        where = self.prog.removeprefix("python -m study").strip()
        print(f"error: {where + ': ' if where else ''}{' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


_STORAGE_HELP = (
    "optuna storage URL (default: $STUDY_STORAGE, else the file's sweep.storage, else a journal file in "
    "the output folder; the flag wins over the variable, which keeps a password off the command line)"
)


DESCRIPTION = (
    "Test hypotheses about the representation geometry of vision transformers: a YAML file declares the "
    "runs and the claims; `run` trains the runs, measures their spectra and prints a verdict per claim. "
    "Start with: python -m study validate FILE, then python -m study run FILE; `python -m study VERB -h` "
    "says more about each verb."
)
EPILOG = (
    "Bad input prints one line (file, field, what was expected) and exits with status 2. --leases and "
    "--storage default to $STUDY_LEASES and $STUDY_STORAGE."
)


def _parser(verb: str | None = None) -> argparse.ArgumentParser:
    """Every verb with its options; given ``verb``, only that verb's options are built.

    The other verbs are still listed, by name and help, so ``-h`` and a wrong verb read as with every
    option built; what is skipped is the option building itself, which for ``run``, ``sweep`` and
    ``submit`` reads the executor registry (and so imports the executors and looks for plug-ins), work
    that ``validate`` or ``status`` would do for nothing.
    """
    p = _Parser(prog="python -m study", description=DESCRIPTION, epilog=EPILOG)
    sub = p.add_subparsers(dest="verb", required=True)
    for name, (text, build) in VERBS.items():
        options = sub.add_parser(name, help=text)
        if verb is None or verb == name:
            build(options)
    return p


def verb_of(argv: list[str]) -> str | None:
    """The verb ``argv`` names (its first word, when that is a verb), else None (``-h``, a typo)."""
    return argv[0] if argv and argv[0] in VERBS else None


def _validate(v: argparse.ArgumentParser) -> None:
    v.add_argument("hypothesis", type=Path)
    v.add_argument("--out", type=Path, default=Path("study_results"), help="where `run` would write")


def _run(r: argparse.ArgumentParser) -> None:
    r.add_argument("hypothesis", type=Path)
    r.add_argument(
        "--out", type=Path, default=Path("study_results"), help="output folder (default: study_results)"
    )
    r.add_argument(
        "--workers",
        default="auto",
        help="parallel training processes ('auto': one per CPU core, or one per visible GPU)",
    )
    r.add_argument("--force", action="store_true", help="retrain runs even if finished results exist")
    r.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    r.add_argument(
        "--data-root",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="folder of the on-disk dataset NAME (overrides its path in the file; repeatable)",
    )
    r.add_argument(
        "--log-model",
        action="store_true",
        help="also log weight files to MLflow (off: ~88 MB per ViT-S seed)",
    )
    r.add_argument("--no-report", action="store_true", help="do not write report.html / report.md")
    r.add_argument("--verbose", action="store_true", help="let MLflow's and alembic's log lines through")
    r.add_argument(
        "--new-registration", metavar="REASON", help="start the study's registration afresh (recorded)"
    )
    _add_sequential_options(r)
    _add_placement(r)


def _plan(pl: argparse.ArgumentParser) -> None:
    pl.add_argument("hypothesis", type=Path)
    pl.add_argument(
        "--pilot", type=Path, default=None, help="tidy table of a pilot (default: the study's own)"
    )
    pl.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")


def _analyze(a: argparse.ArgumentParser) -> None:
    a.add_argument("hypothesis", type=Path)
    a.add_argument("--table", type=Path, required=True, help="tidy table (.parquet or .csv)")
    a.add_argument("--json", action="store_true", help="print the verdicts as JSON")


# ---- observatory verbs: score spectra / rebuild tables from saved runs (no model needed) ---------------
def _metrics(mt: argparse.ArgumentParser) -> None:
    mt.add_argument("spectrum", type=Path, help="a .npy 1-D vector of eigenvalues, or a run's spectra.npz")


def _table(tb: argparse.ArgumentParser) -> None:
    tb.add_argument("hypothesis", type=Path)
    tb.add_argument("--out", type=Path, default=Path("study_results"), help="the folder `run` wrote to")
    tb.add_argument(
        "--to", type=Path, default=None, help="table path (default: OUT/studies/NAME/table.parquet)"
    )


def _sweep(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("hypothesis", type=Path)
    sw.add_argument(
        "--out", type=Path, default=Path("study_results"), help="output folder (default: study_results)"
    )
    sw.add_argument(
        "--n-trials", type=int, default=None, help="trials in all (default: the file's, or the grid)"
    )
    sw.add_argument("--storage", default=None, help=_STORAGE_HELP)
    sw.add_argument(
        "--workers",
        default="auto",
        help="parallel training processes ('auto': one per CPU core, or one per visible GPU)",
    )
    sw.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    sw.add_argument("--no-report", action="store_true", help="do not write report.html / report.md")
    _add_placement(sw)


def _add_sequential_options(r) -> None:
    r.add_argument(  # without it, a run that failed (a seed missing from the verdicts) is exit status 1
        "--allow-failed-runs",
        action="store_true",
        help="exit 0 even when runs failed (their seeds are left out of the verdicts)",
    )
    r.add_argument(
        "--until-decided",
        action="store_true",
        help="add seeds in batches until every confirmatory claim is decided (group-sequential)",
    )
    r.add_argument("--max-seeds", type=int, default=None, help="most seeds (default: twice the file's)")
    r.add_argument("--batch", type=int, default=2, help="seeds added per look (default 2)")
    r.add_argument(
        "--spending",
        choices=("obf", "pocock"),
        default="obf",
        help="alpha spending: O'Brien-Fleming type (default) or Pocock type",
    )


# ---- scale out: where runs execute, submitting to a Ray cluster, what is running ------------------------
def _add_placement(p: argparse.ArgumentParser) -> None:
    from runners.executors.local import EXECUTORS

    kinds = "; ".join(f"{name}: {kind.summary}" for name, kind in EXECUTORS.items())
    p.add_argument(
        "--executor", choices=EXECUTORS.names(), default="local", help=f"where runs train ({kinds})"
    )
    p.add_argument("--address", default="auto", help="Ray cluster address for --executor ray (default: auto)")
    p.add_argument(
        "--cpus-per-run", type=float, default=1, help="CPUs each Ray or Slurm task requests (default 1)"
    )
    p.add_argument(
        "--gpus-per-run", type=float, default=0, help="GPUs each Ray or Slurm task requests (default 0)"
    )
    from study.cluster.executor_flags import add_executor_flags

    add_executor_flags(p)  # each executor's own (local: --gpus, --runs-per-gpu; slurm: --slurm-*)
    p.add_argument(
        "--leases",
        default=None,
        help="run lease store shared by every worker: a database URL (postgresql://...) or a folder "
        "(default: $STUDY_LEASES, else OUT/leases; a sweep with a database --storage uses that database; "
        "the flag wins over the variable, which keeps a password off the command line)",
    )


def _submit(sb: argparse.ArgumentParser) -> None:
    from runners.executors.local import EXECUTORS
    from study.cluster.executor_flags import submit_targets

    sb.add_argument("hypothesis", type=Path, help="the file, on a filesystem every node reaches")
    targets = submit_targets()
    sb.add_argument(
        "--executor",
        choices=targets,
        default=targets[0] if targets else None,
        help="the cluster the driver is submitted to ("
        + "; ".join(f"{n}: {EXECUTORS[n].summary}" for n in targets)
        + f"; default {targets[0] if targets else 'none'})",
    )
    sb.add_argument("--address", default=None, help="the Ray cluster's dashboard, e.g. http://HEAD:8265")
    sb.add_argument("--out", type=Path, default=Path("study_results"), help="shared output folder")
    sb.add_argument(
        "--leases",
        default=None,
        help="run lease store (a postgresql:// URL on a cluster; default: $STUDY_LEASES)",
    )
    sb.add_argument(
        "--storage",
        default=None,
        help="optuna storage URL of a sweep (postgresql://...; default: $STUDY_STORAGE)",
    )
    sb.add_argument("--cpus-per-run", type=float, default=1, help="CPUs each run requests (default 1)")
    sb.add_argument("--gpus-per-run", type=float, default=0, help="GPUs each run requests (default 0)")
    sb.add_argument("--data-root", action="append", default=[], metavar="NAME=PATH", help="as for run")
    sb.add_argument("--force", action="store_true", help="as for run: retrain finished runs")
    sb.add_argument("--n-trials", type=int, default=None, help="as for sweep: trials in all")
    sb.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    sb.add_argument("--no-report", action="store_true", help="do not write report.html / report.md")
    sb.add_argument(
        "--ship-code",
        action="store_true",
        help="send this checkout's code with the job (Ray working_dir), for nodes that lack it",
    )
    from study.cluster.executor_flags import add_executor_flags

    add_executor_flags(sb, submit=True)


def _status(st: argparse.ArgumentParser) -> None:
    st.add_argument("--out", type=Path, default=Path("study_results"), help="output folder (file leases)")
    st.add_argument(
        "--leases", default=None, help="run lease store URL (default: $STUDY_LEASES, else OUT/leases)"
    )
    st.add_argument("--address", default=None, help="also list the Ray jobs of this dashboard address")


# ---- results people can look at: report and ui ---------------------------------------------------------
def _report(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("study", type=Path, help="a study folder (<out>/studies/<name>) or its hypothesis file")
    rp.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")


def _ui(u: argparse.ArgumentParser) -> None:
    u.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    u.add_argument("--port", type=int, default=5000)
    u.add_argument("--study", help="open this study's runs (default: the study logged last)")
    u.add_argument("--no-browser", action="store_true", help="print the address only, open no browser")


def _plugins(pg: argparse.ArgumentParser) -> None:
    pg.add_argument("--json", action="store_true", help="print a JSON mapping instead of a list")


def _doctor(d: argparse.ArgumentParser) -> None:
    d.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    d.add_argument("--repair", action="store_true", help="repair what can be repaired")
    d.add_argument("--verbose", action="store_true", help="let MLflow's and alembic's log lines through")


# verb -> (its line in `python -m study -h`, what adds its options), in the order `-h` lists them
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "validate": ("check a hypothesis file without running anything", _validate),
    "run": ("train the runs a hypothesis needs and test its claims", _run),
    "plan": ("seeds and run-hours each claim needs for 80%%/90%% power (trains nothing)", _plan),
    "sweep": ("run optuna trials over a dataset's knobs and test claims over them", _sweep),
    "analyze": ("re-test a hypothesis's claims on a saved tidy table (no training)", _analyze),
    "metrics": ("eigenvalue metrics of spectra (.npy/.npz) as JSON (null: undefined)", _metrics),
    "table": ("rebuild the tidy table from the saved spectra of a hypothesis's runs", _table),
    "report": ("write report.html and report.md for a finished study", _report),
    "ui": ("start the MLflow UI on the study store (127.0.0.1)", _ui),
    "plugins": ("list every plug-in registry and what is registered in it", _plugins),
    "doctor": ("check an output folder and its MLflow store (and repair)", _doctor),
    "submit": ("start a study or sweep as a Ray or Slurm job on a running cluster", _submit),
    "status": ("studies with their runs done, running and to do", _status),
}
