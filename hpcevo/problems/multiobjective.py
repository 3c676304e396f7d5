"""Multi-objective benchmarks (all objectives minimised), pure JAX: the ZDT and DTLZ suites.

Every function maps the LAST axis to ``m`` objectives: one candidate ``(D,) -> (m,)`` or a block
``(B, D) -> (B, m)``. Rows never mix. Unlike the single-objective benchmarks these are not written
to be bitwise invariant to the block shape: runs stay bitwise equal at any rank count because the
sharded evaluator hands the function blocks whose shapes depend on the population size only.

[ZDT00] E. Zitzler, K. Deb and L. Thiele, "Comparison of Multiobjective Evolutionary Algorithms:
        Empirical Results", Evolutionary Computation 8(2):173-195, 2000. ZDT1-4 and ZDT6
        (Sec. 4, Eqs. 1-6); n = 30 (ZDT1-3) and n = 10 (ZDT4, ZDT6); x in [0, 1], ZDT4's x_2..x_n
        in [-5, 5]. (ZDT5 is binary-coded and not included.)
[DTLZ05] K. Deb, L. Thiele, M. Laumanns and E. Zitzler, "Scalable Test Problems for Evolutionary
        Multiobjective Optimization", in Evolutionary Multiobjective Optimization, Springer,
        pp. 105-145, 2005 (DTLZ1-7, Sec. 6). n = m + k - 1 variables in [0, 1]; the suggested
        k = 5 (DTLZ1), 10 (DTLZ2-6), 20 (DTLZ7); alpha = 100 (DTLZ4). Any n >= m works here.

Each problem also knows its Pareto front (``pareto_front``: points computed on the host in
float64 from the closed form, for IGD) and a default hypervolume reference point: the front's
nadir plus 10% of its extent in every objective (``default_ref_point``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..algorithms.mo import das_dennis
from .base import Problem

Array = jax.Array
HALF_PI = math.pi / 2


# -- ZDT ------------------------------------------------------------------------------------------
def _zdt_g_linear(x: Array) -> Array:
    n = x.shape[-1]
    return 1.0 + 9.0 * jnp.sum(x[..., 1:], axis=-1) / max(n - 1, 1)


def zdt1(x: Array) -> Array:
    f1 = x[..., 0]
    g = _zdt_g_linear(x)
    return jnp.stack([f1, g * (1.0 - jnp.sqrt(f1 / g))], axis=-1)


def zdt2(x: Array) -> Array:
    f1 = x[..., 0]
    g = _zdt_g_linear(x)
    return jnp.stack([f1, g * (1.0 - (f1 / g) ** 2)], axis=-1)


def zdt3(x: Array) -> Array:
    f1 = x[..., 0]
    g = _zdt_g_linear(x)
    r = f1 / g
    return jnp.stack([f1, g * (1.0 - jnp.sqrt(r) - r * jnp.sin(10.0 * math.pi * f1))], axis=-1)


def zdt4(x: Array) -> Array:
    f1 = x[..., 0]
    rest = x[..., 1:]
    g = 1.0 + 10.0 * rest.shape[-1] + jnp.sum(rest * rest - 10.0 * jnp.cos(4.0 * math.pi * rest), axis=-1)
    return jnp.stack([f1, g * (1.0 - jnp.sqrt(f1 / g))], axis=-1)


def zdt6(x: Array) -> Array:
    x1 = x[..., 0]
    f1 = 1.0 - jnp.exp(-4.0 * x1) * jnp.sin(6.0 * math.pi * x1) ** 6
    n = x.shape[-1]
    g = 1.0 + 9.0 * (jnp.sum(x[..., 1:], axis=-1) / max(n - 1, 1)) ** 0.25
    return jnp.stack([f1, g * (1.0 - (f1 / g) ** 2)], axis=-1)


# -- DTLZ -----------------------------------------------------------------------------------------
def _g_rastrigin(xm: Array) -> Array:
    """DTLZ1/3's g: 100 (k + sum((x - 0.5)^2 - cos(20 pi (x - 0.5))))."""
    d = xm - 0.5
    return 100.0 * (xm.shape[-1] + jnp.sum(d * d - jnp.cos(20.0 * math.pi * d), axis=-1))


def _g_sphere(xm: Array) -> Array:
    d = xm - 0.5
    return jnp.sum(d * d, axis=-1)


