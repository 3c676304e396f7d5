"""NSGA-II: non-dominated sorting, crowding distance, elitist (mu + lambda) survival.

[DPAM02] K. Deb, A. Pratap, S. Agarwal and T. Meyarivan, "A Fast and Elitist Multiobjective
         Genetic Algorithm: NSGA-II", IEEE Trans. Evolutionary Computation 6(2):182-197, 2002.

One generation (Sec. III-C): ``pop_size`` children from binary tournaments with the crowded
comparison operator (lower front wins, then the larger crowding distance, then the first one
drawn), simulated binary crossover and polynomial mutation (the bounded operators of ``ga.py``);
then parents and children are merged, sorted into fronts (fast non-dominated sort, Sec. III-A),
and the best ``pop_size`` by (front, crowding distance descending) survive, which is the paper's
"fill front by front, then the last front by crowding distance" (Sec. III-C, Fig. 2). Exact ties
are broken by index (parents before children), so selection is deterministic. The survivors keep
the front and crowding distance computed on the merged set for the next tournaments.

Defaults (Sec. VI): crossover probability 0.9, mutation probability 1/n per variable
(``mutation_rate = 1`` expected mutated variables per child), eta_c = eta_m = 20.
Cost per generation: O(m (2N)^2) time and O((2N)^2) memory for the dominance matrix of the merged
population.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .mo import crowded_order, crowding_distance, non_dominated_rank
from .base import MultiObjectiveAlgorithm
from .ga import check_variation, polynomial_mutation, sbx


class NSGA2State(NamedTuple):
    key: jax.Array
    population: jax.Array  # (N, n)
    fitness: jax.Array  # (N, m)
    rank: jax.Array  # (N,) int32: front, 0 = non-dominated
    crowding: jax.Array  # (N,)
    children: jax.Array  # (N, n): the asked generation


def rank_and_crowding(f: jax.Array) -> tuple[jax.Array, jax.Array]:
    rank = non_dominated_rank(f)
    return rank, crowding_distance(f, rank)


@dataclasses.dataclass(frozen=True)
class NSGA2(MultiObjectiveAlgorithm):
    """NSGA-II [DPAM02] with SBX and polynomial mutation."""
    dynamic: ClassVar[tuple[str, ...]] = ("crossover_rate", "eta_c", "mutation_rate", "eta_m")

    crossover_rate: float = 0.9
    eta_c: float = 20.0
    mutation_rate: float = 1.0  # expected mutated variables per child: probability rate / dim
    eta_m: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 2:
            raise ConfigError(f"NSGA-II needs pop_size >= 2, got {self.pop_size}")
        check_variation(self.crossover_rate, self.eta_c, self.mutation_rate, self.eta_m, self.dim)

    def init(self, key: jax.Array) -> NSGA2State:
        key, k = jax.random.split(key)
        pop = self.uniform_in_bounds(k, self.pop_size)
        n = self.pop_size
        return NSGA2State(key, pop, jnp.full((n, self.num_objectives), jnp.inf, self.dtype),
                          jnp.zeros((n,), jnp.int32), jnp.zeros((n,), self.dtype), jnp.zeros_like(pop))

    def init_ask(self, state: NSGA2State):
        return state.population, state

    def init_tell(self, state: NSGA2State, fitness: jax.Array) -> NSGA2State:
        fitness = fitness.astype(self.dtype)
        rank, crowding = rank_and_crowding(fitness)
        return state._replace(fitness=fitness, rank=rank, crowding=crowding)

    def ask(self, state: NSGA2State) -> tuple[jax.Array, NSGA2State]:
        key, k_t, k_x, k_m = jax.random.split(state.key, 4)
        pairs = -(-self.pop_size // 2)
        a, b = jax.random.randint(k_t, (2, 2 * pairs), 0, self.pop_size)
        ra, rb, ca, cb = state.rank[a], state.rank[b], state.crowding[a], state.crowding[b]
        b_wins = (rb < ra) | ((rb == ra) & (cb > ca))  # crowded comparison; a tie goes to a
        parents = state.population[jnp.where(b_wins, b, a)]
        lb, ub = self.bounds()
        c1, c2 = sbx(k_x, parents[:pairs], parents[pairs:], lb, ub, self.eta_c, self.crossover_rate)
        children = jnp.concatenate([c1, c2])[: self.pop_size]
        children = polynomial_mutation(k_m, children, lb, ub, self.eta_m, self.mutation_rate / self.dim)
        return children, state._replace(key=key, children=children)

    def tell(self, state: NSGA2State, fitness: jax.Array) -> NSGA2State:
        x = jnp.concatenate([state.population, state.children])
        f = jnp.concatenate([state.fitness, fitness.astype(self.dtype)])
        rank, crowding = rank_and_crowding(f)
        keep = crowded_order(rank, crowding)[: self.pop_size]
        return state._replace(population=x[keep], fitness=f[keep], rank=rank[keep], crowding=crowding[keep])

    def population(self, state: NSGA2State):
        return state.population, state.fitness
