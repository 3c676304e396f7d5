"""Inertia-weight global-best Particle Swarm Optimization.

J. Kennedy and R. Eberhart, "Particle swarm optimization", Proc. ICNN 1995; the inertia weight
from Y. Shi and R. Eberhart, "A modified particle swarm optimizer", Proc. IEEE CEC 1998:

    v <- w * v + c1 * r1 * (p_best - x) + c2 * r2 * (g_best - x)
    x <- x + v

Defaults w = 0.7298, c1 = c2 = 1.49618 are the constriction-equivalent values of Clerc and
Kennedy (IEEE TEC 6(1), 2002), the setting recommended by Eberhart and Shi (CEC 2000).
Velocities are clamped to v_max_frac of the search range per coordinate and positions to the box.

``coefficients``: "per_coordinate" (default, as in the papers above) draws r1 and r2 for every
coordinate of every particle; "per_particle" draws one pair per particle and shares it across the
coordinates, a variant common in practice (evosax uses it) that moves each particle along the
plane of its two attractors and costs dim-times fewer random numbers, which dominate a PSO
generation's cost on CPUs for cheap problems.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .base import BaseAlgorithm


class PSOState(NamedTuple):
    key: jax.Array
    position: jax.Array  # (pop, dim): the particles to be evaluated next
    velocity: jax.Array
    pbest_position: jax.Array
    pbest_fitness: jax.Array  # (pop,)
    gbest_position: jax.Array  # (dim,)
    gbest_fitness: jax.Array  # ()


@dataclasses.dataclass(frozen=True)
class PSO(BaseAlgorithm):
    """Global-best PSO with inertia weight (Shi & Eberhart 1998)."""
    dynamic: ClassVar[tuple[str, ...]] = ("w", "c1", "c2", "v_max_frac")

    w: float = 0.7298
    c1: float = 1.49618
    c2: float = 1.49618
    v_max_frac: float = 0.2
    coefficients: str = "per_coordinate"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coefficients not in ("per_coordinate", "per_particle"):
            raise ConfigError(f"coefficients must be 'per_coordinate' or 'per_particle', got {self.coefficients!r}")
        if not 0.0 <= self.w < 1.0:
            raise ConfigError(f"w must be in [0, 1), got {self.w}")
        for name in ("c1", "c2"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.v_max_frac <= 1.0:
            raise ConfigError(f"v_max_frac must be in (0, 1], got {self.v_max_frac}")

    def init(self, key: jax.Array) -> PSOState:
        key, k_pos, k_vel = jax.random.split(key, 3)
        lb, ub = self.bounds()
        vmax = self.v_max_frac * (ub - lb)
        position = self.uniform_in_bounds(k_pos, self.pop_size)
        velocity = jax.random.uniform(k_vel, position.shape, self.dtype, -1.0, 1.0) * vmax
        return PSOState(
            key=key,
            position=position,
            velocity=velocity,
            pbest_position=position,
            pbest_fitness=jnp.full((self.pop_size,), jnp.inf, self.dtype),
            gbest_position=position[0],
            gbest_fitness=jnp.asarray(jnp.inf, self.dtype),
        )

    def ask(self, state: PSOState) -> tuple[jax.Array, PSOState]:
        return state.position, state

    def population(self, state: PSOState) -> tuple[jax.Array, jax.Array]:
        """Each particle's personal best and its fitness (the positions are yet to be evaluated)."""
        return state.pbest_position, state.pbest_fitness

    migrates: ClassVar[bool] = True

    def with_population(self, state: PSOState, x: jax.Array, f: jax.Array) -> PSOState:
        # An immigrant better than the swarm's best becomes the best that every particle follows.
        i = jnp.argmin(f)
        better = f[i] < state.gbest_fitness
        return state._replace(pbest_position=x, pbest_fitness=f,
                              gbest_position=jnp.where(better, x[i], state.gbest_position),
                              gbest_fitness=jnp.where(better, f[i], state.gbest_fitness))

    def tell(self, state: PSOState, fitness: jax.Array) -> PSOState:
        fitness = fitness.astype(state.pbest_fitness.dtype)
        improved = fitness < state.pbest_fitness
        pbest_f = jnp.where(improved, fitness, state.pbest_fitness)
        pbest_x = jnp.where(improved[:, None], state.position, state.pbest_position)
        i = jnp.argmin(pbest_f)
        better = pbest_f[i] < state.gbest_fitness
        gbest_f = jnp.where(better, pbest_f[i], state.gbest_fitness)
        gbest_x = jnp.where(better, pbest_x[i], state.gbest_position)

        dtype = state.position.dtype
        key, k_r = jax.random.split(state.key)
        if self.coefficients == "per_particle":
            r1, r2 = jax.random.uniform(k_r, (2, self.pop_size, 1), dtype)
        else:
            r1, r2 = jax.random.uniform(k_r, (2, *state.position.shape), dtype)
        x = state.position
        lb, ub = self.bounds()
        vmax = self.v_max_frac * (ub - lb)
        v = self.w * state.velocity + self.c1 * r1 * (pbest_x - x) + self.c2 * r2 * (gbest_x - x)
        v = jnp.clip(v, -vmax, vmax)
        x = jnp.clip(x + v, lb, ub)
        return PSOState(key, x, v, pbest_x, pbest_f, gbest_x, gbest_f)


