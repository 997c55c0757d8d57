"""A real Slurm cluster on this host, for the tests and the Slurm benchmark.

munged, slurmctld and one slurmd per node run as real daemons in the foreground,
each in its own process group, configured by files written into a scratch folder
(munge key, ``slurm.conf``, ``cgroup.conf``), talking over 127.0.0.1 on ports
chosen free. Client commands (``sbatch``, ``squeue``, submitit) find it through
``SLURM_CONF``. Several slurmd on one host need Slurm built with
``--enable-multiple-slurmd`` (Debian's is): each node has its own port and spool.

There is no accounting database (``sacct`` answers nothing), so job states come
from the controller (``squeue``/``scontrol``), which is what the backend reads.

    with SlurmCluster(folder, nodes=2) as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)

``stop`` cancels every job, stops the daemons (SIGTERM, then SIGKILL, on each
process group) and then sweeps any process still carrying this cluster's
``SLURM_CONF`` (a job step outliving its slurmd), so nothing is left running.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")


class ClusterUnavailable(RuntimeError):
    """Slurm or munge is not installed here, or would not start: the reason says which."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_tools() -> list[str]:
    return [name for name in DAEMONS + ("sbatch", "squeue", "sinfo", "scancel", "scontrol")
            if shutil.which(name) is None]


class SlurmCluster:
    """A controller and ``nodes`` compute nodes (``cpus`` CPUs each) on this host."""

    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2, name: str = "bhtest"):
        self.root = Path(root)
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.name = name
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- set-up --------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("etc", "munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        host = socket.gethostname().split(".")[0]
        user = pwd.getpwuid(os.getuid()).pw_name
        ctld_port = free_port()
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmUser={user}",  # the user running the tests (root on CI)
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run'}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd.%n.log",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            # Slurm holds a batch job up to 3 s by default (batch_sched_delay) to batch the
            # scheduling of many submissions; a test cluster starts each job at once
            "SchedulerParameters=batch_sched_delay=0",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            # quick to notice, quick to kill: a test cluster, not a production one
            "KillWait=2",
            "MinJobAge=600",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MessageTimeout=10",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for node in self.node_names:
            (self.root / "spool" / node).mkdir(exist_ok=True)
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} "
                         f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainCores=no\n"
                                                       "ConstrainRAMSpace=no\nConstrainDevices=no\n")

    def _spawn(self, label: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{label}.out", "ab")
        try:
            self.procs[label] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env=self.env,
                                                 start_new_session=True, cwd=self.root)
        finally:
            log.close()

    def start(self, timeout_s: float = 60.0) -> "SlurmCluster":
        missing = missing_tools()
        if missing:
            raise ClusterUnavailable("not installed: " + ", ".join(missing)
                                     + " (apt-get install slurm-wlm munge)")
        self.write_config()
        try:
            m = self.root / "munge"
            self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                                   f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                                   f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
            self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged's socket")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._wait(self._controller_answers, timeout_s, "slurmctld to answer")
            for node in self.node_names:
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self._wait(self._all_idle, timeout_s, "every node idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for label, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"{label} exited with {proc.returncode} while waiting for "
                                             f"{what}:\n{self.log_tail(label)}")
            if ready():
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"timed out after {timeout_s:.0f} s waiting for {what}:\n"
                                 + "\n".join(self.log_tail(label) for label in self.procs))

    def log_tail(self, label: str, lines: int = 15) -> str:
        parts = []
        for path in (self.root / "log" / f"{label}.out", self.root / "log" / f"{label}.log",
                     self.root / "log" / f"{label.replace('-', '.')}.log"):
            if path.exists():
                parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def run(self, *argv: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def _controller_answers(self) -> bool:
        return self.run("scontrol", "ping").returncode == 0

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T")
        if out.returncode != 0:
            return {}
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def _all_idle(self) -> bool:
        states = self.node_states()
        return all(states.get(n, "").rstrip("*") == "idle" for n in self.node_names)

    def jobs(self) -> list[str]:
        """Ids of the jobs the controller holds as pending, running or completing."""
        out = self.run("squeue", "--noheader", "--format=%i")
        return out.stdout.split() if out.returncode == 0 else []

    def active_jobs(self) -> list[str]:
        """Ids of the jobs pending or running (not those completing after their end)."""
        out = self.run("squeue", "--noheader", "--format=%i", "--states=PENDING,RUNNING")
        return out.stdout.split() if out.returncode == 0 else []

    def jobs_after(self, timeout_s: float = 30.0) -> list[str]:
        """The jobs still held once those that finished have left the queue (a finished
        job stays COMPLETING while its node cleans up), waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.jobs()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.25)

    # -- tear-down -----------------------------------------------------------

    def stop(self) -> None:
        """Cancel every job, stop every daemon, and sweep what outlived them; never raises
        on a daemon already gone."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--quiet", *self.jobs())
                deadline = time.monotonic() + 15
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for label in sorted(self.procs, key=lambda k: (k == "munged", k == "slurmctld")):
            _stop_group(self.procs[label])
        self._sweep()

    def _sweep(self) -> None:
        """Kill any process still holding this cluster's config (a job or step daemon
        whose slurmd is gone)."""
        conf = str(self.conf)
        me = os.getpid()
        killed = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get("SLURM_CONF") == conf or conf in " ".join(proc.cmdline()):
                    proc.kill()
                    killed.append(proc)
            except (psutil.Error, OSError):
                continue
        psutil.wait_procs(killed, timeout=5)  # gone before anyone counts what outlived the cluster

    def leftovers(self) -> list[int]:
        """Pids of processes still running for this cluster (the daemons' and any with its config)."""
        conf = str(self.conf)
        alive = [p.pid for p in self.procs.values() if p.poll() is None]
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == conf \
                        and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return sorted(set(alive))

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=grace_s)


# --------------------------------------------------------------------------- the fixture


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A two-node Slurm cluster for the session, with ``SLURM_CONF`` set for the client
    commands (and submitit) while it runs. Skipped with the reason where Slurm is not
    installed, unless ``BISECT_HARNESS_REQUIRE_SLURM=1`` (CI), where that fails."""
    required = os.environ.get("BISECT_HARNESS_REQUIRE_SLURM") == "1"
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=2)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        if required:
            raise
        pytest.skip(f"no Slurm cluster on this host: {exc}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the test Slurm cluster outlived it: {left}"
