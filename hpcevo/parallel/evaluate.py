"""Sharded evaluation inside a jitted step, compiled to the same program at every rank count.

The candidates are replicated on every rank (every rank ran the same ``ask``). The batch is
padded to ``k`` micro-batches of ``mb`` rows; each rank evaluates a contiguous range of
micro-batches, writes their fitness bit patterns into a zeroed ``(k, mb)`` buffer, and one
``allreduce`` with bitwise OR merges the buffers (OR with zeros is exact, for every bit pattern).

Why not simply slice a block per rank and allgather it: XLA chooses how to generate a reduction
(``sum(x**2, -1)``) from the shapes of the whole program, so the same row evaluated in a block of
100 rows and in a block of 1000 rows can differ in the last bit (seen on XLA CPU, jax 0.10, for
several dimensions). That would break "the same seed gives bitwise the same run at any rank
count". Here every shape depends on the batch size and ``mb`` only, never on the rank count, and
the range a rank owns is a runtime argument (``shard``), not a constant XLA could specialise on:
all ranks at all rank counts run one and the same program on different data.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from jax import lax
from mpi4py import MPI

from .context import ParallelContext

# Default rows per micro-batch: enough micro-batches (up to 64) to balance the work over many
# ranks, and no fewer than 8 rows so the loop overhead stays small. Depends on n only.
MAX_MICROBATCHES = 64
MIN_MICROBATCH = 8


def microbatch_rows(n: int, requested: int | None = None) -> int:
    if requested:
        return max(1, min(requested, n))
    return max(1, min(n, max(MIN_MICROBATCH, -(-n // MAX_MICROBATCHES))))


def shard_of(n: int, mb: int, size: int, rank: int) -> tuple[int, int]:
    """(first micro-batch, number of micro-batches) that ``rank`` evaluates; balanced, contiguous."""
    k = -(-n // mb)
    q, rem = divmod(k, size)
    return rank * q + min(rank, rem), q + (1 if rank < rem else 0)


_UINT = {4: jnp.uint32, 8: jnp.uint64}


class ShardedEvaluator:
    """``evaluate(candidates, shard) -> fitness``: jittable, (n, dim) -> (n,) or, for a
    multi-objective problem, (n, m); the result is replicated."""

    def __init__(self, fn: Callable[[jax.Array], jax.Array], n: int, ctx: ParallelContext,
                 microbatch: int | None = None):
        self.fn, self.n, self.ctx = fn, n, ctx
        self.mb = microbatch_rows(n, microbatch)
        self.k = -(-n // self.mb)
        self.shard = np.asarray(shard_of(n, self.mb, ctx.size, ctx.rank), np.int32)

    def __call__(self, candidates: jax.Array, shard: jax.Array) -> jax.Array:
        n, mb, k = self.n, self.mb, self.k
        candidates = lax.optimization_barrier(candidates)
        if k * mb > n:
            # Pad with a real candidate (row 0), not zeros: zeros may lie outside the problem's
            # domain and raise floating-point trouble. Padded results are dropped below.
            filler = jnp.broadcast_to(candidates[:1], (k * mb - n, candidates.shape[1]))
            candidates = jnp.concatenate([candidates, filler])
        batches = candidates.reshape(k, mb, candidates.shape[1])
        dtype = candidates.dtype
        utype = _UINT[jnp.dtype(dtype).itemsize]
        per_row = jax.eval_shape(self.fn, jax.ShapeDtypeStruct((mb, candidates.shape[1]), dtype)).shape[1:]

        def body(i, out):
            j = shard[0] + i
            x = lax.dynamic_index_in_dim(batches, j, keepdims=False)
            f = self.fn(x).astype(dtype)
            return lax.dynamic_update_index_in_dim(out, lax.bitcast_convert_type(f, utype), j, 0)

        bits = lax.fori_loop(0, shard[1], body, jnp.zeros((k, mb, *per_row), utype))
        # Issued at one rank too (where it is a copy): leaving it out changes how XLA compiles
        # the rest of the step, and with it the last bits of the state (seen: CSO, pop 1024).
        bits = mpi4jax.allreduce(bits, op=MPI.BOR, comm=self.ctx.comm_jax)
        fitness = lax.bitcast_convert_type(bits, dtype).reshape(k * mb, *per_row)[:n]
        return lax.optimization_barrier(fitness)
