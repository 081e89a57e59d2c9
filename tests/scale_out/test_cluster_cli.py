"""``python -m study submit`` and ``python -m study status``, through the CLI, on real stores and a real
Ray job server (a loopback head with its dashboard)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners.leases._file import FileLeaseStore
from study.cluster.jobs import submit_command
from tests.conftest import TINY_HYPOTHESIS, TINY_SWEEP, env_for, fresh_database

REPO = Path(__file__).resolve().parents[2]


def study_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "study", *args],
        capture_output=True,
        text=True,
        env=env or env_for(),
        cwd=REPO,
        timeout=300,
    )


def status_table(stdout: str) -> dict[str, dict[str, int]]:
    """The ``status`` table as study -> column -> count (checks the header names the columns)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    header = lines[0].split()
    assert header == ["study", "finished", "running", "stalled", "failed", "todo"], stdout
    rows = {}
    for line in lines[1:]:
        if line.startswith("ray jobs"):
            break
        name, *counts = line.split()
        rows[name] = dict(zip(header[1:], map(int, counts), strict=True))
    return rows


def fill_store(store) -> None:
    """Two studies with runs in every state: finished, running (live), stalled (expired), failed, todo."""
    store.announce("alpha", ["a_done", "a_live", "a_dead", "a_failed", "a_todo1", "a_todo2"])
    store.announce("beta", ["b_done1", "b_done2"])
    for key in ("a_done", "a_failed", "b_done1", "b_done2"):
        assert store.acquire(key, "w1", ttl=60)
        store.release(key, "w1", "failed" if key == "a_failed" else "finished")
    assert store.acquire("a_live", "w2", ttl=600)
    assert store.acquire("a_dead", "w3", ttl=0.01)  # its worker died: nobody renews it
    time.sleep(0.05)


EXPECTED = {
    "alpha": {"finished": 1, "running": 1, "stalled": 1, "failed": 1, "todo": 2},
    "beta": {"finished": 2, "running": 0, "stalled": 0, "failed": 0, "todo": 0},
}


def test_status_counts_each_study_s_runs_by_state_from_a_lease_folder(tmp_path):
    fill_store(FileLeaseStore(tmp_path / "out" / "leases"))
    by_out = study_cli("status", "--out", str(tmp_path / "out"))
    assert by_out.returncode == 0, by_out.stderr
    assert status_table(by_out.stdout) == EXPECTED
    by_url = study_cli("status", "--leases", f"file://{tmp_path / 'out' / 'leases'}")
    assert by_url.returncode == 0 and status_table(by_url.stdout) == EXPECTED


@pytest.mark.parametrize("kind", ["folder", "sqlite"])
def test_status_counts_a_study_by_its_own_runs_shared_ones_too(tmp_path, kind):
    """``controls`` plans 10 runs, 5 of them the default study's (trained and leased by it): it counts 10
    (was 5: a lease names the study that trained it), and ``u_shape`` still counts its 5."""
    from runners.leases.members import members, record, record_planned
    from runners.leases.store import open_lease_store
    from runners.shared_out import lease_key, read_token
    from study.cluster.jobs import status_counts

    where = str(tmp_path / "leases") if kind == "folder" else f"sqlite:///{tmp_path / 'leases.db'}"
    store = open_lease_store(where)
    trained, shuffled = [f"t{i}" for i in range(5)], [f"s{i}" for i in range(5)]
    for study, keys in (("u_shape", trained), ("controls", shuffled)):
        store.announce(study, keys)
        for key in keys:
            assert store.acquire(key, "w1", ttl=60, study=study)
            store.release(key, "w1", "finished")
    record(store, "u_shape", trained)
    record(store, "controls", trained + shuffled)
    record(store, "controls", trained)  # recorded again by a rerun: counted once
    counts = status_counts(where)
    assert counts["controls"]["finished"] == 10 and sum(counts["controls"].values()) == 10
    assert counts["u_shape"]["finished"] == 5 and sum(counts["u_shape"].values()) == 5
    # what ``run`` records: every planned run (reused ones too), scoped by the output folder's token
    runs = tmp_path / "out" / "runs"
    record_planned(where, runs, "controls", ["r0", "r1"], training=True)
    token = read_token(tmp_path / "out")
    assert {lease_key("r0", token), lease_key("r1", token)} <= members(open_lease_store(where))["controls"]


def test_status_reads_a_postgresql_lease_store(postgres_url):
    from runners.leases.store import open_lease_store

    db = fresh_database(postgres_url, "status")
    fill_store(open_lease_store(db))
    out = study_cli("status", "--leases", db)
    assert out.returncode == 0, out.stderr
    assert status_table(out.stdout) == EXPECTED


def test_status_on_an_empty_or_unreachable_store(tmp_path):
    empty = study_cli("status", "--out", str(tmp_path))
    assert empty.returncode == 0 and empty.stdout.startswith("no runs in the lease store"), empty
    dead = study_cli("status", "--leases", "postgresql://study:S3cretPW@127.0.0.1:9/none")
    assert dead.returncode == 2 and dead.stdout == ""
    (line,) = dead.stderr.strip().splitlines()
    # the URL once (its password masked), the driver's reason, none of SQLAlchemy's wrapping
    assert line.startswith(
        "error: --leases: cannot read the lease store postgresql://study:***@127.0.0.1:9/none (OperationalError: "
    )
    assert line.count("127.0.0.1:9/none") == 1 and "Connection refused" in line, line
    assert "Background on this error" not in line and "sqlalche.me" not in line and "(psycopg." not in line


