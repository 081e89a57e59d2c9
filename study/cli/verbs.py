"""``python -m study VERB ...``: run, validate and analyze hypothesis files.

    python -m study validate hypotheses/u_shape.yaml
    python -m study run hypotheses/u_shape.yaml [--out study_results] [--workers auto] [--force]
        [--until-decided [--max-seeds N] [--batch K] [--spending obf|pocock]]
    python -m study plan hypotheses/u_shape.yaml [--pilot TABLE] [--json]   # seeds and run-hours needed
    python -m study analyze hypotheses/u_shape.yaml --table study_results/studies/u_shape/table.parquet [--json]
    python -m study report study_results/studies/u_shape   (or the hypothesis file) [--out study_results]
    python -m study ui [--out study_results] [--port 5000] [--study NAME] [--no-browser]
    python -m study metrics SPECTRUM.npy      # every eigenvalue metric of a saved spectrum, as JSON
    python -m study metrics RUN/spectra.npz   # ... of each spectrum a run saved (<epoch>/<layer>/<token set>)
    python -m study table hypotheses/u_shape.yaml --out study_results [--to PATH]   # rebuild the tidy table
    python -m study sweep hypotheses/complexity_sweep.yaml [--n-trials N] [--storage URL] [--workers N]
    python -m study run FILE --executor ray --address HOST:6379 --out /shared/results --leases postgresql://...
    python -m study submit FILE --address http://HEAD:8265 --out /shared/results   # a Ray job on the cluster
    python -m study status [--out OUT | --leases URL] [--address http://HEAD:8265]
    python -m study doctor [--out study_results] [--repair]   # check the output folder and its store

``--leases`` / ``--storage`` default to ``$STUDY_LEASES`` / ``$STUDY_STORAGE`` (the flag wins): a database
URL with a password belongs there (or the password in ``~/.pgpass``), not on a command line, which ``ps``
shows every user of the host.

Bad input prints one line (file, field, what was expected) to stderr and exits with status 2; so does a
write that fails (disk full, read-only folder) or a lost tracking store, naming the path. Ctrl-C or
SIGTERM prints one line and exits with status 130 or 143 (128 + the signal); rerunning resumes.

The argument parser is in ``study.cli._parser``; this module runs the verbs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from study.cli._parser import _parser, verb_of
from vitstudy_core.errors import Interrupted, StudyError
from vitstudy_core.io import WRITE_ERRNOS
from vitstudy_core.redact import redact


def _url_options(args: argparse.Namespace) -> dict[str, str]:
    """``--leases`` / ``--storage`` of the verbs that take them, from ``STUDY_LEASES`` / ``STUDY_STORAGE``
    when the flag is not given (``study.cluster.jobs.url_option``), set on ``args``. Returns flag -> the name
    an error calls the value by: the flag, or the variable it came from."""
    from study.cluster.jobs import URL_VARIABLES, url_option

    names = dict(zip(URL_VARIABLES, URL_VARIABLES, strict=True))
    for flag in URL_VARIABLES:
        attr = flag.removeprefix("--")
        if hasattr(args, attr):
            value, names[flag] = url_option(flag, getattr(args, attr))
            setattr(args, attr, value)
    return names


def _scale_verbs(args, names: dict[str, str]) -> int | None:
    """Run ``submit`` / ``status``; None for any other verb."""
    if args.verb == "submit":
        from study.cluster.jobs import SubmitOptions

        opts = SubmitOptions(
            args.leases,
            args.storage,
            args.cpus_per_run,
            args.gpus_per_run,
            tuple(args.data_root),
            args.force,
            args.n_trials,
            args.no_mlflow,
            args.no_report,
            args.ship_code,
        )
        from study.cluster.executor_flags import submit_driver

        print(submit_driver(args, opts))
        return 0
    if args.verb == "status":
        from study.cluster.jobs import format_status, ray_jobs

        here = args.out.is_dir()
        if not args.leases and not (args.address and not here):  # --address alone: the cluster's jobs
            existing_out(args.out)  # file leases are read from --out: a mistyped path is no empty store
            print(format_status(args.out / "leases", names["--leases"]))
        elif args.leases:
            print(format_status(args.leases, names["--leases"]))
        if args.address:
            print(ray_jobs(args.address))
        from runners.executors.slurm import job_table

        slurm = job_table(args.out / "slurm") if here else None  # runs submitted with --executor slurm
        if slurm:
            print(slurm)
        return 0
    return None


def existing_out(out: Path, option: str = "--out") -> Path:
    """The output folder a verb reads (``status``, ``doctor``, ``ui``, ``table``, ``report``): it must
    exist; a mistyped path is one line and exit 2, and nothing is created there.

    Raises:
        StudyError: ``out`` is not a folder.
    """
    if not Path(out).is_dir():
        what = "is a file" if Path(out).exists() else "no such folder"
        raise StudyError(f"{what}: expected the output folder of `python -m study run`", str(out), option)
    return Path(out)


def _results_verbs(args) -> int | None:
    """Run ``report`` / ``ui``; None for any other verb."""
    if args.verb == "report":
        from study import api

        if Path(args.study).is_file():  # a hypothesis file: its study folder is looked up under --out
            existing_out(args.out)
        html_path, md_path = api.report(args.study, args.out)
        print(f"report: {html_path}\nsummary: {md_path}")
        return 0
    if args.verb == "ui":
        return _ui_verb(args)
    if args.verb == "doctor":
        from study.doctor import doctor

        return doctor(existing_out(args.out), repair=args.repair)
    return None


def _ui_verb(args) -> int:
    """Start the MLflow server on the study store; print (and open) the study's runs table once it is up."""
    from study.tracking.store import default_tracking_uri
    from study.tracking.ui import announce_when_up, ui_plan

    if default_tracking_uri(args.out).startswith("sqlite:///"):  # the folder's own store (no server)
        existing_out(args.out)
    plan = ui_plan(args.out, args.port, args.study)
    if plan.cmd:
        print("starting: mlflow " + " ".join(plan.cmd[3:]), flush=True)
    for name, url in plan.experiments:
        print(f"runs of {name}: {redact(url)}", flush=True)
    if not plan.cmd:  # a tracking server: its own UI, nothing to start here
        import webbrowser

        from study.tracking.ui import can_open_browser

        opened = not args.no_browser and can_open_browser() and webbrowser.open(plan.url)
        print(
            f"the tracking store is a server: {'opened' if opened else 'open'} {redact(plan.url)}", flush=True
        )
        return 0
    return _serve(
        plan.cmd,
        env=plan.env,
        on_start=lambda alive: announce_when_up(plan, alive, not args.no_browser, _flushed_print),
    )


