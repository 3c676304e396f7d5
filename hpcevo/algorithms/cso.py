"""Competitive Swarm Optimizer.

R. Cheng and Y. Jin, "A Competitive Swarm Optimizer for Large Scale Optimization",
IEEE Transactions on Cybernetics 45(2):191-204, 2015. doi:10.1109/TCYB.2014.2322602

Each generation the swarm is split into random pairs. In each pair the particle with the better
fitness (the winner) passes to the next generation unchanged; the loser learns from the winner
and from the swarm's mean position (Eq. 6-7 of the paper):

    v_l <- r1 * v_l + r2 * (x_w - x_l) + phi * r3 * (x_mean - x_l)
    x_l <- x_l + v_l

with r1, r2, r3 ~ U(0, 1)^D drawn per loser. Only the losers move, so after the first
generation (the whole swarm) each generation evaluates pop_size // 2 candidates. With an odd
swarm, the particle left unpaired by the shuffle passes unchanged, as a winner would.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .base import BaseAlgorithm


class CSOState(NamedTuple):
    key: jax.Array
    position: jax.Array  # (pop, dim)
    velocity: jax.Array  # (pop, dim)
    fitness: jax.Array  # (pop,)
    losers: jax.Array  # (pop // 2,) indices of the particles asked for this generation


@dataclasses.dataclass(frozen=True)
class CSO(BaseAlgorithm):
    """Competitive Swarm Optimizer (Cheng & Jin 2015).

    phi: weight of the swarm-mean term. The paper uses phi = 0 for small swarms and raises it
    towards 0.1-0.2 as the swarm and the dimension grow (Sec. IV-A); 0.1 suits the swarm sizes
    this toolkit is meant for (hundreds to thousands).
    """
    dynamic: ClassVar[tuple[str, ...]] = ("phi",)

    phi: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 2:
            raise ConfigError(f"CSO needs pop_size >= 2 to form a pair, got {self.pop_size}")
        if not 0.0 <= self.phi <= 1.0:
            raise ConfigError(f"phi must be in [0, 1], got {self.phi}")

    @property
    def num_init(self) -> int:
        return self.pop_size

    @property
    def num_ask(self) -> int:
        return self.pop_size // 2

    def init(self, key: jax.Array) -> CSOState:
        key, k_pos = jax.random.split(key)
        position = self.uniform_in_bounds(k_pos, self.pop_size)
        return CSOState(
            key=key,
            position=position,
            velocity=jnp.zeros_like(position),
            fitness=jnp.full((self.pop_size,), jnp.inf, self.dtype),
            losers=jnp.zeros((self.pop_size // 2,), jnp.int32),
        )

    def init_ask(self, state: CSOState) -> tuple[jax.Array, CSOState]:
        return state.position, state

    def init_tell(self, state: CSOState, fitness: jax.Array) -> CSOState:
        return state._replace(fitness=fitness.astype(state.fitness.dtype))

    def ask(self, state: CSOState) -> tuple[jax.Array, CSOState]:
        half = self.pop_size // 2
        key, k_perm, k_r = jax.random.split(state.key, 3)
        perm = jax.random.permutation(k_perm, self.pop_size)
        a, b = perm[:half], perm[half : 2 * half]
        # Ties go to the first of the pair so the outcome never depends on evaluation order.
        a_wins = state.fitness[a] <= state.fitness[b]
        winners = jnp.where(a_wins, a, b)
        losers = jnp.where(a_wins, b, a)

        x, v = state.position, state.velocity
        dtype = x.dtype
        r1, r2, r3 = jax.random.uniform(k_r, (3, half, self.dim), dtype)
        mean = jnp.mean(x, axis=0)
        x_l, x_w = x[losers], x[winners]
        v_l = r1 * v[losers] + r2 * (x_w - x_l) + self.phi * r3 * (mean - x_l)
        lb, ub = self.bounds()
        x_new = jnp.clip(x_l + v_l, lb, ub)

        state = state._replace(
            key=key,
            position=x.at[losers].set(x_new),
            velocity=v.at[losers].set(v_l),
            losers=losers.astype(jnp.int32),
        )
        return x_new, state

    def population(self, state: CSOState) -> tuple[jax.Array, jax.Array]:
        """The swarm's positions and their fitness."""
        return state.position, state.fitness

    migrates: ClassVar[bool] = True

    def with_population(self, state: CSOState, x: jax.Array, f: jax.Array) -> CSOState:
        return state._replace(position=x, fitness=f)

    def tell(self, state: CSOState, fitness: jax.Array) -> CSOState:
        return state._replace(fitness=state.fitness.at[state.losers].set(fitness.astype(state.fitness.dtype)))
