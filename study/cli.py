"""``python -m study VERB ...``: run, validate and analyze hypothesis files.

    python -m study validate hypotheses/u_shape.yaml
    python -m study run hypotheses/u_shape.yaml [--out study_results] [--workers auto] [--force]
    python -m study analyze hypotheses/u_shape.yaml --table study_results/studies/u_shape/table.parquet [--json]
    python -m study report study_results/studies/u_shape   (or the hypothesis file) [--out study_results]
    python -m study ui [--out study_results] [--port 5000]
    python -m study metrics SPECTRUM.npy      # every eigenvalue metric of a saved spectrum, as JSON
    python -m study table hypotheses/u_shape.yaml --out study_results [--to PATH]   # rebuild the tidy table
    python -m study doctor [--out study_results] [--repair]   # check the output folder and its store

Bad input prints one line (file, field, what was expected) to stderr and exits with status 2; so does a
write that fails (disk full, read-only folder), naming the path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.errors import StudyError
from core.io import WRITE_ERRNOS


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``error: run: the following arguments ...``."""

    def error(self, message: str):
        where = self.prog.removeprefix("python -m study").strip()
        print(f"error: {where + ': ' if where else ''}{' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m study", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)

    v = sub.add_parser("validate", help="check a hypothesis file without running anything")
    v.add_argument("hypothesis", type=Path)
    v.add_argument("--out", type=Path, default=Path("study_results"), help="where `run` would write")

    r = sub.add_parser("run", help="train the runs a hypothesis needs and test its claims")
    r.add_argument("hypothesis", type=Path)
    r.add_argument(
        "--out", type=Path, default=Path("study_results"), help="output folder (default: study_results)"
    )
    r.add_argument("--workers", default="auto", help="parallel training processes ('auto': one per CPU core)")
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

    a = sub.add_parser("analyze", help="re-test a hypothesis's claims on a saved tidy table (no training)")
    a.add_argument("hypothesis", type=Path)
    a.add_argument("--table", type=Path, required=True, help="tidy table (.parquet or .csv)")
    a.add_argument("--json", action="store_true", help="print the verdicts as JSON")

    # ---- observatory verbs: score spectra / rebuild tables from saved runs (no model needed) -----------
    mt = sub.add_parser("metrics", help="print every eigenvalue metric of a saved spectrum (.npy) as JSON")
    mt.add_argument("spectrum", type=Path, help="a .npy file holding a 1-D vector of eigenvalues")
    tb = sub.add_parser("table", help="rebuild the tidy table from the saved spectra of a hypothesis's runs")
    tb.add_argument("hypothesis", type=Path)
    tb.add_argument("--out", type=Path, default=Path("study_results"), help="the folder `run` wrote to")
    tb.add_argument(
        "--to", type=Path, default=None, help="table path (default: OUT/studies/NAME/table.parquet)"
    )
    _add_results_verbs(sub)
    return p


# ---- results people can look at: report and ui ---------------------------------------------------------
def _add_results_verbs(sub) -> None:
    rp = sub.add_parser("report", help="write report.html and report.md for a finished study")
    rp.add_argument("study", type=Path, help="a study folder (<out>/studies/<name>) or its hypothesis file")
    rp.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    u = sub.add_parser("ui", help="start the MLflow UI on the study store (127.0.0.1)")
    u.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    u.add_argument("--port", type=int, default=5000)
    d = sub.add_parser("doctor", help="check an output folder and its MLflow store (and repair)")
    d.add_argument("--out", type=Path, default=Path("study_results"), help="output folder of `run`")
    d.add_argument("--repair", action="store_true", help="repair what can be repaired")
    d.add_argument("--verbose", action="store_true", help="let MLflow's and alembic's log lines through")


def _results_verbs(args) -> int | None:
    """Run ``report`` / ``ui``; None for any other verb."""
    if args.verb == "report":
        from analysis.report import read_study, write_report
        from study.schema import load_hypothesis

        study_dir = args.study
        if study_dir.is_file():
            study_dir = args.out / "studies" / load_hypothesis(study_dir).name
        if not (study_dir / "verdicts.json").is_file():
            raise StudyError(
                "expected a study folder with verdicts.json (run the study first)", str(study_dir)
            )
        try:  # the study's own copy of its file gives the typed claims; the report goes on without it
            hyp = load_hypothesis(study_dir / "hypothesis.yaml")
            title, description, claims = hyp.name, hyp.description.strip(), list(hyp.claims)
        except StudyError:
            title, description, claims = study_dir.name, "", None
        inp = read_study(study_dir, title, description, claims)
        html_path, md_path = write_report(study_dir, inp)
        print(f"report: {html_path}\nsummary: {md_path}")
        return 0
    if args.verb == "ui":
        from study.tracking import default_tracking_uri

        uri = default_tracking_uri(args.out)
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise StudyError("no MLflow store here (run a study first)", uri.removeprefix("sqlite:///"))
        cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
        cmd += ["--host", "127.0.0.1", "--port", str(args.port)]
        print("starting: mlflow " + " ".join(cmd[3:]), flush=True)
        return _serve(cmd)
    if args.verb == "doctor":
        from study.doctor import doctor

        return doctor(args.out, repair=args.repair)
    return None


