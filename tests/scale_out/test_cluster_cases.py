"""What a real cluster does differently (issue 28), on loopback services: a node that does not see ``--out``,
passwords in URLs, unreachable addresses, a database outage shorter than the lease, pooled connections,
one database for MLflow, optuna and leases, and what ``submit`` ships.

Each test is named after the case it covers; the slow ones train a sweep or need a Ray job server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from runners.leases._file import FileLeaseStore
from runners.leases.sql import SqlLeaseStore, dispose_engines
from runners.leases.store import fill_once, open_lease_store
from runners.shared_out import TOKEN, OutNotShared, check_token, lease_key, seen_by_driver, write_token
from tests.conftest import TINY_HYPOTHESIS, TINY_SWEEP, env_for, fresh_database
from tests.studyproc import study_cmd
from vitstudy_core.redact import redact
from vitstudy_core.runfolder import RunFolder

REPO = Path(__file__).resolve().parents[2]
ONE_SEED = TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0]")


def _finish(run_dir: Path) -> dict:
    import numpy as np

    folder = RunFolder(run_dir)
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.write_spectra({"0/norm/all": np.ones(3)})
    folder.write_result({"status": "finished"})
    return {"status": "finished"}


def _tiny_specs(text: str = ONE_SEED):
    from study.pipeline.triage import plan
    from study.schema import parse_hypothesis

    hyp = parse_hypothesis(yaml.safe_load(text))
    return hyp, plan(hyp)


# ---- case 1: a node that does not see --out ----------------------------------------------------------
def test_case1_a_task_that_does_not_see_out_fails_before_training_naming_its_host(tmp_path):
    from runners.executors.jobs import execute_claimed_run

    _, [spec] = _tiny_specs()
    token = write_token(tmp_path / "out")
    assert write_token(tmp_path / "out") == token  # a second driver on the folder agrees
    private = tmp_path / "node-private"  # what --out resolves to on a node without the shared mount
    with pytest.raises(OutNotShared) as err:
        execute_claimed_run(
            spec.model_dump(),
            str(private / "runs" / spec.key),
            str(private / "data"),
            str(private),
            "t",
            token,
        )
    (line,) = str(err.value).splitlines()
    assert f"host {socket.gethostname()}" in line and "--out must be a folder every node mounts" in line
    assert not (private / "runs").exists()  # nothing trained there
    private.mkdir()
    (private / TOKEN).write_text("another")
    with pytest.raises(OutNotShared, match="another study's token"):
        check_token(private, token)
    check_token(tmp_path / "out", token)


def test_case1_a_run_finished_elsewhere_but_unreadable_here_is_an_error_naming_the_host(tmp_path):
    runs = tmp_path / "runs"
    _finish(runs / "ok")
    ended = iter(
        [
            (0, {"status": "finished", "host": "node-7"}, None),  # its folder is not here
            (1, {"status": "finished", "host": "node-8"}, None),
            (2, None, ConnectionError("the store went away after the run was written")),
        ]
    )
    out = list(seen_by_driver(ended, [runs / "lost", runs / "ok", runs / "ok"]))
    assert out[0][1] is None and isinstance(out[0][2], OutNotShared) and "host node-7" in str(out[0][2])
    assert out[1] == (1, {"status": "finished", "host": "node-8"}, None)
    assert out[2][2] is None and out[2][1]["status"] == "finished"  # finished on disk: never failed


def test_case1_a_ray_task_s_error_is_the_job_s_own_one_line_without_ray_s_traceback():
    exceptions = pytest.importorskip("ray.exceptions")
    from runners.executors.local import ray_job_error

    own = OutNotShared("host node-7 does not see the study's output folder /out (...): --out must be ...")
    # what Ray's driver gets: the task's traceback in colour, and the job's exception as its cause
    traceback = (
        "\x1b[36mray::_ray_call()\x1b[39m (pid=27373, ip=10.0.0.7)\n  File ...\nOutNotShared: host node-7"
    )
    wrapped = exceptions.RayTaskError("_ray_call", traceback, own, pid=27373, ip="10.0.0.7")
    assert ray_job_error(wrapped) is own and ray_job_error(wrapped.as_instanceof_cause()) is own
    # a job's error Ray could not rebuild, and Ray's own errors: one line naming the node, no colour codes
    lost = ray_job_error(exceptions.RayTaskError("_ray_call", traceback, None, pid=1, ip="10.0.0.7"))
    assert str(lost) == "a Ray task on node 10.0.0.7 failed: RayTaskError: OutNotShared: host node-7"
    crashed = str(ray_job_error(exceptions.WorkerCrashedError()))
    assert (
        crashed.startswith("a Ray task failed: WorkerCrashedError: The worker died") and "\n" not in crashed
    )
    assert ray_job_error(own) is own  # anything else is left as it is


@pytest.mark.slow  # a Ray task on the loopback cluster (~10 s: its worker imports torch)
def test_case1_on_ray_a_task_that_does_not_see_out_fails_with_one_line_naming_its_host(tmp_path, ray_address):
    from runners.executors.local import RayExecutor

    [(i, result, exc)] = list(
        RayExecutor(ray_address).map_jobs(check_token, [(str(tmp_path / "private"), "t")])
    )
    assert (i, result) == (0, None) and isinstance(exc, OutNotShared), repr(exc)
    (line,) = f"{type(exc).__name__}: {exc}".splitlines()  # the reason a failed run records
    assert line.startswith(
        f"OutNotShared: host {socket.gethostname()} does not see the study's output folder"
    )
    assert "\x1b" not in line and "ray::" not in line and "Traceback" not in line


def _private_node(monkeypatch, tmp_path):
    """Every job runs as on a node whose --out is a private folder (the driver's path, another disk)."""
    import runners.executors.jobs

    real = runners.executors.jobs.execute_claimed_run

    def on_private_node(run, run_dir, data_dir, leases, study="", token="", label=""):
        node_out = tmp_path / "node-disk"
        return real(run, str(node_out / "runs" / Path(run_dir).name), data_dir, leases, study, token, label)

    monkeypatch.setattr(runners.executors.jobs, "execute_claimed_run", on_private_node)


def test_case1_a_study_whose_runs_fail_exits_1_unless_fewer_seeds_are_allowed(tmp_path, monkeypatch, capsys):
    from study.cli import main

    _private_node(monkeypatch, tmp_path)
    hyp = tmp_path / "one.yaml"
    hyp.write_text(ONE_SEED)
    args = ["run", str(hyp), "--out", str(tmp_path / "out"), "--workers", "1", "--no-mlflow", "--no-report"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "1 run(s) failed" in err and "does not see the study's output folder" in err
    assert socket.gethostname() in err and "--allow-failed-runs" in err
    verdicts = json.loads((tmp_path / "out" / "studies" / "tiny" / "verdicts.json").read_text())
    assert "does not see" in next(iter(verdicts["failed"].values()))
    assert main([*args, "--allow-failed-runs"]) == 0


# ---- case 8: passwords in URLs ------------------------------------------------------------------------
def test_case8_redact_masks_every_password_and_nothing_else():
    line = "run h.yaml --leases postgresql://study:p@ss:w0rd@db:5432/s --storage mysql+pymysql://u:x@h/d"
    assert (
        redact(line)
        == "run h.yaml --leases postgresql://study:***@db:5432/s --storage mysql+pymysql://u:***@h/d"
    )
    for same in ("http://mlflow-host:5000/x", "postgresql://study@db/s", "sqlite:////tmp/a.db", "no url"):
        assert redact(same) == same


@pytest.mark.slow  # trains one tiny run with MLflow and the report on (~25 s under load)
def test_case8_no_artefact_of_a_run_holds_the_password(tmp_path, postgres_url):
    db = fresh_database(postgres_url, "redact").replace("study@", "study:S3cretPW@")  # trust auth ignores it
    hyp = tmp_path / "one.yaml"
    hyp.write_text(ONE_SEED)
    out = tmp_path / "out"
    cmd = study_cmd(hyp, out, "--leases", db, report=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_for(), cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "S3cretPW" not in proc.stdout + proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "report.md" for p in files) and any(p.name == "mlflow.db" for p in files)
    leaked = [str(p) for p in files if b"S3cretPW" in p.read_bytes()]
    assert not leaked, leaked
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert "study:***@127.0.0.1" in verdicts["command"]
    from study.cluster.jobs import SubmitOptions, submit_command

    entry = submit_command(hyp, out, SubmitOptions(leases=db, storage=db), sweep=True)
    assert "S3cretPW" not in entry and "--leases" not in entry and "--storage" not in entry
    dead = subprocess.run(
        [*cmd[:-1], "postgresql://study:S3cretPW@127.0.0.1:9/x"],
        capture_output=True,
        text=True,
        env=env_for(),
    )
    assert dead.returncode == 2 and "S3cretPW" not in dead.stderr and "study:***@" in dead.stderr


def test_case8_run_and_status_take_the_lease_store_from_STUDY_LEASES(tmp_path, monkeypatch, capsys):
    """A URL in a variable is in no process's command line (``ps`` shows those to every local user)."""
    from study.cli import main
    from tests.conftest import BEHAVIOUR, write_runs

    hyp, out = write_runs(tmp_path)  # every run finished: `run` trains nothing and tests the claims
    db = f"sqlite:///{tmp_path / 'leases.db'}"
    keys = sorted(json.loads((BEHAVIOUR / "tiny_keys.json").read_text()).values())
    open_lease_store(db).announce("tiny", keys)  # their releases never reached the store: still "todo"
    monkeypatch.setenv("STUDY_LEASES", db)
    try:
        assert main(["run", str(hyp), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
        assert sorted((lease.run_key, lease.state) for lease in SqlLeaseStore(db).leases()) == [
            (k, "finished") for k in keys
        ]  # recorded in the variable's store, and no OUT/leases made
        assert not (out / "leases").exists()
        verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
        assert verdicts["command"].startswith(f"STUDY_LEASES={db} python -m study run {hyp}")
        folder = tmp_path / "file-leases"
        FileLeaseStore(folder).announce("other", ["k1", "k2"])
        capsys.readouterr()
        assert main(["status", "--out", str(out)]) == 0
        assert capsys.readouterr().out.split("\n")[1].split() == ["tiny", "3", "0", "0", "0", "0"]
        assert main(["status", "--leases", str(folder)]) == 0  # the flag wins over the variable
        assert capsys.readouterr().out.split("\n")[1].split() == ["other", "0", "0", "0", "0", "2"]
        monkeypatch.setenv("STUDY_LEASES", str(folder))  # a lease folder in the variable
        assert main(["status"]) == 0
        assert capsys.readouterr().out.split("\n")[1].split() == ["other", "0", "0", "0", "0", "2"]
    finally:
        dispose_engines()


def test_case8_a_bad_STUDY_LEASES_or_STUDY_STORAGE_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    from study.cli import main

    dead = "postgresql://study:S3cretPW@127.0.0.1:9/none"
    one, sweep, out = tmp_path / "one.yaml", tmp_path / "s.yaml", tmp_path / "out"
    one.write_text(ONE_SEED)
    sweep.write_text(TINY_SWEEP)
    for var, argv in (
        ("STUDY_LEASES", ["run", str(one), "--out", str(out)]),
        ("STUDY_LEASES", ["sweep", str(sweep), "--out", str(out)]),
        ("STUDY_STORAGE", ["sweep", str(sweep), "--out", str(out)]),
        ("STUDY_LEASES", ["status", "--out", str(out)]),
    ):
        monkeypatch.delenv("STUDY_LEASES", raising=False)
        monkeypatch.setenv(var, dead)
        assert main(argv) == 2, (var, argv)
        printed = capsys.readouterr()
        (line,) = printed.err.strip().splitlines()
        assert printed.out == "" and f"{var}: cannot r" in line and "--leases" not in line, line
        assert "study:***@127.0.0.1:9" in line and "S3cretPW" not in line, line
        assert not out.exists(), (var, argv)
        monkeypatch.delenv(var)


# ---- case 10: unreachable --address / --leases --------------------------------------------------------
@pytest.mark.parametrize(
    "flags",
    [
        ["--executor", "ray", "--address", "127.0.0.1:9"],
        ["--leases", "postgresql://study@127.0.0.1:9/none"],
    ],
    ids=["address", "leases"],
)
def test_case10_an_unreachable_cluster_or_database_is_one_line_in_seconds_and_writes_nothing(tmp_path, flags):
    hyp = tmp_path / "one.yaml"
    hyp.write_text(ONE_SEED)
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "study", "run", str(hyp), "--out", str(out), *flags],
        capture_output=True,
        text=True,
        env=env_for(),
        cwd=REPO,
        timeout=90,
    )
    took = time.monotonic() - t0
    print(f"node-b finished the sweep in {took:.0f} s")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert flags[-2] in line and "cannot reach" in line and "127.0.0.1:9" in line
    assert not out.exists() and took < 60


# ---- case 4: a database outage shorter than the lease ---------------------------------------------------
def test_case4_release_and_renewal_survive_an_outage_shorter_than_the_lease(tmp_path, postgres_url):
    from tests.clusters import Outage

    db = fresh_database(postgres_url, "outage")
    proxy = Outage(int(db.rsplit(":", 1)[1].split("/")[0]))
    store, run_dir, logs = SqlLeaseStore(proxy.url(db)), tmp_path / "r", []

    def fill():  # the database goes away mid-run and comes back 2 s after the run is written
        proxy.down()
        time.sleep(2.5)  # a renewal (every ttl/3 = 2 s) fails meanwhile
        result = _finish(run_dir)
        threading.Timer(2.0, proxy.up).start()
        return result

    try:
        out = fill_once(store, {"key": "r"}, run_dir, fill, ttl=6.0, poll_s=0.1, log=logs.append)
    finally:
        proxy.down()
        dispose_engines()
    assert out["status"] == "finished" and out["claim"]["filled"] is True
    assert any("renewal failed" in line for line in logs), logs
    lease = {lease.run_key: lease for lease in SqlLeaseStore(db).leases()}["r"]
    assert (lease.state, lease.attempts, lease.owner) == ("finished", 1, out["claim"]["owner"])


@pytest.mark.parametrize("kind", ["file", "postgres"])
def test_case4_a_rerun_records_runs_finished_on_disk_whose_release_was_lost(tmp_path, kind, request):
    from study.pipeline.stages import Placement, reconcile_leases

    if kind == "file":
        where = str(tmp_path / "out" / "leases")
        store = FileLeaseStore(where)
    else:
        where = fresh_database(request.getfixturevalue("postgres_url"), "reconcile")
        store = open_lease_store(where)
    store.announce("s", ["done", "live", "todo"])
    assert store.acquire("done", "dead-worker", 0.05) and store.acquire("live", "w", 600)
    time.sleep(0.1)
    reconcile_leases(Placement(leases=where), tmp_path / "out" / "runs", ["done", "live"])
    states = {lease.run_key: lease.state for lease in store.leases()}
    assert states == {"done": "finished", "live": "running", "todo": "todo"}  # a live lease is its owner's


# ---- case 5: one pooled engine per process ----------------------------------------------------------------
WORKER = """
import sys, time
from runners.leases.store import fill_once, open_lease_store
from vitstudy_core.runfolder import RunFolder
import numpy as np
url, root = sys.argv[1], sys.argv[2]
def fill(d):
    f = RunFolder(d); f.path.mkdir(parents=True, exist_ok=True)
    f.write_spectra({"0/norm/all": np.ones(3)}); f.write_result({"status": "finished"})
    return {"status": "finished"}
for i in range(12):  # a reused worker process: one job after another, each opening the store by its URL
    d = f"{root}/{sys.argv[3]}-{i}"
    assert fill_once(open_lease_store(url), {"key": d.rsplit('/', 1)[1]}, d, lambda: fill(d), ttl=30)["status"] == "finished"
print("ok")
"""


def test_case5_workers_share_one_pool_each_under_a_low_connection_limit(tmp_path, postgres_url):
    import sqlalchemy as sa

    db = fresh_database(postgres_url, "pooled")
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # two workers of at most 3 connections each fit; one leaking does not
        conn.execute(sa.text('ALTER DATABASE "pooled" CONNECTION LIMIT 6'))
    admin.dispose()
    SqlLeaseStore(db)  # the table exists before the workers race
    dispose_engines()
    sessions = "SELECT sessions FROM pg_stat_database WHERE datname = 'pooled'"
    with sa.create_engine(postgres_url).connect() as conn:
        before = conn.execute(sa.text(sessions)).scalar()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db, str(tmp_path), f"w{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_for(),
            cwd=REPO,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    time.sleep(1.0)  # a session's statistics reach pg_stat_database when it ends
    with sa.create_engine(postgres_url).connect() as conn:
        active = "SELECT count(*) FROM pg_stat_activity WHERE datname = 'pooled'"
        left = conn.execute(sa.text(active)).scalar()
        opened = conn.execute(sa.text(sessions)).scalar() - before
    assert left == 0  # disposed at exit
    assert opened <= 2 * 3, f"24 jobs opened {opened} connections: one pool per process holds at most 3"


def test_case5_one_engine_per_url_and_process(tmp_path):
    from runners.leases.sql import engine_for

    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert open_lease_store(url) is open_lease_store(url) and engine_for(url) is engine_for(url)
    dispose_engines()
    assert open_lease_store(url) is not None


# ---- case 2: one database for MLflow, optuna and leases -------------------------------------------------
def test_case2_optuna_then_mlflow_then_leases_share_one_database_url(postgres_url):
    import mlflow
    import optuna

    from study.sweep.storage import _database_storage

    db = fresh_database(postgres_url, "shared")
    optuna.create_study(study_name="s", storage=_database_storage(db)).enqueue_trial({"x": 1})
    client = mlflow.MlflowClient(db)  # MLflow's migrations in the same database, after optuna's
    client.create_experiment("e")
    store = open_lease_store(db)
    assert store.acquire("k", "a", 30)
    again = optuna.load_study(study_name="s", storage=_database_storage(db))
    assert len(again.trials) == 1 and client.get_experiment_by_name("e") is not None
    dispose_engines()


@pytest.mark.slow  # a sweep of 3 trials x 1 seed with MLflow logging to PostgreSQL (~40 s under load)
def test_case2_a_sweep_with_mlflow_on_against_one_postgresql_url(tmp_path, postgres_url):
    db = fresh_database(postgres_url, "sweep_mlflow")
    hyp = tmp_path / "s.yaml"
    hyp.write_text(TINY_SWEEP.replace("seeds: [0, 1]", "seeds: [0]"))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "study", "sweep", str(hyp), "--out", str(out), "--workers", "1"]
    cmd += ["--storage", db, "--no-report"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_for(MLFLOW_TRACKING_URI=db), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import mlflow

    runs = mlflow.MlflowClient(db).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(db).search_experiments()]
    )
    assert sum(r.data.tags.get("mlflow.parentRunId") is not None for r in runs) == 3


