"""A private single-node Slurm on localhost for tests: munged, slurmctld and slurmd in the
foreground, every file under one directory, ports of their own; torn down whatever happens.

    with private_slurm(tmp_path) as slurm:
        job = slurm.sbatch(script, cwd=tmp_path)
        slurm.wait(job, "COMPLETED")

``unavailable()`` says why a cluster cannot be had here (not root, packages not installable),
or None. Packages are apt-installed when missing (root, Debian).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import netns

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "munged", "mungekey")
_INSTALL_TRIED: list[str | None] = []


def unavailable() -> str | None:
    """Why no private Slurm can run here, or None; installs the packages once when missing."""
    if all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in BINARIES):
        return None
    if _INSTALL_TRIED:
        return _INSTALL_TRIED[0]
    reason = _install()
    _INSTALL_TRIED.append(reason)
    return reason


def _install() -> str | None:
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it needs root"
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if r.returncode != 0:
            return f"cannot install Slurm ({' '.join(cmd[:2])}: {r.stderr.strip()[-300:]})"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Slurm:
    def __init__(self, root: Path, cpus: int):
        self.root, self.cpus = root, cpus
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        for k in [k for k in self.env if k.startswith(("SLURM_", "PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_"))]:
            if k != "SLURM_CONF":
                del self.env[k]
        self.daemons: list[subprocess.Popen] = []

    # -- set-up ------------------------------------------------------------------------------
    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(mode=0o700, exist_ok=True)
        ctld_port, slurmd_port = self._ports()
        self.conf.write_text(f"""\
