"""``Loop``: one population evolving on the ranks of a parallel context.

The step-level API, and the object ``hpcevo.run`` drives (so a test that drives a ``Loop`` drives
the loop users run)::

    ctx = hpcevo.parallel.init()
    problem = hpcevo.problems.make_problem("ackley", 100)
    algorithm = hpcevo.algorithms.CSO(pop_size=1024, dim=100, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algorithm, problem, ctx).init(seed=42)   # generation 1
    loop.advance(99)                    # 99 more, jitted, many generations a dispatch
    loop.best_fitness, loop.best_solution, loop.state, loop.history["best"]
    path = loop.save("ckpt/")           # a checkpoint, written by every rank together
    loop = hpcevo.Loop(algorithm, problem, ctx).load(path)   # at any rank count

Every method that computes is collective: every rank of ``ctx`` calls it, with the same
arguments. The state is replicated: every rank holds the same bits. ``advance`` donates the
state's buffers to the next dispatch: a state read from ``loop.state`` before ``advance`` is not
valid after it (``jax.device_get`` it first to keep it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint, schema
from ..algorithms.base import Algorithm, params_data, params_of, why_static
from ..errors import ConfigError, UsageError, did_you_mean, user_location
from ..parallel import ParallelContext, agree_same, agreed, check_replicas, collective_stage, user_code
from ..problems import as_problem
from ..problems.base import HostProblem, Problem
from . import arguments, build, programs
from .engine import (FINGERPRINT, MAX_CHUNK, PROBLEM_DATA, DeviceEngine, Engine, Functions, Limits, Params, loop_shape,
                     state_digest)
from .host_engine import HostEngine
from .recording import recorder_for


class HistoryBuffer:
    """Per-generation history on the host, grown by doubling (appending stays O(1) amortised)."""

    def __init__(self) -> None:
        self.n = 0
        self.cols: dict[str, np.ndarray] = {}

    def append(self, part: dict[str, np.ndarray]) -> None:
        m = len(next(iter(part.values())))
        for k, v in part.items():
            col = self.cols.get(k)
            if col is None:
                col = self.cols[k] = np.zeros(max(1024, m), np.asarray(v).dtype)
            if self.n + m > len(col):
                grown = np.zeros(max(2 * len(col), self.n + m), col.dtype)
                grown[: self.n] = col[: self.n]
                col = self.cols[k] = grown
            col[self.n : self.n + m] = v
        self.n += m

    def view(self) -> dict[str, np.ndarray]:
        return {k: v[: self.n] for k, v in self.cols.items()}


class Loop:
    """``algorithm`` on ``problem`` over ``ctx``'s ranks (default: ``hpcevo.parallel.init()``).

    ``problem``: a ``Problem`` or ``HostProblem`` object, or a JAX function of a candidate
    ``(dim,) -> ()`` or of a block ``(n, dim) -> (n,)`` (with ``host=True``: a NumPy function),
    whose dim and bounds, unless it carries its own, are the algorithm's. ``microbatch``: rows
    per evaluation micro-batch (default: a function of the population only); ``batch_size``:
    most rows one call of the problem sees; ``recorder``: what the state tracks besides the
    algorithm's (default: ``recording.recorder_for(problem)``); ``concurrency``, ``schedule``,
    ``penalty``: host problems only (``host_engine.HostEngine``). ``observe``: called (on every
    rank) with each dispatch's fitness values of the rows used, in the order they were
    evaluated, and with ``observe_x`` their candidates too (``observe(f, x)``), for a logger
    that needs every evaluation (COCO's data: ``hpcevo.coco``). ``compile_cache``: where the
    compiled programs are kept for the next launch of the script: "auto" (the per-user cache,
    ``$XDG_CACHE_HOME/hpcevo/jax-cache``, when only this user can write it), a directory of
    yours, or "off"; a cache JAX already has (``JAX_COMPILATION_CACHE_DIR``, a run before) is
    kept. The one in use: ``loop.compile_cache``.
    """

    def __init__(self, algorithm: Algorithm, problem: Any, ctx: ParallelContext | None = None, *,
                 host: bool = False, microbatch: int | None = None, batch_size: int | None = None,
                 recorder: Any = None, concurrency: int = 1, schedule: str = "static", penalty: float = math.inf,
                 observe: Callable[..., None] | None = None, observe_x: bool = False,
                 compile_cache: str | os.PathLike = "auto"):
        ctx = context(ctx, "Loop")
        opts: dict[str, Any] = {}
        # Every argument is checked on every rank, and the ranks agree before the engine (which
        # may duplicate a communicator) is built: one rank's bad or different input is every
        # rank's error. Converting a function traces the user's code: it may end its process.
        with collective_stage(ctx), user_code(ctx, "the problem"):
            self.compile_cache = build.enable_api_compile_cache(compile_cache, "Loop")
            opts = arguments.options("Loop", microbatch=microbatch, batch_size=batch_size, concurrency=concurrency,
                                     schedule=schedule, penalty=penalty, host=host)
            algorithm = arguments.checked_algorithm(algorithm, "Loop")
            problem = as_loop_problem(problem, algorithm, opts.pop("host"))
        agree_same(ctx, arguments.describe([algorithm], problem, **opts), "Loop's algorithm, problem or options",
                   arguments.differ)
        self.ctx, self._algorithm, self.problem = ctx, algorithm, problem
        self._params = params_of(algorithm)
        self._data_kept: tuple | None = None  # (what it was made from, Loop._data())
        self._pending: tuple[jax.Array, Any, int] | None = None  # ask's (x, algorithm state, generation)
        self.engine: Engine
        mb, bs = opts["microbatch"], opts["batch_size"]
        trace = "" if observe is None else "fx" if observe_x else "f"
        if problem.host:
            self.engine = HostEngine(algorithm, problem, ctx, microbatch=mb, batch_size=bs,
                                     concurrency=opts["concurrency"], schedule=opts["schedule"], penalty=opts["penalty"])
            self.engine.trace = trace
        else:
            self._engine_args = (problem, ctx, mb, bs, recorder if recorder is not None else recorder_for(problem),
                                 trace)
            self.engine = device_engine(algorithm, problem, ctx, mb, bs, self._engine_args[4], trace)
        # A population that changes size at restarts (IPOP/BIPOP-CMA-ES) runs each generation in
        # the program of its size's bucket: a generation costs what its lambda costs, not the
        # largest lambda's (``row_buckets``: 56x at lambda 8 of 4,096 rows in 5-D, issue 41).
        self._buckets = None if problem.host else getattr(algorithm, "row_buckets", lambda: None)()
        self._family = self.engine  # (the program of pop_size rows: what a batch's loops share)
        if self._buckets:
            self.engine = self._engine_at(self._buckets[0])
        self._observe = observe
        # Called (with the program's rows) on every rank before ``advance`` or ``ask`` compiles the
        # program of a population bucket the run has not used yet: a run's driver gives the
        # watchdog the compile's allowance instead of a dispatch's (driver.execute).
        self.on_compile: Callable[[int], None] | None = None
        self.seed: int | None = None
        self.state: Any = None
        self.generation = 0  # generations completed (1: the initial population evaluated)
        self._history = HistoryBuffer()
        self._compiled: set[tuple[Any, bool]] = set()  # (engine, True: generation 1's program / False: later)
        self.failures: list[dict] = []  # failed host evaluations so far (rank 0)
        self._evaluations = 0  # rows used so far (Algorithm.rows_used), a Python int: no overflow
        self._limits = Limits()
        self.met: str | None = None  # "evaluations" or "target": which limit ended advance()

    # -- running ---------------------------------------------------------------------------------
    def init(self, seed: int) -> "Loop":
        """Start from ``seed`` and evaluate the initial population (generation 1)."""
        seed = arguments.seed(self.ctx, seed, "Loop.init")
        self._start_engine()
        self.compile(seed, first=True)
        self.state, part = self.engine.start(seed, self._data())
        self.seed, self.generation, self._pending = seed, 1, None
        self._restart_history()
        self._took(part)
        return self

    def _restart_history(self) -> None:
        self._history = HistoryBuffer()
        self._evaluations = 0

    def advance(self, generations: int = 1) -> "Loop":
        """Run ``generations`` more, in dispatches of at most ``MAX_CHUNK`` generations, or fewer:
        a limit (``limit``) ends it at the generation that meets it (``met`` says which)."""
        n = arguments.generations(self.ctx, generations, self.generation, "Loop.advance")
        self._require_state()
        self._require_no_pending("advance")
        left = n
        while left and self.check_limits() is None:
            self._select_engine()
            self.compile(self.seed or 0, first=False)
            k = min(left, self.engine.max_chunk)
            self.state, part = self.engine.advance(self.state, k, self._data(), self._dispatch_limits())
            done = len(part["evaluations"])
            self.generation += done
            self._took(part)
            left -= done
            if done < k and not self._buckets:
                break  # (a limit: check_limits says which)
            if not done and self.check_limits() is None:
                raise RuntimeError(f"Loop.advance: the program of {self.engine.algorithm.num_ask} rows ran no "
                                   "generation and no limit was met")
        self.check_limits()
        return self

    def _engine_at(self, rows: int) -> DeviceEngine:
        """The engine of this loop's algorithm computing ``rows`` rows (0: pop_size)."""
        algorithm = self._algorithm.with_rows(rows) if rows else self._algorithm
        return device_engine(algorithm, *self._engine_args)

    def _start_engine(self) -> None:
        """The engine of generation 1 (with population buckets: the first population's)."""
        if self._buckets:
            self.engine = self._engine_at(self._buckets[0])

    def _select_engine(self) -> None:
        """With population buckets: the engine of the bucket the state's population runs in
        (compiled ahead: ``on_compile`` hears of it)."""
        if self._pick_engine():
            self.compile(self.seed or 0, first=False)

    def _pick_engine(self) -> bool:
        """``_select_engine`` without compiling; whether the engine changed."""
        if self._buckets and self.state is not None:
            rows = self._algorithm.bucket_rows(int(jax.device_get(self._algorithm.population_size(self.state.algo))))
            if getattr(self.engine.algorithm, "rows", 0) != rows:
                self.engine = self._engine_at(rows)
                return True
        return False

    def idle_ranks(self) -> tuple[int, int]:
        """(ranks with nothing to evaluate, the micro-batch that would give every rank work) in
        the largest program this loop runs (``Engine.idle_ranks``)."""
        engine = self._engine_at(self._buckets[-1]) if self._buckets else self.engine
        return engine.idle_ranks()

    def limit(self, evaluations: int | None = None, target: float | None = None, stagnation: int | None = None,
              tolerance: float = 0.0) -> "Loop":
        """End ``advance`` at the generation where the evaluations so far reach ``evaluations``
        (that generation's rows all count: at most one generation's rows past the budget, as in
        pycma), where the best fitness so far is <= ``target``, or where it has improved by no
        more than ``tolerance`` over the last ``stagnation`` generations (single-objective; the
        rule of ``hooks.Stagnation``). Checked after every generation inside the compiled loop,
        so the count is exact. None: no such limit. Evaluations, target and tolerance are data
        (changing them compiles nothing); ``stagnation`` shapes the program. Collective: every
        rank passes the same."""
        single = self.engine.recorder.kind == "single-objective"
        check = lambda: checked_limits("Loop.limit", single, evaluations, target, stagnation, tolerance)  # noqa: E731
        self._limits = agreed(self.ctx, "Loop.limit", check, repr, arguments.differ)
        self.met = None
        return self

    def check_limits(self) -> str | None:
        """Which limit the loop has met ("evaluations", "target"), or None; sets ``met``. The
        same on every rank (the state is replicated)."""
        lim, self.met = self._limits, None
        if self.state is None:
            return None
        if lim.evaluations is not None and self._evaluations >= lim.evaluations:
            self.met = "evaluations"
        elif lim.target is not None and self.engine.recorder.kind == "single-objective" and bool(
                np.asarray(jax.device_get(self.state.best_f)) <= np.asarray(lim.target, self._algorithm.dtype)):
            self.met = "target"
        elif lim.stagnation is not None and self._stalled(lim.stagnation, lim.tolerance):
            self.met = "stagnation"
        return self.met

    def _dispatch_limits(self) -> Limits:
        """The limits of the next dispatch: the evaluations left, the stagnation window so far."""
        left = None if self._limits.evaluations is None else self._limits.evaluations - self._evaluations
        return self._limits._replace(evaluations=left, window=self._stagnation_window())

    def _stalled(self, k: int, tolerance: float) -> bool:
        # hooks.Stagnation's rule, in the run's dtype as the compiled loop computes it.
        best = self.history.get("best")
        if best is None or len(best) <= k:
            return False
        dt = np.dtype(self._algorithm.dtype)
        return bool(dt.type(best[-1 - k]) - dt.type(best[-1]) <= dt.type(tolerance))

    def _stagnation_window(self) -> np.ndarray | None:
        """The best so far after each of the last ``stagnation`` generations, generation g at
        position g % stagnation, NaN before generation 1 (``engine.Limits.window``)."""
        k = self._limits.stagnation
        if k is None:
            return None
        best, window = self.history["best"], np.full(k, np.nan)
        for g in range(max(1, self.generation - k + 1), self.generation + 1):
            window[g % k] = best[g - 1]
        return window

    def _took(self, part: dict[str, np.ndarray]) -> None:
        used = part["evaluations"]
        self._evaluations += int(np.sum(used))
        fitness, x = part.pop("fitness", None), part.pop("x", None)
        if self._observe is not None and fitness is not None and len(used):
            f = np.concatenate([row[:k] for row, k in zip(fitness, used)])
            if x is None:
                self._observe(f)
            else:
                self._observe(f, np.concatenate([row[:k] for row, k in zip(x, used)]))
        self._history.append(part)
        self.failures += self.engine.take_failures()

    def compile(self, seed: int = 0, first: bool = True) -> "Loop":
        """Compile ahead of time, so that timing the first dispatch does not time compilation.
        (``init`` and ``advance`` compile what they need on their first call.) Compiling traces
        the problem: an error on any rank is every rank's."""
        if not first:
            self._pick_engine()  # (a loaded run compiles the program of its population)
        want = {(self.engine, True), (self.engine, False)} if first else {(self.engine, False)}
        if want <= self._compiled:
            return self
        if self.on_compile is not None and self._compiled:  # (a later program: a new bucket's)
            self.on_compile(self.engine.algorithm.num_ask)
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            self._compile_programs(seed, first)
        self._compiled |= want
        return self

    def _compile_programs(self, seed: int, first: bool) -> None:
        """The compilation itself: no communication (tests stagger it between ranks)."""
        self.engine.compile(seed, first=first, params=self._data())

    # -- hyper-parameters as data ------------------------------------------------------------------
    @property
    def algorithm(self) -> Algorithm:
        """The algorithm, with the hyper-parameters the loop runs with now. Assigning an algorithm
        that differs only in dynamic hyper-parameters is ``set_params``; one that differs in
        anything else raises UsageError (a running loop cannot change its program)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, new: Algorithm) -> None:
        old = self._algorithm
        if type(new) is not type(old):
            raise UsageError(f"Loop.algorithm: this loop runs {type(old).__name__}; it cannot become "
                             f"{type(new).__name__} while it runs: build a new Loop")
        static = [f.name for f in dataclasses.fields(old)
                  if f.name not in self._params and getattr(old, f.name) != getattr(new, f.name)]
        if static:
            raise UsageError(self._static_message("Loop.algorithm", static[0]))
        self.set_params(**{k: v for k, v in params_of(new).items() if v != self._params[k]})

    @property
    def params(self) -> dict[str, float]:
        """The dynamic hyper-parameters (``Algorithm.dynamic``) and the values the next dispatch
        uses; a copy. Restored from a checkpoint by ``load``."""
        return dict(self._params)

    def set_params(self, **values: float) -> "Loop":
        """Change dynamic hyper-parameters (``DE``'s ``F`` and ``CR``, ``PSO``'s ``w``...): the next
        ``advance``, ``ask`` or ``tell`` uses them, with no recompilation, and checkpoints record
        them. Checked as the algorithm's constructor checks them (ConfigError); a static
        hyper-parameter (one that shapes the program: ``pop_size``, ``strategy``...) raises
        UsageError. Collective: every rank passes the same values (UsageError otherwise)."""
        def check() -> Algorithm:
            fields = {f.name for f in dataclasses.fields(self._algorithm)}
            for name in values:
                if name not in self._params:
                    if name in fields:
                        raise UsageError(self._static_message("Loop.set_params", name))
                    raise UsageError(f"Loop.set_params: {type(self._algorithm).__name__} has no hyper-parameter "
                                     f"'{name}'{did_you_mean(name, sorted(fields))}; the dynamic ones are "
                                     f"{', '.join(self._params) or 'none'}")
            return dataclasses.replace(self._algorithm, **values)

        new = agreed(self.ctx, "Loop.set_params", check, lambda a: json.dumps(params_of(a), sort_keys=True),
                     arguments.differ)
        self._algorithm, self._params = new, params_of(new)
        return self

    def _static_message(self, where: str, name: str) -> str:
        dynamic = ", ".join(self._params) or "none"
        return (f"{where}: '{name}' of {type(self._algorithm).__name__} is static ({why_static(self._algorithm, name)}) "
                f"and cannot change while the loop runs: build a new Loop with it and load a checkpoint "
                f"of this one (what can change: {dynamic})")

    def _data(self) -> Params:
        # Made again only when the algorithm or its values change (a dispatch of cheap
        # generations would otherwise spend more on building these arrays than on computing).
        data = getattr(self.problem, "program_data", None)
        key = (self._algorithm, dict(self._params) if self._params else None, data)
        kept = self._data_kept
        if kept is not None and kept[0][0] is key[0] and kept[0][2] is data and kept[0][1] == key[1]:
            return kept[1]
        if data is None:
            value = params_data(self._algorithm, self._params) if self._params else None
        else:
            value = {**params_data(self._algorithm, self._params), PROBLEM_DATA: data}
        self._data_kept = (key, value)
        return value

    # -- ask / evaluate / tell: a generation in the user's hands --------------------------------
    def ask(self) -> jax.Array:
        """The next generation's candidates, ``(algorithm.num_ask, dim)`` (a population that changes
        size at restarts: the rows of its current bucket, of which the first lambda count), the
        same on every rank.
        Then ``evaluate`` them (or compute their fitness any way that gives every rank the same
        values) and ``tell`` the fitness: ``ask``, ``evaluate``, ``tell`` is bitwise one
        ``advance(1)``. Collective only in what it checks (one small Allreduce)."""
        self._require_state()
        agreed(self.ctx, "Loop.ask", lambda: self._require_no_pending("ask"), lambda _: str(self.generation))
        self._select_engine()
        with collective_stage(self.ctx), user_code(self.ctx, "the algorithm"), user_errors():
            x, algo = self.engine.ask(self.state, self._data())
        self._pending = (x, algo, self.generation + 1)
        return x

    def evaluate(self, x: Any) -> jax.Array:
        """The problem's raw fitness of ``x`` (``(n, dim)``, any n), each rank evaluating its share
        and the values gathered: the same bits at any rank count. Collective: every rank passes
        the same candidates. NaN or infinite values are kept (``tell`` counts them as worst)."""
        def check() -> jax.Array:
            a = jnp.asarray(_real(x, "Loop.evaluate", "x"))
            if a.ndim != 2 or a.shape[1] != self._algorithm.dim or a.shape[0] < 1:
                raise UsageError(f"Loop.evaluate: 'x' must be candidates of shape (n, {self._algorithm.dim}), got "
                                 f"shape {tuple(a.shape)}")
            return a.astype(self._algorithm.dtype)

        a = agreed(self.ctx, "Loop.evaluate's candidates", check, _array_text)
        generation = self._pending[2] if self._pending else self.generation + 1
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            return self.engine.evaluate_batch(a, generation, self._data())

    def tell(self, x: Any, fitness: Any) -> "Loop":
        """End the generation ``ask`` began: the algorithm learns ``fitness`` (of ``x``, the asked
        candidates; minimised; NaN and infinities count as worst), the best-so-far and the history
        are updated, and ``generation`` counts one more. Collective: every rank passes the same
        values (UsageError names the ranks that differ: a fitness computed differently on one
        rank would fork the replicas)."""
        def check() -> tuple[jax.Array, jax.Array]:
            if self._pending is None:
                raise UsageError("Loop.tell: no generation is open: call ask() first")
            asked = self._pending[0]
            xa = jnp.asarray(_real(x, "Loop.tell", "x"), self._algorithm.dtype)
            fa = jnp.asarray(_real(fitness, "Loop.tell", "fitness"))
            if xa.shape != asked.shape:
                raise UsageError(f"Loop.tell: 'x' must be the {asked.shape[0]} candidates ask() gave, shape "
                                 f"{tuple(asked.shape)}; got shape {tuple(xa.shape)}")
            want = (asked.shape[0],) if self.engine.recorder.kind == "single-objective" else (asked.shape[0], -1)
            if fa.ndim != len(want) or fa.shape[0] != want[0]:
                raise UsageError(f"Loop.tell: 'fitness' must have one value per candidate, shape {want[:1]}"
                                 f"{' + (objectives,)' if len(want) > 1 else ''}; got shape {tuple(fa.shape)}")
            return xa, fa.astype(self._algorithm.dtype)

        xa, fa = agreed(self.ctx, "Loop.tell's candidates and fitness", check,
                        lambda v: _array_text(v[0]) + _array_text(v[1]))
        _, algo, _ = self._pending  # type: ignore[misc]
        with collective_stage(self.ctx), user_code(self.ctx, "the algorithm"), user_errors():
            self.state, part = self.engine.tell(self.state, xa, algo, fa, self._data())
        self._pending = None
        self.generation += 1
        self._took(part)
        return self

    def functions(self) -> Functions:
        """The generation as pure functions of the loop state, for the user's own ``jax.jit`` or
        ``lax.scan`` (``engine.Functions``: ``ask(state, params)``, ``evaluate(x)``,
        ``tell(state, x, algo, raw, params)``; ``params``: ``Loop.params_data()``). Every rank must
        run the program alike (its evaluation gathers over the ranks). Hand the state back with
        ``adopt``. JAX problems only. A population that changes size at restarts computes its
        largest size here, every generation (one fixed shape: ``advance`` moves between sizes)."""
        return (self._family if self._buckets else self.engine).functions(self._data())

    def params_data(self) -> Params:
        """The dynamic hyper-parameters as the arrays the functions of ``functions`` take."""
        return self._data() or {}

    def adopt(self, state: Any, history: Any = None) -> "Loop":
        """Continue from ``state``, a loop state that ``functions`` computed from this loop's
        (``generation`` follows it). ``history``: the rows of the generations run outside (a
        ``History`` of stacked values, as a ``lax.scan`` collects them); without it those
        generations' history is NaN (-1 for counts). Collective: checked to be the same on every
        rank (``check_replicas``)."""
        old = self._require_state()
        self._require_no_pending("adopt")
        if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(old) or any(
                jnp.shape(a) != jnp.shape(b) or jnp.result_type(a) != jnp.result_type(b)
                for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(old))):
            raise UsageError("Loop.adopt: 'state' is not a state of this loop (other structure, shapes or dtypes)")
        n = int(state.generation) - self.generation
        if n < 0:
            raise UsageError(f"Loop.adopt: 'state' is at generation {int(state.generation)}, before this loop's "
                             f"{self.generation}")
        fields = self.engine.recorder.history_type._fields
        if history is not None:
            part = {k: np.asarray(jax.device_get(getattr(history, k)))[-n:] if n else
                    np.asarray(jax.device_get(getattr(history, k)))[:0] for k in fields}
        else:
            cols = self.history
            part = {k: np.full(n, -1 if np.issubdtype(cols[k].dtype, np.integer) else np.nan, cols[k].dtype)
                    for k in fields}
        # Generations run outside the loop count every row (their rows_used is not known here).
        part["evaluations"] = np.full(n, self._algorithm.num_ask, np.int64)
        self.state, self.generation = state, self.generation + n
        self.check_replicas()
        self._took(part)
        return self

    def _require_no_pending(self, what: str) -> None:
        if self._pending is not None:
            raise UsageError(f"Loop.{what}: generation {self._pending[2]} was asked but not told: call "
                             "tell(x, fitness) first")

    def close(self) -> None:
        """Free what the engine holds (host problems: threads, simulator processes). Collective."""
        self.engine.close()

    def __enter__(self) -> "Loop":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:  # (collective: not on the way out with an error)
            self.close()

    # -- reading (this rank alone; every rank holds the same) -------------------------------------
    @property
    def history(self) -> dict[str, np.ndarray]:
        """One value per generation so far, by series (``best``, ``gen_mean``...)."""
        return self._history.view()

    @property
    def best_fitness(self) -> float:
        """The best fitness seen so far (single-objective runs)."""
        return float(self._single().best_f)

    @property
    def best_solution(self) -> np.ndarray:
        """Where it was seen."""
        return np.asarray(jax.device_get(self._single().best_x))

    @property
    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """Multi-objective runs: the population's non-dominated candidates and their objectives."""
        state = self._require_state()
        if self.engine.recorder.kind != "multi-objective":
            raise UsageError("a single-objective run has no front: read best_fitness and best_solution")
        n = int(state.front_size)
        return np.asarray(jax.device_get(state.front_x[:n])), np.asarray(jax.device_get(state.front_f[:n]))

    def _single(self) -> Any:
        state = self._require_state()
        if self.engine.recorder.kind != "single-objective":
            raise UsageError("a multi-objective run has no single best: read front (or outcome())")
        return state

    @property
    def evaluations(self) -> int:
        """Evaluations done so far: the rows the algorithm used (``Algorithm.rows_used``; IPOP-
        and BIPOP-CMA-ES's inactive rows do not count). Exact; Python ints never overflow."""
        return self._evaluations

    def population(self) -> tuple[np.ndarray, np.ndarray]:
        """The algorithm's current population and its fitness (``Algorithm.population``)."""
        x, f = self.algorithm.population(self._require_state().algo)
        return np.asarray(jax.device_get(x)), np.asarray(jax.device_get(f))

    def boundary(self) -> dict[str, Any]:
        """What a log boundary reports of the state (best, generation mean...; or hv, igd...)."""
        return self.engine.recorder.boundary(self._require_state())

    def detail_lines(self, rec: dict[str, Any]) -> list[str]:
        """Log lines under a boundary's line (an archipelago's islands; none here)."""
        return []

    def counters(self) -> dict[str, int]:
        """Counts besides the recorder's (host problems: failed_evaluations)."""
        return self.engine.counters(self._require_state())

    def outcome(self) -> dict[str, Any]:
        """The outcome so far: best fitness and solution (or the front and its indicators)."""
        return self.engine.recorder.summary(self._require_state())

    def digest(self) -> str:
        """SHA-256 of the whole state: equal digests, bitwise equal runs."""
        return state_digest(self._require_state())

    def check_replicas(self) -> None:
        """Collective: DivergenceError on every rank if any rank's state differs from rank 0's."""
        state = self._require_state()
        if self.ctx.size > 1:  # (one rank has no replica to compare: no fingerprint to compute)
            check_replicas(self.ctx, self.engine.fingerprint(state), self.generation)

    def _require_state(self) -> Any:
        if self.state is None:
            raise UsageError("this Loop has no state yet: call init(seed) or load(path) first")
        return self.state

    # -- checkpoints (collective) ----------------------------------------------------------------
    def snapshot(self, config_text: str = "") -> checkpoint.Snapshot:
        """What a checkpoint of this loop holds (``config_text``: the run's resolved config)."""
        state = self._require_state()
        self._require_no_pending("save")
        return checkpoint.Snapshot(self.generation, self.evaluations, int(self.seed), config_text, state,
                                   self.history, self.algorithm.num_init, self.algorithm.num_ask, self.params)

    def save(self, directory: str | Path, *, keep: int = 3, config_text: str = "") -> Path:
        """Write a checkpoint into ``directory`` (``gen-NNNNNNNNN.h5``; the newest ``keep`` are
        kept, this one always among them, even beside checkpoints of later generations). Every
        rank writes its share; any rank's failure is CheckpointError everywhere."""
        directory = arguments.path(self.ctx, directory, "Loop.save", "directory")
        keep = arguments.keep(self.ctx, keep, "Loop.save")
        agreed(self.ctx, "Loop.save", self._require_state, lambda _: "")
        return checkpoint.write(self.ctx, directory, self.snapshot(str(config_text)), keep=keep)

    def template(self) -> Any:
        """Shapes and dtypes of the state (what a checkpoint of this loop must hold)."""
        return self.engine.template(self.seed or 0, self._data())

    def load(self, path: str | Path) -> "Loop":
        """Continue from a checkpoint file (written at any rank count): the state, history and
        generation it holds. CheckpointDamaged for a file that cannot be trusted; UsageError for
        one written by another algorithm or problem."""
        path = arguments.path(self.ctx, path, "Loop.load", "path", file=True)
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            template = self.template()
        return self.restore(checkpoint.load(self.ctx, path, template))

    def restore(self, loaded: checkpoint.Loaded) -> "Loop":
        fields = sorted(self.engine.recorder.history_type._fields)
        if sorted(set(loaded.history) - {"evaluations"}) != fields:
            raise UsageError(f"cannot resume from '{loaded.header.path}': its history has "
                             f"{sorted(loaded.history)}, this run keeps {fields}: it was written by another "
                             "kind of run")
        params = loaded.header.params
        if params is not None and set(params) != set(self._params):
            raise UsageError(f"cannot resume from '{loaded.header.path}': it holds hyper-parameters "
                             f"{sorted(params)}, {type(self._algorithm).__name__} has {sorted(self._params)}")
        if params:  # the checkpoint's values, even where they were changed while it ran
            self._algorithm, self._params = dataclasses.replace(self._algorithm, **params), dict(params)
        self.state, self.seed, self.generation = loaded.state, loaded.header.seed, loaded.header.generation
        self._pending = None
        self._history = HistoryBuffer()
        history = dict(loaded.history)
        if "evaluations" not in history:  # (written before evaluations were a series)
            history["evaluations"] = np.diff([evaluations(self._algorithm, g) for g in range(self.generation + 1)])
        self._history.append(history)
        self._evaluations = int(loaded.header.evaluations)
        self.met = None
        return self


