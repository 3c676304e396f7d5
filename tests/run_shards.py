"""Run one pytest selection as N processes at the same time, each a shard of it (conftest.py's
``--shard I/N``), and end with the first failing shard's exit status.

For a tier whose tests mostly wait (the watchdog's: jobs that sleep or wait for a stalled rank):
N shards side by side take about the wall time of the longest one, on the cores one tier alone
leaves idle. One CTest test, so that CTest schedules it as one piece (CMakeLists.txt).

    python tests/run_shards.py N [pytest arguments...]

Each shard's output is printed whole, in shard order, once it has ended. ``HPCEVO_TEST_PASS``,
when set, gets the shard's number appended (each shard writes its own profile).
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 1 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python tests/run_shards.py N [pytest arguments...]", file=sys.stderr)
        return 2
    n, args = int(argv[0]), argv[1:]
    name = os.environ.get("HPCEVO_TEST_PASS", "")
    procs = []
    for i in range(n):
        env = {**os.environ, **({"HPCEVO_TEST_PASS": f"{name}-{i}"} if name else {})}
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest", *args, "--shard", f"{i}/{n}"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    codes = []
    for i, p in enumerate(procs):
        out, _ = p.communicate()
        print(f"----- shard {i}/{n}: exit {p.returncode}\n{out}", flush=True)
        codes.append(p.returncode)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