class SLPSOState(NamedTuple):
    key: jax.Array
    position: jax.Array  # (pop, dim): the swarm, evaluated next
    delta: jax.Array  # (pop, dim): each particle's last move
    fitness: jax.Array  # (pop,) fitness of ``position`` once told


@dataclasses.dataclass(frozen=True)
class SLPSO(BaseAlgorithm):
    """Social learning PSO.

    R. Cheng and Y. Jin, "A social learning particle swarm optimization algorithm for scalable
    optimization", Information Sciences 291:43-60, 2015.

    Each generation the swarm is ranked; every particle but the best learns, coordinate by
    coordinate, from a randomly chosen better particle (the demonstrator, drawn per coordinate)
    and from the swarm's mean (Eq. 5-6):

        dx_ij <- r1 dx_ij + r2 (x_kj - x_ij) + r3 eps (mean_j - x_ij),  x_ij <- x_ij + dx_ij

    with probability P_i = (1 - (i - 1)/m)^(alpha log(ceil(n / M))) for the i-th worst of the m
    particles (Eq. 7: the worse a particle, the likelier it learns), and eps = beta n / M (Eq. 8).
    Defaults from the paper (Sec. 3.4): M = 100, alpha = 0.5, beta = 0.01. The paper also sizes
    the swarm, m = M + floor(n / 10); here the config's pop_size is m. Positions are clipped to
    the box (the paper leaves bounds unspecified; the same as this toolkit's PSO and CSO).
    """
    dynamic: ClassVar[tuple[str, ...]] = ("alpha", "beta")

    M: int = 100
    alpha: float = 0.5
    beta: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 2:
            raise ConfigError(f"SL-PSO needs pop_size >= 2 (a demonstrator), got {self.pop_size}")
        if self.M < 1:
            raise ConfigError(f"M must be >= 1, got {self.M}")
        if self.alpha < 0 or self.beta < 0:
            raise ConfigError("alpha and beta must be >= 0")

    def init(self, key: jax.Array) -> SLPSOState:
        key, k = jax.random.split(key)
        x = self.uniform_in_bounds(k, self.pop_size)
        return SLPSOState(key, x, jnp.zeros_like(x), jnp.full((self.pop_size,), jnp.inf, self.dtype))

    def learning_probability(self) -> jax.Array:
        """P by rank, best first (rank r is the (m - r)-th worst)."""
        m, n = self.pop_size, self.dim
        exponent = self.alpha * math.log(math.ceil(n / self.M))
        r = jnp.arange(m, dtype=self.dtype)
        return ((r + 1) / m) ** exponent

    def ask(self, state: SLPSOState):
        m, n, dt = self.pop_size, self.dim, self.dtype
        key, k_learn, k_demo, k_r = jax.random.split(state.key, 4)
        order = jnp.argsort(state.fitness, stable=True)  # best first
        x, dx = state.position[order], state.delta[order]
        rank = jnp.arange(m)
        # demonstrator for every coordinate: uniformly among the strictly better ranks
        u = jax.random.uniform(k_demo, (m, n), dt)
        demo = jnp.minimum((u * rank[:, None]).astype(jnp.int32), jnp.maximum(rank[:, None] - 1, 0))
        x_demo = x[demo, jnp.arange(n)]
        r1, r2, r3 = jax.random.uniform(k_r, (3, m, n), dt)
        eps = self.beta * n / self.M
        new_dx = r1 * dx + r2 * (x_demo - x) + eps * r3 * (jnp.mean(x, axis=0) - x)
        learns = (jax.random.uniform(k_learn, (m, 1), dt) <= self.learning_probability()[:, None]) & (rank[:, None] > 0)
        dx = jnp.where(learns, new_dx, dx)
        x = jnp.where(learns, self.clip_to_box(x + new_dx), x)
        return x, state._replace(key=key, position=x, delta=dx)

    def population(self, state: SLPSOState) -> tuple[jax.Array, jax.Array]:
        """The swarm and its fitness."""
        return state.position, state.fitness

    migrates: ClassVar[bool] = True

    def with_population(self, state: SLPSOState, x: jax.Array, f: jax.Array) -> SLPSOState:
        return state._replace(position=x, fitness=f)

    def tell(self, state: SLPSOState, fitness: jax.Array) -> SLPSOState:
        return state._replace(fitness=fitness.astype(self.dtype))
