"""Pieces shared by the distribution-based strategies: fitness shaping, ranking, optimizers.

Search-box convention for every strategy with a mean (CMA-ES, sep-CMA-ES, OpenES, SNES, xNES,
PGPE): the mean starts uniformly at random in the box, the initial step size is a fraction of the
box width, and learning rates that are lengths (OpenES/PGPE) are fractions of the box width too.
Candidates are NOT clipped unless the strategy's ``clip`` is true: the updates assume the
candidates were drawn from the search distribution, and clipping silently biases them (a mean
drifting to a wall would see every sample on the wall). With ``clip = true`` the evaluated point
is the clipped one and the update still uses the sampled noise, which is what the mean's best_x
tracking in the workflow then reports. Parameters are kept in the problem's own coordinates (no
affine map to [0, 1]): near an optimum that is not the box centre, an offset lb + u (ub - lb) would
cost all the precision float32 has (ulp(100) is 8e-6).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def ranks(fitness: jax.Array) -> jax.Array:
    """0 for the best (lowest), n - 1 for the worst; ties keep index order (stable sort)."""
    order = jnp.argsort(fitness, stable=True)
    return jnp.zeros(fitness.shape, jnp.int32).at[order].set(jnp.arange(fitness.shape[0], dtype=jnp.int32))


def centred_ranks(fitness: jax.Array, dtype) -> jax.Array:
    """Salimans et al. (2017) rank transform: +0.5 for the best, -0.5 for the worst, mean 0."""
    n = fitness.shape[0]
    r = ranks(fitness).astype(dtype)
    return 0.5 - r / max(n - 1, 1)


def nes_utilities(n: int, dtype) -> jax.Array:
    """Wierstra et al. (2014, JMLR 15, Sec. 3.1) utility values by rank (best first), summing to 0:
    u_k = max(0, ln(n/2 + 1) - ln k) / sum_j max(0, ln(n/2 + 1) - ln j) - 1/n."""
    k = jnp.arange(1, n + 1, dtype=dtype)
    raw = jnp.maximum(0.0, jnp.log(n / 2 + 1.0) - jnp.log(k))
    return raw / raw.sum() - 1.0 / n


class AdamState(NamedTuple):
    m: jax.Array
    v: jax.Array
    t: jax.Array  # int32 step count


def adam_init(x: jax.Array) -> AdamState:
    return AdamState(jnp.zeros_like(x), jnp.zeros_like(x), jnp.asarray(0, jnp.int32))


def adam_step(state: AdamState, grad: jax.Array, b1: float, b2: float, eps: float) -> tuple[jax.Array, AdamState]:
    """Kingma & Ba (ICLR 2015), Algorithm 1: the bias-corrected direction (times the learning
    rate it is the step to subtract for a descent)."""
    t = state.t + 1
    m = b1 * state.m + (1 - b1) * grad
    v = b2 * state.v + (1 - b2) * grad * grad
    tf = t.astype(grad.dtype)
    m_hat = m / (1 - b1**tf)
    v_hat = v / (1 - b2**tf)
    return m_hat / (jnp.sqrt(v_hat) + eps), AdamState(m, v, t)


def clipup_step(velocity: jax.Array, grad: jax.Array, step_size: float, momentum: float,
                max_speed: float) -> jax.Array:
    """ClipUp (Toklu et al., PPSN 2020, Alg. 1): heavy-ball on the normalised gradient, speed
    clipped. Returns the new velocity (add it to the mean for an ascent on ``grad``)."""
    norm = jnp.sqrt(jnp.sum(grad * grad))
    v = momentum * velocity + step_size * grad / jnp.where(norm > 0, norm, 1.0)
    speed = jnp.sqrt(jnp.sum(v * v))
    return jnp.where(speed > max_speed, v * (max_speed / jnp.where(speed > 0, speed, 1.0)), v)


def check_positive(**values: float) -> None:
    for name, v in values.items():
        if not v > 0:
            raise ValueError(f"{name} must be > 0, got {v}")


def check_unit(name: str, v: float, *, closed_low: bool = True, closed_high: bool = True) -> None:
    lo_ok = v >= 0 if closed_low else v > 0
    hi_ok = v <= 1 if closed_high else v < 1
    if not (lo_ok and hi_ok):
        lo, hi = "[" if closed_low else "(", "]" if closed_high else ")"
        raise ValueError(f"{name} must be in {lo}0, 1{hi}, got {v}")