_fingerprint = FINGERPRINT

# Engines (and the programs they compiled) of this process's recent loops. A loop of the same
# algorithm (its dynamic hyper-parameters are data, so their values do not count), problem,
# ranks and options takes the engine of an earlier one: a seed sweep in one process (a study's
# runs, a script that calls hpcevo.run per seed) compiles its programs once. Engines hold no run
# state: the loop does.
ENGINES_KEPT = 64  # (a restarting CMA-ES uses up to ten: one per population bucket)
_ENGINES: list[tuple[tuple, DeviceEngine]] = []


def device_engine(algorithm: Algorithm, problem: Problem, ctx: ParallelContext, microbatch: int | None,
                  batch_size: int | None, recorder: Any, trace: str = "") -> DeviceEngine:
    """A ``DeviceEngine`` for these pieces: a kept one when an earlier loop had the same."""
    with_data = getattr(problem, "program_data", None) is not None
    key = engine_key(algorithm, problem, ctx, microbatch, batch_size, recorder, trace)
    for i, (k, engine) in enumerate(_ENGINES):
        if _same(k, key):
            _ENGINES.append(_ENGINES.pop(i))
            return engine
    evaluate = problem.evaluate_with if with_data else problem.evaluate
    engine = DeviceEngine(algorithm, evaluate, ctx, microbatch=microbatch, batch_size=batch_size,
                          with_generation=problem.wants_generation, recorder=recorder, trace=trace,
                          with_data=with_data, block_invariant=bool(getattr(problem, "block_invariant", False)))
    # One rank's programs of hpcevo's own pieces are kept on disk by what they are made from
    # (the same key, written out): the next launch loads them untraced (programs.py).
    store = programs.store_for(jax.config.jax_compilation_cache_dir) if ctx.size == 1 else None
    made_of = None if store is None else disk_id(problem, key, ctx)
    if made_of is not None:
        engine.keep_on_disk(store, made_of)
    _ENGINES.append((key, engine))
    del _ENGINES[:-ENGINES_KEPT]
    return engine


