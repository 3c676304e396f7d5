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
from .parallel import ParallelContext, ShardedESStep, ShardedEvaluator
from .recording import History, LoopState, MultiObjective, SingleObjective

__all__ = ["MAX_CHUNK", "Boundary", "History", "LoopState", "MultiObjective", "SingleObjective", "Workflow",
           "concat_history", "fingerprint", "state_digest"]


# Generations per dispatch at most: the length of the on-device history buffer. The host wakes
# at least this often, which also bounds how long a stop signal waits to be acted on.
MAX_CHUNK = 256


class Boundary(NamedTuple):
    generation: int
    state: Any  # the recorder's loop state (LoopState for single-objective runs)
    history: dict[str, np.ndarray]  # per generation since the previous boundary


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
    """Compiles and runs one algorithm on one problem over the ranks of ``ctx``.

    ``recorder`` decides what the loop state tracks besides the algorithm's state and which
    per-generation series the run keeps (``hpcevo/recording.py``): ``SingleObjective()`` (the
    default) for fitness of shape (n,), ``MultiObjective(...)`` for (n, m). An algorithm with
    ``distributed = True`` (OpenES, PGPE, SNES) runs each generation through
    ``parallel.ShardedESStep``: no rank ever holds the whole population.
    """

    def __init__(self, algorithm: Algorithm, evaluate: Callable[..., jax.Array], ctx: ParallelContext,
                 microbatch: int | None = None, batch_size: int | None = None,
                 with_generation: bool = False, recorder: Any = None):
        """``with_generation``: call ``evaluate(x, generation)`` with the number of the generation
        being evaluated (1 = the initial population), for problems that draw new random
        scenarios each generation; ``batch_size``: see ``ShardedEvaluator``."""
        self.algorithm = algorithm
        self.ctx = ctx
        self._with_generation = with_generation
        self.recorder = recorder if recorder is not None else SingleObjective()
        if getattr(algorithm, "distributed", False):
            self._es = ShardedESStep(algorithm, evaluate, ctx)
            self._eval_init = self._eval_step = None
            self._shards = (jnp.asarray(self._es.shard), jnp.asarray(self._es.shard))
        else:
            self._es = None
            self._eval_init = ShardedEvaluator(evaluate, algorithm.num_init, ctx, microbatch, batch_size)
            self._eval_step = ShardedEvaluator(evaluate, algorithm.num_ask, ctx, microbatch, batch_size)
            # Which micro-batches this rank evaluates travels as data, not as a compile-time
            # constant, so every rank at every rank count compiles the same program.
            self._shards = (jnp.asarray(self._eval_init.shard), jnp.asarray(self._eval_step.shard))
        self._first = jax.jit(self._first_with_history)
        self._chunk = jax.jit(self._run_chunk, donate_argnums=0)
        self._fingerprint = jax.jit(fingerprint)

    @property
    def history_fields(self) -> tuple[str, ...]:
        """The per-generation series this run keeps (and checkpoints)."""
        return self.recorder.history_type._fields

    # -- jitted pieces -------------------------------------------------------------------------
    def _step(self, state, algo: Any, shard, evaluator, ask, tell):
        args = (state.generation + 1,) if self._with_generation else ()
        if self._es is not None:
            return self._es(algo, shard, *args)
        candidates, algo = ask(algo)
        raw = evaluator(candidates, shard, *args)
        algo = tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return algo, raw, lambda i: candidates[i]

    def _first_generation(self, key: jax.Array, shards):
        a = self.algorithm
        algo = a.init(key)
        empty = self.recorder.empty(a, algo)
        algo, raw, pick = self._step(empty, algo, shards[0], self._eval_init, a.init_ask, a.init_tell)
        return self.recorder.record(a, empty, raw, algo, pick)

    def _generation(self, state, shards):
        a = self.algorithm
        algo, raw, pick = self._step(state, state.algo, shards[1], self._eval_step, a.ask, a.tell)
        return self.recorder.record(a, state, raw, algo, pick)

    # The recorder's pieces under the names HostWorkflow (hpcevo/host_workflow.py) builds on.
    def _empty(self, algo: Any):
        """The loop state before the first evaluation (generation 0, nothing recorded)."""
        return self.recorder.empty(self.algorithm, algo)

    def _record(self, state, candidates: jax.Array, raw: jax.Array, algo: Any):
        return self.recorder.record(self.algorithm, state, raw, algo, lambda i: candidates[i])

    def _history_row(self, before, after) -> tuple:
        return self.recorder.row(before, after)

    def _run_chunk(self, state, n: jax.Array, shards):
        row = self.recorder.row
        buf = self.recorder.history_type(*(jnp.zeros((MAX_CHUNK, *s.shape), s.dtype)
                                           for s in jax.eval_shape(row, state, state)))

        def body(i, carry):
            s, h = carry
            s2 = self._generation(s, shards)
            return s2, type(h)(*(col.at[i].set(v) for col, v in zip(h, row(s, s2))))

        return lax.fori_loop(0, n, body, (state, buf))

    def _first_with_history(self, key: jax.Array, shards):
        state = self._first_generation(key, shards)
        values = self.recorder.row(state._replace(nonfinite=jnp.zeros_like(state.nonfinite)), state)
        return state, self.recorder.history_type(*(jnp.reshape(v, (1,)) for v in values))

    # -- host API ------------------------------------------------------------------------------
    def start(self, seed: int) -> tuple[Any, dict[str, np.ndarray]]:
        """Initialise from the seed and run generation 1 (the initial population's evaluation)."""
        state, hist = self._first(jax.random.PRNGKey(seed), self._shards)
        return state, _host_history(hist, 1)

    def advance(self, state: Any, n: int) -> tuple[Any, dict[str, np.ndarray]]:
        """Run n (<= MAX_CHUNK) more generations in one dispatch; return the state and their
        history. ``state`` is donated: do not reuse it."""
        if not 1 <= n <= MAX_CHUNK:
            raise ValueError(f"advance: n must be in 1..{MAX_CHUNK}, got {n}")
        state, hist = self._chunk(state, jnp.asarray(n, jnp.int32), self._shards)
        return state, _host_history(hist, n)

    @property
    def microbatches(self) -> int:
        """Micro-batches (blocks, in the distributed ES mode) per generation: no more ranks than
        this have evaluation work."""
        return self._es.k if self._es is not None else self._eval_step.k

    def template(self, seed: int = 0) -> Any:
        """The shapes and dtypes of the loop state (no computation): what a checkpoint must hold."""
        return jax.eval_shape(self._first_generation, jax.random.PRNGKey(seed), self._shards)

    def fingerprint(self, state: Any) -> np.ndarray:
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

    def run(self, seed: int, generations: int, every: int, state: Any = None) -> Iterator[Boundary]:
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


def _host_history(hist: Any, n: int) -> dict[str, np.ndarray]:
    host = jax.device_get(hist)
    return {k: np.asarray(v[:n]) for k, v in zip(type(hist)._fields, host)}


def concat_history(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join per-dispatch histories in order (an empty list gives an empty dict)."""
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
