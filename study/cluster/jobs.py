"""A study on a running Ray cluster: submit it as a Ray job, and see what every study is doing.

    python -m study submit hypotheses/u_shape.yaml --address http://HEAD:8265 --out /shared/results \\
        --leases postgresql://study@db/study
    python -m study status --leases postgresql://study@db/study [--address http://HEAD:8265]

``submit`` starts ``python -m study run|sweep FILE --executor ray --address auto`` as a Ray job
(``ray.job_submission.JobSubmissionClient``): the job's driver runs on the head node, so it keeps running
when the submitting terminal closes. The file and ``--out`` must be paths every node reaches (a shared
filesystem). The job gets this interpreter, the options given here, the database URLs (as the variables
``STUDY_LEASES`` / ``STUDY_STORAGE``, which ``run`` and ``sweep`` read when their flag is not given: no
URL on the job's command line, so none in ``ps`` on the head) and the variables the file references
(``${VAR}``); a value that holds a password travels in a file under ``--out`` (mode 600, deleted as the
job starts), never in what Ray records (:func:`ship_secrets`). ``status`` reads the lease
store (``runners.leases.store``): per study, its runs finished, running (a live lease), stalled (a lease past
its time: a dead worker's run, taken over by the next worker that asks), failed and to do.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from vitstudy_core.errors import StudyError
from vitstudy_core.redact import redact

COLUMNS = ("finished", "running", "stalled", "failed", "todo")


# the variables ``run``, ``sweep``, ``status`` and ``submit`` read a database URL from when its flag is not
# given (the flag wins): a URL on a command line is in ``ps`` and /proc/PID/cmdline for every local user,
# a process's environment only for its own user
URL_VARIABLES = {"--leases": "STUDY_LEASES", "--storage": "STUDY_STORAGE"}
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "STUDY_LEASE_TTL")  # besides the file's own ${VAR}s
CODE_DIGEST_ENV = "STUDY_CODE_DIGEST"  # the submitting host's code; the job's driver checks it has the same
PACKAGES = ("vitstudy_core", "runners", "analysis", "study")


@dataclass(frozen=True)
class SubmitOptions:
    """``submit``'s flags that the job's ``run`` / ``sweep`` receives as they are.

    Attributes:
        leases, storage: the run lease store and a sweep's optuna storage (database URLs). They reach the
            job as ``STUDY_LEASES`` / ``STUDY_STORAGE``, never in its entrypoint (the dashboard and ``ps``
            show it).
        cpus_per_run, gpus_per_run: what each run's Ray task requests.
        data_root: ``NAME=PATH`` folders of on-disk datasets (``run --data-root``).
        force: retrain finished runs (``run --force``). n_trials: a sweep's trials (``sweep --n-trials``).
        no_mlflow, no_report: as for ``run``.
        ship_code: send this checkout's code with the job (Ray ``working_dir``), for nodes without it.
    """

    leases: str | None = None
    storage: str | None = None
    cpus_per_run: float = 1
    gpus_per_run: float = 0
    data_root: tuple[str, ...] = ()
    force: bool = False
    n_trials: int | None = None
    no_mlflow: bool = False
    no_report: bool = False
    ship_code: bool = False


def submit_command(hyp_path: Path, out: Path, opts: SubmitOptions | None = None, sweep: bool = False) -> str:
    """The job's entrypoint (a shell line), with absolute paths (the job runs in another folder, on the
    head node) and this interpreter (the head's ``python`` may be another one). It names no database URL:
    the job's environment holds them (``STUDY_LEASES`` / ``STUDY_STORAGE``, :func:`submit_env`), so the
    driver's command line, which ``ps`` shows every user of the head node, holds no password."""
    opts = opts or SubmitOptions()
    cmd = [sys.executable, "-m", "study", "sweep" if sweep else "run", str(Path(hyp_path).resolve())]
    cmd += ["--executor", "ray", "--address", "auto", "--out", str(Path(out).resolve())]
    cmd += ["--cpus-per-run", str(opts.cpus_per_run), "--gpus-per-run", str(opts.gpus_per_run)]
    cmd += driver_flags(opts, sweep)
    return shlex.join(cmd)


def driver_flags(opts: SubmitOptions, sweep: bool) -> list[str]:
    """The driver's options that every cluster forwards alike: ``--no-mlflow``, ``--no-report``, and
    ``--n-trials`` for a sweep or ``--data-root`` and ``--force`` for a run."""
    cmd = [flag for flag, on in (("--no-mlflow", opts.no_mlflow), ("--no-report", opts.no_report)) if on]
    if sweep and opts.n_trials is not None:
        cmd += ["--n-trials", str(opts.n_trials)]
    if not sweep:
        cmd += [a for root in opts.data_root for a in ("--data-root", root)]
        cmd += ["--force"] if opts.force else []
    return cmd


def submit_env(hyp_text: str, opts: SubmitOptions) -> dict[str, str]:
    """The job's environment variables: the database URLs (:data:`URL_VARIABLES`), ``MLFLOW_TRACKING_URI``
    and ``STUDY_LEASE_TTL`` when set here, every ``${VAR}`` the hypothesis file references (a dataset's
    folder), and this code's digest (the job's driver checks it runs the same code)."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", hyp_text):
        if name in os.environ:
            env[name] = os.environ[name]
    for flag, var in URL_VARIABLES.items():
        if getattr(opts, flag.removeprefix("--")):
            env[var] = getattr(opts, flag.removeprefix("--"))
    env[CODE_DIGEST_ENV] = code_digest()
    return env


def code_digest() -> str:
    """A digest of this checkout's Python code (the four packages), to tell two hosts' code apart."""
    import hashlib

    root, h = Path(__file__).resolve().parents[2], hashlib.sha256()  # study/cluster/jobs.py -> the checkout
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def check_code_digest() -> None:
    """In a submitted job's driver: stop with one line when this host's code is not the submitter's."""
    want = os.environ.get(CODE_DIGEST_ENV)
    if want and want != (have := code_digest()):
        raise StudyError(
            f"host {socket.gethostname()} runs other code (digest {have}) than the host that submitted "
            f"this job ({want}): install the same version on every node, or submit with --ship-code",
            CODE_DIGEST_ENV,
        )


def runtime_env(hyp_text: str, opts: SubmitOptions) -> dict:
    """The job's Ray ``runtime_env``: its variables, this interpreter for the driver and every task
    (``py_executable``: nodes reach it at the same path, a shared or identical venv), and with
    ``ship_code`` this checkout as the ``working_dir`` (uploaded, so nodes need not hold the code)."""
    env: dict = {"env_vars": submit_env(hyp_text, opts), "py_executable": sys.executable}
    if opts.ship_code:
        root = Path(__file__).resolve().parents[2]  # study/cluster/jobs.py -> the checkout
        env["working_dir"] = str(root)
        env["excludes"] = [
            ".git",
            "study_results",
            SECRETS_DIR,
            "*.npy",
            "*.pt",
            "*.npz",
            "*.parquet",
            "mlruns",
        ]
    return env


SECRETS_DIR = (
    ".study-submit"  # under --out: a job's variables that hold a password, mode 600, until it starts
)


def ship_secrets(env: dict, out: Path, job_id: str) -> tuple[dict, str]:
    """Take the variables whose value holds a password (a ``user:PASSWORD@`` URL: :func:`redact` changes
    it) out of a job's ``runtime_env`` variables, which Ray keeps in its GCS and shows on its dashboard,
    into a file only this user can read (mode 600) in the shared ``--out``. Returns the variables left and
    the entrypoint's lead, which exports the file's variables and deletes it before the study starts
    (the job's driver runs on the head node, which mounts ``--out``)."""
    secret = {k: v for k, v in env.items() if redact(str(v)) != str(v)}
    if not secret:
        return env, ""
    folder = Path(out).resolve() / SECRETS_DIR
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{job_id}.env"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(f"export {k}={shlex.quote(str(v))}\n" for k, v in secret.items())
    os.chmod(path, 0o600)  # an existing file keeps its mode under O_CREAT
    quoted = shlex.quote(str(path))
    return {k: v for k, v in env.items() if k not in secret}, f". {quoted} && rm -f {quoted} && "


def submit(hyp_path: Path, address: str, out: Path, opts: SubmitOptions | None = None) -> str:
    """Submit the study (or sweep, when the file has a ``sweep`` section) as a Ray job; returns its id.
    No password reaches Ray: URLs that hold one travel in a file (:func:`ship_secrets`)."""
    from study.schema import load_hypothesis

    opts = opts or SubmitOptions()
    hyp = load_hypothesis(hyp_path)
    sweep = hyp.sweep is not None
    job_id = f"study-{hyp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    env = runtime_env(Path(hyp_path).read_text(encoding="utf-8"), opts)
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise StudyError("submit needs Ray: pip install -e '.[ray]'") from None
    env["env_vars"], lead = ship_secrets(env["env_vars"], out, job_id)
    entrypoint = lead + submit_command(hyp_path, out, opts, sweep)
    job = dict(
        entrypoint=entrypoint,
        submission_id=job_id,
        metadata={"study": hyp.name, "kind": "sweep" if sweep else "run"},
        runtime_env=env,
    )
    try:
        return submit_job(JobSubmissionClient(address), job, address)
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster is one line
        (Path(out).resolve() / SECRETS_DIR / f"{job_id}.env").unlink(missing_ok=True)  # no job will read it
        if isinstance(exc, StudyError):
            raise
        raise StudyError(
            f"--address: cannot submit to the Ray cluster {address!r} ({type(exc).__name__}: {redact(str(exc))})"
        ) from None


# Ray's job server answers ``500: No available agent to submit job`` until the head's job agent has
# registered, seconds (tens of seconds on a loaded host) after ``ray start --head`` returns; the server
# itself waits ~10 s per request, so a retry every few seconds until this bound
AGENT_WAIT_S = 120.0
NO_AGENT = "No available agent"


def submit_ray_driver(
    hyp_path: Path, out: Path, opts: SubmitOptions, options: dict, address: str | None
) -> str:
    """``submit --executor ray`` (``ExecutorKind.submit`` of ``ray``): the study as a Ray job on the
    dashboard at ``address``; returns the lines to print."""
    if not address:
        raise StudyError(
            "submit: --address is required with --executor ray (the dashboard, http://HEAD:8265)"
        )
    job_id = submit(hyp_path, address, out, opts)
    return f"submitted: {job_id}\nfollow:    ray job logs --follow {job_id} --address {address}"


def submit_job(client, job: dict, address: str, wait: float = AGENT_WAIT_S, pause: float = 2.0) -> str:
    """``client.submit_job(**job)``, retried while the cluster's job agent is not ready yet (for at most
    ``wait`` seconds, then one line); any other failure is raised at once. A refused request submitted
    nothing, so the retry cannot start the job twice."""
    deadline, said = time.monotonic() + wait, False
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as exc:
            if NO_AGENT not in str(exc):
                raise
            if not said:
                print(f"waiting for the Ray cluster's job agent (up to {wait:.0f}s)", file=sys.stderr)
                said = True
            if time.monotonic() + pause > deadline:
                raise StudyError(
                    f"--address: the Ray cluster {address!r} has no job agent ready after {wait:.0f}s "
                    "(its dashboard answers, the head's job agent does not: see dashboard_agent.log in "
                    "the head's Ray session logs; two Ray nodes on one host need distinct "
                    "--dashboard-agent-listen-port); submit again once it is up"
                ) from None
        time.sleep(pause)


def url_option(flag: str, given: str | None) -> tuple[str | None, str]:
    """A ``--leases`` / ``--storage`` value: the flag's, else its variable's (:data:`URL_VARIABLES`; unset
    or empty: None), with the name an error about it gives (the flag, or the variable it came from)."""
    if given:
        return given, flag
    var = URL_VARIABLES[flag]
    value = os.environ.get(var, "").strip()
    return (value, var) if value else (None, flag)


def check_reachable(
    placement,
    storage: str | None = None,
    timeout: float = 5.0,
    names: tuple[str, str] = ("--leases", "--storage"),
) -> None:
    """One line (``StudyError``, exit 2) within ``timeout`` seconds when ``--address`` (a ``HOST:PORT``
    or ``ray://HOST:PORT`` cluster) or a ``--leases`` / ``--storage`` database cannot be reached: called
    before anything is written. ``--address auto`` and SQLite files are not checked here. A submitted
    job's driver also checks that it runs the submitter's code (:func:`check_code_digest`). ``names``:
    what the lines call the lease store and the storage (a variable they came from, :func:`url_option`)."""
    check_code_digest()
    _check_executor(placement)
    from runners.executors.local import EXECUTORS

    if EXECUTORS.get(placement.executor).dials_address and placement.address != "auto":
        host, _, port = placement.address.split("://", 1)[-1].rstrip("/").rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
        except (OSError, ValueError) as exc:
            raise StudyError(
                f"--address: cannot reach the Ray cluster {placement.address!r} within {timeout:.0f}s "
                f"({type(exc).__name__}: {exc}); is `ray start --head` running there?"
            ) from None
    for name, url in zip(names, (placement.leases, storage), strict=True):
        check_database(name, url)


def _check_executor(placement) -> None:
    """The executor's own check (``ExecutorKind.check``: Slurm asks its controller, ``sbatch --test-only``)."""
    from runners.executors.local import EXECUTORS, ExecutorOptions

    kind = EXECUTORS.get(placement.executor)
    if kind.check is not None:
        opts = ExecutorOptions(
            address=placement.address,
            cpus_per_run=placement.cpus_per_run,
            gpus_per_run=placement.gpus_per_run,
            options=dict(placement.options),
        )
        kind.check(opts)


def check_database(name: str, url: str | None) -> None:
    """One line naming ``name`` (a flag or a variable) when the database at ``url`` cannot be reached;
    None, folders, ``file://`` and SQLite URLs are not checked."""
    if url and "://" in url and not url.startswith(("file://", "sqlite")):
        _check_database(name, url)


def _check_database(flag: str, url: str) -> None:
    from runners.leases.sql import engine_for

    try:
        with engine_for(url).connect():
            pass
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the same one line
        raise StudyError(f"{flag}: cannot reach the database {redact(url)} ({db_reason(exc)})") from None


def db_reason(exc: BaseException) -> str:
    """``Type: reason`` of a database error in one line: the driver's own message (SQLAlchemy's wrapped
    ``orig``), its first line, without SQLAlchemy's ``(Background on this error at: ...)`` tail."""
    text = str(getattr(exc, "orig", None) or exc)
    lines = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", text).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].strip() if lines else ''}".rstrip(": ")


def status_counts(leases: str | Path, name: str = "--leases") -> dict[str, Counter]:
    """Study name -> counts of its runs by :data:`COLUMNS`, from the lease store (``name``: what an error
    calls it, the flag or the variable it came from)."""
    from runners.leases.members import members
    from runners.leases.store import open_lease_store

    try:
        store = open_lease_store(leases)
        rows, now = store.leases(), store.now()  # a database's leases expire on its own clock
        planned = members(store)  # each study's own runs, shared ones too (runners.leases.members)
    except Exception as exc:  # noqa: BLE001 - an unreachable store is one line
        raise StudyError(
            f"{name}: cannot read the lease store {redact(str(leases))} ({db_reason(exc)})"
        ) from None
    out: dict[str, Counter] = {}
    folders: dict[str, set[str]] = {}
    # a lease from before leases were scoped by folder (``<run key>`` alone) is superseded by a scoped one
    scoped = {(x.study, x.run_key.partition("@")[0]) for x in rows if "@" in x.run_key}
    rows = [x for x in rows if "@" in x.run_key or (x.study, x.run_key) not in scoped]
    # a run counts for the study that leased it and for every study that plans it (a control file's
    # trained cell is the default study's runs): each study by its own runs, not by who trained them
    owners: dict[str, set[str]] = {}
    for lease in rows:
        owners.setdefault(lease.run_key, set()).add(lease.study or "(unnamed)")
    for study, keys in planned.items():
        for key in keys:
            if key in owners:
                owners[key].add(study)
    for lease in rows:
        state = lease.state
        if state == "running" and not lease.live(now):
            state = "stalled"
        scope = lease.run_key.partition("@")[2]  # its output folder (runners.shared_out.lease_key)
        for study in owners[lease.run_key]:
            out.setdefault(study, Counter())[state] += 1
            if scope:  # a pre-scope lease belongs to no folder this can tell apart
                folders.setdefault(study, set()).add(scope)
    # output folders sharing the store each train their own copy of a study's runs: said, not hidden
    return {
        (f"{s} ({len(folders[s])} output folders)" if len(folders.get(s, ())) > 1 else s): c
        for s, c in out.items()
    }


def format_status(leases: str | Path, name: str = "--leases") -> str:
    """One line per study: runs finished, running, stalled, failed and to do."""
    counts = status_counts(leases, name)
    if not counts:
        return f"no runs in the lease store {redact(str(leases))}"
    width = max(len(s) for s in counts) + 2
    lines = ["study".ljust(width) + "".join(c.rjust(10) for c in COLUMNS)]
    for study, c in sorted(counts.items()):
        lines.append(study.ljust(width) + "".join(str(c.get(col, 0)).rjust(10) for col in COLUMNS))
    return "\n".join(lines)


def ray_jobs(address: str) -> str:
    """The cluster's study jobs (id, status, study), newest last."""
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(address).list_jobs()
    rows = [
        f"{j.submission_id}  {j.status}  {(j.metadata or {}).get('study', '')}"
        for j in sorted(jobs, key=lambda j: j.start_time or 0)
        if (j.metadata or {}).get("study")
    ]
    return "\n".join(["ray jobs:", *rows]) if rows else "ray jobs: none"