def engine_key(algorithm: Algorithm, problem: Problem, ctx: ParallelContext, microbatch: int | None,
               batch_size: int | None, recorder: Any, trace: str = "") -> tuple:
    """What makes an engine's programs: loops whose keys are equal share one engine."""
    # A problem whose instance data are arguments (``program_data``) is one program for all its
    # instances.
    program = problem.program if getattr(problem, "program_data", None) is not None else problem
    return (_static_part(algorithm), program, ctx, microbatch, batch_size, _recorder_key(recorder), trace,
            loop_shape(ctx.device_kind))


def disk_id(problem: Problem, key: tuple, ctx: Any) -> str | None:
    """``engine_key`` written out (the context by what its programs see of it: one rank, its
    device kind), for programs kept on disk; None where a piece is not hpcevo's own."""
    made_of = programs.describe((type(problem), *key[:2], *key[3:], ctx.size, ctx.device_kind))
    return None if made_of is None else hashlib.sha256(made_of.encode()).hexdigest()


def _static_part(algorithm: Algorithm) -> tuple:
    dynamic = params_of(algorithm)
    return (type(algorithm), tuple((f.name, getattr(algorithm, f.name)) for f in dataclasses.fields(algorithm)
                                   if f.name not in dynamic))


def _recorder_key(recorder: Any) -> tuple:
    arrays = tuple(None if a is None else (a.shape, a.tobytes())
                   for a in (getattr(recorder, "ref_point", None), getattr(recorder, "ref_front", None)))
    return (type(recorder), getattr(recorder, "m", 1), arrays)


