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
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

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
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(f"""\
ClusterName=hpcevo-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r / 'munge' / 'socket'},cred_expire=10
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
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
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

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
        self._daemon(_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf))
        self._daemon(_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", self.node)
        self._until(lambda: self.run("sinfo", "-h", "-o", "%T", check=False).strip() == "idle", 60,
                    "the node did not become idle")

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
    def run(self, *cmd: str, check: bool = True, cwd: Path | None = None) -> str:
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=cwd, timeout=60)
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


@contextlib.contextmanager
def private_slurm(root: Path, cpus: int = 4) -> Iterator[Slurm]:
    slurm = Slurm(root, cpus)
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()
