"""Islands on ranks: which rank hosts which island, each island's communicator, and the one
collective that carries migrants between islands.

With at least as many ranks as islands, the ranks split into one group per island
(``MPI_Comm_split``; contiguous, sizes differing by at most one) and each island's evaluation is
sharded over its group as a lone population's is over the job. With fewer ranks than islands, a
rank hosts several islands, each on a group of one. Either way an island's generation sees the
same numbers (sharded evaluation is bitwise independent of the rank count), and migration sees
the same table of emigrants on every rank: so the layout never changes a bit of the run.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .context import ParallelContext, context_for


@dataclasses.dataclass(frozen=True)
class IslandLayout:
    """``count`` islands on ``size`` ranks, seen from ``rank``."""

    count: int
    size: int
    rank: int

    def islands_of(self, rank: int) -> tuple[int, ...]:
        """The islands rank ``rank`` computes (one when size >= count)."""
        if self.size >= self.count:
            return (rank * self.count // self.size,)
        return tuple(i for i in range(self.count) if i * self.size // self.count == rank)

    @property
    def local(self) -> tuple[int, ...]:
        return self.islands_of(self.rank)

    def ranks_of(self, island: int) -> tuple[int, ...]:
        """The ranks that hold ``island`` (its group; the first is its leader)."""
        return tuple(r for r in range(self.size) if island in self.islands_of(r))

    @property
    def per_rank(self) -> int:
        """The most islands any rank hosts (the rows each rank sends in the exchange)."""
        return -(-self.count // self.size)

    def table_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Where island i's row lands in the gathered (size, per_rank, ...) buffer: (rank, slot)
        of its group's leader."""
        ranks, slots = [], []
        for i in range(self.count):
            leader = self.ranks_of(i)[0]
            ranks.append(leader)
            slots.append(self.islands_of(leader).index(i))
        return np.asarray(ranks, np.int32), np.asarray(slots, np.int32)


def island_context(ctx: ParallelContext, layout: IslandLayout) -> ParallelContext:
    """The context of this rank's island group (collective over ``ctx``): the island's
    communicators, rank and size within the group. A rank hosting several islands gets a group
    of one for all of them.

    Made once per (context, island count) in a process: the communicators' handles are part of
    the programs mpi4jax compiles, so new ones for every run of the same islands would miss the
    persistent compilation cache every time."""
    key = (ctx.comm_ctl.py2f(), layout.count)
    if key not in _GROUPS:
        color = layout.local[0] if layout.size >= layout.count else layout.size + ctx.rank
        comm = ctx.comm_ctl.Split(color, key=ctx.rank)
        try:
            _GROUPS[key] = context_for(comm)
        finally:
            comm.Free()
    return _GROUPS[key]


_GROUPS: dict[tuple[int, int], ParallelContext] = {}


def gather_islands(rows, layout: IslandLayout, ctx: ParallelContext):
    """Inside jitted code: ``rows`` (this rank's islands, ``(len(layout.local), ...)``) ->
    every island's row, ``(count, ...)``, in island order, on every rank: one allgather over the
    whole job (issued at one rank too, where it is a copy, so that the program XLA compiles has
    the same shape at every rank count)."""
    import jax.numpy as jnp
    import mpi4jax

    pad = layout.per_rank - rows.shape[0]
    if pad:
        rows = jnp.concatenate([rows, jnp.zeros((pad, *rows.shape[1:]), rows.dtype)])
    everyone = mpi4jax.allgather(rows, comm=ctx.comm_jax)  # (size, per_rank, ...)
    ranks, slots = layout.table_index()
    return everyone[ranks, slots]