# ---- case 3: submit ships its environment -------------------------------------------------------------
def test_case3_submit_forwards_every_option_the_interpreter_and_the_file_s_variables(tmp_path, monkeypatch):
    from study.cluster.jobs import CODE_DIGEST_ENV, SubmitOptions, code_digest, runtime_env, submit_command

    monkeypatch.setenv("CIFAR100_DIR", "/shared/cifar100")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    text = "datasets: [{name: c, kind: cifar100, path: '${CIFAR100_DIR}'}]  # ${UNSET_VAR_XYZ}"
    opts = SubmitOptions(
        leases="postgresql://u:pw@db/s",
        cpus_per_run=2,
        data_root=("c=/shared/c",),
        force=True,
        n_trials=5,
        ship_code=True,
    )
    run = submit_command(tmp_path / "h.yaml", tmp_path / "o", opts)
    assert run.startswith(f"{sys.executable} -m study run {tmp_path / 'h.yaml'}")
    for part in ("--cpus-per-run 2", "--data-root c=/shared/c", "--force"):
        assert part in run, run
    assert "--n-trials" not in run and "pw" not in run and "--leases" not in run  # the job's STUDY_LEASES
    sweep = submit_command(tmp_path / "h.yaml", tmp_path / "o", opts, sweep=True)
    assert " sweep " in sweep and "--n-trials 5" in sweep and "--force" not in sweep
    env = runtime_env(text, opts)
    assert env["py_executable"] == sys.executable and env["working_dir"] == str(REPO)
    assert env["env_vars"]["CIFAR100_DIR"] == "/shared/cifar100" and "UNSET_VAR_XYZ" not in env["env_vars"]
    assert env["env_vars"]["STUDY_LEASES"] == "postgresql://u:pw@db/s"
    assert env["env_vars"][CODE_DIGEST_ENV] == code_digest()


