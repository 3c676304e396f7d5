"""Real-coded genetic algorithm: tournament selection, SBX, polynomial mutation, elitism.

[DA95] K. Deb and R. B. Agrawal, "Simulated Binary Crossover for Continuous Search Space",
       Complex Systems 9(2):115-148, 1995. SBX, spread factor density Eq. 7-8.
[DG96] K. Deb and M. Goyal, "A Combined Genetic Adaptive Search (GeneAS) for Engineering
       Design", Computer Science and Informatics 26(4):30-45, 1996. Polynomial mutation.
[DPAM02] K. Deb, A. Pratap, S. Agarwal and T. Meyarivan, "A Fast and Elitist Multiobjective
       Genetic Algorithm: NSGA-II", IEEE TEC 6(2):182-197, 2002. The defaults used here
       (Sec. VI: crossover probability 0.9, mutation probability 1/n, eta_c = eta_m = 20) and the
       bounded forms of both operators (children never leave the box: the spread factor and the
       perturbation are drawn from densities truncated at the bounds, as in NSGA-II's reference
       code), each variable crossed with probability 0.5.

A generation: ``pop_size`` children from pairs of tournament winners (``tournament`` = 2 is
binary tournament), SBX with probability ``crossover_rate`` per pair, polynomial mutation with
probability ``mutation_rate / dim`` per variable. Elitism (De Jong's elitist strategy, 1975):
the ``elites`` best parents survive in place of the worst children.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


def _spread(u: jax.Array, beta: jax.Array, eta: float) -> jax.Array:
    # [DA95, Eq. 7-8] with the density cut at the bound: alpha = 2 - beta^-(eta + 1).
    alpha = 2.0 - beta ** (-(eta + 1.0))
    e = 1.0 / (eta + 1.0)
    return jnp.where(u <= 1.0 / alpha, (u * alpha) ** e, (1.0 / (2.0 - u * alpha)) ** e)


def sbx(key: jax.Array, p1: jax.Array, p2: jax.Array, lb: jax.Array, ub: jax.Array, eta: float,
        rate: float) -> tuple[jax.Array, jax.Array]:
    """Bounded SBX on paired parents (m, n): two children per pair, inside [lb, ub]."""
    k_pair, k_var, k_u, k_swap = jax.random.split(key, 4)
    m, n = p1.shape
    dt = p1.dtype
    cross = (jax.random.uniform(k_pair, (m, 1), dt) <= rate) & (jax.random.uniform(k_var, (m, n), dt) <= 0.5)
    y1, y2 = jnp.minimum(p1, p2), jnp.maximum(p1, p2)
    gap = y2 - y1
    cross = cross & (gap > 1e-14)
    safe = jnp.where(cross, gap, 1.0)
    u = jax.random.uniform(k_u, (m, n), dt)
    bq1 = _spread(u, 1.0 + 2.0 * (y1 - lb) / safe, eta)
    bq2 = _spread(u, 1.0 + 2.0 * (ub - y2) / safe, eta)
    c1 = jnp.clip(0.5 * ((y1 + y2) - bq1 * gap), lb, ub)
    c2 = jnp.clip(0.5 * ((y1 + y2) + bq2 * gap), lb, ub)
    swap = jax.random.uniform(k_swap, (m, n), dt) <= 0.5
    a, b = jnp.where(swap, c2, c1), jnp.where(swap, c1, c2)
    return jnp.where(cross, a, p1), jnp.where(cross, b, p2)


def polynomial_mutation(key: jax.Array, x: jax.Array, lb: jax.Array, ub: jax.Array, eta: float,
                        rate: float) -> jax.Array:
    """Bounded polynomial mutation [DG96] of each variable with probability ``rate``."""
    k_m, k_u = jax.random.split(key)
    dt = x.dtype
    mutate = jax.random.uniform(k_m, x.shape, dt) < rate
    u = jax.random.uniform(k_u, x.shape, dt)
    span = ub - lb
    d1, d2 = (x - lb) / span, (ub - x) / span
    p = 1.0 / (eta + 1.0)
    low = (2 * u + (1 - 2 * u) * (1 - d1) ** (eta + 1)) ** p - 1
    high = 1 - (2 * (1 - u) + 2 * (u - 0.5) * (1 - d2) ** (eta + 1)) ** p
    y = x + jnp.where(u < 0.5, low, high) * span
    return jnp.where(mutate, jnp.clip(y, lb, ub), x)


def check_variation(crossover_rate: float, eta_c: float, mutation_rate: float, eta_m: float, dim: int) -> None:
    """The SBX / polynomial mutation settings' checks (shared with NSGA-II and MOEA/D)."""
    _es.check_unit("crossover_rate", crossover_rate)
    if not 0 <= mutation_rate <= dim:
        raise ConfigError(f"mutation_rate must be in [0, dim = {dim}], got {mutation_rate}")
    if eta_c < 0 or eta_m < 0:
        raise ConfigError("eta_c and eta_m must be >= 0")