def _flushed_print(line: str) -> None:
    print(line, flush=True)


def _serve(cmd: list[str], env: dict[str, str] | None = None, on_start=None) -> int:
    """Run the MLflow server in its own process group; SIGTERM/SIGINT here stop the whole group (the
    server and its workers), so none outlives this process. ``env``: variables added for the server;
    ``on_start(alive)``: called in a thread once it is started (``alive()``: the server still runs)."""
    import os
    import signal
    import subprocess
    import threading

    proc = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, **(env or {})})
    if on_start is not None:
        threading.Thread(target=on_start, args=(lambda: proc.poll() is None,), daemon=True).start()

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
    from analysis.spectral import spectra_metrics_json

    print(json.dumps(spectra_metrics_json(path), indent=1, allow_nan=False))
    return 0


def _table_verb(args: argparse.Namespace) -> int:
    from analysis.table import save_table
    from study.pipeline.tables import collect_table
    from study.pipeline.triage import plan
    from study.runspecs import unknown_fingerprints
    from study.schema import load_hypothesis

    hyp = load_hypothesis(args.hypothesis)
    existing_out(args.out)
    specs = plan(hyp, args.out / "data")  # recorded fingerprints: the data need not be on this host
    unknown = unknown_fingerprints(specs)
    if unknown:
        raise StudyError(
            f"dataset {', '.join(unknown)}: no fingerprint recorded in {args.out / 'data' / 'fingerprints.json'} "
            "and the folder is not here, so its run keys are unknown (give the `run` output folder as --out)",
            str(args.hypothesis),
        )
    collected = collect_table(specs, args.out / "runs", hyp.design.layers)
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