def test_case3_a_job_driver_with_other_code_stops_with_one_line(tmp_path):
    hyp = tmp_path / "one.yaml"
    hyp.write_text(ONE_SEED)
    proc = subprocess.run(
        [sys.executable, "-m", "study", "run", str(hyp), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env_for(STUDY_CODE_DIGEST="0000000000000000"),
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and "runs other code" in proc.stderr and "--ship-code" in proc.stderr
    assert not (tmp_path / "out").exists()


# ---- case 9: a waiting task holds no worker ----------------------------------------------------------
def _echo(i: int) -> int:
    return i


class _PluginExecutor:
    """An executor as a plug-in may write it: ``map_jobs(fn, jobs)`` without ``requeue``."""

    def map_jobs(self, fn, jobs):
        from runners.executors.local import InlineExecutor

        yield from InlineExecutor().map_jobs(fn, jobs)


@pytest.mark.parametrize(
    "name",
    [pytest.param("local-2", marks=pytest.mark.slow), "ray-1", "plugin"],  # local-2: spawns workers (~8 s)
)
def test_case9_every_executor_sends_a_job_back_after_its_delay_and_yields_it_once(name, request):
    from runners.executors.local import EXECUTORS, ExecutorOptions, map_requeued

    if name == "plugin":
        executor = _PluginExecutor()
    else:
        kind, workers = name.split("-")
        address = request.getfixturevalue("ray_address") if kind == "ray" else "auto"
        executor = EXECUTORS.get(kind).make(ExecutorOptions(workers=int(workers), n_jobs=3, address=address))
    seen: list[tuple[int, int]] = []

    def requeue(i, result, times):  # job 1 waits twice (another worker holds its run), then ends
        seen.append((i, times))
        return 0.2 if i == 1 and times < 2 else None

    t0 = time.monotonic()
    out = [(i, r, e) for i, r, e in map_requeued(executor, _echo, [(0,), (1,), (2,)], requeue)]
    assert sorted(out) == [(0, 0, None), (1, 1, None), (2, 2, None)] and out[-1][0] == 1
    assert sorted(seen) == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]
    assert time.monotonic() - t0 >= 0.4  # sent back after its delay each time


def test_case9_a_run_leased_elsewhere_frees_its_slot_and_reuses_the_holder_s_result(tmp_path, monkeypatch):
    """One slot (the in-process executor): run A is leased live by another worker; run B, independent,
    finishes while A waits, and A then reuses the holder's result without training."""
    import runners.executors.jobs
    from study.pipeline.stages import Placement, execute

    _, specs = _tiny_specs(ONE_SEED.replace("seeds: [0]", "seeds: [0, 1]"))
    a, b = specs
    runs, leases, trained, logs = tmp_path / "out" / "runs", tmp_path / "out" / "leases", [], []
    store = FileLeaseStore(leases)
    scoped = lease_key(a.key, write_token(tmp_path / "out"))  # this folder's lease of run A
    assert store.acquire(scoped, "other-host:1:abc", 60)  # a live holder elsewhere

    def training(run, run_dir, data_dir, label=""):
        trained.append(run["key"])
        return _finish(Path(run_dir))

    def holder():  # finishes A once B has finished beside it (or after 8 s, when B could not start)
        deadline = time.monotonic() + 8
        while not RunFolder(runs / b.key).is_finished() and time.monotonic() < deadline:
            time.sleep(0.05)
        _finish(runs / a.key)
        store.release(scoped, "other-host:1:abc", "finished")

    monkeypatch.setattr(runners.executors.jobs, "execute_run", training)
    ended: list[str] = []
    threading.Thread(target=holder, daemon=True).start()
    failed = execute(
        [a, b],
        runs,
        tmp_path / "out" / "data",
        1,
        logs.append,
        lambda s, r: ended.append(s.key),
        Placement(leases=str(leases)),
    )
    assert failed == {} and trained == [b.key] and ended == [b.key, a.key]
    assert any("leased by another worker" in line for line in logs), logs
    assert any(line.startswith(f"[{a.label}] finished by another worker") for line in logs), logs
    lease = {x.run_key: x for x in store.leases()}[scoped]
    assert (lease.state, lease.attempts) == ("finished", 1)


@pytest.mark.slow  # trains one tiny run on the loopback Ray cluster (~30 s under load)
def test_case9_on_ray_waiting_tasks_free_their_cpus_for_an_independent_run(tmp_path, ray_address):
    """2 CPUs, 3 runs: two leased live elsewhere, one independent. The independent one trains while the
    other two wait (before, the two waiting tasks held both CPUs), and they then reuse the holder's runs."""
    from study.pipeline.stages import Placement, execute, prepare_data

    _, (a1, a2, b) = _tiny_specs(TINY_HYPOTHESIS)
    out = tmp_path / "out"
    runs, leases, logs = out / "runs", out / "leases", []
    store = FileLeaseStore(leases)
    token = write_token(out)  # the folder's leases are scoped by its token (shared_out.lease_key)
    for spec in (a1, a2):
        assert store.acquire(lease_key(spec.key, token), "other-host:1:abc", 600)
    prepare_data([b], out / "data", logs.append)

    def holder():  # finishes a1 and a2 once b has finished beside them (or after 90 s: b could not start)
        deadline = time.monotonic() + 90
        while not RunFolder(runs / b.key).is_finished() and time.monotonic() < deadline:
            time.sleep(0.2)
        for spec in (a1, a2):
            _finish(runs / spec.key)
            store.release(lease_key(spec.key, token), "other-host:1:abc", "finished")

    ended: list[tuple[str, dict]] = []
    threading.Thread(target=holder, daemon=True).start()
    failed = execute(
        [a1, a2, b],
        runs,
        out / "data",
        "auto",
        logs.append,
        lambda s, r: ended.append((s.key, r)),
        Placement("ray", ray_address, leases=str(leases)),
    )
    assert failed == {} and ended[0][0] == b.key, logs
    claims = {key: r["claim"]["filled"] for key, r in ended}
    assert claims == {b.key: True, a1.key: False, a2.key: False}
    assert {x.run_key.split("@")[0]: x.attempts for x in store.leases()} == {a1.key: 1, a2.key: 1, b.key: 1}


# ---- case 11: lease expiry on the database's clock; no server ERROR per poll -----------------------------
def _skewed_clock(monkeypatch, minutes: float) -> None:
    """This process's clock (the worker's) ``minutes`` off; the database server's is not."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60 * minutes)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_case11_a_worker_with_a_skewed_clock_neither_takes_a_live_lease_nor_keeps_an_expired_one(
    kind, tmp_path, monkeypatch, request
):
    # the session's PostgreSQL database (no CREATE DATABASE: seconds under load), keys of this test's own
    url = f"sqlite:///{tmp_path / 'l.db'}" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    store, live, dead = SqlLeaseStore(url), f"skew-live-{time.time_ns()}", f"skew-dead-{time.time_ns()}"
    assert store.acquire(live, "A", 30) and store.acquire(dead, "A", 0.3)
    with monkeypatch.context() as m:  # a worker whose clock runs 10 minutes fast
        _skewed_clock(m, +10)
        assert not store.acquire(live, "B", 30)  # 30 s left on the server's clock
        assert abs(store.now() - time.time() + 600) < 5  # the store's clock is the server's
    time.sleep(0.5)
    with monkeypatch.context() as m:  # one 10 minutes slow: the lease expired on the server's clock
        _skewed_clock(m, -10)
        assert store.acquire(dead, "B", 30)
        assert store.renew(dead, "B", 30)  # renewed to 30 s from the server's now, not 10 min ago
    assert not store.acquire(dead, "C", 30)
    leases = {x.run_key: x for x in store.leases()}
    assert leases[live].live(store.now()) and leases[dead].owner == "B" and leases[dead].attempts == 2
    dispose_engines()


def _server_errors(url: str) -> int | None:
    """ERROR lines in the PostgreSQL server's log so far (tests/clusters.py logs to <data dir>/../pg.log);
    None when it cannot be read (a server this session did not start)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.connect() as conn:
        data = conn.execute(sa.text("SHOW data_directory")).scalar()
    engine.dispose()
    try:
        text = (Path(data).parent / "pg.log").read_text(errors="replace")
    except OSError:
        return None
    return sum("ERROR:" in line for line in text.splitlines())


def test_case11_polls_of_a_waiting_worker_and_announcements_log_no_server_error(postgres_url, tmp_path):
    store, k, j = SqlLeaseStore(postgres_url), f"quiet-k-{time.time_ns()}", f"quiet-j-{time.time_ns()}"
    store.announce("s", [k, j])
    assert store.acquire(k, "holder", 60)
    before = _server_errors(postgres_url)
    if before is None:
        pytest.skip("the PostgreSQL server's log is not readable here")
    run = tmp_path / "k"
    for _ in range(5):  # a waiting worker's polls: the lease is held live by another
        assert (
            fill_once(store, {"key": k}, run, lambda: pytest.fail("filled"), wait=False)["status"]
            == "waiting"
        )
    store.announce("s", [k, j])  # a second study announcing the same runs
    time.sleep(0.2)
    assert _server_errors(postgres_url) == before
    assert {x.run_key: x.attempts for x in store.leases() if x.run_key in (k, j)} == {k: 1, j: 0}
    dispose_engines()


def test_case11_a_tracking_server_decides_where_experiments_keep_artifacts(tmp_path):
    from study.tracking.store import experiment_artifact_location

    for server in ("http://mlflow-host:5000", "https://u:pw@mlflow.example.org"):
        assert experiment_artifact_location(server, tmp_path, "tiny") is None  # its --artifacts-destination
    home = (tmp_path / "mlartifacts" / "tiny").resolve().as_uri()
    for store in (f"sqlite:///{tmp_path / 'mlflow.db'}", "postgresql://study@db/study"):  # no server
        assert experiment_artifact_location(store, tmp_path, "tiny") == home


def test_case11_the_hint_and_ui_for_a_tracking_server_open_its_address(tmp_path, monkeypatch):
    import study.tracking.ui as ui

    hint = ui.store_hint("http://u:pw@mlflow-host:5000")
    assert hint.startswith("http://u:***@mlflow-host:5000 ") and "mlflow ui" not in hint and "pw" not in hint
    assert ui.store_hint("sqlite:////o/mlflow.db") == "mlflow ui --backend-store-uri sqlite:////o/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow-host:5000/")
    monkeypatch.setattr(ui, "study_experiments", lambda uri: [("tiny", "3")])
    plan = ui.ui_plan(tmp_path, 5000, "tiny")  # nothing to start: the server is the UI
    assert plan.cmd == [] and plan.url == ui.runs_url("http://mlflow-host:5000", "3")