class GAState(NamedTuple):
    key: jax.Array
    population: jax.Array
    fitness: jax.Array
    children: jax.Array


@dataclasses.dataclass(frozen=True)
class GA(BaseAlgorithm):
    """Real-coded GA with SBX and polynomial mutation ([DA95], [DG96]; defaults from [DPAM02])."""
    dynamic: ClassVar[tuple[str, ...]] = ("crossover_rate", "eta_c", "mutation_rate", "eta_m")

    tournament: int = 2
    crossover_rate: float = 0.9
    eta_c: float = 20.0
    mutation_rate: float = 1.0  # expected mutated variables per child: probability rate / dim
    eta_m: float = 20.0
    elites: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 2:
            raise ConfigError(f"GA needs pop_size >= 2, got {self.pop_size}")
        if self.tournament < 1:
            raise ConfigError(f"tournament must be >= 1, got {self.tournament}")
        check_variation(self.crossover_rate, self.eta_c, self.mutation_rate, self.eta_m, self.dim)
        if not 0 <= self.elites < self.pop_size:
            raise ConfigError(f"elites must be in [0, pop_size), got {self.elites}")

    def init(self, key: jax.Array) -> GAState:
        key, k = jax.random.split(key)
        pop = self.uniform_in_bounds(k, self.pop_size)
        return GAState(key, pop, jnp.full((self.pop_size,), jnp.inf, self.dtype), jnp.zeros_like(pop))

    def init_ask(self, state: GAState):
        return state.population, state

    def init_tell(self, state: GAState, fitness: jax.Array) -> GAState:
        return state._replace(fitness=fitness.astype(self.dtype))

    def ask(self, state: GAState) -> tuple[jax.Array, GAState]:
        key, k_t, k_x, k_m = jax.random.split(state.key, 4)
        pairs = -(-self.pop_size // 2)
        entrants = jax.random.randint(k_t, (2 * pairs, self.tournament), 0, self.pop_size)
        # lowest fitness wins; ties to the first entrant drawn
        winner = entrants[jnp.arange(2 * pairs), jnp.argmin(state.fitness[entrants], axis=1)]
        parents = state.population[winner]
        lb, ub = self.bounds()
        c1, c2 = sbx(k_x, parents[:pairs], parents[pairs:], lb, ub, self.eta_c, self.crossover_rate)
        children = jnp.concatenate([c1, c2])[: self.pop_size]
        children = polynomial_mutation(k_m, children, lb, ub, self.eta_m, self.mutation_rate / self.dim)
        return children, state._replace(key=key, children=children)

    def population(self, state: GAState) -> tuple[jax.Array, jax.Array]:
        """The parents of the next generation and their fitness."""
        return state.population, state.fitness

    migrates: ClassVar[bool] = True

    def with_population(self, state: GAState, x: jax.Array, f: jax.Array) -> GAState:
        return state._replace(population=x, fitness=f)

    def tell(self, state: GAState, fitness: jax.Array) -> GAState:
        fitness = fitness.astype(self.dtype)
        e = self.elites
        if e == 0:
            return state._replace(population=state.children, fitness=fitness)
        best_parents = jnp.argsort(state.fitness, stable=True)[:e]
        keep_children = jnp.argsort(fitness, stable=True)[: self.pop_size - e]
        return state._replace(
            population=jnp.concatenate([state.population[best_parents], state.children[keep_children]]),
            fitness=jnp.concatenate([state.fitness[best_parents], fitness[keep_children]]),
        )
