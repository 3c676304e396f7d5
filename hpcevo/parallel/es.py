"""One generation of an evolution strategy with no rank ever holding the whole population.

For OpenES, PGPE and SNES with ``distributed = true`` (``hpcevo/algorithms/_es.py``,
``BlockedES``). Their population is mean + noise, and the update needs only weighted sums of
per-sample noise terms, so nothing population-sized has to exist anywhere:

1. Generate and evaluate. The ``units`` noise rows (pairs for mirrored sampling) are cut into
   ``k`` blocks of ``b`` rows (a function of the population only). Each rank takes a contiguous
   range of blocks (``shard``, runtime data, as in ``evaluate.py``), regenerates each block's
   noise from its counter-based key fold_in(key, block), builds and evaluates its candidates, and
   writes their fitness into its own buffer of ``slots = ceil(k / ranks)`` blocks. One allgather
   of those buffers and a fixed reordering (a copy) give every rank the whole fitness vector
   (pop scalars).
2. Shape and accumulate. Every rank turns the fitness into per-unit weights (ranks, utilities;
   replicated). Each rank regenerates its blocks' noise once more and computes each block's
   share of the update sums, an (a, d) partial, into its (slots, a, d) buffer; a second
   allgather brings all k partials to every rank, which adds them in the same fixed pairwise
   order (``BlockedES.combine``) and applies the update.

Why not a plain float SUM allreduce of per-rank partial sums: its grouping follows the rank
count (and MPI's reduction algorithm), so the update's last bits would change with the number of
ranks. Here a block's partial is computed whole on one rank with fenced, fixed-order arithmetic,
so it has the same bits wherever it is computed; gathering copies bits exactly; the final sum has
a fixed order. The result is bitwise the same at every rank count, and bitwise the same as the
replicated ``ask``/``tell`` of the same strategy, which computes the same blocks in one program.

Why an allgather and not a bitwise-OR allreduce of zero-padded (k, a, d) buffers (the first
design, equally exact): the allreduce moves and ORs the whole k-block buffer at every step of its
algorithm, while the allgather moves each block once. Measured here (2-core VM, MPICH): the
exchange of 64 partials of 10^6 floats alone took 463 ms as an OR allreduce against 212 ms as an
allgather at 2 ranks (943 / 503 ms at 4); a whole generation of OpenES at dim 20,000, pop 4,096
(``benchmarks/es_distributed_memory.py --only mid-d``) 2.18 -> 1.88 s at 2 ranks and
2.52 -> 1.99 s at 3, peak memory per rank unchanged (0.40 GB).

What it costs, against a SUM allreduce of one (a, d) vector: the exchange is k (a, d) partials
(k <= 64 by default: 256 MB for a = 1, d = 10^6, float32), and memory per rank is the gathered
partials plus one block's noise and candidates, (copies + 1) b d values: O((k a + b) d),
independent of the population size and of the rank count (the population itself would be pop d).
Compute: the noise is generated twice (once per pass) instead of once, which is what keeps
memory at a block rather than pop/N rows. ``block`` trades the two: larger blocks, fewer
partials to exchange.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .context import ParallelContext
from .evaluate import gather_slots, shard_of, slot_layout


class ShardedESStep:
    """``step(state, shard) -> (state, raw fitness (pop,), pick)``: one generation, jittable.

    ``pick(i)`` regenerates candidate ``i`` of the generation (one noise row), for the run's
    best-so-far tracking.
    """

    def __init__(self, algorithm, fn: Callable[..., jax.Array], ctx: ParallelContext, fixed: bool = False):
        self.algorithm, self.fn, self.ctx = algorithm, fn, ctx
        # fixed: both loops run ``slots`` blocks on every rank (evaluate.py, ShardedEvaluator)
        self.fixed = fixed
        self.units = algorithm.units
        self.b = algorithm.block_rows
        self.k = -(-self.units // self.b)
        self.shard = np.asarray(shard_of(self.k, 1, ctx.size, ctx.rank), np.int32)
        self.slots, self.order = slot_layout(self.k, ctx.size)  # one allgather, as in evaluate.py

    def __call__(self, state: Any, shard: jax.Array, *args, algorithm: Any = None):
        """``args`` (e.g. the generation number) are passed on to the problem function;
        ``algorithm``: the one built with (an equal one whose hyper-parameters are traced)."""
        a, b, k, units = algorithm if algorithm is not None else self.algorithm, self.b, self.k, self.units
        c = a.copies
        # Past a rank's own blocks (fixed trip counts, an uneven split) j names no block: its
        # results fill slots the reordering drops.
        count = self.slots if self.fixed else shard[1]
        dtype = jnp.dtype(a.dtype)
        state, key = a.split_key(state)

        def evaluate(i, out):
            j = shard[0] + i
            x = a.expand(state, a.block_noise(key, j))
            f = self.fn(x, *args).astype(dtype).reshape(c, b)
            return lax.dynamic_update_index_in_dim(out, f, i, 0)

        f = lax.fori_loop(0, count, evaluate, jnp.zeros((self.slots, c, b), dtype))
        raw = gather_slots(f, self.order, self.ctx).transpose(1, 0, 2)  # (c, k, b)
        raw = raw.reshape(c, k * b)[:, :units].reshape(c * units)
        w = a.weights(state, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        w = jnp.concatenate([w, jnp.zeros((k * b - units, w.shape[1]), w.dtype)]).reshape(k, b, w.shape[1])
        shape = jax.eval_shape(lambda z, v: a.partial(state, z, v), jax.ShapeDtypeStruct((b, a.dim), dtype),
                               jax.ShapeDtypeStruct((b, w.shape[2]), w.dtype)).shape

        def accumulate(i, out):
            j = shard[0] + i
            p = a.partial(state, a.block_noise(key, j), w[j])
            return lax.dynamic_update_index_in_dim(out, p, i, 0)

        partials = lax.fori_loop(0, count, accumulate, jnp.zeros((self.slots, *shape), dtype))
        new = a.apply(state, a.combine(gather_slots(partials, self.order, self.ctx)))
        return new, raw, lambda i: a.candidate(state, key, i)
