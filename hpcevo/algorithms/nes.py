"""Natural evolution strategies: separable NES (SNES) and exponential NES (xNES).

[W14] D. Wierstra, T. Schaul, T. Glasmachers, Y. Sun, J. Peters and J. Schmidhuber, "Natural
      Evolution Strategies", Journal of Machine Learning Research 15:949-980, 2014. xNES is their
      Algorithm 5, SNES Algorithm 6; utilities Sec. 3.1 (Eq. before Sec. 3.2); default learning
      rates Table 1: eta_mu = 1, eta_sigma = eta_B = (9 + 3 ln d) / (5 d sqrt d) for xNES and
      eta_sigma = (3 + ln d) / (5 sqrt d) for SNES; population 4 + floor(3 ln d).
[G10] T. Glasmachers, T. Schaul, Y. Sun, D. Wierstra and J. Schmidhuber, "Exponential Natural
      Evolution Strategies", GECCO 2010, pp. 393-400 (xNES, Alg. 1).
[S11] T. Schaul, T. Glasmachers and J. Schmidhuber, "High Dimensions and Heavy Tails for Natural
      Evolution Strategies", GECCO 2011, pp. 845-852 (SNES).

Conventions (see ``_es.py``): the mean starts uniformly in the box, the search distribution's
initial deviation is ``sigma_init`` times the box width per coordinate, candidates are not
clipped unless ``clip`` is true. A learning rate of 0 in the config means the [W14] default.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import expm

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


class SNESState(NamedTuple):
    key: jax.Array
    mean: jax.Array  # (n,)
    sigma: jax.Array  # (n,)
    z: jax.Array  # (pop, n); (0, n) in distributed mode


class XNESState(NamedTuple):
    key: jax.Array
    mean: jax.Array  # (n,)
    sigma: jax.Array  # () overall scale
    B: jax.Array  # (n, n) shape matrix, det 1: A = sigma B
    z: jax.Array  # (pop, n)


@dataclasses.dataclass(frozen=True)
class _NESBase(BaseAlgorithm):
    initial: ClassVar[tuple[str, ...]] = ("sigma_init", "x0")
    sigma_init: float = 0.3
    eta_mu: float = 1.0
    eta_sigma: float = 0.0  # 0: the [W14, Table 1] default
    clip: bool = False
    x0: tuple[float, ...] | None = None  # the initial mean (default: uniform in the box)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pop_size < 2:
            raise ConfigError(f"pop_size must be >= 2, got {self.pop_size}")
        _es.check_positive(sigma_init=self.sigma_init, eta_mu=self.eta_mu)
        if self.eta_sigma < 0:
            raise ConfigError(f"eta_sigma must be >= 0 (0: paper default), got {self.eta_sigma}")

    def _candidates(self, mean, scaled):
        x = mean + scaled
        return self.clip_to_box(x) if self.clip else x

    def _sorted_utilities(self, fitness):
        """Utility of each sample: the [W14] value of its rank (ties: index order)."""
        u = _es.nes_utilities(self.pop_size, self.dtype)
        return u[_es.ranks(fitness.astype(self.dtype))]


@dataclasses.dataclass(frozen=True)
class SNES(_es.BlockedES, _NESBase):
    """Separable NES [S11; W14, Alg. 6]: a diagonal Gaussian, exponential updates of sigma.

    Noise per block from its own key and the update's sums in fixed blocks of ``block`` samples
    (``_es.BlockedES``): ``distributed = true`` runs it without any rank holding the population
    (``hpcevo/parallel/es.py``), with bitwise the same result.
    """
    dynamic: ClassVar[tuple[str, ...]] = ("eta_mu",)

    distributed: bool = False
    block: int = 0  # samples per block of the update's partial sums (0: automatic)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_blocked()

    @property
    def units(self) -> int:
        return self.pop_size

    @property
    def lr_sigma(self) -> float:
        d = self.dim
        return self.eta_sigma or (3 + math.log(d)) / (5 * math.sqrt(d))

    def init(self, key: jax.Array) -> SNESState:
        key, k = jax.random.split(key)
        return SNESState(key, self.initial_mean(k), self.sigma_init * self.width(),
                         jnp.zeros((self.stored_noise_rows(), self.dim), self.dtype))

    def expand(self, state: SNESState, z: jax.Array) -> jax.Array:
        return self._candidates(state.mean, _es.fence(state.sigma * z, z))

    def weights(self, state: SNESState, fitness: jax.Array) -> jax.Array:
        return self._sorted_utilities(fitness)[:, None]

    def partial(self, state: SNESState, z: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.stack([_es.weighted_rows(w[:, 0], z), _es.weighted_rows(w[:, 0], _es.fence(z * z, z) - 1)])

    def apply(self, state: SNESState, total: jax.Array) -> SNESState:
        g_mu, g_sigma = total[0], total[1]
        return state._replace(
            mean=state.mean + self.eta_mu * state.sigma * g_mu,
            sigma=state.sigma * jnp.exp(self.lr_sigma / 2 * g_sigma),
        )


@dataclasses.dataclass(frozen=True)
class XNES(_NESBase):
    """Exponential NES [G10; W14, Alg. 5]: full covariance A A^T, A = sigma B, det B = 1.

    O(n^3) per generation (a matrix exponential); eta_sigma sets eta_B too ([W14] use one value).
    """
    dynamic: ClassVar[tuple[str, ...]] = ("eta_mu",)

    @property
    def lr_sigma(self) -> float:
        d = self.dim
        return self.eta_sigma or (9 + 3 * math.log(d)) / (5 * d * math.sqrt(d))

    def init(self, key: jax.Array) -> XNESState:
        key, k = jax.random.split(key)
        width = [u - lo for lo, u in zip(self.lb, self.ub)]
        geo = math.exp(sum(math.log(w) for w in width) / len(width))
        # A0 = sigma_init * diag(width) split as sigma * B with det B = 1
        B = jnp.diag(jnp.asarray([w / geo for w in width], self.dtype))
        return XNESState(key, self.initial_mean(k), jnp.asarray(self.sigma_init * geo, self.dtype),
                         B, jnp.zeros((self.pop_size, self.dim), self.dtype))

    def ask(self, state: XNESState):
        key, k = jax.random.split(state.key)
        z = jax.random.normal(k, (self.pop_size, self.dim), self.dtype)
        return self._candidates(state.mean, state.sigma * (z @ state.B.T)), state._replace(key=key, z=z)

    def tell(self, state: XNESState, fitness: jax.Array) -> XNESState:
        n = self.dim
        u = self._sorted_utilities(fitness)
        z = state.z
        g_delta = u @ z
        eye = jnp.eye(n, dtype=self.dtype)
        g_M = (z.T * u) @ z - jnp.sum(u) * eye
        g_sigma = jnp.trace(g_M) / n
        g_B = g_M - g_sigma * eye
        lr = self.lr_sigma
        return state._replace(
            mean=state.mean + self.eta_mu * state.sigma * (state.B @ g_delta),
            sigma=state.sigma * jnp.exp(lr / 2 * g_sigma),
            B=state.B @ expm(lr / 2 * g_B),
        )