def _serve(cmd: list[str]) -> int:
    """Run the MLflow server in its own process group; SIGTERM/SIGINT here stop the whole group (the
    server and its workers), so none outlives this process."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, start_new_session=True)

    def forward(signum, frame) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        try:  # workers that outlive the server (it exited on its own) go with it
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return code


def _metrics_verb(path: Path) -> int:
    from analysis.spectral import compute_metrics, load_spectrum

    values = compute_metrics(load_spectrum(path))
    print(json.dumps({k: (float(v) if v == v else None) for k, v in values.items()}, indent=1))
    return 0


def _table_verb(args: argparse.Namespace) -> int:
    from analysis.table import save_table
    from study.schema import load_hypothesis
    from study.stages import collect_table, plan

    hyp = load_hypothesis(args.hypothesis)
    collected = collect_table(plan(hyp), args.out / "runs", hyp.design.layers)
    if not collected.rows:
        raise StudyError(
            f"no finished run of this hypothesis under {args.out / 'runs'} (run `python -m study run` first)",
            str(args.hypothesis),
        )
    to = args.to or args.out / "studies" / hyp.name / "table.parquet"
    save_table(collected.table, to)
    print(f"table: {to} ({len(collected.table)} rows from {len(collected.rows)} run(s))")
    if collected.missing:
        print(f"missing (not finished): {', '.join(s.label for s in collected.missing)}", file=sys.stderr)
    return 0


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise StudyError(f"--workers: expected 'auto' or a positive integer, got {value!r}")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from core.faults import check_env

        check_env()
        if getattr(args, "verbose", False):
            import study.tracking

            study.tracking.VERBOSE = True
        return _verbs(args, argv)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"error: {exc.filename or '?'}: cannot write ({exc.strerror})", file=sys.stderr)
        return 2


def _verbs(args: argparse.Namespace, argv: list[str] | None) -> int:
    done = _results_verbs(args)
    if done is not None:
        return done
    if args.verb == "metrics":
        return _metrics_verb(args.spectrum)
    if args.verb == "table":
        return _table_verb(args)
    from study.schema import load_hypothesis

    hyp = load_hypothesis(args.hypothesis)
    if args.verb == "validate":
        from study.planner import plan_runs
        from study.preflight import check_hypothesis

        check_hypothesis(hyp, str(args.hypothesis), args.out)
        print(f"ok: {args.hypothesis}: {len(hyp.claims)} claim(s), {len(plan_runs(hyp))} run(s) planned")
        return 0
    if args.verb == "analyze":
        from analysis.table import load_table
        from analysis.verdicts import evaluate_claims, format_verdicts

        table = load_table(args.table)
        results = evaluate_claims(hyp, table, source=str(args.hypothesis))
        if args.json:
            print(json.dumps([r.to_dict() for r in results], indent=1, default=float))
        else:
            print(format_verdicts(results))
        return 0
    if args.verb == "run":
        return _run_verb(args, hyp, argv)
    return 1


def _run_verb(args: argparse.Namespace, hyp, argv: list[str] | None) -> int:
    from analysis.verdicts import format_verdicts
    from study.orchestrate import run_study
    from study.schema import with_data_roots

    roots = dict(r.partition("=")[::2] for r in args.data_root)
    if any(not k or not v for k, v in roots.items()) or len(roots) != len(args.data_root):
        raise StudyError(f"--data-root: expected NAME=PATH, got {args.data_root}")
    hyp = with_data_roots(hyp, roots, str(args.hypothesis)) if roots else hyp

    outcome = run_study(
        hyp,
        args.hypothesis,
        args.out,
        workers=_workers(args.workers),
        force=args.force,
        track=not args.no_mlflow,
        log_model=args.log_model,
        report=not args.no_report,
        command=" ".join(["python -m study", *(argv if argv is not None else sys.argv[1:])]),
    )
    print()
    print(format_verdicts(outcome.results))
    print(f"\nresults: {outcome.study_dir}/ (table.parquet, verdicts.json)")
    if outcome.report:
        print(f"report:  {outcome.report}")
    if not args.no_mlflow:
        from study.tracking import default_tracking_uri

        print(f"mlflow:  mlflow ui --backend-store-uri {default_tracking_uri(args.out)}")
    return 0