def _sweep_verb(args: argparse.Namespace, hyp, argv, names: dict[str, str]) -> int:
    from analysis.verdicts import format_verdicts
    from study.sweep.loop import run_sweep

    if hyp.sweep is None:
        raise StudyError(
            "no sweep section (expected sweep: {dataset, space, sampler, objective})",
            str(args.hypothesis),
            "sweep",
        )
    if args.n_trials is not None and args.n_trials < 1:
        raise StudyError(f"--n-trials: expected a positive integer, got {args.n_trials}")
    from study.cluster.jobs import check_reachable
    from study.sweep.loop import SweepOptions
    from study.sweep.storage import storage_url
    from study.sweep.storage_check import check_storage

    sweep = SweepOptions(n_trials=args.n_trials, storage=args.storage, storage_from=names["--storage"])
    opts = _run_options(args, argv, names)
    url, where = storage_url(hyp, args.storage), (names["--leases"], names["--storage"])
    check_reachable(opts.placement, None, names=where)  # before anything is written
    check_storage(url, str(args.hypothesis), names["--storage"] if args.storage else None)
    outcome = run_sweep(hyp, args.hypothesis, args.out, opts, sweep)
    print()
    print(format_verdicts(outcome.results))
    print(f"\nresults: {outcome.sweep_dir}/ (trials.csv, table.parquet, verdicts.json)")
    if outcome.report:
        print(f"report:  {outcome.report}")
    return 0


def _command(argv: list[str] | None, args: argparse.Namespace, names: dict[str, str]) -> str:
    """The command line recorded with a study (MLflow, the report), led by ``STUDY_LEASES=URL`` (and
    ``STUDY_STORAGE``) when the URL came from the variable; the caller redacts it."""
    import shlex

    env = [f"{var}={shlex.quote(getattr(args, f[2:]))}" for f, var in names.items() if var != f]
    return " ".join([*env, "python -m study", *(argv if argv is not None else sys.argv[1:])])


def _run_options(args: argparse.Namespace, argv: list[str] | None, names: dict[str, str]):
    """``sweep``'s flags as ``stages.RunOptions`` (no ``--force`` or ``--log-model``); ``run``'s go to
    ``study.api.run`` as keyword arguments."""
    from study.api import _workers
    from study.pipeline.stages import Placement, RunOptions

    workers = _workers(args.workers)
    if args.cpus_per_run <= 0 or args.gpus_per_run < 0:
        raise StudyError("--cpus-per-run / --gpus-per-run: expected CPUs > 0 and GPUs >= 0")
    from study.cluster.executor_flags import executor_flags

    placement = Placement(
        args.executor,
        args.address,
        args.cpus_per_run,
        args.gpus_per_run,
        args.leases,
        tuple(executor_flags(args).items()),
    )
    return RunOptions(
        workers=workers,
        track=not args.no_mlflow,
        report=not args.no_report,
        command=redact(_command(argv, args, names)),  # no password of a --leases/--storage URL
        placement=placement,
    )


def _analyze_verb(args: argparse.Namespace) -> int:
    from study import api

    verdicts = api.analyze(args.hypothesis, args.table)
    if args.json:
        print(json.dumps(verdicts.to_dicts(), indent=1, default=float))
    else:
        print(str(verdicts) + (f"\n{verdicts.note}" if verdicts.note else ""))
    return 0


