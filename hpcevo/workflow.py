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


class History(NamedTuple):
    """One entry per generation of a dispatch (the first ``n`` of ``MAX_CHUNK`` rows are valid)."""

    best: jax.Array  # best fitness seen so far
    gen_best: jax.Array  # best / mean / std of the generation's finite fitness values
    gen_mean: jax.Array
    gen_std: jax.Array
    nonfinite: jax.Array  # int32: NaN or infinite fitness values in the generation


# Generations per dispatch at most: the length of the on-device history buffer. The host wakes
# at least this often, which also bounds how long a stop signal waits to be acted on.
MAX_CHUNK = 256


class Boundary(NamedTuple):
    generation: int
    state: LoopState
    history: dict[str, np.ndarray]  # per generation since the previous boundary


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

    history_fields = History._fields  # the per-generation series a run keeps (and checkpoints)

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
        self._first = jax.jit(self._first_with_history)
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

    def _empty(self, algo: Any) -> LoopState:
        """The loop state before the first evaluation (generation 0, nothing recorded)."""
        dtype = jnp.dtype(self.algorithm.dtype)
        return LoopState(
            algo=algo,
            best_x=jnp.zeros((self.algorithm.dim,), dtype),
            best_f=jnp.asarray(jnp.inf, dtype),
            generation=jnp.asarray(0, jnp.int32),
            nonfinite=jnp.asarray(0, jnp.int32),
            last=jnp.zeros((3,), dtype),
        )

    def _first_generation(self, key: jax.Array, shards) -> LoopState:
        algo = self.algorithm.init(key)
        empty = self._empty(algo)
        candidates, algo = self.algorithm.init_ask(algo)
        raw = self._eval_init(candidates, shards[0], *self._generation_arg(empty))
        algo = self.algorithm.init_tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(empty, candidates, raw, algo)

    def _generation(self, state: LoopState, shards) -> LoopState:
        candidates, algo = self.algorithm.ask(state.algo)
        raw = self._eval_step(candidates, shards[1], *self._generation_arg(state))
        algo = self.algorithm.tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(state, candidates, raw, algo)

    @staticmethod
    def _history_row(before: LoopState, after: LoopState) -> tuple:
        return (after.best_f, after.last[0], after.last[1], after.last[2],
                after.nonfinite - before.nonfinite)

    def _run_chunk(self, state: LoopState, n: jax.Array, shards) -> tuple[LoopState, History]:
        dtype = state.best_f.dtype
        buf = History(*(jnp.zeros((MAX_CHUNK,), dtype) for _ in range(4)), jnp.zeros((MAX_CHUNK,), jnp.int32))

        def body(i, carry):
            s, h = carry
            s2 = self._generation(s, shards)
            row = self._history_row(s, s2)
            return s2, History(*(col.at[i].set(v) for col, v in zip(h, row)))

        return lax.fori_loop(0, n, body, (state, buf))

    def _first_with_history(self, key: jax.Array, shards) -> tuple[LoopState, History]:
        state = self._first_generation(key, shards)
        row = self._history_row(state._replace(nonfinite=jnp.zeros_like(state.nonfinite)), state)
        return state, History(*(jnp.reshape(v, (1,)) for v in row))

    # -- host API ------------------------------------------------------------------------------
    def start(self, seed: int) -> tuple[LoopState, dict[str, np.ndarray]]:
        """Initialise from the seed and run generation 1 (the initial population's evaluation)."""
        state, hist = self._first(jax.random.PRNGKey(seed), self._shards)
        return state, _host_history(hist, 1)

    def advance(self, state: LoopState, n: int) -> tuple[LoopState, dict[str, np.ndarray]]:
        """Run n (<= MAX_CHUNK) more generations in one dispatch; return the state and their
        history. ``state`` is donated: do not reuse it."""
        if not 1 <= n <= MAX_CHUNK:
            raise ValueError(f"advance: n must be in 1..{MAX_CHUNK}, got {n}")
        state, hist = self._chunk(state, jnp.asarray(n, jnp.int32), self._shards)
        return state, _host_history(hist, n)

    @property
    def microbatches(self) -> int:
        """Micro-batches per generation: no more ranks than this have evaluation work."""
        return self._eval_step.k

    def template(self, seed: int = 0) -> LoopState:
        """The shapes and dtypes of the loop state (no computation): what a checkpoint must hold."""
        return jax.eval_shape(self._first_generation, jax.random.PRNGKey(seed), self._shards)

    def fingerprint(self, state: LoopState) -> np.ndarray:
        return np.asarray(self._fingerprint(state))

    def compile(self, seed: int, first: bool = True) -> None:
        """Compile the entry points ahead of time, so the first timed chunk is not compile time.
        ``first=False`` skips generation 1's program (a resumed run never runs it)."""
        key = jax.random.PRNGKey(seed)
        if first:
            self._first.lower(key, self._shards).compile()
        shapes = self.template(seed)
        self._chunk.lower(shapes, jnp.asarray(1, jnp.int32), self._shards).compile()
        self._fingerprint.lower(shapes).compile()

    def evaluations(self, generation: int) -> int:
        """Evaluations done after ``generation`` generations (exact; Python ints never overflow)."""
        if generation <= 0:
            return 0
        return self.algorithm.num_init + (generation - 1) * self.algorithm.num_ask

    def run(self, seed: int, generations: int, every: int, state: LoopState | None = None) -> Iterator[Boundary]:
        """Yield the state at every multiple of ``every`` and at the end: the loop for library
        use (the runner drives ``start``/``advance`` itself, adding checkpoints and signals).

        A yielded state is valid until the next iteration resumes the generator (its buffers are
        donated to the next chunk): read what you need from it before asking for the next one.
        """
        parts: list[dict[str, np.ndarray]] = []
        if state is None:
            state, hist = self.start(seed)
            done = 1
            parts.append(hist)
            if done % every == 0 or done == generations:
                yield Boundary(done, state, concat_history(parts))
                parts = []
        else:
            done = int(state.generation)
        while done < generations:
            target = min((done // every + 1) * every, generations, done + MAX_CHUNK)
            state, hist = self.advance(state, target - done)
            parts.append(hist)
            done = target
            if done % every == 0 or done == generations:
                yield Boundary(done, state, concat_history(parts))
                parts = []


def _host_history(hist: History, n: int) -> dict[str, np.ndarray]:
    host = jax.device_get(hist)
    return {k: np.asarray(v[:n]) for k, v in zip(History._fields, host)}


def concat_history(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join per-dispatch histories in order (an empty list gives empty arrays)."""
    if not parts:
        return {k: np.zeros((0,), np.int32 if k == "nonfinite" else np.float64) for k in History._fields}
    return {k: np.concatenate([p[k] for p in parts]) for k in History._fields}
