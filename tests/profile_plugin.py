"""Where the suite's time goes: one JSON line per test, per pass.

Loaded by conftest.py when ``HPCEVO_TEST_PROFILE`` names a directory (CTest sets it to
``build/profile``). Rank 0 of each pass appends to ``<dir>/<pass>.jsonl``, where the pass is
the pytest marker expression and the rank count, one record per test:

* ``wall``: setup + call + teardown, seconds;
* ``cpu``: CPU seconds of this process and of the children it waited for (a launched job's
  ranks, a Slurm daemon stopped by the test): work done on purpose, by anyone;
* ``compile``: seconds JAX spent in this process tracing, lowering and compiling (a load from
  the persistent compilation cache included), and ``cache_load`` the part of it that was loads;
* ``sleep``: seconds this process spent in ``time.sleep`` (polling, stalls on purpose);
* ``idle``: wall - cpu, floored at 0: waiting on a clock, on another rank, or for a core (or
  on work in processes this one did not start: a Slurm job's ranks are slurmd's children);
* ``busy``: the share of the machine's CPU time that was in use during the test, by anything
  (from /proc/stat): near 1 on a saturated machine, low where the test really waits.

``python scripts/suite-profile.py build/profile`` turns the files into the README's table.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_CACHE_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"


class Profile:
    def __init__(self, directory: str, size: int, markexpr: str):
        self.path = Path(directory) / f"{_pass_name(markexpr, size)}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")  # a pass run again replaces its own records
        self.size = size
        self.compile = 0.0
        self.cache_load = 0.0
        self.slept = 0.0
        self._start: dict[str, tuple[float, float, float, float, float]] = {}
        self._install()

    def _install(self) -> None:
        import jax.monitoring

        def on_duration(event: str, duration: float, **_kw) -> None:
            if event in _COMPILE_EVENTS:
                self.compile += duration
            elif event == _CACHE_EVENT:
                self.cache_load += duration

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        plain_sleep = time.sleep

        def sleep(seconds: float) -> None:
            t = time.perf_counter()
            try:
                plain_sleep(seconds)
            finally:
                self.slept += time.perf_counter() - t

        time.sleep = sleep

    @staticmethod
    def _cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @staticmethod
    def _machine() -> tuple[int, int]:
        """(busy, total) CPU ticks of the whole machine so far; (0, 0) where /proc/stat is not."""
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return sum(ticks) - idle, sum(ticks)

    def start(self, nodeid: str) -> None:
        self._start[nodeid] = (time.perf_counter(), self._cpu(), self.compile, self.cache_load, self.slept,
                               *self._machine())

    def finish(self, nodeid: str, outcome: str) -> None:
        if nodeid not in self._start:
            return
        t0, c0, k0, l0, s0, b0, n0 = self._start.pop(nodeid)
        wall = time.perf_counter() - t0
        cpu = self._cpu() - c0
        b1, n1 = self._machine()
        record = {
            "test": nodeid,
            "file": nodeid.split("::", 1)[0],
            "ranks": self.size,
            "outcome": outcome,
            "wall": round(wall, 3),
            "cpu": round(cpu, 3),
            "compile": round(self.compile - k0, 3),
            "cache_load": round(self.cache_load - l0, 3),
            "sleep": round(self.slept - s0, 3),
            "idle": round(max(0.0, wall - cpu), 3),
            "busy": round((b1 - b0) / (n1 - n0), 3) if n1 > n0 else None,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _pass_name(markexpr: str, size: int) -> str:
    # HPCEVO_TEST_PASS names a pass whose marker expression another pass shares (CMakeLists.txt)
    words = os.environ.get("HPCEVO_TEST_PASS") or markexpr or "all"
    words = "".join(c if c.isalnum() else "-" for c in words).strip("-")
    while "--" in words:
        words = words.replace("--", "-")
    return f"np{size}-{words}"[:120]


def install(config, size: int, rank: int) -> Profile | None:
    directory = os.environ.get("HPCEVO_TEST_PROFILE")
    if not directory or rank != 0:
        return None
    shard = config.getoption("shard", None)
    return Profile(directory, size, (config.option.markexpr or "") + (f" shard {shard}" if shard else ""))