def test_submit_to_an_unreachable_cluster_is_one_line_and_writes_nothing(tmp_path):
    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    out = study_cli("submit", str(hyp), "--address", "http://127.0.0.1:9", "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "--address" in line and "127.0.0.1:9" in line
    assert not (tmp_path / "out").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_HYPOTHESIS.replace("kind: u_shape", "kind: v_shape"))
    invalid = study_cli("submit", str(bad), "--address", "http://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert invalid.returncode == 2 and "bad.yaml" in invalid.stderr and "kind" in invalid.stderr


def test_submit_command_runs_a_sweep_file_as_a_sweep_with_absolute_paths(tmp_path, monkeypatch):
    import shlex

    from study.cluster.jobs import SubmitOptions

    monkeypatch.chdir(tmp_path)
    opts = SubmitOptions(leases="postgresql://db/x", storage="postgresql://db/x", gpus_per_run=0.5)
    cmd = shlex.split(submit_command(Path("s.yaml"), Path("res"), opts, sweep=True))
    assert cmd[:4] == [sys.executable, "-m", "study", "sweep"]
    assert cmd[4] == str(tmp_path / "s.yaml") and cmd[cmd.index("--out") + 1] == str(tmp_path / "res")
    assert "--storage" not in cmd and "--leases" not in cmd  # the job's STUDY_STORAGE / STUDY_LEASES
    run = shlex.split(submit_command(Path("t.yaml"), Path("res"), SubmitOptions(storage="postgresql://db/x")))
    assert run[3] == "run" and "--storage" not in run  # a study has no optuna storage


def _agent_starting(monkeypatch, refusals: int) -> list[dict]:
    """Ray's job client as it answers while the head's job agent starts: ``refusals`` submissions refused
    with Ray's own 500, then accepted; returns the submissions it saw (no real sleep between them)."""
    import ray.job_submission

    from study.cluster import jobs as cluster

    seen: list[dict] = []

    class Client:
        def __init__(self, address):
            pass

        def submit_job(self, **job):
            seen.append(job)
            if len(seen) <= refusals:  # what ray.dashboard.modules.dashboard_sdk raises for it
                raise RuntimeError(
                    "Request failed with status code 500: No available agent to submit job, please try again later.."
                )
            return job["submission_id"]

    clock = [0.0]
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setattr(cluster.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cluster.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    return seen


def test_submit_waits_for_the_job_agent_then_submits_once(tmp_path, monkeypatch, capsys):
    from study.cli import main

    seen = _agent_starting(monkeypatch, refusals=3)
    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS)
    assert main(["submit", str(hyp), "--address", "http://head:8265", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr()
    assert len(seen) == 4 and len({j["submission_id"] for j in seen}) == 1  # the refused ones started nothing
    assert printed.out.split()[1] == seen[-1]["submission_id"]
    assert printed.err.strip() == "waiting for the Ray cluster's job agent (up to 120s)"


def test_submit_whose_job_agent_never_comes_is_one_line_within_its_bound(tmp_path, monkeypatch, capsys):
    from study.cli import main
    from study.cluster import jobs as cluster

    seen = _agent_starting(monkeypatch, refusals=10**6)
    hyp, out = tmp_path / "tiny.yaml", tmp_path / "out"
    hyp.write_text(TINY_HYPOTHESIS)
    monkeypatch.setenv(
        "STUDY_LEASES", "postgresql://study:S3cretPW@db/study"
    )  # travels in a file under --out
    assert main(["submit", str(hyp), "--address", "http://head:8265", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "waiting for the Ray cluster's job agent (up to 120s)" and len(err) == 2
    assert err[1].startswith(
        "error: --address: the Ray cluster 'http://head:8265' has no job agent ready after 120s"
    )
    assert (
        cluster.time.monotonic() <= cluster.AGENT_WAIT_S and len(seen) == cluster.AGENT_WAIT_S / 2 + 1
    )  # every 2 s
    assert not list((out / cluster.SECRETS_DIR).iterdir())  # no job will read the secrets file: deleted
    calls = []

    class Refusing:  # any other refusal is raised at once (submit makes it one line), not retried
        def submit_job(self, **job):
            calls.append(job)
            raise RuntimeError("Request failed with status code 400: bad.")

    with pytest.raises(RuntimeError, match="status code 400"):
        cluster.submit_job(Refusing(), {}, "http://head:8265")
    assert len(calls) == 1


@pytest.fixture
def job_cluster(tmp_path):
    """A one-node Ray cluster (2 CPUs) with its dashboard, the job server ``submit`` talks to."""
    from tests.clusters import RayCluster, free_port, unavailable

    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        unavailable("ray[default] not installed: pip install -e '.[ray]'")
    cluster = RayCluster(tmp_path, {"MLFLOW_DISABLE_TELEMETRY": "true"})
    dashboard = free_port()
    cluster.start_node(head=True, num_cpus=2, dashboard_port=dashboard)
    try:
        cluster.wait_for_cpus(2)
        address = f"http://127.0.0.1:{dashboard}"
        wait_for_job_server(address)
        yield address
    finally:
        cluster.stop()


def wait_for_job_server(address: str, timeout: float = 300) -> None:
    """Until the head's dashboard answers and its job agent has run a job (``true``): the cluster's CPUs
    are there seconds before either, and a submission meanwhile is refused (``Failed to connect to Ray``,
    ``No available agent``). The job has no study metadata, so ``status`` does not list it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            client = JobSubmissionClient(address)
            job_id = client.submit_job(entrypoint="true")
            break
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    while (status := client.get_job_status(job_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED}:
        assert time.monotonic() < deadline, client.get_job_logs(job_id)[-3000:]
        time.sleep(0.5)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]


def wait_for_job(address: str, job_id: str, timeout: float = 400) -> str:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client, deadline = JobSubmissionClient(address), time.monotonic() + timeout
    done = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    while (status := client.get_job_status(job_id)) not in done:
        assert time.monotonic() < deadline, client.get_job_logs(job_id)[-3000:]
        time.sleep(1)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
    return client.get_job_logs(job_id)


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_a_submitted_study_runs_as_a_ray_job_and_status_shows_it(tmp_path, job_cluster):
    hyp = tmp_path / "tiny.yaml"
    hyp.write_text(TINY_HYPOTHESIS.replace("seeds: [0, 1, 2]", "seeds: [0, 1]"))
    out = tmp_path / "out"
    sub = study_cli("submit", str(hyp), "--address", job_cluster, "--out", str(out))
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.split()[1]
    assert job_id.startswith("study-tiny-") and f"ray job logs --follow {job_id}" in sub.stdout
    wait_for_job(job_cluster, job_id)
    verdicts = json.loads((out / "studies" / "tiny" / "verdicts.json").read_text())
    assert len(verdicts["runs"]) == 2 and not verdicts["failed"]
    assert verdicts["claims"][0]["verdict"] in {"ACCEPTED", "REJECTED", "INCONCLUSIVE"}
    st = study_cli("status", "--out", str(out), "--address", job_cluster)
    assert st.returncode == 0, st.stderr
    assert status_table(st.stdout) == {
        "tiny": {"finished": 2, "running": 0, "stalled": 0, "failed": 0, "todo": 0}
    }
    jobs = st.stdout.split("ray jobs:", 1)[1].split()
    assert jobs == [job_id, "SUCCEEDED", "tiny"]


@pytest.mark.slow  # the entrypoint differs only by its verb (test_submit_command_...); 20 s of Ray job
def test_a_submitted_sweep_runs_as_a_sweep(tmp_path, job_cluster):
    hyp = tmp_path / "s.yaml"
    hyp.write_text(TINY_SWEEP)
    out = tmp_path / "out"
    sub = study_cli("submit", str(hyp), "--address", job_cluster, "--out", str(out))
    assert sub.returncode == 0, sub.stderr
    wait_for_job(job_cluster, sub.stdout.split()[1])
    trials = (out / "sweeps" / "tiny_sweep" / "trials.csv").read_text().splitlines()
    assert len(trials) == 1 + 3 * 2  # header, then 3 grid points x 2 seeds


@pytest.mark.slow  # a Ray job (~25 s); the default suite checks the entrypoint with a mocked client
def test_a_submitted_sweep_takes_its_database_from_the_variables_and_records_no_password(
    tmp_path, job_cluster, postgres_url
):
    from ray.job_submission import JobSubmissionClient

    db = fresh_database(postgres_url, "submit_env").replace("study@", "study:S3cretPW@")  # trust auth
    hyp, out = tmp_path / "s.yaml", tmp_path / "out"
    hyp.write_text(TINY_SWEEP)
    env = env_for(STUDY_LEASES=db, STUDY_STORAGE=db)
    sub = study_cli("submit", str(hyp), "--address", job_cluster, "--out", str(out), "--no-mlflow", env=env)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.split()[1]
    logs = wait_for_job(job_cluster, job_id)
    info = JobSubmissionClient(job_cluster).get_job_info(job_id)
    assert "S3cretPW" not in json.dumps(info.__dict__, default=str) + logs and "://" not in info.entrypoint
    assert len((out / "sweeps" / "tiny_sweep" / "trials.csv").read_text().splitlines()) == 1 + 3 * 2
    assert not [p for p in out.rglob("*") if p.is_file() and b"S3cretPW" in p.read_bytes()]
    assert not (out / "leases").exists()  # the leases are in the variable's database
    verdicts = json.loads((out / "sweeps" / "tiny_sweep" / "verdicts.json").read_text())
    assert verdicts["command"].startswith("STUDY_LEASES=postgresql://study:***@127.0.0.1:")
    st = study_cli("status", env=env)
    assert st.returncode == 0 and status_table(st.stdout)["tiny_sweep"]["finished"] == 6, st
