"""The way in for a program: this process's place in the job, bound to its device."""

from __future__ import annotations

from typing import Any

from .. import schema
from ..errors import UsageError
from .context import ParallelContext, bind, discover
from .control import collective_stage


def init(device: str = "auto", threads: int | str = 1, share_gpus: bool = False, *,
         comm: Any = None) -> ParallelContext:
    """This process's context in the job (``mpiexec -n N python script.py``, or alone), bound to
    its device as ``device`` ("auto", "cpu", "gpu"), ``threads`` (XLA CPU threads per rank, or
    "auto") and ``share_gpus`` ask (``binding.py``). Collective on the first call, and it must
    come before the first JAX computation; later calls return the same context, binding unchanged.
    Raises UsageError on every rank when the binding asked for cannot be had on some rank's node.

    ``comm``: the mpi4py communicator hpcevo is to use, when it is one task of a larger MPI job
    (dask-mpi's workers, a Parsl or Flux task's ranks, ranks split off for other work): every
    collective call of hpcevo's (runs, Loops, studies; their checkpoints and exits) then involves
    only its ranks, never COMM_WORLD, and GPUs are bound by the ranks' order on each node within
    it. Only the ranks of ``comm`` call this; give it on the first call.
    """
    device = schema.check(schema.Device, device, "device", "parallel.init")
    threads = schema.check(schema.Threads, threads, "threads", "parallel.init")
    share_gpus = schema.check(bool, share_gpus, "share_gpus", "parallel.init")
    ctx = discover(comm)
    if ctx.binding is None:
        with collective_stage(ctx, catch=UsageError):
            bind(ctx, device, threads, share_gpus)
    return ctx