def _linear_front(x: Array, m: int, scale: Array) -> Array:
    """DTLZ1's objectives: f_i = scale (prod_{j < m-i} x_j) (1 - x_{m-i}) [DTLZ05, Eq. 6.1]."""
    ones = jnp.ones_like(x[..., :1])
    cum = jnp.concatenate([ones, jnp.cumprod(x[..., : m - 1], axis=-1)], axis=-1)  # prod of the first j
    out = []
    for i in range(m):
        term = cum[..., m - 1 - i]
        if i > 0:
            term = term * (1.0 - x[..., m - 1 - i])
        out.append(scale * term)
    return jnp.stack(out, axis=-1)


def _spherical_front(theta: Array, m: int, scale: Array) -> Array:
    """f_i = scale (prod_{j < m-i} cos theta_j) sin theta_{m-i} [DTLZ05, Eq. 6.3], theta of
    shape (..., m - 1)."""
    ones = jnp.ones_like(theta[..., :1])
    cum = jnp.concatenate([ones, jnp.cumprod(jnp.cos(theta), axis=-1)], axis=-1)
    out = []
    for i in range(m):
        term = cum[..., m - 1 - i]
        if i > 0:
            term = term * jnp.sin(theta[..., m - 1 - i])
        out.append(scale * term)
    return jnp.stack(out, axis=-1)


def dtlz1(x: Array, m: int) -> Array:
    g = _g_rastrigin(x[..., m - 1:])
    return _linear_front(x, m, 0.5 * (1.0 + g))


def dtlz2(x: Array, m: int) -> Array:
    g = _g_sphere(x[..., m - 1:])
    return _spherical_front(x[..., : m - 1] * HALF_PI, m, 1.0 + g)


def dtlz3(x: Array, m: int) -> Array:
    g = _g_rastrigin(x[..., m - 1:])
    return _spherical_front(x[..., : m - 1] * HALF_PI, m, 1.0 + g)


DTLZ4_ALPHA = 100.0


def dtlz4(x: Array, m: int) -> Array:
    g = _g_sphere(x[..., m - 1:])
    return _spherical_front(x[..., : m - 1] ** DTLZ4_ALPHA * HALF_PI, m, 1.0 + g)


def _degenerate_theta(x: Array, m: int, g: Array) -> Array:
    """DTLZ5/6: theta_1 = x_1 pi/2, theta_i = pi / (4 (1 + g)) (1 + 2 g x_i) [DTLZ05, Eq. 6.7]."""
    first = x[..., :1] * HALF_PI
    rest = (math.pi / 4.0) / (1.0 + g[..., None]) * (1.0 + 2.0 * g[..., None] * x[..., 1 : m - 1])
    return jnp.concatenate([first, rest], axis=-1)


def dtlz5(x: Array, m: int) -> Array:
    g = _g_sphere(x[..., m - 1:])
    return _spherical_front(_degenerate_theta(x, m, g), m, 1.0 + g)


def dtlz6(x: Array, m: int) -> Array:
    g = jnp.sum(x[..., m - 1:] ** 0.1, axis=-1)
    return _spherical_front(_degenerate_theta(x, m, g), m, 1.0 + g)


def dtlz7(x: Array, m: int) -> Array:
    xm = x[..., m - 1:]
    g = 1.0 + 9.0 / xm.shape[-1] * jnp.sum(xm, axis=-1)
    f = x[..., : m - 1]
    h = m - jnp.sum(f / (1.0 + g[..., None]) * (1.0 + jnp.sin(3.0 * math.pi * f)), axis=-1)
    return jnp.concatenate([f, ((1.0 + g) * h)[..., None]], axis=-1)


# -- Pareto fronts on the host (float64) ----------------------------------------------------------
FRONT_POINTS = 1000  # about this many reference points per front


def non_dominated_rows(f: np.ndarray, chunk: int = 256) -> np.ndarray:
    """The rows of ``f`` that no other row dominates (host; O(n^2 m) in vectorised chunks)."""
    dominated = np.zeros(len(f), bool)
    for start in range(0, len(f), chunk):
        a = f[start : start + chunk, None, :]
        dominated |= np.any(np.all(a <= f[None], axis=-1) & np.any(a < f[None], axis=-1), axis=0)
    return f[~dominated]


def simplex_lattice(m: int, points: int = FRONT_POINTS) -> np.ndarray:
    """Das and Dennis' evenly spread points on the unit simplex, for the largest number of
    divisions H that gives at most ``points`` of them (at least H = 1)."""
    h = 1
    while math.comb(h + 1 + m - 1, m - 1) <= points:
        h += 1
    return das_dennis(m, h)


