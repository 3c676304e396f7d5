"""The generation loop for host problems: jitted ask -> host evaluation -> gather -> jitted tell.

Host problems (a NumPy function, an external command: ``hpcevo/problems/host.py``) cannot run
inside a jitted step, so here the host wakes every generation:

    candidates, algo = ask(state)             jitted, replicated: the same on every rank
    x = candidates on the host (float64)
    this rank's tasks evaluated               threads, outside JIT (``parallel.host.TaskRunner``)
    fitness = the tasks' values by index      Allgatherv (``parallel.host.allgather_rows``)
    state = tell(state, candidates, fitness)  jitted, replicated, recorded as on the device

A task is a fixed slice of the population (one candidate, or for a NumPy block function
``microbatch`` rows), fixed by the population size and the config alone; its values are placed
by index. So the fitness vector, and with it the run, does not depend on the rank count, the
schedule (static blocks or a dynamic queue) or the concurrency, as long as the problem is
deterministic. Failed evaluations get ``penalty`` and are counted in the state (``failures``;
checkpointed, so a resumed run counts on); rank 0 keeps one record per failed candidate until
``take_failures`` (the run directory appends them to failures.jsonl).

``HostEngine`` follows ``engine.Engine``, so a ``Loop`` drives it as it drives a JAX problem:
checkpoints, signals, deadlines and resume work the same. A stop request is acted on between
generations (the driver's chunks shrink to one generation when generations are slow), never in
the middle of one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms.base import Algorithm, with_params
from ..errors import UsageError, UserCodeExit, user_location
from ..parallel import (ParallelContext, TaskRunner, allgather_obj, allgather_rows, gather_to_root, microbatch_rows,
                        user_code)
from ..parallel.compiling import compile_on_node
from ..problems.base import HostProblem
from .engine import MAX_CHUNK, Limits, Params, fingerprint, idle_ranks, rows_used
from .recording import LoopState, SingleObjective

# A LoopState's fields (whatever they are), then ``failures``: int32 (), the evaluations that
# failed and got the penalty so far. Flat, so the driver, ``hpcevo inspect`` and checkpoints see
# the same names as in a LoopState (``state/best_f``), plus ``state/failures``.
HostLoopState = NamedTuple("HostLoopState", [*((f, Any) for f in LoopState._fields), ("failures", Any)])


def _join(loop: LoopState, failures) -> HostLoopState:
    return HostLoopState(*loop, jnp.asarray(failures, jnp.int32))


def _loop(state: HostLoopState) -> LoopState:
    return LoopState(*state[:-1])


class HostEngine:
    """Runs one algorithm on one host problem over the ranks of ``ctx``. Collective to create
    (a dynamic schedule duplicates a communicator) and to ``close``.

    ``microbatch`` / ``batch_size``: rows per call of a block function (``rows_per_task``);
    ``concurrency``, ``schedule``: see ``parallel.TaskRunner``; ``penalty``: the fitness a
    failed evaluation gets.
    """

    def __init__(self, algorithm: Algorithm, problem: HostProblem, ctx: ParallelContext, *,
                 microbatch: int | None = None, batch_size: int | None = None, concurrency: int = 1,
                 schedule: str = "static", penalty: float = float("inf")):
        self.algorithm, self.problem, self.ctx = algorithm, problem, ctx
        self.recorder = SingleObjective()  # host problems are single-objective
        self.trace = ""  # each generation's fitness ("f"), and candidates ("fx"), with the history
        self.max_chunk = MAX_CHUNK
        self.penalty = float(penalty)
        self._microbatch, self._batch_size = microbatch, batch_size
        self._failures: list[dict] = []
        self._pending_failures = 0  # failed evaluations of Loop.evaluate, not yet told
        self._runner = TaskRunner(ctx, concurrency, schedule)  # type: ignore[arg-type]
        self._ask_first = jax.jit(self._first_ask_fn)
        self._tell_first = jax.jit(self._first_tell_fn)
        self._ask = jax.jit(self._ask_fn)
        self._tell = jax.jit(self._tell_fn)
        self._fingerprint = jax.jit(fingerprint)

    # -- jitted pieces -------------------------------------------------------------------------
    def _first_ask_fn(self, key: jax.Array, params: Params = None):
        a = with_params(self.algorithm, params)
        x, algo = a.init_ask(a.init(key))
        return x, algo, rows_used(a, algo, x.shape[0])

    def _record(self, a: Algorithm, loop: LoopState, candidates: jax.Array, raw: jax.Array, algo: Any, used):
        state = self.recorder.record(a, loop, raw, algo, lambda i: candidates[i], used)
        return state, self.recorder.row(loop, state), used

    def _first_tell_fn(self, candidates: jax.Array, algo: Any, raw: jax.Array, params: Params = None):
        a = with_params(self.algorithm, params)
        empty = self.recorder.empty(a, algo)
        used = rows_used(a, algo, candidates.shape[0])
        algo = a.init_tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(a, empty, candidates, raw, algo, used)

    def _ask_fn(self, loop: LoopState, params: Params = None):
        a = with_params(self.algorithm, params)
        x, algo = a.ask(loop.algo)
        return x, algo, rows_used(a, algo, x.shape[0])

    def _tell_fn(self, loop: LoopState, candidates: jax.Array, algo: Any, raw: jax.Array, params: Params = None):
        a = with_params(self.algorithm, params)
        used = rows_used(a, algo, candidates.shape[0])
        algo = a.tell(algo, jnp.where(jnp.isfinite(raw), raw, jnp.inf))
        return self._record(a, loop, candidates, raw, algo, used)

    # -- host evaluation -----------------------------------------------------------------------
    def rows_per_task(self, n: int) -> int:
        """Rows evaluated by one task (one call of a block function, or one candidate): a
        function of the batch size and the config only, never of the rank count."""
        rows = self.problem.rows_per_call
        if rows is not None:
            return rows
        mb = microbatch_rows(n, self._microbatch)
        return min(mb, self._batch_size) if self._batch_size else mb

    @property
    def microbatches(self) -> int:
        """Tasks per generation (the driver warns when there are more ranks than this)."""
        n = self.algorithm.num_ask
        return -(-n // self.rows_per_task(n))

    def idle_ranks(self) -> tuple[int, int]:
        return idle_ranks(self.ctx.size, self.microbatches, self.algorithm.num_ask)

    def evaluate(self, candidates, generation: int, used: int | None = None) -> tuple[np.ndarray, int]:
        """The fitness of ``candidates`` (replicated, the algorithm's dtype; failed evaluations
        get the penalty) and how many failed. Collective. ``used``: only the first ``used`` rows
        are evaluated (the others, which the algorithm ignores, get inf and count nowhere).

        The problem's code runs under ``parallel.user_code``: a ``sys.exit`` in it does not end
        this rank alone (the others would wait for its values forever) but travels with the
        values as a flag, so every rank raises ``UserCodeExit`` naming the rank; an ``os._exit``
        ends the whole job with one message."""
        x = np.asarray(jax.device_get(candidates), np.float64)
        total = x.shape[0]
        n = total if used is None else int(used)
        x = x[:n]
        rows = self.rows_per_task(total)

        def task(t: int):
            lo = t * rows  # a copy: a function that writes into its input cannot touch the batch
            try:
                return lo, *self.problem.evaluate_rows(x[lo : lo + rows].copy(), lo, generation), None
            except SystemExit as e:
                where = user_location(e)
                return lo, np.full(min(rows, n - lo), np.nan), [], (
                    f"called sys.exit({e.code!r}) on rank {self.ctx.rank}{f' ({where})' if where else ''}")

        try:
            with user_code(self.ctx, f"problem '{self.problem.name}'"):
                done = self._runner.map(-(-n // rows), task)
        except BaseException:
            self.problem.cancel()  # leave no simulator running behind an error or a Ctrl-C
            raise
        index, values, reasons, exits = [], [], [], []
        for lo, vals, fails, exited in done.values():
            flags = np.zeros(len(vals))
            for row, why in fails:
                flags[row] = 1.0
                reasons.append((lo + row, why))
            index.append(np.arange(lo, lo + len(vals)))
            values.append(np.column_stack([vals, flags, np.full(len(vals), float(exited is not None))]))
            if exited is not None:
                exits.append(exited)
        gathered = allgather_rows(self.ctx, n, np.concatenate(index or [np.zeros(0, np.int64)]),
                                  np.concatenate(values or [np.zeros((0, 3))]))
        if gathered[:, 2].any():  # every rank sees it, so every rank takes part in this gather
            self.problem.cancel()
            said = [e for part in allgather_obj(self.ctx, exits) for e in part]
            raise UserCodeExit(f"problem '{self.problem.name}' {said[0]} while evaluating generation {generation}: "
                               "a problem must return its values or raise an exception (counted as a failed "
                               "evaluation), not end the process")
        bad = gathered[:, 1] != 0
        count = int(bad.sum())
        if count:  # every rank knows the count, so all of them take part in this gather, or none
            everyone = gather_to_root(self.ctx, [(i, why, self.ctx.rank) for i, why in reasons])
            if self.ctx.is_root:
                self._failures += [{"generation": generation, "index": i, "reason": why, "rank": rank,
                                    "x": x[i].tolist()} for i, why, rank in sorted(r for p in everyone for r in p)]
        fitness = np.where(bad, self.penalty, gathered[:, 0])
        fitness = np.concatenate([fitness, np.full(total - n, np.inf)])
        return fitness.astype(self.algorithm.dtype), count

    # -- the Engine protocol -------------------------------------------------------------------
    def start(self, seed: int, params: Params = None) -> tuple[HostLoopState, dict[str, np.ndarray]]:
        candidates, algo, used = self._ask_first(jax.random.PRNGKey(seed), params)
        raw, failed = self.evaluate(candidates, 1, int(used))
        loop, row, used = self._tell_first(candidates, algo, raw, params)
        return _join(loop, failed), self._history([row], [used], [raw], [candidates])

    def evaluate_batch(self, x: jax.Array, generation: int, params: Params = None) -> np.ndarray:
        """``evaluate`` for ``Loop.evaluate``: its failures are counted at the next ``tell``."""
        fitness, failed = self.evaluate(x, generation)
        self._pending_failures += failed
        return fitness

    def ask(self, state: HostLoopState, params: Params = None) -> tuple[jax.Array, Any]:
        return self._ask(_loop(state), params)[:2]

    def tell(self, state: HostLoopState, x: jax.Array, algo: Any, raw: Any,
             params: Params = None) -> tuple[HostLoopState, dict[str, np.ndarray]]:
        """Telling a fitness the caller computed: its failures are what evaluate counted."""
        failed = int(self._pending_failures)
        self._pending_failures = 0
        loop, row, used = self._tell(_loop(state), jnp.asarray(x), algo, jnp.asarray(raw, self.algorithm.dtype), params)
        return _join(loop, int(state.failures) + failed), self._history([row], [used], [raw], [x])

    def functions(self, params: Params = None) -> Any:
        raise UsageError(f"problem '{self.problem.name}' runs on the host, outside JAX: it cannot be evaluated "
                         "inside a jitted function; use Loop.ask, Loop.evaluate and Loop.tell")

    def advance(self, state: HostLoopState, n: int, params: Params = None,
                limits: Limits = Limits()) -> tuple[HostLoopState, dict[str, np.ndarray]]:
        if not 1 <= n <= MAX_CHUNK:
            raise ValueError(f"advance: n must be in 1..{MAX_CHUNK}, got {n}")
        loop, failures, rows, counts, fits, xs = _loop(state), int(state.failures), [], [], [], []
        generation = int(loop.generation)
        # The same rule as the device loop's, in the run's dtype, on every rank alike.
        dt = np.dtype(self.algorithm.dtype)
        target = None if limits.target is None else np.asarray(limits.target, dt)
        window = None if limits.window is None else np.asarray(limits.window, dt).copy()
        for _ in range(n):
            if limits.evaluations is not None and sum(counts) >= limits.evaluations:
                break
            if target is not None and np.asarray(jax.device_get(loop.best_f)) <= target:
                break
            generation += 1
            candidates, algo, used = self._ask(loop, params)
            raw, failed = self.evaluate(candidates, generation, int(used))
            loop, row, used = self._tell(loop, candidates, algo, raw, params)
            failures += failed
            rows.append(row)
            counts.append(int(used))
            fits.append(raw)
            if window is not None:  # the device loop's rule (engine.DeviceEngine._run_chunk), in numpy
                at = int(loop.generation) % len(window)
                then, window[at] = window[at], np.asarray(jax.device_get(loop.best_f), dt)
                if then - window[at] <= dt.type(limits.tolerance):
                    break
            xs.append(candidates)
        return _join(loop, failures), self._history(rows, counts, fits, xs)

    def _history(self, rows: list, used: list, fits: list, xs: list) -> dict[str, np.ndarray]:
        fields = self.recorder.history_type._fields
        columns = list(zip(*jax.device_get(rows))) or [[] for _ in fields]
        out = {**{k: np.asarray(v) for k, v in zip(fields, columns)},
               "evaluations": np.asarray([int(u) for u in used], np.int64)}
        if self.trace:
            out["fitness"] = np.asarray([np.asarray(f) for f in fits]).reshape(len(fits), -1)
        if self.trace == "fx":
            out["x"] = np.asarray(jax.device_get(xs)).reshape(len(xs), -1, self.algorithm.dim)
        return out

    def template(self, seed: int = 0, params: Params = None) -> HostLoopState:
        def first(key, params):
            candidates, algo, _ = self._first_ask_fn(key, params)
            loop, _, _ = self._first_tell_fn(candidates, algo, jnp.zeros(candidates.shape[:1], candidates.dtype), params)
            return _join(loop, 0)

        return jax.eval_shape(first, jax.random.PRNGKey(seed), params)

    def compile(self, seed: int, first: bool = True, params: Params = None) -> None:
        key = jax.random.PRNGKey(seed)

        def lower() -> list:
            lowered = []
            if first:
                candidates, algo, _ = jax.eval_shape(self._first_ask_fn, key, params)
                lowered.append(self._ask_first.lower(key, params))
                lowered.append(self._tell_first.lower(candidates, algo, _fitness_like(candidates), params))
            shapes = self.template(seed, params)
            loop = _loop(shapes)
            candidates, algo, _ = jax.eval_shape(self._ask_fn, loop, params)
            lowered.append(self._ask.lower(loop, params))
            lowered.append(self._tell.lower(loop, candidates, algo, _fitness_like(candidates), params))
            lowered.append(self._fingerprint.lower(shapes))
            return lowered
        compile_on_node(self.ctx, lower)

    def fingerprint(self, state: HostLoopState) -> np.ndarray:
        return np.asarray(self._fingerprint(state))

    def counters(self, state: HostLoopState) -> dict[str, int]:
        return {"failed_evaluations": int(state.failures)}

    def take_failures(self) -> list[dict]:
        out, self._failures = self._failures, []
        return out

    def close(self) -> None:
        """Stop the worker threads and free the dispatcher's communicator. Collective."""
        self._runner.close()
        self.problem.close()


def _fitness_like(candidates: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(candidates.shape[:1], candidates.dtype)