def _same(a: tuple, b: tuple) -> bool:
    # The context by identity (its communicators are compiled in); the rest by value where a
    # value comparison is defined, else by identity (a problem holding arrays).
    if a[2] is not b[2]:
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an __eq__ that cannot answer: not the same
        return False


def _real(value: Any, where: str, name: str) -> Any:
    """``value`` if it is (convertible to) an array of real numbers; else a UsageError naming it.
    A complex fitness would lose its imaginary part without a word, and strings, None or objects
    would fail deep inside JAX."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            value = np.asarray(value)
        except (ValueError, TypeError) as e:  # (ragged lists)
            raise UsageError(f"{where}: '{name}' must be an array of real numbers; got {type(value).__name__} "
                             f"({e})") from None
        dtype = value.dtype
    if np.dtype(dtype).kind not in "biuf":
        what = {"c": "complex numbers", "U": "strings", "S": "bytes", "O": "Python objects (or None)"}.get(
            np.dtype(dtype).kind, str(dtype))
        raise UsageError(f"{where}: '{name}' must be an array of real numbers; got {what} ({np.dtype(dtype)})")
    return value


def _array_text(a: jax.Array) -> str:
    """An array as text for agreement: its shape, dtype and a fingerprint computed where it lies
    (a few bytes reach the host, not the array)."""
    return f"{a.dtype}{tuple(a.shape)}:{np.asarray(_fingerprint(a)).tolist()}"


def context(ctx: Any, where: str) -> ParallelContext:
    if ctx is None:
        from ..parallel import init

        return init()
    if not isinstance(ctx, ParallelContext):
        raise UsageError(f"{where}: 'ctx' must be a ParallelContext (hpcevo.parallel.init()), got {type(ctx).__name__}")
    return ctx


def as_loop_problem(problem: Any, algorithm: Algorithm, host: bool) -> Problem | HostProblem:
    """``problem`` as a problem object for ``algorithm`` (a function is wrapped; its dim and box
    default to the algorithm's), checked to be of the algorithm's dimension."""
    if host or not isinstance(problem, (Problem, HostProblem)):
        try:
            problem = as_problem(problem, host=host, dtype=algorithm.dtype,
                                 fallback=(algorithm.dim, algorithm.lb, algorithm.ub))
        except ValueError as e:
            raise ConfigError(str(e), "problem") from None
    if problem.dim != algorithm.dim:
        raise ConfigError(f"problem '{problem.name}' has dim {problem.dim}, the algorithm {algorithm.dim}: build the "
                          "algorithm with the problem's dim", "problem")
    return problem


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """An exception raised by the user's code while it is traced becomes bad input (UsageError,
    naming the user's line) on the rank that saw it, before the ranks agree on it; one raised
    inside hpcevo or JAX stays what it is (a bug)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - converted or raised again as it is
        where = user_location(e)
        if isinstance(e, UsageError) or where is None:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"the problem raised {type(e).__name__}{': ' + first if first else ''} ({where}) "
                         "while its step was compiled") from None


