"""Problems for tests/test_watchdog.py: runs that are slow but healthy, and ranks that stall.

Each reads its schedule from the environment (WD_*), so one file serves every case. The rank is
the launcher's (PMI_RANK): these run under mpiexec only.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

RANK = int(os.environ.get("PMI_RANK", "0"))
_calls = {"n": 0}


def _sleep_for(call: int) -> float:
    """WD_SLOW = "grow:<first>:<factor>:<calls>": each call sleeps first * factor**(call/calls),
    up to factor times longer at the last call; "jump:<first>:<then>:<at>": first, then ``then``
    from call ``at``."""
    spec = os.environ.get("WD_SLOW", "")
    if not spec:
        return 0.0
    kind, a, b, c = spec.split(":")
    if kind == "grow":
        return float(a) * float(b) ** (min(call, int(c)) / int(c))
    return float(a) if call < int(c) else float(b)


def slowing(x):
    """A host (NumPy) sphere whose calls, one per generation on each rank, take longer."""
    call = _calls["n"]
    _calls["n"] += 1
    time.sleep(_sleep_for(call))
    stall = os.environ.get("WD_STALL", "")  # "<rank>:<call>:stop|sleep"
    if stall:
        rank, at, how = stall.split(":")
        if RANK == int(rank) and call == int(at):
            print(f"WD-STALL rank {RANK} at {time.time():.3f}", flush=True)
            if how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)  # the whole process: heartbeats too
            else:
                time.sleep(600)
    return np.sum(np.asarray(x, dtype=np.float64) ** 2, axis=-1)


_traced = {"slow": False}


def slow_to_trace(x):
    """A JAX sphere that takes WD_TRACE seconds to trace on rank 1: a long compilation there
    while the other ranks wait for it in the first generation. Once: the first trace after the
    problem was loaded (a run traces it about ten times; loading, before the run's clock for
    compilation starts, traces it to find its shape)."""
    import traceback

    import jax.numpy as jnp

    loading = any(f.name == "load_user_problem" for f in traceback.extract_stack())
    if RANK == 1 and not loading and not _traced["slow"]:
        _traced["slow"] = True
        mark = os.environ.get("WD_TRACE_MARK")
        if mark:  # (for a test that signals the job while this rank compiles)
            open(mark, "w").close()
        time.sleep(float(os.environ.get("WD_TRACE", "0")))
    return jnp.sum(x * x)


def _slow_checkpoints() -> None:
    """WD_CHECKPOINT = seconds: rank 1 takes that much longer for each checkpoint write, while the
    others wait for it inside the collective write."""
    seconds = float(os.environ.get("WD_CHECKPOINT", "0"))
    if not seconds or RANK != 1:
        return
    import hpcevo.checkpoint as checkpoint

    real = checkpoint.write
    if getattr(real, "slowed", False):
        return

    def write(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    write.slowed = True
    checkpoint.write = write


_slow_checkpoints()
