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

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import ConfigError


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
            raise ConfigError(f"{name} must be > 0, got {v}")


def check_unit(name: str, v: float, *, closed_low: bool = True, closed_high: bool = True) -> None:
    lo_ok = v >= 0 if closed_low else v > 0
    hi_ok = v <= 1 if closed_high else v < 1
    if not (lo_ok and hi_ok):
        lo, hi = "[" if closed_low else "(", "]" if closed_high else ")"
        raise ConfigError(f"{name} must be in {lo}0, 1{hi}, got {v}")


# -- per-candidate noise and order-fixed update sums (OpenES, PGPE, SNES) ---------------------------
#
# These strategies' update is a weighted sum over the population of per-sample noise terms. They
# compute it in a form that a sharded evaluation can reproduce bit for bit without any rank ever
# holding the whole population (``algorithm.distributed``, ``hpcevo/parallel/es.py``):
#   * the noise of block j (units j b .. j b + b - 1) is drawn from its own counter-based key
#     fold_in(key, j) (``block_noise``), so any rank can regenerate any block without the others;
#   * the sum runs over fixed blocks of ``block_rows`` units: inside a block a pairwise tree over
#     the rows, then a pairwise tree over the blocks. The grouping depends on the population
#     only, never on how blocks are spread over ranks;
#   * products are fenced (``fence``) before anything adds them, so no compiler can contract a
#     multiply and an add into one FMA differently in two programs (see the note on bitwise block
#     invariance in hpcevo/problems/numerical.py). A block's partial sum is then the same bits
#     whether it is computed in one program over the whole population or on some rank alone.

# Units per block by default: at most this many blocks (the partial sums the distributed mode
# exchanges), at least MIN_BLOCK rows each. Depends on the population only.
MAX_BLOCKS = 64
MIN_BLOCK = 8


