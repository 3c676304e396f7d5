"""PGPE: policy gradients with parameter-based exploration, symmetric sampling; ClipUp optional.

[S10] F. Sehnke, C. Osendorfer, T. Rueckstiess, A. Graves, J. Peters and J. Schmidhuber,
      "Parameter-exploring policy gradients", Neural Networks 23(4):551-559, 2010. Symmetric
      sampling (Sec. 3.2, Alg. 2 with symmetric samples): pairs theta = mu +- eps,
      eps ~ N(0, diag sigma^2), Delta mu = alpha_mu T r_T and Delta sigma = alpha_sigma S r_S, sums
      over the pairs with T = [eps], r_T = [(r+ - r-) / (2m - r+ - r-)], S = [(eps^2 - sigma^2) /
      sigma], r_S = [((r+ + r-)/2 - b) / (m - b)] (m the best reward, b a baseline); step sizes
      alpha_mu = 0.2, alpha_sigma = 0.1 (Sec. 4).
[T20] N. E. Toklu, P. Liskowski and R. K. Srivastava, "ClipUp: A Simple and Powerful Optimizer
      for Distribution-based Policy Evolution", PPSN XVI, LNCS 12270, pp. 515-527, 2020. ClipUp
      (Alg. 1) for the mean: momentum 0.9 on the normalised gradient, speed clipped, the paper's
      advice max_speed = 2 step_size; and centred-rank rewards (which also make the baseline b
      the mean reward, 0).

Here the rewards are centred ranks of the fitness (best +0.5, worst -0.5), so b = 0, m = 0.5, and
[S10]'s normalised rewards become r_T = r+ - r- and r_S = r+ + r- (both in [-1, 1], as theirs);
the sums grow with the number of pairs, so lower ``center_lr`` for large populations, or use
ClipUp, whose step does not depend on the gradient's size; sigma's relative change per generation is clipped to
``sigma_max_change`` (0.2, as in [T20]'s experiments) to keep a bad generation from collapsing
it. Box conventions as in ``_es.py``: ``sigma_init``, ClipUp's ``clipup_step`` and
``clipup_max_speed`` are fractions of the box width (ClipUp runs in box-normalised coordinates);
pop_size must be even (mirrored pairs). Noise per block of pairs from its own key and update sums in fixed
blocks of ``block`` pairs (``_es.MirroredES``): ``distributed = true`` runs it without any rank
holding the population (``hpcevo/parallel/es.py``), with bitwise the same result.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


class PGPEState(NamedTuple):
    key: jax.Array
    mean: jax.Array  # (n,)
    sigma: jax.Array  # (n,)
    velocity: jax.Array  # (n,) ClipUp velocity, box-normalised units
    z: jax.Array  # (pop/2, n) standard normal noise, eps = sigma z; (0, n) in distributed mode


@dataclasses.dataclass(frozen=True)
class PGPE(_es.MirroredES, BaseAlgorithm):
    """PGPE with symmetric sampling [S10]; ``optimizer = "clipup"`` for ClipUp on the mean [T20]."""
    dynamic: ClassVar[tuple[str, ...]] = (
        "center_lr", "sigma_lr", "sigma_max_change", "clipup_step", "clipup_max_speed", "momentum")
    initial: ClassVar[tuple[str, ...]] = ("sigma_init", "x0")

    sigma_init: float = 0.1
    center_lr: float = 0.2
    sigma_lr: float = 0.1
    sigma_max_change: float = 0.2
    optimizer: Literal["sgd", "clipup"] = "sgd"
    clipup_step: float = 0.15
    clipup_max_speed: float = 0.3
    momentum: float = 0.9
    clip: bool = False
    x0: tuple[float, ...] | None = None  # the initial mean (default: uniform in the box)
    distributed: bool = False  # no rank holds the population (hpcevo/parallel/es.py)
    block: int = 0  # pairs per block of the update's partial sums (0: automatic)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_blocked()
        if self.optimizer not in ("sgd", "clipup"):
            raise ConfigError(f"optimizer must be 'sgd' or 'clipup', got {self.optimizer!r}")
        _es.check_positive(sigma_init=self.sigma_init, center_lr=self.center_lr,
                           clipup_step=self.clipup_step, clipup_max_speed=self.clipup_max_speed)
        if self.sigma_lr < 0:
            raise ConfigError(f"sigma_lr must be >= 0, got {self.sigma_lr}")
        _es.check_unit("sigma_max_change", self.sigma_max_change, closed_low=False, closed_high=False)
        _es.check_unit("momentum", self.momentum, closed_high=False)

    def init(self, key: jax.Array) -> PGPEState:
        key, k = jax.random.split(key)
        mean = self.initial_mean(k)
        return PGPEState(key, mean, self.sigma_init * self.width(), jnp.zeros_like(mean),
                         jnp.zeros((self.stored_noise_rows(), self.dim), self.dtype))

    def weights(self, state: PGPEState, fitness: jax.Array) -> jax.Array:
        r = _es.centred_ranks(fitness, self.dtype)
        r_plus, r_minus = r[: self.units], r[self.units :]
        return jnp.stack([r_plus - r_minus, r_plus + r_minus], axis=1)

    def partial(self, state: PGPEState, z: jax.Array, w: jax.Array) -> jax.Array:
        sigma = state.sigma
        eps = _es.fence(sigma * z, z)
        spread = _es.fence(eps * eps, eps) - _es.fence(sigma * sigma, sigma)
        return jnp.stack([_es.weighted_rows(w[:, 0], eps), _es.weighted_rows(w[:, 1], spread)])

    def apply(self, state: PGPEState, total: jax.Array) -> PGPEState:
        sigma = state.sigma
        g_mu, g_sigma = total[0], total[1] / sigma
        velocity = state.velocity
        if self.optimizer == "clipup":
            w = self.width()
            velocity = _es.clipup_step(velocity, g_mu / w, self.clipup_step, self.momentum, self.clipup_max_speed)
            mean = state.mean + velocity * w
        else:
            mean = state.mean + self.center_lr * g_mu
        change = jnp.clip(self.sigma_lr * g_sigma / sigma, -self.sigma_max_change, self.sigma_max_change)
        return state._replace(mean=mean, sigma=sigma * (1 + change), velocity=velocity)
