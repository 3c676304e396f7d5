"""Where start-up time goes. Phases, each ending at a mark on this rank (wall-clock):

    python            the interpreter starts
    imports_mpi       hpcevo, JAX and mpi4jax are imported, MPI is initialised, the node probed
    config            the config is read and validated, the rank bound to its device
    setup             problem, algorithm, run directory, checkpoint to resume from
    compile           the run's programs are compiled (or loaded from the compilation cache)
    first_generation  generation 1 (or a resumed run's first chunk) has run

The first three are the process's; the last three are each run's (``begin_run``). A process that
runs many (a study's group, a script calling ``hpcevo.run`` in a loop) records each run's own:
its first run's phases count from the process's start, python and imports included; a later
run's from its own start, with only setup, compile and first_generation.
"""

from __future__ import annotations

import os
import time

MARKS: dict[str, float] = {}
RUN_PHASES = ("setup", "compile", "first_generation")
_RUN = {"count": 0, "start": None}  # runs begun in this process; when the current one began (not the first)


def process_started() -> float | None:
    """Wall-clock time this process started (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def begin_run() -> None:
    """A run starts in this process: the marks of the run before it (setup, compile,
    first_generation) are dropped, and a second or later run's phases count from now."""
    _RUN["count"] += 1
    if _RUN["count"] > 1:
        for name in RUN_PHASES:
            MARKS.pop(name, None)
        _RUN["start"] = time.time()


def mark(name: str) -> None:
    """Record the first time ``name`` is reached (later calls keep the first; a run's own marks,
    until the next ``begin_run``)."""
    MARKS.setdefault(name, time.time())


# Phases in order; each lasts from the previous mark that exists to its own.
PHASES = ("python", "imports_mpi", "config", "setup", "compile", "first_generation")


def phases() -> dict[str, float]:
    """Seconds spent in each phase reached so far, plus ``total`` (launch to the last mark; for a
    process's second or later run, that run's phases alone, ``total`` from its start)."""
    later = _RUN["start"]
    start = process_started() if later is None else later
    out: dict[str, float] = {}
    prev = start
    for name in PHASES if later is None else RUN_PHASES:
        t = MARKS.get(name)
        if t is None:
            continue
        if prev is not None:
            out[name] = round(t - prev, 4)
        prev = t
    if start is not None and prev is not None:
        out["total"] = round(prev - start, 4)
    return out