def block_rows(units: int, requested: int = 0) -> int:
    if requested:
        return max(1, min(requested, units))
    return max(1, min(units, max(MIN_BLOCK, -(-units // MAX_BLOCKS))))


def fence(value: jax.Array, source: jax.Array) -> jax.Array:
    """``value``, rounded before a consumer sees it (a select LLVM cannot contract across; see
    hpcevo/problems/numerical.py). ``source`` is a factor of ``value``: a NaN there is a NaN here."""
    return jnp.where(jnp.isnan(source), source, value)


def pairwise_sum(t: jax.Array) -> jax.Array:
    """Sum over axis 0 as a pairwise tree of explicit adds (zero-padded to a power of two): a fixed
    order for a given length, whatever program it is compiled in."""
    n = t.shape[0]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        t = jnp.concatenate([t, jnp.zeros((width - n, *t.shape[1:]), t.dtype)])
    while t.shape[0] > 1:
        h = t.shape[0] // 2
        t = t[:h] + t[h:]
    return t[0]


def _unit_interval(bits: jax.Array, dtype) -> jax.Array:
    """Uniform in (0, 1]: the top mantissa-width bits as a float in [1, 2), subtracted from 2
    (both exact)."""
    dtype = jnp.dtype(dtype)
    nbits, mant = (32, 23) if dtype.itemsize == 4 else (64, 52)
    utype = jnp.uint32 if nbits == 32 else jnp.uint64
    one = lax.bitcast_convert_type(jnp.asarray(1.0, dtype), utype)
    f = lax.bitcast_convert_type((bits >> (nbits - mant)) | one, dtype)  # [1, 2)
    return 2.0 - f


def _horner(coef: list[float], x: jax.Array) -> jax.Array:
    """sum coef[i] x^i, every product fenced (no FMA contraction, the same bits in any program)."""
    p = jnp.full_like(x, coef[-1])
    for a in reversed(coef[:-1]):
        p = fence(p * x, p) + a
    return p


def _sincos_turn(u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cos 2 pi u, sin 2 pi u) for u in [0, 1], to about one ulp.

    The angle is reduced exactly, in turns: 4u is exact, q = round(4u) its quadrant and
    t = 4u - q in [-1/2, 1/2] exact as well (Sterbenz), so theta = t pi / 2 lies in
    [-pi/4, pi/4], where the Taylor series of sin and cos converge fast (float32: terms to
    theta^11 and theta^12, truncation below 2e-9; float64: to theta^19 and theta^20, below 1e-17);
    the quadrant only swaps and negates. Why not jnp.cos / jnp.sin of 2 pi u: on XLA CPU they
    took 70% of the whole noise block (0.56 of 0.80 ms for 51,200 normals, one core) against
    0.20 ms here, and rounding 2 pi u first costs them accuracy (max error 3.8e-7 in float32
    against 9.7e-8 here, measured over 2e6 samples).
    """
    terms = 6 if jnp.dtype(u.dtype).itemsize == 4 else 10
    sin_c = [(-1) ** k / math.factorial(2 * k + 1) for k in range(terms)]
    cos_c = [(-1) ** k / math.factorial(2 * k) for k in range(terms + 1)]
    u4 = 4.0 * u
    q = jnp.round(u4)
    t = u4 - q
    theta = fence((math.pi / 2) * t, t)
    theta2 = fence(theta * theta, theta)
    sn = fence(theta * _horner(sin_c, theta2), theta)
    cs = _horner(cos_c, theta2)
    quadrant = q.astype(jnp.int32) & 3
    first = [quadrant == 0, quadrant == 1, quadrant == 2]
    return jnp.select(first, [cs, -sn, -cs], sn), jnp.select(first, [sn, cs, -sn], -cs)


def block_noise(key: jax.Array, block, rows: int, dim: int, dtype) -> jax.Array:
    """Standard normal (rows, dim) for block ``block`` of the generation, from fold_in(key, block).

    Box-Muller [BM58] using both outputs of each pair of uniforms (r cos t and r sin t, two
    independent standard normals), so one 2 x ceil(rows dim / 2) draw of random bits makes the
    whole block: half the bits and half the logs and square roots of using cos alone, and one
    key per block rather than per row. Every product is fenced: JAX's own normal sampler
    evaluates erfinv as a polynomial of plain multiplies and adds that XLA fuses into its
    consumers, and the FMA contractions then differ between programs (seen: the same key gave
    rows differing in the last bit inside a sharded step and inside ``ask``). log and sqrt are
    single operations here, cos and sin fenced polynomials (``_sincos_turn``), and a block comes
    out the same in every program.

    [BM58] G. E. P. Box and M. E. Muller, "A Note on the Generation of Random Normal Deviates",
           Annals of Mathematical Statistics 29(2):610-611, 1958.
    """
    dtype = jnp.dtype(dtype)
    width = jnp.uint32 if dtype.itemsize == 4 else jnp.uint64
    n = rows * dim
    bits = jax.random.bits(jax.random.fold_in(key, block), (2, -(-n // 2)), width)
    u1, u2 = _unit_interval(bits[0], dtype), _unit_interval(bits[1], dtype)
    log_u = jnp.log(u1)
    r = jnp.sqrt(fence(-2.0 * log_u, log_u))
    c, s = _sincos_turn(u2)
    z = jnp.concatenate([fence(r * c, c), fence(r * s, s)])
    return z[:n].reshape(rows, dim)


def weighted_rows(w: jax.Array, rows: jax.Array) -> jax.Array:
    """sum_r w[r] rows[r] over a block, (b,), (b, d) -> (d,), in the fixed order."""
    return pairwise_sum(fence(w[:, None] * rows, rows))


class BlockedES:
    """ask/tell of a strategy whose update is a sum of per-unit terms, in blocks (see above).

    A strategy provides: ``units`` (noise rows per generation), ``copies`` (candidates per unit:
    2 for mirrored pairs, ordered [all plus; all minus], else 1), ``expand(state, z)`` (the
    candidates of noise rows z), ``weights(state, fitness) -> (units, a)``, ``partial(state, z, w)
    -> (a, d)`` (one block's share of the a update sums) and ``apply(state, total) -> state``; its
    state has ``key`` and ``z`` (the asked noise; shape (0, dim) in distributed mode, where no rank
    keeps it). The distributed primitive calls the same pieces block by block.
    """

    copies = 1

    @property
    def block_rows(self) -> int:
        return block_rows(self.units, self.block)

    def _check_blocked(self) -> None:
        if self.block < 0:
            raise ConfigError(f"block must be >= 0 (0: automatic), got {self.block}")

    def split_key(self, state):
        key, k = jax.random.split(state.key)
        return state._replace(key=key), k

    def block_noise(self, key: jax.Array, j) -> jax.Array:
        """The noise rows of block ``j`` (units j b .. j b + b - 1; past the last unit: zero)."""
        b = self.block_rows
        z = block_noise(key, j, b, self.dim, self.dtype)
        if self.units % b == 0:  # no padded block
            return z
        return jnp.where((j * b + jnp.arange(b) < self.units)[:, None], z, 0)

    def noise(self, key: jax.Array) -> jax.Array:
        """All blocks' noise, (blocks * b, dim), the padding rows zero."""
        b = self.block_rows
        blocks = -(-self.units // b)
        return jax.vmap(lambda j: self.block_noise(key, j))(jnp.arange(blocks)).reshape(blocks * b, self.dim)

    def stored_noise_rows(self) -> int:
        return 0 if self.distributed else self.units

    def candidate(self, state, key: jax.Array, i) -> jax.Array:
        """Candidate i of the generation drawn with ``key`` from ``state``, alone."""
        unit = i % self.units
        z = lax.dynamic_index_in_dim(self.block_noise(key, unit // self.block_rows), unit % self.block_rows, 0)
        return self.expand(state, z)[i // self.units]

    def combine(self, partials: jax.Array) -> jax.Array:
        """(blocks, a, d) block sums -> (a, d), in the fixed order."""
        return pairwise_sum(partials)

    def ask(self, state):
        state, k = self.split_key(state)
        z = self.noise(k)[: self.units]
        return self.expand(state, z), state._replace(z=z)

    def tell(self, state, fitness: jax.Array):
        b, u = self.block_rows, self.units
        blocks = -(-u // b)
        w = self.weights(state, fitness)
        pad = blocks * b - u
        z = jnp.concatenate([state.z, jnp.zeros((pad, self.dim), state.z.dtype)]) if pad else state.z
        w = jnp.concatenate([w, jnp.zeros((pad, w.shape[1]), w.dtype)]) if pad else w
        partials = jax.vmap(lambda zb, wb: self.partial(state, zb, wb))(
            z.reshape(blocks, b, self.dim), w.reshape(blocks, b, w.shape[1]))
        return self.apply(state, self.combine(partials))


class MirroredES(BlockedES):
    """A BlockedES sampling mirrored (antithetic) pairs: unit i gives mean + sigma z_i and
    mean - sigma z_i, candidates ordered [all plus; all minus], so pop_size must be even. The
    strategy has ``pop_size`` and ``clip``; its state has ``mean`` and ``sigma`` (per coordinate)."""

    copies = 2

    @property
    def units(self) -> int:
        return self.pop_size // 2

    def _check_blocked(self) -> None:
        if self.pop_size < 2 or self.pop_size % 2:
            raise ConfigError(f"mirrored sampling needs an even pop_size >= 2, got {self.pop_size}")
        super()._check_blocked()

    def expand(self, state, z: jax.Array) -> jax.Array:
        step = fence(state.sigma * z, z)
        x = jnp.concatenate([state.mean + step, state.mean - step])
        return self.clip_to_box(x) if self.clip else x
