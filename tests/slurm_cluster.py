"""A real single-node Slurm for the Slurm executor's tests: ``munged``, ``slurmctld`` and ``slurmd`` on this host.

    with slurm_cluster(tmp) as cluster:   # sets SLURM_CONF for this process and its children
        subprocess.run(["sbatch", "--wrap", "true"])

Everything lives in a fresh folder: ``slurm.conf``, munge's key and socket, the daemons' state, spool and
logs. Accounting: Debian's ``slurm-wlm`` without ``slurmdbd`` (which needs MySQL) has no ``sacct``
(``accounting_storage/none``: "Slurm accounting storage is disabled"), so the executor reads states
from ``squeue --states=all`` (``MinJobAge=3600`` keeps ended jobs there), and the controller writes one
line per ended job to ``jobcomp.txt`` (``JobCompType=jobcomp/filetxt``): :meth:`SlurmCluster.ended`
reads it, so a test counts every job that ran and how it ended. The daemons run as root (``SlurmUser``)
and are stopped by their process ids. Time limits: ``KillWait=2``, ``OverTimeLimit`` 0 (a job is
killed at its limit, seen by the controller's check every 30 s), and ``cred_expire=10`` so that a
requeued job waits 10 s, not 120, before it starts again. Missing binaries skip (``tests.clusters.unavailable``: under CI,
which installs them, they fail).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tests.clusters import free_port, unavailable

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
PARTITION = "debug"


def _conf(tmp: Path, host: str, cpus: int) -> str:
    return f"""\
ClusterName=study-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={tmp}/munge.sock,cred_expire=10
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={tmp}/jobcomp.txt
MinJobAge=3600
KillWait=2
InactiveLimit=0
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
NodeName={host} CPUs={cpus} RealMemory=1024 State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """The daemons of one test cluster and the environment (``SLURM_CONF``) its clients need."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.conf = tmp / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        host = socket.gethostname().split(".")[0]
        (self.tmp / "state").mkdir()
        (self.tmp / "spool").mkdir()
        key = self.tmp / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(_conf(self.tmp, host, os.cpu_count() or 1))
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={self.tmp}/munge.sock", f"--key-file={key}"]
            + [f"--pid-file={self.tmp}/munged.pid", f"--log-file={self.tmp}/munged.log"]
            + [f"--seed-file={self.tmp}/munged.seed"],
        )
        self._wait_for(lambda: (self.tmp / "munge.sock").exists(), "munged")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait_for(self._idle, "the node to be idle (sinfo)")

    def _daemon(self, name: str, args: list[str]) -> None:
        log = open(self.tmp / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
        )

    def _idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True, env=self.env(), timeout=30
        )
        return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")

    def _wait_for(self, ready, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (self.tmp / f"{name}.out").read_text()[-2000:]
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"test Slurm: waited {timeout:.0f}s for {what}")
            time.sleep(0.5)

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def ended(self) -> list[dict[str, str]]:
        """One dict per ended job (``jobcomp.txt``: JobId, JobState, ArrayJobId, ArrayTaskId, NodeList...)."""
        try:
            text = (self.tmp / "jobcomp.txt").read_text()
        except FileNotFoundError:
            return []
        return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in text.splitlines()]

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until the controller lists none (their ``slurmstepd`` processes,
        which run in sessions of their own, exit with them)."""

        def jobs() -> str:
            out = subprocess.run(
                ["squeue", "--noheader", "--format=%i"],
                capture_output=True,
                text=True,
                env=self.env(),
                timeout=30,
            )
            return out.stdout.strip() if out.returncode == 0 else ""

        if jobs():
            subprocess.run(
                ["scancel", "--full", "--user=root"], capture_output=True, env=self.env(), timeout=30
            )
            deadline = time.monotonic() + timeout
            while jobs() and time.monotonic() < deadline:
                time.sleep(0.5)

    def stop(self) -> None:
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
            except ProcessLookupError:
                pass


@contextmanager
def slurm_cluster():
    """A running single-node cluster; ``SLURM_CONF`` points this process (and its children) at it."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        unavailable(
            f"Slurm binaries {missing} not found: apt-get install -y --no-install-recommends slurm-wlm munge"
        )
    if os.geteuid() != 0:
        unavailable(
            "the test Slurm runs slurmctld and slurmd as root (SlurmUser=root): run the tests as root"
        )
    try:
        import submitit  # noqa: F401
    except ImportError:
        unavailable("submitit not installed: pip install -e '.[slurm]'")
    tmp = Path(tempfile.mkdtemp(prefix="study-slurm-"))
    cluster, before = SlurmCluster(tmp), os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(tmp, ignore_errors=True)