def chunks(generations: int, most: int = MAX_CHUNK) -> list[int]:
    """``generations`` as the dispatches that run them: at most ``most`` each."""
    if generations < 0:
        raise ValueError(f"advance: generations must be >= 0, got {generations}")
    return [most] * (generations // most) + ([generations % most] if generations % most else [])


def checked_limits(where: str, single_objective: bool, evaluations: Any, target: Any, stagnation: Any,
                   tolerance: Any) -> Limits:
    """The arguments of ``Loop.limit`` (and ``Archipelago.limit``) checked: Limits, or UsageError."""
    ev = None if evaluations is None else schema.check(int, evaluations, "evaluations", where)
    if ev is not None and ev < 1:
        raise UsageError(f"{where}: 'evaluations' must be >= 1 (or None), got {ev}")
    tg = None if target is None else schema.check(float, target, "target", where)
    st = None if stagnation is None else schema.check(int, stagnation, "stagnation", where)
    tol = schema.check(float, tolerance, "tolerance", where)
    if (tg is not None or st is not None) and not single_objective:
        raise UsageError(f"{where}: 'target' and 'stagnation' are about a fitness value: for "
                         "single-objective runs only")
    if tg is not None and math.isnan(tg):
        raise UsageError(f"{where}: 'target' must be a number, got nan")
    if st is not None and st < 1:
        raise UsageError(f"{where}: 'stagnation' must be >= 1 generations (or None), got {st}")
    if not tol >= 0:
        raise UsageError(f"{where}: 'tolerance' must be >= 0, got {tol}")
    return Limits(ev, tg, st, tol)


def evaluations(algorithm: Algorithm, generation: int) -> int:
    """Evaluations done after ``generation`` generations."""
    if generation <= 0:
        return 0
    return algorithm.num_init + (generation - 1) * algorithm.num_ask
