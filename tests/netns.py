"""Simulated hosts on one machine, for tests that need several nodes: each host is a network
namespace with its own interface on a private switch, and every process started on it also gets
its own hostname (UTS), mount table (its own /etc/hosts, /dev/shm, /sys, boot id and a local
disk at ``Network.local``), SysV IPC and PID namespace.
The filesystem is otherwise shared, as a cluster's shared filesystem is.

    with Network(tmp_path, ["head", "node1", "node2"]) as net:
        net["node1"].spawn(["slurmd", "-D"], log)
        net["node1"].power_off()        # cable pulled, then every process of the host killed

The switch is a bridge inside a namespace of its own; the addresses are from 198.18.0.0/15
(RFC 2544's benchmarking range) and exist only inside the namespaces made here, so nothing
reaches or leaves the machine. Everything is removed on exit, and namespaces left behind by a
test process that was killed are removed by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

SUBNET = "198.18.0"
PREFIX = "hpcevo"  # namespace names: hpcevo<pid of the test process>-<host>

# PID 1 of each spawned process's namespaces: name the host and give it its own /etc/hosts,
# /dev/shm, local disk and boot id (UCX takes two processes with the same boot id for one machine
# and joins them through shared memory), and a /sys that shows its own network interfaces (the machine's
# cgroups kept in it: slurmd wants them); then run the command and reap whatever is orphaned onto
# it. Its death takes every process of the namespace with it.
INIT = """set -e
hostname "$1"
mount --bind "$2" /etc/hosts
mount --bind "$3" /proc/sys/kernel/random/boot_id
mount --bind "$4" "$5"
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
cgroups=$(mktemp -d)
mount --rbind /sys/fs/cgroup "$cgroups"
mount -t sysfs sysfs /sys
mount --rbind "$cgroups" /sys/fs/cgroup
umount -l "$cgroups" && rmdir "$cgroups"
shift 5
"$@" &
set +e
wait $!
"""


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    missing = [b for b in ("ip", "unshare", "nsenter") if not shutil.which(b)]
    if missing:
        return f"{', '.join(missing)} not found (iproute2, util-linux)"
    name = f"{PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    probe = subprocess.run(["unshare", "--uts", "--ipc", "--mount", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make UTS, IPC, mount and PID namespaces: {probe.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def remove_stale() -> None:
    """Namespaces of test processes that no longer exist (killed before their clean-up ran)."""
    for name in _ip("netns", "list", check=False).split():
        m = re.fullmatch(rf"{PREFIX}(\d+)-.*", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            for pid in _ip("netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", name, check=False)


class Host:
    def __init__(self, network: Network, name: str, addr: str):
        self.network, self.name, self.addr = network, name, addr
        self.netns = f"{network.tag}-{name}"
        self.port = f"p-{name}"[:15]  # its end of the cable, on the switch
        self.inits: list[subprocess.Popen] = []
        self.boot_id = network.root / f"boot_id-{name}"
        self.disk = network.root / f"disk-{name}"  # what the host's processes see at network.local

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run with this host's network (for clients: sbatch, scontrol)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    def spawn(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` on this host, in new UTS, mount and PID namespaces under its network."""
        cmd = [*self.command(["unshare"]), "--uts", "--ipc", "--mount", "--pid", "--fork",
               "--kill-child", "--mount-proc", "bash", "-c", INIT, "init", self.name,
               str(self.network.hosts_file), str(self.boot_id), str(self.disk), str(self.network.local), *argv]
        with open(log, "ab") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.inits.append(p)
        return p

    def pids(self) -> list[int]:
        """Every process on this host (every process in its network namespace)."""
        return [int(p) for p in _ip("netns", "pids", self.netns, check=False).split()]

    def processes(self, pattern: str) -> list[str]:
        """Command lines of this host's processes that contain ``pattern``."""
        out = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if pattern in cmdline:
                    out.append(cmdline.strip())
        return out

    def traffic(self) -> tuple[int, int]:
        """(bytes received, bytes sent) on this host's network interface."""
        (link,) = json.loads(_ip("-n", self.netns, "-j", "-s", "link", "show", "eth0"))
        stats = link["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def cable(self, connected: bool) -> None:
        _ip("-n", self.network.switch, "link", "set", self.port, "up" if connected else "down")

    def power_off(self) -> None:
        """As a node that dies: its cable goes first (no goodbye reaches its peers), then every
        process on it is killed at once."""
        self.cable(False)
        for p in self.inits:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.inits:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        self.inits.clear()

    def _create(self) -> None:
        ns, sw = self.netns, self.network.switch
        _ip("netns", "add", ns)
        _ip("-n", sw, "link", "add", self.port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", self.port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{self.addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


class Network:
    """Hosts on one switch; host i (0-based) of the list has address 198.18.0.(10 + i), except
    a host named "head", which is .1."""

    def __init__(self, root: Path, names: list[str]):
        self.root = root
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.names = list(names)
        self.hosts_file = root / "hosts"
        # A node-local disk at the same path on every host, as /var/spool is on a cluster (a
        # path on the shared filesystem would be one directory for all of them).
        self.local = root / "local"
        self.hosts = {n: Host(self, n, self._addr(n)) for n in names}

    def index(self, name: str) -> int:
        return self.names.index(name)

    def _addr(self, name: str) -> str:
        return f"{SUBNET}.1" if name == "head" else f"{SUBNET}.{10 + self.index(name)}"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Network:
        remove_stale()
        try:
            self.local.mkdir(parents=True, exist_ok=True)
            self.hosts_file.write_text("127.0.0.1 localhost\n"
                                       + "".join(f"{h.addr} {h.name}\n" for h in self.hosts.values()))
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for h in self.hosts.values():
                h.boot_id.write_text(f"{uuid.uuid4()}\n")
                h.disk.mkdir(exist_ok=True)
                h._create()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in self.hosts.values():
            with contextlib.suppress(Exception):
                h.power_off()
        deadline = time.monotonic() + 10
        for name in [h.netns for h in self.hosts.values()] + [self.switch]:
            while _ip("netns", "pids", name, check=False).split() and time.monotonic() < deadline:
                time.sleep(0.1)
            _ip("netns", "del", name, check=False)
