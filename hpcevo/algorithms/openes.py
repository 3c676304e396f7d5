"""OpenAI-ES.

T. Salimans, J. Ho, X. Chen, S. Sidor and I. Sutskever, "Evolution Strategies as a Scalable
Alternative to Reinforcement Learning", arXiv:1703.03864, 2017.

A fixed isotropic Gaussian around the mean; the gradient estimate of Algorithm 1 with mirrored
(antithetic) sampling and centred-rank fitness shaping (Sec. 2.2 and their App.), fed to Adam
(Kingma & Ba 2015); weight decay (L2 on the mean, their App.) optional. Their defaults:
sigma = 0.02, Adam learning rate 0.01, L2 coefficient 0.005 (the last is off here by default: it
pulls towards the origin, a regulariser for network weights, not for a box-constrained problem).

Box conventions (see ``_es.py``): the mean starts uniformly in the box; ``sigma_init`` and
``lr`` are fractions of the box width per coordinate (so Adam effectively runs in box-normalised
coordinates, and the paper's values for unit-scale weights carry over). ``sigma_decay`` and
``lr_decay`` (per generation, floored at ``sigma_min``/``lr_min``) are the common practical
addition (e.g. evosax, estool); the defaults of 1 keep the paper's fixed values.

The population is mirrored: rows i and i + pop/2 are mean + sigma eps_i and mean - sigma eps_i,
so pop_size must be even. eps_i comes from its block's key (fold_in of the generation's key and the block)
and the gradient is summed in fixed blocks of ``block`` pairs (``_es.MirroredES``), which is what
lets ``distributed = true`` run it without any rank holding the population
(``hpcevo/parallel/es.py``), with bitwise the same result.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


class OpenESState(NamedTuple):
    key: jax.Array
    mean: jax.Array  # (n,)
    sigma: jax.Array  # (n,) absolute deviation per coordinate
    lr: jax.Array  # (n,) absolute Adam step per coordinate
    adam: _es.AdamState
    z: jax.Array  # (pop/2, n) the asked generation's noise eps; (0, n) in distributed mode


@dataclasses.dataclass(frozen=True)
class OpenES(_es.MirroredES, BaseAlgorithm):
    """OpenAI-ES (Salimans et al. 2017): mirrored sampling, centred ranks, Adam on the mean."""
    dynamic: ClassVar[tuple[str, ...]] = (
        "sigma_decay", "sigma_min", "lr_decay", "lr_min", "weight_decay", "beta1", "beta2", "adam_eps")
    initial: ClassVar[tuple[str, ...]] = ("sigma_init", "lr", "x0")

    sigma_init: float = 0.02
    lr: float = 0.01
    sigma_decay: float = 1.0
    sigma_min: float = 0.0
    lr_decay: float = 1.0
    lr_min: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    clip: bool = False
    x0: tuple[float, ...] | None = None  # the initial mean (default: uniform in the box)
    distributed: bool = False  # no rank holds the population (hpcevo/parallel/es.py)
    block: int = 0  # pairs per block of the gradient's partial sums (0: automatic)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_blocked()
        _es.check_positive(sigma_init=self.sigma_init, lr=self.lr)
        _es.check_unit("sigma_decay", self.sigma_decay, closed_low=False)
        _es.check_unit("lr_decay", self.lr_decay, closed_low=False)
        _es.check_unit("beta1", self.beta1, closed_high=False)
        _es.check_unit("beta2", self.beta2, closed_high=False)
        if min(self.sigma_min, self.lr_min, self.weight_decay, self.adam_eps) < 0:
            raise ConfigError("sigma_min, lr_min, weight_decay and adam_eps must be >= 0")

    def init(self, key: jax.Array) -> OpenESState:
        key, k = jax.random.split(key)
        mean = self.initial_mean(k)
        w = self.width()
        return OpenESState(key, mean, self.sigma_init * w, self.lr * w, _es.adam_init(mean),
                           jnp.zeros((self.stored_noise_rows(), self.dim), self.dtype))

    def weights(self, state: OpenESState, fitness: jax.Array) -> jax.Array:
        util = _es.centred_ranks(fitness, self.dtype)
        half = self.units
        return (util[:half] - util[half:])[:, None]

    def partial(self, state: OpenESState, z: jax.Array, w: jax.Array) -> jax.Array:
        return _es.weighted_rows(w[:, 0], z)[None]

    def apply(self, state: OpenESState, total: jax.Array) -> OpenESState:
        # Algorithm 1 with mirrored pairs: g = 1/(n sigma) sum_i F_i eps_i, the pair sharing eps.
        g = total[0] / (self.pop_size * state.sigma)
        # Adam minimises: feed it the loss gradient in box-normalised coordinates (x = w u).
        w = self.width()
        loss_grad = (-g + self.weight_decay * state.mean) * w
        direction, adam = _es.adam_step(state.adam, loss_grad, self.beta1, self.beta2, self.adam_eps)
        return state._replace(
            mean=state.mean - state.lr * direction,
            adam=adam,
            sigma=jnp.maximum(state.sigma * self.sigma_decay, self.sigma_min * w),
            lr=jnp.maximum(state.lr * self.lr_decay, self.lr_min * w),
        )
