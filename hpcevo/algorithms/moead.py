"""MOEA/D: decomposition into scalar subproblems, each improved with its neighbours' help.

[ZL07] Q. Zhang and H. Li, "MOEA/D: A Multiobjective Evolutionary Algorithm Based on
       Decomposition", IEEE Trans. Evolutionary Computation 11(6):712-731, 2007.

N = pop_size weight vectors spread evenly over the simplex (Das and Dennis' lattice with
H divisions, so N = C(H + m - 1, m - 1); Sec. V-A), each defining one Tchebycheff subproblem
g(x | lambda, z) = max_i lambda_i |f_i(x) - z_i| (Sec. II-B, Eq. 5), with z the best value seen
in each objective. Subproblem i's neighbourhood B(i) is the T closest weight vectors (Euclidean,
itself included; ties in index order). The paper's Algorithm (Sec. III, Step 2) per subproblem i:
pick two parents from B(i), make one child y (here SBX and polynomial mutation, the operators
and settings of the paper's comparison with NSGA-II, Sec. V-B: crossover rate 1, eta 20, mutation
rate 1/n), update z with y, and let y replace every neighbour j in B(i) whose subproblem it
solves no worse: g(y | lambda_j, z) <= g(x_j | lambda_j, z). T = 20 (Sec. V-B).

Batch form (one deviation from [ZL07]): the N children of a generation are made from the
population at the start of the generation and evaluated together (that is what the sharded
evaluator spreads over the ranks); the updates then run in the paper's order, subproblem 1 to N,
each seeing the replacements before it. The external population (EP) of non-dominated points,
optional in [ZL07], is not kept: a run's recorder reports the population's non-dominated front.
A zero weight counts as 1e-4 (as jMetal's MOEA/D does), so the boundary subproblems still prefer
a point that is better in the objective they would otherwise ignore.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ConfigError
from .mo import das_dennis
from .base import MultiObjectiveAlgorithm
from .ga import check_variation, polynomial_mutation, sbx

ZERO_WEIGHT = 1e-4


def lattice_size(m: int, h: int) -> int:
    return math.comb(h + m - 1, m - 1)


def simplex_weights(m: int, n: int) -> np.ndarray | None:
    """The Das-Dennis lattice with exactly ``n`` points in ``m`` objectives, or None."""
    h = 1
    while lattice_size(m, h) < n:
        h += 1
    if lattice_size(m, h) != n:
        return None
    return das_dennis(m, h)


@functools.lru_cache(maxsize=16)
def _decomposition(m: int, n: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    w = simplex_weights(m, n)
    d = np.sqrt(((w[:, None, :] - w[None, :, :]) ** 2).sum(-1))
    neighbours = np.argsort(d, axis=1, kind="stable")[:, :t].astype(np.int32)
    return np.where(w == 0, ZERO_WEIGHT, w), neighbours


class MOEADState(NamedTuple):
    key: jax.Array
    population: jax.Array  # (N, n): the best solution found for each subproblem
    fitness: jax.Array  # (N, m)
    ideal: jax.Array  # (m,) z: best value seen in each objective
    children: jax.Array  # (N, n): the asked generation, child i made for subproblem i


@dataclasses.dataclass(frozen=True)
class MOEAD(MultiObjectiveAlgorithm):
    """MOEA/D with Tchebycheff decomposition [ZL07]; pop_size must be a Das-Dennis lattice size."""
    dynamic: ClassVar[tuple[str, ...]] = ("crossover_rate", "eta_c", "mutation_rate", "eta_m")

    neighbours: int = 20
    crossover_rate: float = 1.0
    eta_c: float = 20.0
    mutation_rate: float = 1.0
    eta_m: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        m, n = self.num_objectives, self.pop_size
        if simplex_weights(m, n) is None:
            h = 1
            while lattice_size(m, h + 1) <= n:
                h += 1
            raise ConfigError(
                f"pop_size must be a number of evenly spread weight vectors for {m} objectives, "
                f"C(H + {m - 1}, {m - 1}); {n} is not: the nearest are {lattice_size(m, h)} and "
                f"{lattice_size(m, h + 1)}")
        if not 2 <= self.neighbours <= n:
            raise ConfigError(f"neighbours must be in [2, pop_size = {n}], got {self.neighbours}")
        check_variation(self.crossover_rate, self.eta_c, self.mutation_rate, self.eta_m, self.dim)

    def _tables(self):
        w, b = _decomposition(self.num_objectives, self.pop_size, self.neighbours)
        return jnp.asarray(w, self.dtype), jnp.asarray(b)

    def init(self, key: jax.Array) -> MOEADState:
        key, k = jax.random.split(key)
        pop = self.uniform_in_bounds(k, self.pop_size)
        m = self.num_objectives
        return MOEADState(key, pop, jnp.full((self.pop_size, m), jnp.inf, self.dtype),
                          jnp.full((m,), jnp.inf, self.dtype), jnp.zeros_like(pop))

    def init_ask(self, state: MOEADState):
        return state.population, state

    def init_tell(self, state: MOEADState, fitness: jax.Array) -> MOEADState:
        fitness = fitness.astype(self.dtype)
        return state._replace(fitness=fitness, ideal=jnp.min(fitness, axis=0))

    def ask(self, state: MOEADState) -> tuple[jax.Array, MOEADState]:
        key, k_p, k_q, k_x, k_m = jax.random.split(state.key, 5)
        _, b = self._tables()
        n, t = self.pop_size, self.neighbours
        i = jnp.arange(n)
        first = jax.random.randint(k_p, (n,), 0, t)
        second = (first + jax.random.randint(k_q, (n,), 1, t)) % t  # a different neighbour
        p1, p2 = state.population[b[i, first]], state.population[b[i, second]]
        lb, ub = self.bounds()
        child, _ = sbx(k_x, p1, p2, lb, ub, self.eta_c, self.crossover_rate)
        child = polynomial_mutation(k_m, child, lb, ub, self.eta_m, self.mutation_rate / self.dim)
        return child, state._replace(key=key, children=child)

    def tell(self, state: MOEADState, fitness: jax.Array) -> MOEADState:
        w, b = self._tables()
        fitness = fitness.astype(self.dtype)

        def update(i, s):
            pop, fit, z = s
            fy = fitness[i]
            z = jnp.minimum(z, fy)
            nb = b[i]
            wj = w[nb]
            g_new = jnp.max(wj * jnp.abs(fy - z), axis=-1)
            g_old = jnp.max(wj * jnp.abs(fit[nb] - z), axis=-1)
            better = g_new <= g_old
            pop = pop.at[nb].set(jnp.where(better[:, None], state.children[i], pop[nb]))
            fit = fit.at[nb].set(jnp.where(better[:, None], fy, fit[nb]))
            return pop, fit, z

        pop, fit, z = lax.fori_loop(0, self.pop_size, update, (state.population, state.fitness, state.ideal))
        return state._replace(population=pop, fitness=fit, ideal=z)

    def population(self, state: MOEADState):
        return state.population, state.fitness
