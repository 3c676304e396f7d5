"""Differential Evolution: DE/rand/1/bin, DE/current-to-best/1/bin, and JADE.

[SP97] R. Storn and K. Price, "Differential Evolution - A Simple and Efficient Heuristic for
       Global Optimization over Continuous Spaces", Journal of Global Optimization 11:341-359,
       1997. Mutation Eq. 1 (DE/rand/1), the best-guided variant of Sec. 2.2 (here in its usual
       current-to-best/1 form, v = x_i + F (x_best - x_i) + F (x_r1 - x_r2)), binomial crossover
       Eq. 2-4 with one coordinate j_rand always taken from the mutant, greedy one-to-one
       selection. Defaults: F = 0.5, CR = 0.9 (their Sec. 4 advice: F in [0.5, 1], CR = 0.9 or
       1 for fast convergence, 0.1 for separable problems; NP = 5-10 times the dimension).
[ZS09] J. Zhang and A. C. Sanderson, "JADE: Adaptive Differential Evolution With Optional
       External Archive", IEEE Transactions on Evolutionary Computation 13(5):945-958, 2009.
       DE/current-to-pbest/1 with archive (Eq. 7-8), CR_i ~ N(mu_CR, 0.1) (Eq. 9-10),
       F_i ~ Cauchy(mu_F, 0.1) (Eq. 11-12, Lehmer mean), defaults p = 0.05, c = 0.1,
       mu_CR = mu_F = 0.5 (Sec. IV-A).

All three repair a mutant coordinate outside the box to the midpoint between the bound and the
parent's coordinate, the rule of [ZS09, Sec. IV-A]: the trial stays in the box without piling up
on the bound as clipping would. A trial replaces its parent when it is at least as good [SP97]
(strictly better in JADE's success bookkeeping [ZS09, Alg. 1]).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


def _skip(r: jax.Array, excluded: jax.Array) -> jax.Array:
    """Map r in [0, n - m) to the r-th integer of [0, n) not among the m ``excluded`` (per row,
    columns of ``excluded``), uniformly: shift past the excluded values in increasing order."""
    for j in range(excluded.shape[1]):
        r = r + (r >= excluded[:, j])
    return r


def distinct_indices(key: jax.Array, n: int, target: jax.Array, k: int) -> jax.Array:
    """(len(target), k) indices, uniform over [0, n), distinct in a row and from ``target``."""
    chosen = target[:, None]
    for j in range(k):
        key, sub = jax.random.split(key)
        r = jax.random.randint(sub, target.shape, 0, n - 1 - j)
        r = _skip(r, jnp.sort(chosen, axis=1))
        chosen = jnp.concatenate([chosen, r[:, None]], axis=1)
    return chosen[:, 1:]


def binomial_crossover(key: jax.Array, parent: jax.Array, mutant: jax.Array, cr: jax.Array) -> jax.Array:
    """[SP97, Eq. 4]: coordinate j from the mutant if U(0,1) <= CR or j == j_rand."""
    k_u, k_j = jax.random.split(key)
    pop, dim = parent.shape
    u = jax.random.uniform(k_u, (pop, dim), parent.dtype)
    j_rand = jax.random.randint(k_j, (pop, 1), 0, dim)
    take = (u <= jnp.reshape(cr, (-1, 1))) | (jnp.arange(dim) == j_rand)
    return jnp.where(take, mutant, parent)


class DEState(NamedTuple):
    key: jax.Array
    population: jax.Array  # (pop, dim)
    fitness: jax.Array  # (pop,)
    trials: jax.Array  # (pop, dim) the asked trial vectors


class JADEState(NamedTuple):
    key: jax.Array
    population: jax.Array
    fitness: jax.Array
    trials: jax.Array
    F: jax.Array  # (pop,) this generation's scale factors
    CR: jax.Array  # (pop,) this generation's crossover rates
    mu_F: jax.Array  # ()
    mu_CR: jax.Array  # ()
    archive: jax.Array  # (pop, dim) recently replaced parents; rows >= archive_size unused
    archive_size: jax.Array  # int32


@dataclasses.dataclass(frozen=True)
class _DEBase(BaseAlgorithm):
    def _repair(self, mutant: jax.Array, parent: jax.Array) -> jax.Array:
        lb, ub = self.bounds()
        mutant = jnp.where(mutant < lb, (lb + parent) / 2, mutant)
        return jnp.where(mutant > ub, (ub + parent) / 2, mutant)

    def _start(self, key: jax.Array):
        key, k_pos = jax.random.split(key)
        pos = self.uniform_in_bounds(k_pos, self.pop_size)
        return key, pos, jnp.full((self.pop_size,), jnp.inf, self.dtype)

    def init_ask(self, state):
        return state.population, state

    def init_tell(self, state, fitness):
        return state._replace(fitness=fitness.astype(self.dtype))

    def population(self, state) -> tuple[jax.Array, jax.Array]:
        """The population and its fitness (the trial vectors are not part of it)."""
        return state.population, state.fitness

    migrates: ClassVar[bool] = True

    def with_population(self, state, x: jax.Array, f: jax.Array):
        return state._replace(population=x, fitness=f)


@dataclasses.dataclass(frozen=True)
class DE(_DEBase):
    """Classic DE [SP97]: ``strategy`` "rand/1/bin" or "current-to-best/1/bin", F, CR."""
    dynamic: ClassVar[tuple[str, ...]] = ("F", "CR")

    strategy: Literal["rand/1/bin", "current-to-best/1/bin"] = "rand/1/bin"
    F: float = 0.5
    CR: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        need = {"rand/1/bin": 4, "current-to-best/1/bin": 3}
        if self.strategy not in need:
            raise ConfigError(f"strategy must be one of {', '.join(need)}, got {self.strategy!r}")
        if self.pop_size < need[self.strategy]:
            raise ConfigError(
                f"DE/{self.strategy} needs pop_size >= {need[self.strategy]} (distinct donors), got {self.pop_size}")
        if not 0 < self.F <= 2:
            raise ConfigError(f"F must be in (0, 2], got {self.F}")
        _es.check_unit("CR", self.CR)

    def init(self, key: jax.Array) -> DEState:
        key, pos, fit = self._start(key)
        return DEState(key, pos, fit, jnp.zeros_like(pos))

    def ask(self, state: DEState) -> tuple[jax.Array, DEState]:
        key, k_idx, k_cr = jax.random.split(state.key, 3)
        x, n = state.population, self.pop_size
        target = jnp.arange(n, dtype=jnp.int32)
        if self.strategy == "rand/1/bin":
            r = distinct_indices(k_idx, n, target, 3)
            mutant = x[r[:, 0]] + self.F * (x[r[:, 1]] - x[r[:, 2]])
        else:
            r = distinct_indices(k_idx, n, target, 2)
            best = x[jnp.argmin(state.fitness)]
            mutant = x + self.F * (best - x) + self.F * (x[r[:, 0]] - x[r[:, 1]])
        trials = binomial_crossover(k_cr, x, self._repair(mutant, x), jnp.asarray(self.CR, self.dtype))
        return trials, state._replace(key=key, trials=trials)

    def tell(self, state: DEState, fitness: jax.Array) -> DEState:
        fitness = fitness.astype(self.dtype)
        better = fitness <= state.fitness
        return state._replace(
            population=jnp.where(better[:, None], state.trials, state.population),
            fitness=jnp.where(better, fitness, state.fitness),
        )


@dataclasses.dataclass(frozen=True)
class JADE(_DEBase):
    """JADE [ZS09]: DE/current-to-pbest/1/bin, archive, self-adapted F and CR."""
    dynamic: ClassVar[tuple[str, ...]] = ("c",)

    p: float = 0.05
    c: float = 0.1
    archive: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 3:
            raise ConfigError(f"JADE needs pop_size >= 3 (distinct donors), got {self.pop_size}")
        _es.check_unit("p", self.p, closed_low=False)
        _es.check_unit("c", self.c)

    def init(self, key: jax.Array) -> JADEState:
        key, pos, fit = self._start(key)
        n, dt = self.pop_size, self.dtype
        half = jnp.asarray(0.5, dt)
        return JADEState(key, pos, fit, jnp.zeros_like(pos), jnp.zeros((n,), dt), jnp.zeros((n,), dt),
                         half, half, jnp.zeros_like(pos), jnp.asarray(0, jnp.int32))

    def _sample_F(self, key: jax.Array, mu_F: jax.Array) -> jax.Array:
        # [ZS09, Eq. 12]: Cauchy(mu_F, 0.1), truncated to 1 above, drawn again where <= 0.
        def draw(k):
            return mu_F + 0.1 * jax.random.cauchy(k, (self.pop_size,), self.dtype)

        def again(c):
            k, F = c
            k, sub = jax.random.split(k)
            return k, jnp.where(F > 0, F, draw(sub))

        key, sub = jax.random.split(key)
        _, F = jax.lax.while_loop(lambda c: jnp.any(c[1] <= 0), again, (key, draw(sub)))
        return jnp.minimum(F, 1.0)

    def ask(self, state: JADEState) -> tuple[jax.Array, JADEState]:
        key, k_f, k_cr, k_best, k_r1, k_r2, k_x = jax.random.split(state.key, 7)
        x, n, dt = state.population, self.pop_size, self.dtype
        F = self._sample_F(k_f, state.mu_F)
        CR = jnp.clip(state.mu_CR + 0.1 * jax.random.normal(k_cr, (n,), dt), 0.0, 1.0)
        # x_pbest: uniformly one of the 100p% best [ZS09, Eq. 7]
        top = max(1, round(self.p * n))
        order = jnp.argsort(state.fitness, stable=True)
        pbest = order[jax.random.randint(k_best, (n,), 0, top)]
        target = jnp.arange(n, dtype=jnp.int32)
        r1 = distinct_indices(k_r1, n, target, 1)[:, 0]
        # x~_r2 from the population and the archive, distinct from i and r1 [ZS09, Eq. 8]
        pool = n + (state.archive_size if self.archive else 0)
        u = jax.random.uniform(k_r2, (n,), jnp.float32)
        r2 = jnp.minimum((u * (pool - 2).astype(jnp.float32)).astype(jnp.int32), pool - 3)
        r2 = _skip(r2, jnp.sort(jnp.stack([target, r1], axis=1), axis=1))
        union = jnp.concatenate([x, state.archive]) if self.archive else x
        Fc = F[:, None]
        mutant = x + Fc * (x[pbest] - x) + Fc * (x[r1] - union[r2])
        trials = binomial_crossover(k_x, x, self._repair(mutant, x), CR)
        return trials, state._replace(key=key, trials=trials, F=F, CR=CR)

    def tell(self, state: JADEState, fitness: jax.Array) -> JADEState:
        fitness = fitness.astype(self.dtype)
        success = fitness < state.fitness
        keep = fitness <= state.fitness
        count = success.sum()
        s = success.astype(self.dtype)
        any_ = count > 0
        mean_cr = jnp.sum(s * state.CR) / jnp.maximum(count, 1)
        lehmer_f = jnp.sum(s * state.F**2) / jnp.where(any_, jnp.sum(s * state.F), 1)
        c = self.c
        mu_CR = jnp.where(any_, (1 - c) * state.mu_CR + c * mean_cr, state.mu_CR)
        mu_F = jnp.where(any_, (1 - c) * state.mu_F + c * lehmer_f, state.mu_F)
        archive, size, key = state.archive, state.archive_size, state.key
        if self.archive:
            # Replaced parents join the archive; beyond pop_size entries a uniformly random
            # subset of pop_size is kept, which is what "remove at random until |A| <= NP" gives.
            key, k_keep = jax.random.split(key)
            pool = jnp.concatenate([archive, state.population])
            valid = jnp.concatenate([jnp.arange(self.pop_size) < size, success])
            rank_key = jnp.where(valid, jax.random.uniform(k_keep, valid.shape), 2.0)
            archive = pool[jnp.argsort(rank_key, stable=True)[: self.pop_size]]
            size = jnp.minimum(size + count, self.pop_size).astype(jnp.int32)
        return state._replace(
            key=key,
            population=jnp.where(keep[:, None], state.trials, state.population),
            fitness=jnp.where(keep, fitness, state.fitness),
            mu_F=mu_F, mu_CR=mu_CR, archive=archive, archive_size=size,
        )
