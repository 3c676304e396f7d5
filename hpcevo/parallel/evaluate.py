"""Sharded evaluation inside a jitted step, compiled to the same program at every rank count.

The candidates are replicated on every rank (every rank ran the same ``ask``). The batch is
padded to ``k`` micro-batches of ``mb`` rows; each rank evaluates a contiguous range of
micro-batches, one micro-batch at a time, into a buffer of ``ceil(k / ranks)`` micro-batches; one
``allgather`` of those buffers and a fixed reordering (a copy: exact for every bit pattern) give
every rank the whole fitness vector.

Why not simply slice a block per rank and evaluate it in one call: XLA chooses how to generate a
reduction (``sum(x**2, -1)``) from the shapes of the whole program, so the same row evaluated in
a block of 100 rows and in a block of 1000 rows can differ in the last bit (seen on XLA CPU, jax
0.10, for several dimensions). That would break "the same seed gives bitwise the same run at any
rank count". Here the problem only ever sees blocks of ``mb`` rows, a size fixed by the
population, never by the rank count, and the range a rank owns is a runtime argument
(``shard``), not a constant XLA could specialise on: the evaluation is one and the same program
on every rank at every rank count; only the exchange after it depends on the rank count.

Why allgather and not an OR-allreduce of zero-padded ``(k, mb)`` buffers (the first design): the
same result, but MPICH's allreduce computes over the whole buffer, and through mpi4jax at 2 ranks
it cost 200 us for 32 KiB of fitness against 18 us for the allgather (min of 15 x 200 calls).

Bounded memory (``batch_size``): a micro-batch larger than ``batch_size`` rows is evaluated in
``ceil(mb / batch_size)`` pieces of ``batch_size`` rows, one after another (``lax.map``), so the
problem's intermediates never hold more rows than that. The pieces, like the micro-batches, are
fixed by the population and the setting, never by the rank count. Whether a row's value is also
the same as in the unchunked run depends on the problem: it is, bit for bit, when a row's value
does not depend on the shape of the block it is evaluated in. hpcevo's own functions are written
that way (``numerical.py``, ``cec2022.py``; tested); for others ``chunking_is_exact`` probes it.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .context import ParallelContext

# Default rows per micro-batch: enough micro-batches (up to 64) to balance the work over many
# ranks, and no fewer than 8 rows so the loop overhead stays small. Depends on n only.
MAX_MICROBATCHES = 64
MIN_MICROBATCH = 8
# On a GPU each micro-batch cost a host round trip (XLA ran the loop, whose trip count was data,
# by copying its condition to the host every iteration; now fixed, below) and a few kernel
# launches: 20 to 36 us on an H200 with jax 0.11.2, where a 128-row Ackley block takes a few.
# Measured (CSO, Ackley, dim 100, one rank, ms per generation against the bare step's): pop
# 16,384 in 64 micro-batches 2.45 ms, in 8 1.37, in 1 1.26 (bare 1.04); pop 262,144 in 64 21.3,
# in 8 19.3 (bare 18.8); docs/gpu.md. So
# a GPU rank takes blocks of at least GPU_MICROBATCH rows, and at most GPU_MAX_MICROBATCHES of them
# (enough to give 16 GPUs work at large populations). Still a function of n alone: the same seed
# gives the same bits at any rank count on GPUs, as on CPUs (a GPU's bits differ from a CPU's).
GPU_MICROBATCH = 2048
GPU_MAX_MICROBATCHES = 16
# Loops of a fixed trip count (``fixed=True``): every rank runs ``slots`` micro-batches (the
# most any rank owns; past its own count, a block evaluated and dropped by the reordering, work
# an uneven split's busiest rank does anyway) and the one-call evaluation has no loop at all. XLA
# on a GPU then runs the loop without copying its condition to the host each iteration (its
# while thunk skips the condition when the trip count is known); a CPU gains nothing from it,
# so there the trip count stays data (``driver/engine.py``, ``loop_shape``).


def microbatch_rows(n: int, requested: int | None = None, device: str = "cpu") -> int:
    """Rows per micro-batch for a batch of ``n``: ``requested`` (``parallel.microbatch``), else the
    default for ranks of this ``device`` kind ("cpu" or "gpu")."""
    if requested:
        return max(1, min(requested, n))
    if device == "gpu":
        return max(1, min(n, max(GPU_MICROBATCH, -(-n // GPU_MAX_MICROBATCHES))))
    return max(1, min(n, max(MIN_MICROBATCH, -(-n // MAX_MICROBATCHES))))


def shard_of(n: int, mb: int, size: int, rank: int) -> tuple[int, int]:
    """(first micro-batch, number of micro-batches) that ``rank`` evaluates; balanced, contiguous."""
    k = -(-n // mb)
    q, rem = divmod(k, size)
    return rank * q + min(rank, rem), q + (1 if rank < rem else 0)



def blockwise(fn: Callable[[jax.Array], jax.Array], blocks: jax.Array, first: jax.Array | int,
              count: jax.Array | int, out: jax.Array) -> jax.Array:
    """``out[i] = fn(blocks[first + i])`` for ``i < count``, one block at a time.

    The block a call sees is a loop-carried buffer, fetched one iteration ahead, never a
    dynamic slice of ``blocks`` inside the body: XLA on CPU fuses such a slice into the problem's
    own fusions, which then recompute the clamped offset per element and lose vectorisation.
    Measured (Ackley, dim 100, one core, min of 7): the plain loop took 1.38x the time of one
    call on the whole 1,024-row block (16-row blocks) and 1.28x at 16,384 rows (256-row blocks);
    this loop 1.03x and 0.98x; for the sphere function 4.0x / 3.3x against 1.26x / 0.88x. Both
    give bitwise the same values (each block is still evaluated alone, at the same shape).
    """
    def body(i, carry):
        out, current = carry
        # Past the last block the index clamps: a block fetched and never used.
        upcoming = lax.dynamic_index_in_dim(blocks, first + i + 1, keepdims=False)
        return lax.dynamic_update_index_in_dim(out, fn(current), i, 0), upcoming

    start = lax.dynamic_index_in_dim(blocks, first, keepdims=False)
    return lax.fori_loop(0, count, body, (out, start))[0]


def slot_layout(k: int, size: int) -> tuple[int, np.ndarray]:
    """How ``k`` blocks, split by ``shard_of``, travel in one allgather: every rank sends ``slots``
    blocks (the most any rank owns; the rest is padding) and ``order[j]`` is where block j lands
    in the gathered (size * slots) buffer."""
    slots = -(-k // size)
    order = np.concatenate([r * slots + np.arange(shard_of(k, 1, size, r)[1]) for r in range(size)])
    return slots, order


def gather_slots(mine: jax.Array, order: np.ndarray, ctx: ParallelContext) -> jax.Array:
    """(slots, ...) on each rank -> (k, ...) on every rank, block j at row j: an exact copy.

    At one rank there is nothing to gather: ``mine`` is the whole buffer, in order. Leaving the
    collective out there keeps the program free of MPI's ordered effects, so JAX dispatches it
    from its C++ fast path (the Python path cost about 1 ms a dispatch, 4 us a generation of a
    cheap step). An ``optimization_barrier`` stands where the collective stood: the evaluation
    stays a separate piece of the program, as it is at several ranks (with the micro-batch loop
    of the first design, leaving the collective out without a barrier changed the bits; the
    digests at 1 to 4 ranks are the test of this).
    """
    if ctx.size == 1:
        return lax.optimization_barrier(mine).reshape(-1, *mine.shape[1:])[: len(order)]
    import mpi4jax  # here, not at import: microbatch_rows and shard_of need no MPI

    _allgather_batches()
    everyone = mpi4jax.allgather(mine, comm=ctx.comm_jax)
    return everyone.reshape(-1, *mine.shape[1:])[order]


def _allgather_batches() -> None:
    """Teach ``jax.vmap`` mpi4jax's allgather (mpi4jax 0.9 has no batching rule for it), so that a
    user's ``jax.vmap`` over ``Loop.functions()`` (many runs, seeds or hyper-parameters, in one
    program) works at any rank count, not only at one, where there is no collective. A batched
    operand is gathered whole, batch axis first, one collective for all: (B, ...) on each rank
    -> (size, B, ...) -> (B, size, ...); every rank must batch alike, as every rank runs the same
    program. A batching rule mpi4jax brings itself is left in place."""
    from jax.interpreters import batching
    from mpi4jax._src.collective_ops.allgather import mpi_allgather_p

    if mpi_allgather_p in batching.fancy_primitive_batchers:  # (where ``primitive_batchers[p] = ...`` lands)
        return

    def rule(args, dims, *, comm):
        (x,), (d,) = args, dims
        return mpi_allgather_p.bind(jnp.moveaxis(x, d, 0), comm=comm), 1

    batching.primitive_batchers[mpi_allgather_p] = rule


class ShardedEvaluator:
    """``evaluate(candidates, shard) -> fitness``: jittable, (n, dim) -> (n,) or, for a
    multi-objective problem, (n, m); the result is replicated."""

    def __init__(self, fn: Callable[..., jax.Array], n: int, ctx: ParallelContext,
                 microbatch: int | None = None, batch_size: int | None = None, block_invariant: bool = False,
                 fixed: bool = False):
        self.fn, self.n, self.ctx, self.fixed = fn, n, ctx, fixed
        self.mb = microbatch_rows(n, microbatch, ctx.device_kind)
        self.k = -(-n // self.mb)
        self.shard = np.asarray(shard_of(n, self.mb, ctx.size, ctx.rank), np.int32)
        self.slots, self.order = slot_layout(self.k, ctx.size)
        self.piece = min(batch_size, self.mb) if batch_size else self.mb
        # A block-invariant problem (a row's value never depends on its block: hpcevo's own
        # functions, tested bitwise) gives the same bits whether a rank's micro-batches are
        # evaluated one at a time or together, so a rank evaluates its slots in one call: no loop
        # of micro-batches (about 0.5 us an iteration on a CPU core, 20-36 us on a GPU, which
        # made a cheap generation up to 1.7x its bare step). Every rank's call has the same
        # shape (slots * mb rows from a data offset), so the rows past a rank's own count (an
        # uneven split) are real candidates or filler, evaluated and dropped by ``order``.
        # Not with a memory bound smaller than that (``batch_size``): then the loop, as before.
        # One rank only: with several, a rank's share is a slice of the batch (``dynamic_slice``
        # outside the loop), and XLA fused the algorithm's ask into that slice, computing the
        # candidates it evaluated at the share's shape: CSO, pop 30, dim 6, Ackley at 2 ranks
        # gave one row's fitness another last bit (tests/test_api.py's save/load test). At one
        # rank the share is the whole batch: no slice, and the digests equal the loop's at 1-4
        # ranks (tests/test_parallel.py, tests/test_algorithms_digest.py).
        self.whole = (block_invariant and ctx.size == 1
                      and (not batch_size or batch_size >= self.slots * self.mb))
        self.rows = self.mb * max(s + self.slots for s, _ in
                                  (shard_of(n, self.mb, ctx.size, r) for r in range(ctx.size)))

    def _micro(self, x: jax.Array, args: tuple) -> jax.Array:
        """The fitness of one micro-batch, in pieces of at most ``self.piece`` rows."""
        mb, piece = self.mb, self.piece
        if piece == mb:
            return self.fn(x, *args)
        pieces = -(-mb // piece)
        if pieces * piece > mb:  # pad with the micro-batch's first row, dropped below
            x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pieces * piece - mb, x.shape[1]))])
        parts = x.reshape(pieces, piece, x.shape[1])
        per_row = jax.eval_shape(lambda p: self.fn(p, *args), jax.ShapeDtypeStruct(parts.shape[1:], x.dtype)).shape[1:]
        out = jnp.zeros((pieces, piece, *per_row), x.dtype)
        f = blockwise(lambda p: self.fn(p, *args).astype(x.dtype), parts, 0, pieces, out)
        return f.reshape(pieces * piece, *f.shape[2:])[:mb]

    def _whole(self, candidates: jax.Array, shard: jax.Array, args: tuple, per_row: tuple) -> jax.Array:
        """This rank's ``slots`` micro-batches evaluated in one call, as (slots, mb, ...)."""
        size = self.slots * self.mb
        dtype = candidates.dtype
        start = shard[0] * self.mb
        if self.fixed:
            # No loop: the barriers keep the block and its fitness pieces of their own (the
            # ask not fused into the block), as the loop's buffers do; one rank, so no slice.
            block = lax.optimization_barrier(lax.dynamic_slice_in_dim(candidates, start, size))
            out = lax.optimization_barrier(self.fn(block, *args).astype(dtype))
            return out.reshape(self.slots, self.mb, *per_row)

        def body(i, carry):
            # The next block is fetched as ``blockwise`` does (never used: one pass), so that the
            # body depends on the loop and XLA cannot hoist the problem's call out of it.
            nxt = lax.dynamic_slice_in_dim(candidates, start + (i + 1) * size, size)
            return self.fn(carry[1], *args).astype(dtype), nxt

        # A loop of one pass (its trip count is data, so XLA keeps the loop): the block reaches
        # the problem as a buffer of its own, as in the loop of micro-batches, never fused with
        # the algorithm's ask, whose code (and so whose last bits) would then depend on the
        # block's shape, which depends on the rank count.
        once = (shard[1] >= 0).astype(jnp.int32)
        block = lax.dynamic_slice_in_dim(candidates, start, size)
        out = lax.fori_loop(0, once, body, (jnp.zeros((size, *per_row), dtype), block))[0]
        return out.reshape(self.slots, self.mb, *per_row)

    def __call__(self, candidates: jax.Array, shard: jax.Array, *args, used: jax.Array | None = None) -> jax.Array:
        """``args`` (e.g. the generation number) are passed on to the problem function. ``used``:
        only the first ``used`` rows matter (IPOP's active lambda of its largest population):
        micro-batches past them are not evaluated, and those rows get inf. The rows evaluated
        give the same bits either way (each micro-batch is evaluated alone, at the same shape)."""
        n, mb, k = self.n, self.mb, self.k
        candidates = lax.optimization_barrier(candidates)
        whole = self.whole and used is None
        rows = self.rows if whole else k * mb
        if rows > n:
            # Pad with a real candidate (row 0), not zeros: zeros may lie outside the problem's
            # domain and raise floating-point trouble. Padded results are dropped below.
            filler = jnp.broadcast_to(candidates[:1], (rows - n, candidates.shape[1]))
            candidates = jnp.concatenate([candidates, filler])
        dtype = candidates.dtype
        per_row = jax.eval_shape(lambda x: self._micro(x, args),
                                 jax.ShapeDtypeStruct((mb, candidates.shape[1]), dtype)).shape[1:]
        if whole:
            mine = self._whole(candidates, shard, args, per_row)
        else:
            batches = candidates.reshape(k, mb, candidates.shape[1])
            count = self.slots if self.fixed else shard[1]
            if used is not None:  # this rank's micro-batches that hold used rows
                count = jnp.clip((used + mb - 1) // mb - shard[0], 0, shard[1])
            mine = blockwise(lambda x: self._micro(x, args).astype(dtype), batches, shard[0], count,
                             jnp.zeros((self.slots, mb, *per_row), dtype))
        fitness = gather_slots(mine, self.order, self.ctx).reshape(k * mb, *per_row)[:n]
        if used is not None:
            rows = (jnp.arange(n) < used).reshape(n, *(1,) * len(per_row))
            fitness = jnp.where(rows, fitness, jnp.asarray(jnp.inf, dtype))
        return lax.optimization_barrier(fitness)


def chunking_is_exact(fn: Callable[..., jax.Array], x: jax.Array, piece: int, *args) -> bool:
    """Whether evaluating the block ``x`` in pieces of ``piece`` rows gives bitwise the values of
    evaluating it whole (for this ``x``: a probe, not a proof). Compiles ``fn`` at two shapes."""
    whole = jax.jit(lambda a: fn(a, *args))(x)
    n = x.shape[0]
    pieces = -(-n // piece)
    padded = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pieces * piece - n, x.shape[1]))])
    parts = jax.jit(lambda a: lax.map(lambda p: fn(p, *args), a))(padded.reshape(pieces, piece, -1))
    return bool(jnp.array_equal(parts.reshape(pieces * piece, *parts.shape[2:])[:n], whole))