def _run_verb(args: argparse.Namespace, argv, names: dict[str, str]) -> int:
    from analysis.verdicts import format_verdicts
    from study import api
    from study.cluster.executor_flags import executor_flags
    from study.cluster.jobs import check_database

    if names["--leases"] != "--leases":  # from STUDY_LEASES: its one line names the variable
        check_database(names["--leases"], args.leases)

    result = api.run(
        args.hypothesis,
        args.out,
        workers=args.workers,
        force=args.force,
        track=not args.no_mlflow,
        log_model=args.log_model,
        report=not args.no_report,
        data_roots=args.data_root,
        new_registration=args.new_registration,
        until_decided=args.until_decided,
        max_seeds=args.max_seeds,
        batch=args.batch,
        spending=args.spending,
        executor=args.executor,
        address=args.address,
        cpus_per_run=args.cpus_per_run,
        gpus_per_run=args.gpus_per_run,
        leases=args.leases,
        executor_options=executor_flags(args),
        log=print,
        command=redact(_command(argv, args, names)),  # recorded in MLflow, verdicts.json and the report
    )
    print()
    print(format_verdicts(result.results))
    if result.sequential:
        seq = result.sequential
        print(f"\n{len(seq['looks'])} looks; stopped at {seq['stopped_at']} seeds: {seq['stopped_because']}")
    print(f"\nresults: {result.folder}/ (table.parquet, verdicts.json, registration.json)")
    if result.report_path:
        print(f"report:  {result.report_path}")
    if not args.no_mlflow:
        from study.tracking.store import default_tracking_uri
        from study.tracking.ui import store_hint

        print(f"mlflow:  {store_hint(default_tracking_uri(args.out))}")
    return _failed_exit(result.outcome.failed if result.outcome else {}, args.allow_failed_runs)


def _failed_exit(failed: dict[str, str], allowed: bool) -> int:
    """0, or 1 with one line when runs failed (their seeds are missing from the verdicts) and
    ``--allow-failed-runs`` was not given."""
    if not failed or allowed:
        return 0
    first = next(iter(failed.values())).splitlines()[0] if failed else ""
    print(
        f"error: {len(failed)} run(s) failed, so their seeds are left out of the verdicts (first: {redact(first)}); "
        "rerun to retry them (finished runs are reused), or pass --allow-failed-runs to accept fewer seeds",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    # only the named verb's options are built (the others' would import the executors for nothing)
    args = _parser(verb_of(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    try:
        from vitstudy_core.faults import check_env

        check_env()
        if getattr(args, "verbose", False):
            import study.tracking.tracker

            study.tracking.tracker.VERBOSE = True
        return _verbs(args, argv)
    except StudyError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except (
        KeyboardInterrupt
    ) as exc:  # Ctrl-C or SIGTERM (study.pipeline.stopping): one line, 128 + the signal
        stop = exc if isinstance(exc, Interrupted) else Interrupted()
        print(stop.line(), file=sys.stderr)
        return stop.exit_code
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"error: {exc.filename or '?'}: cannot write ({exc.strerror})", file=sys.stderr)
        return 2


def _verbs(args: argparse.Namespace, argv: list[str] | None) -> int:
    names = _url_options(args)
    done = next((d for d in (_results_verbs(args), _scale_verbs(args, names)) if d is not None), None)
    if done is not None:
        return done
    if args.verb == "metrics":
        return _metrics_verb(args.spectrum)
    if args.verb == "plugins":
        from study.plugins import plugins_verb

        return plugins_verb(args.json)
    if args.verb == "table":
        return _table_verb(args)
    if args.verb in ("plan", "validate", "analyze", "run"):
        return _api_verbs(args, argv, names)
    if args.verb == "sweep":
        from study.schema import load_hypothesis

        return _sweep_verb(args, load_hypothesis(args.hypothesis), argv, names)
    return 1


def _api_verbs(args: argparse.Namespace, argv: list[str] | None, names: dict[str, str]) -> int:
    """``plan``, ``validate``, ``analyze`` and ``run``: the ``study.api`` function, then its output printed."""
    from study import api

    if args.verb == "plan":
        plan = api.plan(args.hypothesis, args.out, args.pilot)
        print(plan.to_json() if args.json else str(plan))
        return 0
    if args.verb == "validate":
        checked = api.validate(args.hypothesis, args.out)
        print(checked.message)
        for line in checked.warnings:
            print(f"warning: {checked.file}: {line}", file=sys.stderr)
        return 0
    if args.verb == "analyze":
        return _analyze_verb(args)
    return _run_verb(args, argv, names)