def _front_zdt(name: str, m: int) -> np.ndarray:
    del m
    f1 = np.linspace(0.0, 1.0, FRONT_POINTS)
    if name in ("zdt1", "zdt4"):
        return np.stack([f1, 1.0 - np.sqrt(f1)], axis=1)
    if name == "zdt2":
        return np.stack([f1, 1.0 - f1**2], axis=1)
    if name == "zdt3":  # disconnected: the non-dominated part of the g = 1 curve
        f1 = np.linspace(0.0, 1.0, 200 * FRONT_POINTS)
        curve = np.stack([f1, 1.0 - np.sqrt(f1) - f1 * np.sin(10.0 * math.pi * f1)], axis=1)
        front = curve[np.minimum.accumulate(curve[:, 1]) == curve[:, 1]]  # sorted by f1 already
        return front[np.linspace(0, len(front) - 1, FRONT_POINTS).round().astype(int)]
    # zdt6: f1 = 1 - exp(-4 x) sin^6(6 pi x) reaches its minimum on [0, 1/6]
    x = np.linspace(0.0, 1.0 / 6.0, 1_000_001)
    lo = float(np.min(1.0 - np.exp(-4.0 * x) * np.sin(6.0 * math.pi * x) ** 6))
    f1 = np.linspace(lo, 1.0, FRONT_POINTS)
    return np.stack([f1, 1.0 - f1**2], axis=1)


def _front_dtlz(name: str, m: int) -> np.ndarray:
    if name == "dtlz1":
        return 0.5 * simplex_lattice(m)
    if name in ("dtlz2", "dtlz3", "dtlz4"):
        w = simplex_lattice(m)
        return w / np.linalg.norm(w, axis=1, keepdims=True)
    if name in ("dtlz5", "dtlz6"):  # a curve: theta_1 free, the others pi/4 where g = 0
        t = np.linspace(0.0, HALF_PI, FRONT_POINTS)
        theta = np.concatenate([t[:, None], np.full((len(t), m - 2), math.pi / 4)], axis=1)
        ones = np.ones((len(t), 1))
        cum = np.concatenate([ones, np.cumprod(np.cos(theta), axis=1)], axis=1)
        cols = [cum[:, m - 1 - i] * (np.sin(theta[:, m - 1 - i]) if i else 1.0) for i in range(m)]
        return np.stack(cols, axis=1)
    # dtlz7: g = 1 on the front; a grid over the first m - 1 objectives, non-dominated part kept
    per_axis = max(2, int(round((4 * FRONT_POINTS) ** (1.0 / (m - 1)))))
    axes = np.meshgrid(*[np.linspace(0.0, 1.0, per_axis)] * (m - 1), indexing="ij")
    f = np.stack([a.ravel() for a in axes], axis=1)
    fm = 2.0 * (m - np.sum(f / 2.0 * (1.0 + np.sin(3.0 * math.pi * f)), axis=1))
    front = non_dominated_rows(np.concatenate([f, fm[:, None]], axis=1))
    if len(front) > FRONT_POINTS:
        front = front[np.linspace(0, len(front) - 1, FRONT_POINTS).round().astype(int)]
    return front


@dataclass(frozen=True)
class MOSpec:
    name: str
    function: Callable  # (x) for fixed m, (x, m) for scalable problems
    objectives: int | None  # fixed number of objectives, or None: scalable (default 3)
    default_k: int  # ZDT: default n; DTLZ: default k (n = m + k - 1)
    front: Callable[[str, int], np.ndarray]
    description: str


