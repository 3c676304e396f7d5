"""Inertia-weight global-best Particle Swarm Optimization.

J. Kennedy and R. Eberhart, "Particle swarm optimization", Proc. ICNN 1995; the inertia weight
from Y. Shi and R. Eberhart, "A modified particle swarm optimizer", Proc. IEEE CEC 1998:

    v <- w * v + c1 * r1 * (p_best - x) + c2 * r2 * (g_best - x)
    x <- x + v

Defaults w = 0.7298, c1 = c2 = 1.49618 are the constriction-equivalent values of Clerc and
Kennedy (IEEE TEC 6(1), 2002), the setting recommended by Eberhart and Shi (CEC 2000).
Velocities are clamped to v_max_frac of the search range per coordinate and positions to the box.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .base import Algorithm


class PSOState(NamedTuple):
    key: jax.Array
    position: jax.Array  # (pop, dim): the particles to be evaluated next
    velocity: jax.Array
    pbest_position: jax.Array
    pbest_fitness: jax.Array  # (pop,)
    gbest_position: jax.Array  # (dim,)
    gbest_fitness: jax.Array  # ()


@dataclasses.dataclass(frozen=True)
class PSO(Algorithm):
    """Global-best PSO with inertia weight (Shi & Eberhart 1998)."""

    w: float = 0.7298
    c1: float = 1.49618
    c2: float = 1.49618
    v_max_frac: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.w < 1.0:
            raise ValueError(f"w must be in [0, 1), got {self.w}")
        for name in ("c1", "c2"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.v_max_frac <= 1.0:
            raise ValueError(f"v_max_frac must be in (0, 1], got {self.v_max_frac}")

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
        r1, r2 = jax.random.uniform(k_r, (2, *state.position.shape), dtype)
        x = state.position
        lb, ub = self.bounds()
        vmax = self.v_max_frac * (ub - lb)
        v = self.w * state.velocity + self.c1 * r1 * (pbest_x - x) + self.c2 * r2 * (gbest_x - x)
        v = jnp.clip(v, -vmax, vmax)
        x = jnp.clip(x + v, lb, ub)
        return PSOState(key, x, v, pbest_x, pbest_f, gbest_x, gbest_f)
