"""The generation loop: ask -> shard -> evaluate -> allgather -> tell, many generations a dispatch.

The host wakes only at boundaries (logging, the end of the run). Between them one jitted call runs
a ``fori_loop`` whose body is a whole generation with its communication inside, so there is no
per-generation host synchronisation.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .algorithms.base import Algorithm
from .parallel import ParallelContext, ShardedEvaluator


class LoopState(NamedTuple):
    """Everything a run carries between generations; replicated and bitwise equal on all ranks."""

    algo: Any
    best_x: jax.Array  # (dim,) best candidate seen so far
    best_f: jax.Array  # ()
    generation: jax.Array  # int32 (), generations completed
    nonfinite: jax.Array  # int32 (), evaluations that returned NaN or +-inf, counted as worst
    last: jax.Array  # (3,) best, mean, std of the latest generation's batch (finite values)


class Boundary(NamedTuple):
    generation: int
    state: LoopState


def _batch_stats(fitness: jax.Array) -> jax.Array:
    finite = jnp.isfinite(fitness)
    n = jnp.maximum(finite.sum(), 1)
    f0 = jnp.where(finite, fitness, 0)
    mean = f0.sum() / n
    std = jnp.sqrt(jnp.where(finite, (fitness - mean) ** 2, 0).sum() / n)
    best = jnp.where(finite, fitness, jnp.inf).min()
    return jnp.stack([best, mean, std])


def fingerprint(tree: Any) -> jax.Array:
    """A uint32 per leaf: sum of its bit patterns times odd position weights, mod 2^32.

    Any single changed bit changes the sum (odd weights are invertible mod 2^32), it costs one
    pass over the state on the device, and only a few bytes go to the host and over MPI.
    """
    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        leaf = jnp.asarray(leaf)
        if leaf.dtype != jnp.bool_ and leaf.dtype.itemsize in (4, 8):
            bits = lax.bitcast_convert_type(leaf, jnp.uint32)  # 8-byte leaves give (..., 2)
        else:
            bits = leaf.astype(jnp.uint32)
        bits = bits.reshape(-1)
        weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) | jnp.uint32(1)
        out.append(jnp.sum(bits * weights, dtype=jnp.uint32))
    return jnp.stack(out)


def state_digest(tree: Any) -> str:
    """SHA-256 over every leaf's dtype, shape and bytes, in pytree order (on the host)."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(jax.device_get(tree)):
        a = np.ascontiguousarray(leaf)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class Workflow:
    """Compiles and runs one algorithm on one problem over the ranks of ``ctx``."""

    def __init__(self, algorithm: Algorithm, evaluate: Callable[..., jax.Array], ctx: ParallelContext,
                 microbatch: int | None = None, batch_size: int | None = None,
                 with_generation: bool = False):
        """``with_generation``: call ``evaluate(x, generation)`` with the number of the generation
        being evaluated (1 = the initial population), for problems that draw new random
        scenarios each generation; ``batch_size``: see ``ShardedEvaluator``."""
        self.algorithm = algorithm
        self.ctx = ctx
        self._with_generation = with_generation
        self._eval_init = ShardedEvaluator(evaluate, algorithm.num_init, ctx, microbatch, batch_size)
        self._eval_step = ShardedEvaluator(evaluate, algorithm.num_ask, ctx, microbatch, batch_size)
        # Which micro-batches this rank evaluates travels as data, not as a compile-time
        # constant, so every rank at every rank count compiles the same program.
        self._shards = (jnp.asarray(self._eval_init.shard), jnp.asarray(self._eval_step.shard))
        self._first = jax.jit(self._first_generation)
        self._chunk = jax.jit(self._run_chunk, donate_argnums=0)
        self._fingerprint = jax.jit(fingerprint)

    # -- jitted pieces -------------------------------------------------------------------------
    def _record(self, state: LoopState, candidates: jax.Array, raw: jax.Array, algo: Any) -> LoopState:
        bad = ~jnp.isfinite(raw)
        fitness = jnp.where(bad, jnp.inf, raw)
        i = jnp.argmin(fitness)
        better = fitness[i] < state.best_f
        return LoopState(
            algo=algo,
            best_x=jnp.where(better, candidates[i], state.best_x),
            best_f=jnp.where(better, fitness[i], state.best_f),
            generation=state.generation + 1,
            nonfinite=state.nonfinite + bad.sum(dtype=jnp.int32),
            last=_batch_stats(raw),
        )

    def _generation_arg(self, state: LoopState) -> tuple:
        return (state.generation + 1,) if self._with_generation else ()

    def _first_generation(self, key: jax.Array, shards) -> LoopState:
        algo = self.algorithm.init(key)
        dtype = jnp.dtype(self.algorithm.dtype)
        empty = LoopState(
            algo=algo,
            best_x=jnp.zeros((self.algorithm.dim,), dtype),
            best_f=jnp.asarray(jnp.inf, dtype),
            generation=jnp.asarray(0, jnp.int32),
            nonfinite=jnp.asarray(0, jnp.int32),
            last=jnp.zeros((3,), dtype),
        )
        candidates, algo = self.algorithm.init_ask(algo)
        raw = self._eval_init(candidates, shards[0], *self._generation_arg(empty))
        algo = self.algorithm.init_tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(empty, candidates, raw, algo)

    def _generation(self, state: LoopState, shards) -> LoopState:
        candidates, algo = self.algorithm.ask(state.algo)
        raw = self._eval_step(candidates, shards[1], *self._generation_arg(state))
        algo = self.algorithm.tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(state, candidates, raw, algo)

    def _run_chunk(self, state: LoopState, n: jax.Array, shards) -> LoopState:
        return lax.fori_loop(0, n, lambda _, s: self._generation(s, shards), state)

    # -- host API ------------------------------------------------------------------------------
    def start(self, seed: int) -> LoopState:
        """Initialise from the seed and run generation 1 (the initial population's evaluation)."""
        return self._first(jax.random.PRNGKey(seed), self._shards)

    def advance(self, state: LoopState, n: int) -> LoopState:
        """Run n more generations in one dispatch. ``state`` is donated: do not reuse it."""
        return self._chunk(state, jnp.asarray(n, jnp.int32), self._shards)

    def fingerprint(self, state: LoopState) -> np.ndarray:
        return np.asarray(self._fingerprint(state))

    def compile(self, seed: int) -> None:
        """Compile both entry points ahead of time, so the first timed chunk is not compile time."""
        key = jax.random.PRNGKey(seed)
        self._first.lower(key, self._shards).compile()
        shapes = jax.eval_shape(self._first, key, self._shards)
        self._chunk.lower(shapes, jnp.asarray(1, jnp.int32), self._shards).compile()
        self._fingerprint.lower(shapes).compile()

    def evaluations(self, generation: int) -> int:
        """Evaluations done after ``generation`` generations (exact; Python ints never overflow)."""
        if generation <= 0:
            return 0
        return self.algorithm.num_init + (generation - 1) * self.algorithm.num_ask

    def run(self, seed: int, generations: int, every: int, state: LoopState | None = None) -> Iterator[Boundary]:
        """Yield the state at every multiple of ``every`` and at the end.

        A yielded state is valid until the next iteration resumes the generator (its buffers are
        donated to the next chunk): read what you need from it before asking for the next one.
        """
        if state is None:
            state = self.start(seed)
            done = 1
            if done % every == 0 or done == generations:
                yield Boundary(done, state)
        else:
            done = int(state.generation)
        while done < generations:
            target = min((done // every + 1) * every, generations)
            state = self.advance(state, target - done)
            done = target
            yield Boundary(done, state)