MO_PROBLEMS: dict[str, MOSpec] = {
    s.name: s
    for s in (
        MOSpec("zdt1", zdt1, 2, 30, _front_zdt, "ZDT1: convex front [Zitzler, Deb & Thiele 2000]"),
        MOSpec("zdt2", zdt2, 2, 30, _front_zdt, "ZDT2: concave front [Zitzler, Deb & Thiele 2000]"),
        MOSpec("zdt3", zdt3, 2, 30, _front_zdt, "ZDT3: disconnected front [Zitzler, Deb & Thiele 2000]"),
        MOSpec("zdt4", zdt4, 2, 10, _front_zdt, "ZDT4: 21^9 local fronts [Zitzler, Deb & Thiele 2000]"),
        MOSpec("zdt6", zdt6, 2, 10, _front_zdt, "ZDT6: non-uniform, biased [Zitzler, Deb & Thiele 2000]"),
        MOSpec("dtlz1", dtlz1, None, 5, _front_dtlz, "DTLZ1: linear front, 11^k - 1 local fronts [Deb et al. 2005]"),
        MOSpec("dtlz2", dtlz2, None, 10, _front_dtlz, "DTLZ2: spherical front [Deb et al. 2005]"),
        MOSpec("dtlz3", dtlz3, None, 10, _front_dtlz, "DTLZ3: spherical, 3^k - 1 local fronts [Deb et al. 2005]"),
        MOSpec("dtlz4", dtlz4, None, 10, _front_dtlz, "DTLZ4: spherical, biased density [Deb et al. 2005]"),
        MOSpec("dtlz5", dtlz5, None, 10, _front_dtlz, "DTLZ5: degenerate (a curve) [Deb et al. 2005]"),
        MOSpec("dtlz6", dtlz6, None, 10, _front_dtlz, "DTLZ6: degenerate, hard g [Deb et al. 2005]"),
        MOSpec("dtlz7", dtlz7, None, 20, _front_dtlz, "DTLZ7: 2^(m-1) disconnected regions [Deb et al. 2005]"),
    )
}
DTLZ_DEFAULT_OBJECTIVES = 3


@dataclass(frozen=True)
class MOProblem(Problem):
    """One multi-objective benchmark instance. Hashable (a jit static arg)."""

    name: str
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    num_objectives: int

    @property
    def spec(self) -> MOSpec:
        return MO_PROBLEMS[self.name]

    def evaluate(self, x) -> Array:
        """Objective vectors: x of shape (..., dim) -> (..., m); dtype kept."""
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        if x.ndim < 1 or x.shape[-1] != self.dim:
            raise ConfigError(f"{self.name}: expected candidates with last axis {self.dim}, got shape {x.shape}")
        if self.spec.objectives is None:
            return self.spec.function(x, self.num_objectives)
        return self.spec.function(x)

    __call__ = evaluate

    def pareto_front(self) -> np.ndarray:
        """About FRONT_POINTS points of the true Pareto front, float64 (r, m)."""
        return self.spec.front(self.name, self.num_objectives)

    def default_ref_point(self) -> np.ndarray:
        """The front's nadir plus 10% of its extent per objective."""
        front = self.pareto_front()
        lo, hi = front.min(axis=0), front.max(axis=0)
        return hi + 0.1 * (hi - lo)


def make_mo_problem(name: str, dim: int | None, lb=None, ub=None, objectives: int | None = None) -> MOProblem:
    """A ZDT or DTLZ instance; ``dim`` None gives the paper's size; bounds default to [0, 1]
    (ZDT4: x_1 in [0, 1], the rest in [-5, 5])."""
    from .numerical import _bounds  # the same rules and messages as the single-objective problems

    spec = MO_PROBLEMS[name]
    if objectives is None:
        m = spec.objectives or DTLZ_DEFAULT_OBJECTIVES
    else:
        if isinstance(objectives, bool) or not isinstance(objectives, int):
            raise ConfigError(f"{name}: objectives must be an integer, got {objectives!r}")
        if spec.objectives is not None and objectives != spec.objectives:
            raise ConfigError(f"{name} has {spec.objectives} objectives, got objectives = {objectives}")
        if objectives < 2:
            raise ConfigError(f"{name}: objectives must be >= 2, got {objectives}")
        m = objectives
    if dim is None:
        dim = spec.default_k if spec.objectives else m + spec.default_k - 1
    if isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise ConfigError(f"{name}: dim must be an integer, got {dim!r}")
    dim = dim.__index__()
    least = 2 if spec.objectives else m
    if dim < least:
        raise ConfigError(f"{name}: dim must be >= {least}" + (f" (the number of objectives)" if not spec.objectives else "")
                         + f", got {dim}")
    lo, hi = (0.0, 1.0)
    lb_t = _bounds(name, "lb", lb, lo, dim)
    ub_t = _bounds(name, "ub", ub, hi, dim)
    if name == "zdt4":
        lb_t = _bounds(name, "lb", lb, -5.0, dim) if lb is not None else (0.0,) + (-5.0,) * (dim - 1)
        ub_t = _bounds(name, "ub", ub, 5.0, dim) if ub is not None else (1.0,) + (5.0,) * (dim - 1)
    for i, (a, b) in enumerate(zip(lb_t, ub_t)):
        if not (math.isfinite(a) and math.isfinite(b) and a < b):
            raise ConfigError(f"{name}: need finite lb < ub in every coordinate; coordinate {i} has "
                             f"lb = {a}, ub = {b}")
    return MOProblem(name, dim, lb_t, ub_t, m)
