"""Run pytest as several processes at the same time and end with the first failing one's exit
status. Two forms:

    python tests/run_shards.py N [pytest arguments...]
        one selection as N shards (conftest.py's ``--shard I/N``), for a tier whose tests mostly
        wait (the watchdog's: jobs that sleep or wait for a stalled rank): N shards side by side
        take about the wall time of the longest one, on the cores one tier alone leaves idle;
    python tests/run_shards.py apart [common arguments...] +NAME [arguments...] +NAME [arguments...]
        one process per ``+NAME`` group, each with the common arguments and its own, for tiers
        that wait on different things (the simulated Slurm cluster's node failures and the
        private single-node Slurm's job scripts): each process's profile is the pass NAME.

One CTest test either way, so that CTest schedules it as one piece (CMakeLists.txt). Each
process's output is printed whole, in order, once it has ended. In the first form
``HPCEVO_TEST_PASS``, when set, gets the shard's number appended (each shard writes its own
profile).
"""

from __future__ import annotations

import os
import subprocess
import sys

USAGE = ("usage: python tests/run_shards.py N [pytest arguments...]\n"
         "       python tests/run_shards.py apart [common arguments...] +NAME [arguments...] +NAME [arguments...]")


def _jobs(argv: list[str]) -> list[tuple[str, list[str], dict[str, str]]] | None:
    """(label, pytest arguments, environment changes) per process, or None for bad arguments."""
    if argv and argv[0] == "apart":
        common, groups = [], []
        for a in argv[1:]:
            if a.startswith("+") and len(a) > 1:
                groups.append((a[1:], []))
            elif groups:
                groups[-1][1].append(a)
            else:
                common.append(a)
        if len(groups) < 2:
            return None
        return [(name, [*common, *args], {"HPCEVO_TEST_PASS": name}) for name, args in groups]
    if len(argv) < 1 or not argv[0].isdigit() or int(argv[0]) < 1:
        return None
    n, args = int(argv[0]), argv[1:]
    name = os.environ.get("HPCEVO_TEST_PASS", "")
    return [(f"shard {i}/{n}", [*args, "--shard", f"{i}/{n}"], {"HPCEVO_TEST_PASS": f"{name}-{i}"} if name else {})
            for i in range(n)]


def main(argv: list[str]) -> int:
    jobs = _jobs(argv)
    if jobs is None:
        print(USAGE, file=sys.stderr)
        return 2
    procs = [(label, subprocess.Popen([sys.executable, "-m", "pytest", *args], env={**os.environ, **env},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for label, args, env in jobs]
    codes = []
    for label, p in procs:
        out, _ = p.communicate()
        print(f"----- {label}: exit {p.returncode}\n{out}", flush=True)
        codes.append(p.returncode)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