ClusterName=hpcevo-test
SlurmctldHost={self._controller()}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r / 'munge' / 'socket'},cred_expire=10
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={self._local() / 'spool'}
SlurmdPidFile={self._local() / 'slurmd.pid'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd'}{self.per_node}.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r / 'log' / 'jobcomp.txt'}
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
{self._extra_config()}{self._nodes()}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    # What differs between one node on localhost and simulated nodes (see Cluster).
    per_node = ""  # SlurmdLogFile's suffix: "-%n" when several slurmd write logs side by side

    def _local(self) -> Path:
        """Where each slurmd keeps its spool and pid file: must be node-local (slurmstepd
        tells other nodes its socket's path there, and they look for it under their own)."""
        return self.root

    def _ports(self) -> list[int]:
        return _free_ports(2)

    def _controller(self) -> str:
        return f"{self.node}(127.0.0.1)"

    def _extra_config(self) -> str:
        return ""

    def _nodes(self) -> str:
        return f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1024 State=UNKNOWN"

    def _daemon(self, *cmd: str) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "w")
        self.daemons.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                             start_new_session=True))

    def start(self) -> None:
        self._write_config()
        m = self.root / "munge"
        subprocess.run([_sbin("mungekey"), "--create", f"--keyfile={m / 'key'}"], check=True,
                       capture_output=True)
        self._daemon(_sbin("munged"), "-F", "--force", f"--socket={m / 'socket'}", f"--key-file={m / 'key'}",
                     f"--pid-file={m / 'pid'}", f"--log-file={m / 'log'}", f"--seed-file={m / 'seed'}")
        self._until(lambda: (m / "socket").exists(), 10, "munged did not start")
        self._start_slurm()
        self._until(self.all_idle, 60, "the nodes did not become idle")

    def _start_slurm(self) -> None:
        self._daemon(_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf))
        self._daemon(_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", self.node)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(ln.split() for ln in out.splitlines() if len(ln.split()) == 2)

    def all_idle(self) -> bool:
        states = self.node_states()
        return bool(states) and set(states.values()) == {"idle"}

    def _until(self, ready, timeout: float, what: str) -> None:
        t0 = time.monotonic()
        while not ready():
            dead = [p.args[0] for p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{what} ({'exited: ' + ', '.join(dead) if dead else 'timed out'})\n"
                                   + self.logs())
            time.sleep(0.2)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                self._until(lambda: not self.run("squeue", "-h", "-o", "%i", check=False).split(), 30,
                            "jobs did not end")
        for p in reversed(self.daemons):  # slurmd, slurmctld, munged
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)

    # -- use ---------------------------------------------------------------------------------
    def client(self, argv: list[str]) -> list[str]:
        """``argv`` as a command that reaches the cluster (sbatch, scontrol, hpcevo jobs submit)."""
        return argv

    def run(self, *cmd: str, check: bool = True, cwd: Path | None = None, timeout: float = 60) -> str:
        r = subprocess.run(self.client(list(cmd)), capture_output=True, text=True, env=self.env, cwd=cwd,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def sbatch(self, script: Path, cwd: Path) -> str:
        return self.run("sbatch", "--parsable", str(script), cwd=cwd).strip().split(";")[0]

    def job(self, job: str) -> dict[str, str]:
        text = self.run("scontrol", "show", "job", "-o", job)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job: str, *states: str, timeout: float = 300) -> dict[str, str]:
        """Wait until the job is in one of ``states``; fail early on a final state not asked for."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
        t0 = time.monotonic()
        while True:
            info = self.job(job)
            state = info.get("JobState", "")
            if state in states:
                return info
            if state in final or time.monotonic() - t0 > timeout:
                raise AssertionError(f"job {job} is {state}, waited for {'/'.join(states)}: {info}\n{self.logs()}")
            time.sleep(0.5)

    # -- hpcevo's jobs -----------------------------------------------------------------------
    def submit(self, tmp: Path, config: str | Path, *options: str) -> str:
        """`hpcevo jobs submit slurm config ...` from ``tmp``: renders tmp/job.sbatch, calls
        sbatch, returns the job id. The job log is tmp/job-<id>.out."""
        cmd = [sys.executable, "-m", "hpcevo", "jobs", "submit", "slurm", str(config), "--time", "00:10:00",
               "--signal-margin", "60", "--output", str(tmp / "job-%j.out"), *options, "-o", str(tmp / "job.sbatch")]
        r = subprocess.run(self.client(cmd), capture_output=True, text=True, cwd=tmp, env=self.env, timeout=120)
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip()
        assert job.isdigit(), job
        return job

    def signal_and_requeue(self, job: str, ready) -> None:
        """Wait for ``ready()``, send the warning signal to the batch shell only, and wait for the
        requeue. The cluster reruns a requeued job after cred_expire (10 s here; Slurm waits for
        the old job's steps to be gone); a job still pending after a minute is started by hand."""
        t0 = time.monotonic()
        while not ready():
            self.wait(job, "RUNNING", "PENDING")
            assert time.monotonic() - t0 < 300, "the job never got going"
            time.sleep(0.2)
        self.run("scancel", "-b", "-s", "USR1", job)
        self.wait(job, "PENDING", "REQUEUED", timeout=120)
        self.start_if_pending(job)

    def start_if_pending(self, job: str, after: float = 60) -> None:
        try:
            self.wait(job, "RUNNING", "COMPLETED", timeout=after)
        except AssertionError:
            self.run("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)


@contextlib.contextmanager
def private_slurm(root: Path, cpus: int = 4) -> Iterator[Slurm]:
    slurm = Slurm(root, cpus)
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()


class Cluster(Slurm):
    """Slurm on simulated nodes (tests/netns.py): a head node running slurmctld, and nodes
    node1..nodeN, each with its own hostname, address and slurmd. munged runs once, on the
    machine, and every node reaches it through its socket on the shared filesystem.

    Commands reach the cluster from the head node (``client``); a job's files are on the
    filesystem every node shares, as on a cluster. ``kill_node`` is a node failure; the
    controller notices it after ``SlurmdTimeout`` (``slurmd_timeout``), marks the node DOWN and
    requeues the jobs that ran on it.
    """

    per_node = "-%n"

    def __init__(self, root: Path, nodes: int = 3, cpus: int = 2, gpus: int = 2, slurmd_timeout: int = 5):
        super().__init__(root, cpus)
        self.node_names = [f"node{i}" for i in range(1, nodes + 1)]
        self.gpus, self.slurmd_timeout = gpus, slurmd_timeout
        self.net = netns.Network(root / "net", ["head", *self.node_names])

    def _ports(self) -> list[int]:
        return [6817, 6818]  # the simulated network is private: the standard ports are free

    def _controller(self) -> str:
        return f"head({self.net['head'].addr})"

    def _local(self) -> Path:
        return self.net.local

    def _extra_config(self) -> str:
        # Node failure is noticed after SlurmdTimeout (300 s by default); short here so that a
        # killed node is DOWN, and its job requeued, within seconds.
        return f"SlurmdTimeout={self.slurmd_timeout}\nMessageTimeout=5\nTCPTimeout=2\nGresTypes=gpu\n"

    def _gres(self) -> None:
        """``gpus`` GPU entries per node in Slurm's GRES. Their device files are character
        devices with the NVIDIA driver's numbers (major 195) on the node's local disk, with no
        driver behind them: Slurm counts, allocates and announces them (CUDA_VISIBLE_DEVICES) as
        it would real ones, and nothing can compute on them."""
        files = [self.net.local / f"nvidia{i}" for i in range(self.gpus)]
        for n in self.node_names:
            for i, f in enumerate(files):
                dev = self.net[n].disk / f.name
                if not dev.exists():
                    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(195, i))
        lines = [f"NodeName={n} Name=gpu File={f}" for n in self.node_names for f in files]
        (self.root / "gres.conf").write_text("\n".join(lines) + "\n")

    def _nodes(self) -> str:
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        return "\n".join(f"NodeName={n} NodeAddr={self.net[n].addr} CPUs={self.cpus} RealMemory=1024{gres} State=UNKNOWN"
                          for n in self.node_names)

    def _on(self, host: str, *argv: str) -> None:
        log = self.root / "log" / f"{Path(argv[0]).name}-{host}.out"
        self.daemons.append(self.net[host].spawn(list(argv), log, env=self.env))

    def _start_slurm(self) -> None:
        self._gres()
        for n in self.node_names:
            (self.net[n].disk / "spool").mkdir(mode=0o700, exist_ok=True)
        self._on("head", _sbin("slurmctld"), "-D", "-i", "-f", str(self.conf))
        for n in self.node_names:
            self._slurmd(n)

    def _slurmd(self, node: str) -> None:
        self._on(node, _sbin("slurmd"), "-D", "-f", str(self.conf), "-N", node)

    def start(self) -> None:
        self.net.__enter__()
        super().start()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.net.__exit__()

    def client(self, argv: list[str]) -> list[str]:
        return self.net["head"].command(argv)

    # -- failures --------------------------------------------------------------------------
    def kill_node(self, node: str) -> None:
        """The node dies: its network goes, then slurmd and every process on it."""
        host = self.net[node]
        self.daemons = [p for p in self.daemons if p not in host.inits]
        host.power_off()

    def revive_node(self, node: str) -> None:
        """The node boots again: network back, slurmd started; it returns to service when it
        registers (ReturnToService=2)."""
        self.net[node].cable(True)
        self._slurmd(node)


@contextlib.contextmanager
def private_cluster(root: Path, nodes: int = 3, cpus: int = 2, gpus: int = 2,
                    slurmd_timeout: int = 5) -> Iterator[Cluster]:
    """A Slurm of ``nodes`` simulated nodes; see Cluster. ``cluster_unavailable()`` says why not."""
    cluster = Cluster(root, nodes, cpus, gpus, slurmd_timeout)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cluster_unavailable() -> str | None:
    return unavailable() or netns.unavailable()


def reference_digest(tmp: Path, config: str | Path, *overrides: str) -> str:
    """The state digest of ``config`` run uninterrupted on one rank, without any launcher."""
    out = tmp / "reference"
    cmd = [sys.executable, "-m", "hpcevo", "run", str(config), "-q", "--set", f"run.out={out}"]
    for o in overrides:
        cmd += ["--set", o]
    r = subprocess.run(cmd, capture_output=True, text=True, env=launcher_free_env(), timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "summary.json").read_text())["state_digest"]


def launcher_free_env() -> dict[str, str]:
    """This environment without any launcher's or scheduler's variables."""
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}
