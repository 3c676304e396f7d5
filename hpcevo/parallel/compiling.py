"""Turns at compiling: the ranks of one node compile a program once.

Every rank of a run traces and lowers the same programs (a rank's share of the population is
data, not a constant, and the collectives run over a communicator whose handle is the same in
every process: ``context._jax_comm``), so the ranks of one node would otherwise run the same XLA
compilation side by side, N times the CPU of one. With the persistent compilation cache on,
``compile_on_node`` lets the node's first rank compile while the others wait (asleep between
polls, not spinning in MPI), then the others compile, which finds the first's programs in the
cache and loads them. Tracing and lowering stay on every rank at once (they are the rank's own
Python work, and lowering is what the cache's key is made from).

Where it applies: CPU ranks, more than one on the node, a context over COMM_WORLD (a study's
groups and islands run over communicators of their own, whose handles differ between ranks), a
compilation cache in use, and ``HPCEVO_NODE_COMPILE`` not ``every``. GPU ranks compile as before,
each for itself: the one lent machine of this project had one GPU, and whether ranks bound to
other GPUs of a node get the same cache entries has not been measured.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .context import ParallelContext
from .control import wait

ENV = "HPCEVO_NODE_COMPILE"  # "once" (the default) or "every": each rank compiles for itself


def shared_compilation(ctx: ParallelContext) -> bool:
    """Whether the ranks of this rank's node take turns at compiling (see the module)."""
    import jax
    from mpi4py import MPI

    node = ctx.node_comm
    # (Over another communicator than COMM_WORLD, e.g. a study's group or an island, each rank's
    # programs hold a handle of its own: the others would find nothing to load.)
    return (node is not None and node.size > 1 and ctx.device_kind != "gpu"
            and (ctx.comm_jax == MPI.COMM_WORLD or ctx.comm_jax == MPI.COMM_SELF)
            and bool(jax.config.jax_compilation_cache_dir)
            and os.environ.get(ENV, "once").strip().lower() != "every")


def compile_on_node(ctx: ParallelContext, lower: Callable[[], Sequence[Any]]) -> None:
    """Collective over the node's ranks of ``ctx``: ``lower()`` (tracing and lowering: on every
    rank at once), then XLA's compilation of what it returned, first on the node's first rank,
    then on the others, which load what it wrote to the compilation cache.

    No rank is left waiting: a rank whose ``lower()`` fails still takes part (it votes against
    turns, so the others compile side by side) and raises afterwards; a failure in the first
    rank's compilation still lets the others go on (they meet it again themselves, or not). The
    caller's agreement (``collective_stage``) decides what every rank raises."""
    error: BaseException | None = None
    programs: Sequence[Any] = ()
    try:
        programs = lower()
    except BaseException as e:  # (raised below, after this rank's part in the collectives)
        error = e
    node = ctx.node_comm
    turns = node is not None and node.size > 1 and _agree(node, error is None and shared_compilation(ctx),
                                                           ctx.comm_jax)
    if error is not None:
        raise error
    if not turns:
        _compile(programs)
    elif node.rank == 0:
        try:
            _compile(programs)
        finally:
            wait(node.Ibarrier())  # (the others may still be lowering theirs)
    else:
        wait(node.Ibarrier())  # (asleep between polls: MPICH's blocking wait would spin on the CPUs it needs)
        _compile(programs)


def _compile(programs: Sequence[Any]) -> None:
    for program in programs:
        program.compile()


def _agree(node: Any, mine: bool, comm_jax: Any) -> bool:
    """Whether every rank of the node takes turns (a rank deciding otherwise, say by its
    environment, would leave the others waiting for a turn it never takes) and its programs hold
    the same communicator handle (MPICH's predefined handles are one number everywhere; Open
    MPI's are addresses, which may differ between processes: then the others would find nothing
    to load and compile after the first, one after the other)."""
    import numpy as np
    from mpi4py import MPI

    handle = MPI._handleof(comm_jax) & ((1 << 62) - 1)
    answer = np.zeros(3, np.int64)
    wait(node.Iallreduce(np.array([int(mine), handle, -handle], np.int64), answer, op=MPI.MIN))
    return bool(answer[0]) and int(answer[1]) == -int(answer[2])
