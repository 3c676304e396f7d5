"""Where start-up time goes. Phases, each ending at a mark on this rank (wall-clock):

    python            the interpreter starts
    imports_mpi       hpcevo, JAX and mpi4jax are imported, MPI is initialised, the node probed
    config            the config is read and validated, the rank bound to its device
    setup             problem, algorithm, run directory, checkpoint to resume from
    compile           the run's programs are compiled (or loaded from the compilation cache)
    first_generation  generation 1 (or a resumed run's first chunk) has run
"""

from __future__ import annotations

import os
import time

MARKS: dict[str, float] = {}


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


def mark(name: str) -> None:
    """Record the first time ``name`` is reached (later calls keep the first)."""
    MARKS.setdefault(name, time.time())


# Phases in order; each lasts from the previous mark that exists to its own.
PHASES = ("python", "imports_mpi", "config", "setup", "compile", "first_generation")


def phases() -> dict[str, float]:
    """Seconds spent in each phase reached so far, plus ``total`` (launch to the last mark)."""
    start = process_started()
    out: dict[str, float] = {}
    prev = start
    for name in PHASES:
        t = MARKS.get(name)
        if t is None:
            continue
        if prev is not None:
            out[name] = round(t - prev, 4)
        prev = t
    if start is not None and prev is not None:
        out["total"] = round(prev - start, 4)
    return out
