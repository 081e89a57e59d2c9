"""Real services for the scale-out tests: a throwaway PostgreSQL cluster and a loopback Ray cluster.

Each helper starts its processes in their own process group and stops exactly that group. A missing
binary or package skips with the reason, unless ``CI`` is set: then it fails (CI installs both).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def unavailable(reason: str):
    """Skip with ``reason``; fail instead under CI, where the service must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the scale-out tests must run)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@contextmanager
def postgres():
    """A PostgreSQL server on 127.0.0.1 with trust auth for user ``study``; yields its database URL.

    Its folder is a fresh one under the system temp folder (pytest's is private to root; postgres refuses
    to run as root, so it runs as the ``postgres`` user) and is removed afterwards."""
    if os.environ.get("STUDY_TEST_POSTGRES_URL"):  # one already running
        yield os.environ["STUDY_TEST_POSTGRES_URL"]
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        unavailable("PostgreSQL binaries (initdb, pg_ctl) not found: apt-get install -y postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg not installed: pip install -e '.[ray]'")
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        as_user = ["runuser", "-u", "postgres", "--"]
    tmp = Path(tempfile.mkdtemp(prefix="study-pg-"))
    data, port = tmp / "pgdata", free_port()
    if as_user:
        shutil.chown(tmp, "postgres")
    subprocess.run(
        [*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "study"], check=True, capture_output=True
    )
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        [*as_user, pg_ctl, "-D", str(data), "-o", opts, "-l", str(tmp / "pg.log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://study@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


class RayCluster:
    """A Ray head and worker nodes on this host (``ray start --block``, one process group each)."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp, self.port, self.nodes = tmp, free_port(), []
        self.env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            **env,
        }
        self.address = f"127.0.0.1:{self.port}"

    def start_node(
        self, head: bool, num_cpus: int = 1, dashboard_port: int | None = None
    ) -> subprocess.Popen:
        """Start a node; a head with ``dashboard_port`` also runs the dashboard (Ray's job server)."""
        ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
        args = [
            ray,
            "start",
            "--block",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            # the job agent's port is fixed (52365) by default: a second node or cluster on this host (the
            # session's `ray_address`, another test run) could not start its agent, and a head without one
            # refuses every job ("No available agent to submit job")
            f"--dashboard-agent-listen-port={free_port()}",
        ]
        if head and dashboard_port:
            args += ["--head", f"--port={self.port}", "--include-dashboard=true"]
            args += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
        elif head:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            args += [f"--address={self.address}"]
        log = open(self.tmp / f"ray_node{len(self.nodes)}.log", "w")
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.nodes.append(proc)
        return proc

    def wait_for_cpus(self, cpus: int, timeout: float = 180) -> None:
        import ray

        if not ray.is_initialized():
            deadline = time.monotonic() + timeout
            while True:
                try:
                    ray.init(address=self.address, configure_logging=False, log_to_driver=False)
                    break
                except Exception:  # noqa: BLE001 - the head is still starting
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(2)
        deadline = time.monotonic() + timeout
        while sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]) < cpus:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray cluster has not reached {cpus} CPUs")
            time.sleep(1)

    def stop_node(self, proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)

    def stop(self) -> None:
        import ray

        ray.shutdown()
        for proc in reversed(self.nodes):  # SIGKILL: Ray's graceful stop takes tens of seconds
            self.stop_node(proc)


@contextmanager
def ray_cluster(tmp: Path, workers: int = 2, env: dict[str, str] | None = None):
    """A head (1 CPU) and ``workers - 1`` more nodes of 1 CPU each; the driver (this process) connected."""
    try:
        import ray  # noqa: F401
    except ImportError:
        unavailable("ray not installed: pip install -e '.[ray]'")
    cluster = RayCluster(tmp, env or {})
    try:
        cluster.start_node(head=True)
        for _ in range(workers - 1):
            cluster.start_node(head=False)
        cluster.wait_for_cpus(workers)
        yield cluster
    finally:
        cluster.stop()


class Outage:
    """A TCP proxy on 127.0.0.1 in front of a server, that can drop every connection and refuse new ones
    for a while (:meth:`down` / :meth:`up`): a database outage, as a worker's network sees it."""

    def __init__(self, target_port: int):
        import threading

        self.target, self.port = target_port, free_port()
        self._lock, self._conns, self._server = threading.Lock(), [], None
        self.up()

    def url(self, base: str) -> str:
        """``base`` (a URL to the target) pointed at this proxy instead."""
        return base.replace(f":{self.target}/", f":{self.port}/")

    def up(self) -> None:
        import threading

        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def down(self) -> None:
        """Close the listener and every proxied connection (clients see their connections reset)."""
        with self._lock:
            server, self._server, conns, self._conns = self._server, None, self._conns, []
        if server is not None:
            try:
                server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            except OSError:
                pass
            server.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self, server: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed: down()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
