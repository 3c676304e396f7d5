"""Islands: several populations, each on its group of ranks, with deterministic migration.

``Archipelago`` is to islands what ``Loop`` is to one population, and ``hpcevo.run`` drives
either through the same ``execute``::

    ctx = hpcevo.parallel.init()
    algorithms = [CSO(...), CSO(...), DE(...), DE(...)]        # one per island
    arch = Archipelago(algorithms, problem, ctx, Migration(every=20, migrants=5)).init(seed=1)
    arch.advance(99)
    arch.best_fitness, arch.island_best(), arch.digest()

Islands are laid out on ranks by ``parallel.islands.IslandLayout``: a group of ranks per island
(evaluation sharded over it), or several islands per rank. One jitted call advances this rank's
islands many generations; every ``every`` generations the islands' emigrants travel in one
allgather inside it (``parallel.islands.gather_islands``) and each island takes its immigrants
(``algorithms.migration``). Island i starts from ``fold_in(PRNGKey(seed), i)``.

What the host sees of other ranks' islands it gathers at boundaries: histories after each
dispatch (a few numbers per generation), states only for a checkpoint or the digest (every
island, in island order: so a checkpoint resumes at any rank count and layout).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..algorithms import migration as mig
from ..algorithms.base import Algorithm
from ..parallel import ParallelContext
from ..parallel.islands import IslandLayout, gather_islands, island_context
from .engine import MAX_CHUNK, DeviceEngine, fingerprint, idle_ranks
from .recording import SingleObjective


@dataclasses.dataclass(frozen=True)
class Totals:
    """What the driver reads of "the algorithm" of a whole archipelago: sums over islands."""

    pop_size: int
    num_init: int
    num_ask: int


class IslandsEngine:
    """This rank's islands, advanced together in one jitted call, migration inside it."""

    def __init__(self, algorithms: Sequence[Algorithm], problem: Any, ctx: ParallelContext,
                 migration: mig.Migration, *, microbatch: int | None = None, batch_size: int | None = None,
                 trace: str = ""):
        self.algorithms, self.ctx, self.migration = list(algorithms), ctx, migration
        self.layout = IslandLayout(len(self.algorithms), ctx.size, ctx.rank)
        self.group = island_context(ctx, self.layout)
        self.recorder = SingleObjective()
        # Every island gets an engine (cheap: nothing compiles until called) for its template;
        # this rank computes with its own islands' only.
        # ``trace``: each generation's fitness values (and candidates: "fx") of every island come
        # back with the history, for a logger of every evaluation (COCO's), as DeviceEngine's.
        self.trace = trace
        self.engines = [DeviceEngine(a, problem.evaluate, self.group, microbatch=microbatch, batch_size=batch_size,
                                     with_generation=problem.wants_generation, recorder=self.recorder, trace=trace)
                        for a in self.algorithms]
        self.local = self.layout.local
        self.max_chunk = min(e.max_chunk for e in self.engines)
        self.shards = tuple(self.engines[i].generation.shards for i in self.local)
        self._first = jax.jit(self._first_all)
        self._chunk = jax.jit(self._run_chunk, donate_argnums=0)
        self._fingerprint = jax.jit(lambda states: tuple(fingerprint(s) for s in states))

    @property
    def microbatches(self) -> int:
        return min(e.microbatches for e in self.engines)

    def idle_ranks(self) -> tuple[int, int]:
        """Over the islands: each island's evaluation is shared by its group of ranks alone (a
        rank hosting several islands evaluates each of them whole)."""
        idle, fair = 0, []
        for i, e in enumerate(self.engines):
            n, f = idle_ranks(len(self.layout.ranks_of(i)), e.microbatches, e.algorithm.num_ask)
            idle, fair = idle + n, fair + [f]
        return idle, min(fair)

    @property
    def migrates(self) -> bool:
        return len(self.algorithms) > 1 and self.migration.migrants > 0

    # -- jitted ------------------------------------------------------------------------------------
    def _first_all(self, key: jax.Array, shards: tuple):
        out = [self.engines[i]._first_with_history(mig.island_key(key, i), sh) for i, sh in zip(self.local, shards)]
        states = tuple(o[0] for o in out)
        if self.migrates and self.migration.every == 1:
            states = self._migrate(states, key, jnp.asarray(1, jnp.int32))
        return states, tuple(o[1] for o in out), tuple(o[2] for o in out), tuple(o[3] for o in out)

    def _run_chunk(self, states: tuple, n: jax.Array, key: jax.Array, shards: tuple):
        engines = [self.engines[i] for i in self.local]
        row = self.recorder.row
        bufs = tuple(self.recorder.history_type(*(jnp.zeros((MAX_CHUNK, *s.shape), s.dtype)
                                                  for s in jax.eval_shape(row, st, st))) for st in states)
        used = tuple(jnp.zeros(MAX_CHUNK, jnp.int32) for _ in states)
        traced = [jax.eval_shape(e._next_generation, s, sh)[2] for e, s, sh in zip(engines, states, shards)]
        traces = tuple(tuple(jnp.zeros((self.max_chunk if self.trace else 0, *t.shape), t.dtype) for t in tr)
                       for tr in traced)

        def body(j, carry):
            ss, hs, us, ts = carry
            # A barrier per island: XLA compiles each island's generation as it would alone, so
            # a rank hosting several islands computes each with the bits of a rank hosting one.
            # (What a generation brings back besides its state passes the barrier with it: the
            # state's computation is the same whether the fitness is traced or not.)
            outs = [lax.optimization_barrier(e._next_generation(lax.optimization_barrier(s), sh))
                    for e, s, sh in zip(engines, ss, shards)]
            new = tuple(o[0] for o in outs)
            hs = tuple(type(h)(*(col.at[j].set(v) for col, v in zip(h, row(s, s2)))) for h, s, s2 in zip(hs, ss, new))
            us = tuple(u.at[j].set(o[1]) for u, o in zip(us, outs))
            if self.trace:
                ts = tuple(tuple(b.at[j].set(v) for b, v in zip(t, o[2])) for t, o in zip(ts, outs))
            if self.migrates:
                g = new[0].generation
                new = lax.cond(g % self.migration.every == 0, lambda t: self._migrate(t, key, g), lambda t: t, new)
            return new, hs, us, ts

        return lax.fori_loop(0, n, body, (states, bufs, used, traces))

    def _migrate(self, states: tuple, key: jax.Array, generation: jax.Array) -> tuple:
        how = self.migration
        m = how.migrants
        k = mig.migration_key(key, generation)
        pops, rows = [], []
        for i, s in zip(self.local, states):
            x, f = self.algorithms[i].population(s.algo)
            ex, ef = mig.emigrants(x, f, m, how.emigrants, jax.random.fold_in(k, 2 * i))
            pops.append((x, f))
            rows.append(jnp.concatenate([ex, ef[:, None].astype(ex.dtype)], axis=1))
        table = gather_islands(jnp.stack(rows), self.layout, self.ctx)
        table_x, table_f = table[..., :-1], table[..., -1]
        src = mig.sources(how.topology, len(self.algorithms), k)
        out = []
        for i, s, (x, f) in zip(self.local, states, pops):
            ix, iff = mig.immigrants(table_x, table_f, i, src, m)
            x2, f2 = mig.replace(x, f, ix, iff, how.replace, jax.random.fold_in(k, 2 * i + 1))
            out.append(s._replace(algo=self.algorithms[i].with_population(s.algo, x2, f2)))
        return tuple(out)

    # -- host side ---------------------------------------------------------------------------------
    def start(self, seed: int) -> tuple[tuple, dict[int, dict[str, np.ndarray]]]:
        states, hists, used, traces = self._first(jax.random.PRNGKey(seed), self.shards)
        return states, self._host(hists, used, traces, 1)

    def advance(self, states: tuple, n: int, seed: int) -> tuple[tuple, dict[int, dict[str, np.ndarray]]]:
        """``n`` (1..max_chunk) more generations of this rank's islands; the states are donated.
        Each island's rows: its history's columns, ``evaluations`` (rows used per generation)
        and, when traced, ``fitness`` and ``x``."""
        if not 1 <= n <= self.max_chunk:
            raise ValueError(f"advance: n must be in 1..{self.max_chunk}, got {n}")
        states, hists, used, traces = self._chunk(states, jnp.asarray(n, jnp.int32), jax.random.PRNGKey(seed),
                                                  self.shards)
        return states, self._host(hists, used, traces, n)

    def _host(self, hists: tuple, used: tuple, traces: tuple, n: int) -> dict[int, dict[str, np.ndarray]]:
        host, used, traces = jax.device_get((hists, used, traces))
        out = {}
        for i, h, u, t in zip(self.local, host, used, traces):
            rows = {k: np.asarray(v[:n]) for k, v in zip(type(h)._fields, h)}
            rows["evaluations"] = np.asarray(u[:n], np.int64)
            for name, values in zip(("fitness", "x"), t if self.trace else ()):
                rows[name] = np.asarray(values[:n])
            out[i] = rows
        return out

    def copy(self, states: tuple) -> tuple:
        """A copy of ``states`` that ``advance`` (which donates its argument) leaves intact."""
        return jax.tree.map(jnp.copy, states)

    def template(self) -> tuple:
        """Every island's state shape, in island order (what a checkpoint holds)."""
        return tuple(e.template(0) for e in self.engines)

    def compile(self, seed: int, first: bool = True) -> None:
        key = jax.random.PRNGKey(seed)
        if first:
            self._first.lower(key, self.shards).compile()
        shapes = tuple(self.engines[i].template(seed) for i in self.local)
        self._chunk.lower(shapes, jnp.asarray(1, jnp.int32), key, self.shards).compile()

    def fingerprints(self, states: tuple) -> dict[int, np.ndarray]:
        return {i: np.asarray(fp) for i, fp in zip(self.local, self._fingerprint(states))}

    def close(self) -> None:
        pass