@pytest.mark.slow  # starts a real `mlflow server` (~30 s under load)
def test_case11_on_a_real_server_artifacts_go_to_its_artifacts_destination(tmp_path, monkeypatch):
    import os
    import signal
    import urllib.request

    from study.tracking.tracker import Tracker
    from tests.clusters import free_port

    port, dest, out = free_port(), tmp_path / "server-artifacts", tmp_path / "out"
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 's.db'}"]
    cmd += [
        "--artifacts-destination",
        str(dest),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = env_for(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "mlflow server did not start"
                time.sleep(0.5)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        with Tracker(out, "tiny") as tracker:
            exp = tracker.client.get_experiment(tracker.experiment_id)
            (tmp_path / "note.txt").write_text("x")
            tracker.client.log_artifact(tracker.parent_id, str(tmp_path / "note.txt"))
        assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
        assert list(dest.rglob("note.txt")) and not (out / "mlartifacts").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


# ---- case 6: two output folders sharing one database --------------------------------------------------
def _together(n: int, fn) -> list[BaseException]:
    """Run ``fn(i)`` for i < n in threads released at once; the exceptions they raised."""
    gate, errors = threading.Barrier(n), []

    def one(i: int) -> None:
        gate.wait()
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - collected, asserted on by the caller
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_case6_two_invocations_on_a_fresh_database_both_create_its_tables(
    tmp_path, postgres_url, monkeypatch
):
    import contextlib

    import mlflow.tracking._tracking_service.registry as mlflow_stores

    from study.sweep.storage import _database_storage
    from study.tracking.tracker import Tracker

    db = fresh_database(postgres_url, "case6_fresh")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    # two threads as two processes (two hosts) are: MLflow serialises building a store within a process
    monkeypatch.setattr(mlflow_stores, "_building_store_lock", contextlib.nullcontext())

    def open_stores(i: int) -> None:  # what `run` / `sweep` on output folder i opens first
        Tracker(tmp_path / f"out{i}", "case6")  # MLflow's tables
        SqlLeaseStore(db)  # the lease table
        _database_storage(db)  # optuna's

    try:
        errors = _together(2, open_stores)
    finally:
        dispose_engines()
    assert not errors, [f"{type(e).__name__}: {str(e)[:300]}" for e in errors]


def test_case6_two_output_folders_hold_separate_leases_each_run_filled_once(
    tmp_path, postgres_url, monkeypatch
):
    import runners.executors.jobs
    from study.cluster.jobs import format_status

    db = fresh_database(postgres_url, "case6_leases")
    monkeypatch.setattr(
        runners.executors.jobs, "execute_run", lambda run, run_dir, data_dir, label="": _finish(Path(run_dir))
    )
    _, [spec] = _tiny_specs()
    try:
        for out in ("a", "b"):  # B's job after A's run finished: A's finished lease is not B's run
            token = write_token(tmp_path / out)
            run_dir = tmp_path / out / "runs" / spec.key
            done = runners.executors.jobs.execute_claimed_run(
                spec.model_dump(), str(run_dir), "-", db, "tiny", token
            )
            assert done["claim"]["filled"] and RunFolder(run_dir).is_finished()
        leases = open_lease_store(db).leases()
        assert sorted((le.state, le.attempts) for le in leases) == [("finished", 1), ("finished", 1)]
        assert {le.run_key.split("@")[0] for le in leases} == {spec.key}
        assert "tiny (2 output folders)" in format_status(db)
    finally:
        dispose_engines()


@pytest.fixture(scope="module")
def case6_store(postgres_url):
    """One PostgreSQL database serving as the MLflow store of several output folders."""
    return fresh_database(postgres_url, "case6_store")


def _trained(out: Path, spec, finished_at: float) -> Path:
    """A finished run folder as a training leaves it: its result says when it finished (unique per training)."""
    import numpy as np

    folder = RunFolder(out / "runs" / spec.key)
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.write_spectra({f"{e}/{layer}/all": np.linspace(3, 1, 4) for e in (0, 2) for layer in ("norm",)})
    folder.write_result({"status": "finished", "started_at": finished_at - 1, "finished_at": finished_at})
    return folder.path


def test_case6_each_output_folder_s_training_reaches_mlflow_once(tmp_path, case6_store, monkeypatch):
    import shutil

    from mlflow.tracking import MlflowClient

    from study.doctor import check_store
    from study.pipeline.runlog import log_run
    from study.tracking.tracker import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", case6_store)
    hyp, [spec] = _tiny_specs()
    layers, logged = hyp.design.layers, {}
    _trained(tmp_path / "a", spec, 1000.0)
    _trained(tmp_path / "b", spec, 2000.0)  # folder B trained its own copy (it cannot see A's)
    (tmp_path / "c" / "runs").mkdir(parents=True)  # folder C downloaded A's copy from the store
    shutil.copytree(tmp_path / "a" / "runs" / spec.key, tmp_path / "c" / "runs" / spec.key)
    for out in ("a", "b", "c"):
        with Tracker(tmp_path / out, "case6_log") as tracker:
            logged[out] = log_run(tracker, spec, tmp_path / out / "runs", layers)
            assert not log_run(tracker, spec, tmp_path / out / "runs", layers)  # once per training
    assert logged == {"a": True, "b": True, "c": False}
    client = MlflowClient(case6_store)
    runs = client.search_runs(
        [client.get_experiment_by_name("case6_log").experiment_id], "tags.`study.role` = 'training'"
    )
    assert sorted(r.data.tags["study.out"] for r in runs) == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert not [f for f in check_store(tmp_path / "a", client) if f.kind == "duplicate"]


def _posing_on_store(monkeypatch, store: str, name: str):
    """Trackers on ``store`` with a 0.2 s parent heartbeat (a parent silent for 4 beats, 0.8 s, is dead),
    posing as host ``name`` (change ``host["name"]`` to pose as another); -> (host, client)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("STUDY_HEARTBEAT_S", "0.2")
    host = {"name": name}
    monkeypatch.setattr(socket, "gethostname", lambda: host["name"])
    return host, MlflowClient(store)


def test_case6_a_live_parent_of_another_host_or_folder_is_never_closed_a_silent_one_is(
    tmp_path, case6_store, monkeypatch
):
    from study.tracking.tracker import Tracker

    host, client = _posing_on_store(monkeypatch, case6_store, "host-a")

    def status(tracker) -> str:
        return client.get_run(tracker.parent_id).info.status

    a = Tracker(tmp_path / "a", "case6_beat").__enter__()
    time.sleep(1.1)  # older than the grace time: only its heartbeats say that it lives
    host["name"] = "host-b"
    b = Tracker(tmp_path / "b", "case6_beat").__enter__()  # each closes the stale parents it finds
    c = Tracker(tmp_path / "c", "case6_beat").__enter__()  # b's host, another output folder
    try:
        assert (status(a), status(b)) == ("RUNNING", "RUNNING")
        a._heartbeat.stop()  # host-a dies: its heartbeats stop (its lock is on its own machine)
        time.sleep(1.1)
        assert c.close_stale() == [a.parent_id]
        assert (status(a), status(b), status(c)) == ("KILLED", "RUNNING", "RUNNING")
    finally:
        for t in (c, b, a):
            t.__exit__(None, None, None)


@pytest.mark.slow  # two invocations of the 3-run tiny study at once, a third after, one undisturbed (~2 min under load)
def test_case6_two_output_folders_on_one_fresh_database_each_train_their_runs_once(tmp_path, postgres_url):
    """docs/scale-out.md, "Two output folders on one database": two invocations that both looked in the
    store before either finished a run each train every run once, in their own folder; a later one
    downloads the store's finished runs and trains none. Which of the two a real pair of invocations
    does depends on when each looks; here they meet (tests/pose_as.py --meet) after looking, before training,
    so it is the first every time."""
    import re
    from collections import Counter

    from mlflow.tracking import MlflowClient

    from tests.studyproc import verdicts

    db = fresh_database(postgres_url, "case6_two_folders")  # fresh: both create MLflow's tables
    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    outs = [tmp_path / "a", tmp_path / "b"]
    pose = [
        sys.executable,
        str(REPO / "tests" / "pose_as.py"),
        socket.gethostname(),
        "--meet",
        str(tmp_path / "met"),
        "2",
    ]
    procs = [
        subprocess.Popen(
            [*pose, *study_cmd(hyp, out, "--leases", db)[3:]],  # study_cmd without `python -m study`
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env_for(MLFLOW_TRACKING_URI=db),
            cwd=REPO,
        )
        for out in outs
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n=====\n".join(log[-3000:] for log in logs)
    for log in logs:  # each folder trained each of its runs, once, and reused none
        assert all(log.count(f"[objects/seed{seed}] epoch 2/2") == 1 for seed in (0, 1, 2)), log
        assert "study tiny: 3 runs planned, 0 reused, 3 to train" in log, log
    leases = open_lease_store(db).leases()
    assert len(leases) == 6 and {(le.state, le.attempts) for le in leases} == {("finished", 1)}
    client = MlflowClient(db)
    exp = client.get_experiment_by_name("tiny").experiment_id
    query = "tags.`study.role` = 'training' and attributes.status = 'FINISHED'"
    trainings = client.search_runs([exp], query)
    assert Counter(r.data.tags["study.out"] for r in trainings) == {str(out): 3 for out in outs}
    parents = client.search_runs([exp], "tags.`study.role` = 'study'")
    assert sorted(r.info.status for r in parents) == ["FINISHED", "FINISHED"]  # neither closed the other
    # a third folder started after them: every run is in the store, FINISHED, so it is downloaded, not trained
    later = subprocess.run(
        study_cmd(hyp, tmp_path / "c", "--leases", db),
        capture_output=True,
        text=True,
        env=env_for(MLFLOW_TRACKING_URI=db),
        cwd=REPO,
    )
    assert later.returncode == 0, later.stdout[-3000:] + later.stderr[-3000:]
    assert (
        "study tiny: 3 runs planned, 3 reused, 0 to train" in later.stdout and "epoch 2/2" not in later.stdout
    )
    sources = re.findall(r"reused objects/seed\d \(key \w+, from MLflow run (\w+)\)", later.stdout)
    assert len(sources) == 3 and set(sources) <= {r.info.run_id for r in trainings}, later.stdout
    assert len(open_lease_store(db).leases()) == 6  # it took no lease: nothing to train
    assert len(client.search_runs([exp], query)) == 6  # a downloaded copy is never logged again
    alone = subprocess.run(
        study_cmd(hyp, tmp_path / "alone", "--no-mlflow"),
        capture_output=True,
        text=True,
        env=env_for(),
        cwd=REPO,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert verdicts(outs[0]) == verdicts(outs[1]) == verdicts(tmp_path / "c") == verdicts(tmp_path / "alone")
    dispose_engines()


# ---- case 7: a sweep restarted on another host ----------------------------------------------------------
FAST_BEATS = {"STUDY_TRIAL_HEARTBEAT": "1", "STUDY_HEARTBEAT_S": "0.5", "STUDY_LEASE_TTL": "4"}


def _sweep_driver(host: str, hyp: Path, out: Path, db: str, *pose: str, fault: str = "") -> subprocess.Popen:
    """``sweep`` on ``db`` (optuna, leases and MLflow) posing as ``host`` (tests/pose_as.py, ``pose``: its
    options), in a session of its own (a ``kill`` fault kills that group, never the test); heartbeats
    every 1 s (trials: stale after 3 s), 0.5 s (the parent run: stale after 2 s)."""
    cmd = [
        sys.executable,
        str(REPO / "tests" / "pose_as.py"),
        host,
        *pose,
        "sweep",
        str(hyp),
        "--out",
        str(out),
    ]
    env = env_for(MLFLOW_TRACKING_URI=db, **FAST_BEATS)
    env.pop("STUDY_FAULT", None)
    if fault:
        env["STUDY_FAULT"] = fault
    return subprocess.Popen(
        [*cmd, "--workers", "1", "--storage", db, "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )


def _log_within(proc: subprocess.Popen, seconds: float) -> str:
    """``proc``'s output once it ended; killed and failed when it runs longer than ``seconds``."""
    try:
        return proc.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:  # was: "waiting for 3 trial(s)" forever
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the sweep still runs after {seconds:.0f} s:\n{proc.communicate()[0][-3000:]}")


def _epochs(log: str) -> list[str]:
    """The run labels of a driver's epoch lines (one per training of the 1-epoch runs)."""
    import re

    return re.findall(r"\[([^\]]+)\] epoch 1/1 ", log)


def _trials(out: Path):
    """trials.csv by knob value and seed (trial numbers differ where a trial was run again)."""
    import pandas as pd

    cols = ["texture_reliance", "seed", "run_key", "objective", "test_acc", "trial_value"]
    trials = pd.read_csv(out / "sweeps" / "tiny_sweep" / "trials.csv")
    return trials[cols].sort_values(["texture_reliance", "seed"]).reset_index(drop=True)


def _claims(out: Path) -> list[dict]:
    """The sweep's verdicts, without when each claim was registered (each folder registered its own)."""
    claims = json.loads((out / "sweeps" / "tiny_sweep" / "verdicts.json").read_text())["claims"]
    return [{**c, "registration": {**c["registration"], "registered_at": None}} for c in claims]


@pytest.fixture(scope="module")
def undisturbed_sweep(tmp_path_factory) -> Path:
    """The output folder of TINY_SWEEP run alone, on a journal file, without MLflow."""
    out = tmp_path_factory.mktemp("undisturbed") / "out"
    hyp = out.parent / "s.yaml"
    hyp.write_text(TINY_SWEEP)
    cmd = [sys.executable, "-m", "study", "sweep", str(hyp), "--out", str(out), "--workers", "1"]
    proc = subprocess.run(
        [*cmd, "--no-mlflow", "--no-report"], capture_output=True, text=True, env=env_for(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _each_run_once(db: str, attempts: list[int]) -> None:
    """Every lease finished with these attempts, and MLflow holds one finished training per run."""
    from collections import Counter

    from mlflow.tracking import MlflowClient

    leases = open_lease_store(db).leases()
    assert {le.state for le in leases} == {"finished"} and sorted(le.attempts for le in leases) == attempts
    client = MlflowClient(db)
    exp = client.get_experiment_by_name("tiny_sweep.sweep").experiment_id
    trainings = client.search_runs([exp], "tags.`study.role` = 'training' and attributes.status = 'FINISHED'")
    assert sorted(Counter(r.data.tags["run_key"] for r in trainings).values()) == [1] * 6


def _parents(db: str) -> list[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(db)
    exp = client.get_experiment_by_name("tiny_sweep.sweep").experiment_id
    return sorted(
        (r.data.tags["study.host"], r.info.status)
        for r in client.search_runs([exp], "tags.`study.role` = 'sweep'")
    )


@pytest.mark.slow  # 6 tiny runs over two drivers on PostgreSQL, and the undisturbed sweep (~45 s under load)
def test_case7_a_sweep_restarted_on_another_host_takes_over_the_dead_driver_s_trials(
    tmp_path, postgres_url, undisturbed_sweep
):
    from collections import Counter

    db = fresh_database(postgres_url, "case7_restart")
    hyp = tmp_path / "s.yaml"
    hyp.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    # node-a asks the grid's 3 trials and is SIGKILLed after the first epoch of its third run: trial 0
    # is complete, trial 1 has one of its two seeds, trial 2 none
    a = _sweep_driver("node-a", hyp, out, db, fault="train.epoch@3:kill")
    log_a = a.communicate(timeout=600)[0]
    assert a.returncode == -9, log_a[-3000:]
    t0 = time.monotonic()
    log_b = _log_within(_sweep_driver("node-b", hyp, out, db), 150)
    took = time.monotonic() - t0
    print(f"node-b finished the sweep in {took:.0f} s")
    assert took < 120 and log_b.count("waiting for") <= 2, (took, log_b)
    assert "has no heartbeat" in log_b and "(node-a:" in log_b, log_b
    # each run trained once: node-a's two finished runs are reused, the killed one is trained again
    assert len(_epochs(log_a)) == 2 and not set(_epochs(log_a)) & set(_epochs(log_b)), (log_a, log_b)
    assert sorted(Counter(_epochs(log_a) + _epochs(log_b)).values()) == [1] * 6
    _each_run_once(db, [1] * 5 + [2])
    assert _parents(db) == [("node-a", "KILLED"), ("node-b", "FINISHED")]  # node-b closed the dead parent
    import pandas as pd

    pd.testing.assert_frame_equal(_trials(out), _trials(undisturbed_sweep))
    assert _claims(out) == _claims(undisturbed_sweep)
    dispose_engines()


@pytest.mark.slow  # 6 tiny runs on PostgreSQL, a second driver waiting for them (~25 s under load)
def test_case7_a_driver_on_another_host_waits_for_a_live_driver_s_trials(
    tmp_path, postgres_url, undisturbed_sweep
):
    import optuna

    from study.sweep.storage import _database_storage

    db = fresh_database(postgres_url, "case7_live")
    hyp, hold = tmp_path / "s.yaml", tmp_path / "go"
    hyp.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    a = _sweep_driver("node-a", hyp, out, db, "--hold", str(hold))  # asks its 3 trials, then holds
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and a.poll() is None:
        with contextlib.suppress(Exception):  # the study is not there yet
            study = optuna.load_study(study_name="tiny_sweep", storage=_database_storage(db))
            if sum(t.state.name == "RUNNING" for t in study.trials) == 3:
                break
        time.sleep(0.5)
    b = _sweep_driver("node-b", hyp, out, db)
    waited = ""
    while b.poll() is None and waited.count("waiting for 3 trial(s)") < 2:  # 5 s apart: past the 3 s grace
        waited += b.stdout.readline()
    hold.touch()  # node-a, alive all along, runs its trials
    log_a, log_b = _log_within(a, 150), waited + _log_within(b, 150)
    assert (a.returncode, b.returncode) == (0, 0), (log_a[-3000:], log_b[-3000:])
    assert "has no heartbeat" not in log_b and "gone" not in log_b, log_b  # node-a's trials were not failed
    assert len(_epochs(log_a)) == 6 and not _epochs(log_b), (log_a, log_b)
    _each_run_once(db, [1] * 6)
    assert _parents(db) == [("node-a", "FINISHED"), ("node-b", "FINISHED")]
    study = optuna.load_study(study_name="tiny_sweep", storage=_database_storage(db))
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 3
    assert _claims(out) == _claims(undisturbed_sweep)
    dispose_engines()


def test_case7_drivers_whose_postgresql_sessions_keep_other_time_zones_agree_on_heartbeats(
    tmp_path, postgres_url, monkeypatch
):
    from study.schema import parse_hypothesis
    from study.sweep import _heartbeat as sweep_heartbeat
    from study.sweep import storage as sweep_storage
    from study.sweep import trials as sweep_trials

    hyp = parse_hypothesis(yaml.safe_load(TINY_SWEEP))
    db = fresh_database(postgres_url, "case7_time_zones")
    monkeypatch.setenv(sweep_storage.HEARTBEAT_ENV, "20")
    # node-a's libpq keeps its session in Los Angeles time (PGTZ): optuna stores the database's now() in
    # a column without a time zone, so its heartbeats read 7-8 hours old in a UTC session
    monkeypatch.setenv("PGTZ", "America/Los_Angeles")
    monkeypatch.setattr(sweep_heartbeat, "_hostname", lambda: "node-a")
    (point,) = sweep_trials._ask(
        sweep_storage.open_optuna_study(hyp, tmp_path, db, "s.yaml"), hyp, 1, tmp_path / "data"
    )
    monkeypatch.delenv("PGTZ")
    monkeypatch.setattr(sweep_heartbeat, "_hostname", lambda: "node-b")
    again = sweep_storage.open_optuna_study(hyp, tmp_path, db, "s.yaml")
    lines: list[str] = []
    assert sweep_heartbeat.recover_stale(again, hyp, lines.append) == 0, (
        lines
    )  # was: node-a's live trial failed
    assert again.trials[point.number].state.name == "RUNNING"
    dispose_engines()


def test_case7_a_parent_that_goes_silent_while_another_invocation_runs_is_closed_when_that_one_ends(
    tmp_path, case6_store, monkeypatch
):
    from study.tracking.tracker import Tracker

    host, client = _posing_on_store(monkeypatch, case6_store, "node-a")
    a = Tracker(tmp_path / "out", "case7_exit").__enter__()
    a._heartbeat.stop()  # node-a's driver is killed
    host["name"] = "node-b"
    b = Tracker(tmp_path / "out", "case7_exit").__enter__()  # restarted at once: a's parent looks alive
    try:
        assert client.get_run(a.parent_id).info.status == "RUNNING"
        time.sleep(1.1)  # node-b's sweep outlasts the grace time
    finally:
        b.__exit__(None, None, None)
        os.close(a._parent_lock)
    # was: RUNNING for good when the restart came within the grace time (2 minutes by default)
    assert [client.get_run(t.parent_id).info.status for t in (a, b)] == ["KILLED", "FINISHED"]
