"""Classic single-objective numerical benchmarks (all minimised), pure JAX.

Every function maps the LAST axis to a scalar: one candidate ``(D,) -> ()`` or a block
``(B, D) -> (B,)`` (any leading shape works). Only a row's own coordinates are ever combined,
by element-wise arithmetic and by sums/products over the last axis, because the whole project's
promise of bitwise-identical results at any number of MPI ranks rests on a row's value not
depending on which other rows share its block. That takes more than not mixing rows: see
"Bitwise block invariance" below (``tests/test_problems.py`` checks it bitwise for every
problem, in float32 and float64, over many block shapes).

The dtype of the input is kept: constants are Python floats (weakly typed in JAX) or are built
in the input's dtype, so float32 stays float32 and float64 stays float64. Integer input is
promoted to JAX's default float type.

Some functions are written in an algebraically equivalent form of the textbook formula that
avoids cancellation near the optimum (noted at each); the values agree with the textbook
formula to rounding, and the optimum evaluates to exactly 0 where it is exact.

References:
  [JY13] M. Jamil, X.-S. Yang, "A literature survey of benchmark functions for global
         optimization problems", Int. J. Math. Modelling & Num. Optimisation 4(2), 2013.
  [HFRA09] N. Hansen, S. Finck, R. Ros, A. Auger, "Real-parameter black-box optimization
         benchmarking 2009: noiseless functions definitions", INRIA RR-6829, 2009; and pycma's
         ``cma.ff.elli``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence, Union

import jax
import jax.numpy as jnp

from ..errors import ConfigError, did_you_mean
from .base import Problem

Array = jax.Array
BoundsLike = Union[float, int, Sequence[float], None]

# Per-coordinate maximum of x*sin(sqrt|x|) on [-500, 500] (attained at SCHWEFEL_X), the
# constant of Schwefel 2.26 as tabulated in [JY13] and the Virtual Library of Simulation
# Experiments.
SCHWEFEL_C = 418.9828872724338
# argmax of x*sin(sqrt(x)): root of sin(sqrt x) + sqrt(x)/2*cos(sqrt x), bisected in float64.
SCHWEFEL_X = 420.968746359982

# Condition number of the ellipsoid, as in pycma's ``elli``.
ELLIPSOID_COND = 1e6


def _as_float(x) -> Array:
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise ConfigError(
            f"a candidate must have at least one axis (the last one is the dimension), "
            f"got a scalar of shape {x.shape}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        # Integers would otherwise make sphere return integers and overflow silently.
        x = x.astype(jnp.result_type(float))
    return x


def _per_coordinate(values: Sequence[float], x: Array) -> Array:
    # Built on the host in float64 and rounded once to x's dtype: more accurate than computing
    # pow/sqrt in float32 inside the graph, and a compile-time constant either way.
    return jnp.asarray(values, dtype=x.dtype)


# Bitwise block invariance, and why the functions below look the way they do.
#
# XLA compiles the same HLO differently for different block shapes (B, D): a vectorised loop
# body, a scalar remainder, a fully unrolled tiny loop, a special path for B = 1. Two compiler
# freedoms then make a row's value depend on the shape of the block it sits in (measured on
# XLA:CPU with jax 0.10.2, in float32 and float64, already for B = 2 vs B = 1):
#   1. ``reduce`` ops are emitted with reassociation allowed, so the order in which a row's D
#      terms are summed changes with the vectorisation strategy;
#   2. LLVM contracts a multiply feeding an add/sub into one fused multiply-add (XLA:CPU always
#      allows it, no flag turns it off), and whether it does so, and for which of two products,
#      differs between those code paths.
# ``lax.optimization_barrier`` does not help: XLA:CPU expands it away before fusion.
# So: sums and products over the last axis are explicit pairwise trees of element-wise ops on
# slices (no ``reduce``, a fixed order for every D), and every product or transcendental
# result is passed through ``_fence`` before an add, a subtraction or another transcendental
# consumes it, which leaves nothing to contract. Division by a constant counts as a product:
# XLA rewrites ``a / c`` into ``a * (1 / c)``.
#
# The public functions are jitted: called eagerly, their few dozen small ops would otherwise
# each dispatch (and compile) on their own; inside another jit they are simply inlined.


def _fence(value: Array, source: Array) -> Array:
    """``value``, rounded to its dtype before its consumer sees it (no FMA contraction).

    ``select(isnan(source), source, value)`` equals ``value`` whenever a NaN ``source`` makes
    ``value`` NaN too (``source`` is a factor or the argument of ``value``). Neither XLA nor
    LLVM folds the select away (jax 0.10.2), and a select between a multiply and an add keeps
    LLVM from fusing the two. A cheap compare and blend per element; the block-invariance tests
    are what would notice if a later compiler learned to see through it.
    """
    return jnp.where(jnp.isnan(source), source, value)


def _pairwise(t: Array, op: Callable[[Array, Array], Array], identity: float) -> Array:
    # Pad the last axis to a power of two with the identity of ``op`` (exact: x + 0 == x,
    # x * 1 == x), then halve it until one column is left, column i combining with i + h. The
    # tree depends on D only, never on the row count, and pairwise summation is also more
    # accurate than a running sum (error O(log D) rather than O(D)).
    d = t.shape[-1]
    width = 1 << (d - 1).bit_length()
    if width != d:
        fill = jnp.full(t.shape[:-1] + (width - d,), identity, dtype=t.dtype)
        t = jnp.concatenate([t, fill], axis=-1)
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = op(t[..., :h], t[..., h:])
    return t[..., 0]


def _sum(t: Array) -> Array:
    """Sum over the last axis, in an order that does not depend on the leading shape."""
    return _pairwise(t, jnp.add, 0.0)


def _prod(t: Array) -> Array:
    """Product over the last axis (fenced, so its result may feed an add)."""
    return _pairwise(t, lambda a, b: _fence(a * b, a), 1.0)


def _square(x: Array) -> Array:
    return _fence(x * x, x)


@jax.jit
def sphere(x) -> Array:
    """sum_i x_i^2 [JY13, f136]."""
    x = _as_float(x)
    return _sum(_square(x))


@jax.jit
def ackley(x) -> Array:
    """-20 exp(-0.2 sqrt(mean x_i^2)) - exp(mean cos(2 pi x_i)) + 20 + e [JY13, f1]."""
    x = _as_float(x)
    d = x.shape[-1]
    r = jnp.sqrt(_sum(_square(x)) / d)
    # mean cos(2 pi x) - 1 == -2 mean sin^2(pi x), and 20 - 20 exp(a) == -20 expm1(a): the same
    # function without the cancellations of the textbook form, so the optimum is exactly 0 and
    # float32 keeps its relative precision near it instead of bottoming out at ~1e-6.
    s = jnp.sin(_fence(math.pi * x, x))
    sin_sq = _sum(_square(s))
    e1 = jnp.expm1(_fence(-0.2 * r, r))
    e2 = jnp.expm1(_fence(-2.0 * (sin_sq / d), sin_sq))
    return _fence(-20.0 * e1, e1) - _fence(math.e * e2, e2)


@jax.jit
def rastrigin(x) -> Array:
    """10 D + sum_i (x_i^2 - 10 cos(2 pi x_i)) [JY13, f102 (Rastrigin 1974)]."""
    x = _as_float(x)
    # 10 - 10 cos(2 pi x) == 20 sin^2(pi x): each term is then >= 0, with no 10 D - 10 D
    # cancellation, so float32 resolves values far below 10 D * eps near the optimum.
    s = jnp.sin(_fence(math.pi * x, x))
    return _sum(_square(x) + _fence(20.0 * (s * s), s))


@jax.jit
def rosenbrock(x) -> Array:
    """sum_{i=1}^{D-1} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2, D >= 2 [JY13, f105]."""
    x = _as_float(x)
    if x.shape[-1] < 2:
        raise ConfigError(f"rosenbrock needs dimension >= 2, got {x.shape[-1]}")
    head, tail = x[..., :-1], x[..., 1:]
    a = tail - _square(head)
    return _sum(_fence(100.0 * (a * a), a) + _square(1.0 - head))


@jax.jit
def griewank(x) -> Array:
    """1 + sum_i x_i^2 / 4000 - prod_i cos(x_i / sqrt(i)), i = 1..D [JY13, f59]."""
    x = _as_float(x)
    d = x.shape[-1]
    # XLA turns x / sqrt(i) into x * (1 / sqrt(i)) anyway; say so, with 1 / sqrt(i) rounded
    # once from float64 rather than computed in x's dtype.
    inv_root_i = _per_coordinate([1.0 / math.sqrt(i) for i in range(1, d + 1)], x)
    u = _fence(x * inv_root_i, x)
    sq = _sum(_square(x))
    return 1.0 + _fence(sq / 4000.0, sq) - _prod(_fence(jnp.cos(u), u))


@jax.jit
def schwefel(x) -> Array:
    """418.9828872724338 D - sum_i x_i sin(sqrt|x_i|), Schwefel 2.26 [JY13, f128]."""
    x = _as_float(x)
    # Summing (c - x sin sqrt|x|) per coordinate rather than c D - sum(...): every term is ~>= 0
    # on the domain, so there is no cancellation of two numbers of size 419 D at the optimum.
    return _sum(SCHWEFEL_C - _fence(x * jnp.sin(jnp.sqrt(jnp.abs(x))), x))


@jax.jit
def ellipsoid(x) -> Array:
    """sum_{i=0}^{D-1} (1e6)^(i/(D-1)) x_i^2, exponent 0 if D = 1 [HFRA09 f2; pycma elli]."""
    x = _as_float(x)
    d = x.shape[-1]
    weights = _per_coordinate(
        [ELLIPSOID_COND ** (i / (d - 1)) if d > 1 else 1.0 for i in range(d)], x
    )
    return _sum(_fence(weights * (x * x), x))


@dataclass(frozen=True)
class ProblemSpec:
    """What is known about one benchmark: its function, domain and minimum."""

    name: str
    function: Callable[[Array], Array]
    lb: float  # conventional domain, the same for every coordinate
    ub: float
    min_dim: int
    optimum_coord: float  # the minimiser is this value in every coordinate
    optimum_value: float
    description: str


PROBLEMS: dict[str, ProblemSpec] = {
    spec.name: spec
    for spec in (
        ProblemSpec("sphere", sphere, -100.0, 100.0, 1, 0.0, 0.0,
                    "sum x_i^2; unimodal, separable [Jamil & Yang 2013]"),
        ProblemSpec("ackley", ackley, -32.768, 32.768, 1, 0.0, 0.0,
                    "Ackley; multimodal, nearly flat outer region [Jamil & Yang 2013]"),
        ProblemSpec("rastrigin", rastrigin, -5.12, 5.12, 1, 0.0, 0.0,
                    "Rastrigin; multimodal, separable, regular grid of local minima "
                    "[Jamil & Yang 2013]"),
        # Domain [-5, 10] (Virtual Library of Simulation Experiments, Surjanovic & Bingham), the
        # common modern choice; De Jong's F2 used [-2.048, 2.048]. Asymmetric, so the optimum
        # at all-ones is not the centre of the box.
        ProblemSpec("rosenbrock", rosenbrock, -5.0, 10.0, 2, 1.0, 0.0,
                    "Rosenbrock; curved narrow valley, non-separable, D >= 2 "
                    "[Jamil & Yang 2013]"),
        ProblemSpec("griewank", griewank, -600.0, 600.0, 1, 0.0, 0.0,
                    "Griewank; multimodal, non-separable product term [Jamil & Yang 2013]"),
        # The minimum is 0 only to the precision of SCHWEFEL_C: 5.7e-14 per coordinate (one
        # ulp of 419) in float64 at SCHWEFEL_X; exactly 0 in float32 with this formulation,
        # though no better than a float32 ulp of 419 (3e-5) per coordinate can be promised.
        ProblemSpec("schwefel", schwefel, -500.0, 500.0, 1, SCHWEFEL_X, 0.0,
                    "Schwefel 2.26; deceptive, best minimum far from the next best "
                    "[Jamil & Yang 2013]"),
        ProblemSpec("ellipsoid", ellipsoid, -100.0, 100.0, 1, 0.0, 0.0,
                    "ellipsoid with condition number 1e6; unimodal, ill-conditioned "
                    "[Hansen et al. 2009, pycma elli]"),
    )
}


def _unknown_name(name: object) -> ConfigError:
    valid = sorted(PROBLEMS)
    return ConfigError(f"unknown problem {name!r}{did_you_mean(name, valid)} (valid: {', '.join(valid)})")


def _bounds(name: str, which: str, value: BoundsLike, default: float, dim: int) -> tuple[float, ...]:
    if value is None:
        return (float(default),) * dim
    if isinstance(value, (str, bytes)) or isinstance(value, bool):
        raise ConfigError(
            f"{name}: {which} must be a number or a sequence of {dim} numbers, got {value!r}"
        )
    if isinstance(value, (int, float)):
        return (float(value),) * dim
    try:
        values = [float(v) for v in value]  # also accepts numpy arrays and JAX arrays
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}: {which} must be a number or a sequence of {dim} numbers, got {value!r}"
        ) from None
    if len(values) != dim:
        raise ConfigError(
            f"{name}: {which} has {len(values)} entries but dim is {dim}; give one number "
            f"for every coordinate, or a single number for all of them"
        )
    return tuple(values)


@dataclass(frozen=True)
class NumericalProblem(Problem):
    """One benchmark instance: name, dimension and search box. Hashable (a jit static arg)."""

    name: str
    dim: int
    lb: tuple[float, ...]  # per-coordinate lower bounds, length dim
    ub: tuple[float, ...]

    # A row's value never depends on its block (see "Bitwise block invariance" above).
    block_invariant: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # Checked here too (not only in make_problem) so a hand-built instance is never invalid.
        if self.name not in PROBLEMS:
            raise _unknown_name(self.name)
        spec = PROBLEMS[self.name]
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise ConfigError(f"{self.name}: dim must be an integer, got {self.dim!r}")
        if self.dim < spec.min_dim:
            raise ConfigError(
                f"{self.name}: dim must be >= {spec.min_dim}, got {self.dim}"
            )
        for which, b in (("lb", self.lb), ("ub", self.ub)):
            if not isinstance(b, tuple):
                raise ConfigError(f"{self.name}: {which} must be a tuple of floats, got {type(b).__name__}")
            if len(b) != self.dim:
                raise ConfigError(
                    f"{self.name}: {which} has {len(b)} entries but dim is {self.dim}"
                )
            for i, v in enumerate(b):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ConfigError(f"{self.name}: {which}[{i}] must be a number, got {v!r}")
                if not math.isfinite(v):
                    raise ConfigError(
                        f"{self.name}: {which}[{i}] must be finite, got {v}"
                    )
        for i, (lo, hi) in enumerate(zip(self.lb, self.ub)):
            if not lo < hi:
                raise ConfigError(
                    f"{self.name}: lb must be < ub in every coordinate, but at coordinate "
                    f"{i} lb = {lo} and ub = {hi}"
                )

    @property
    def spec(self) -> ProblemSpec:
        return PROBLEMS[self.name]

    def evaluate(self, x) -> Array:
        """Objective values: x of shape (..., dim) -> (...); dtype kept."""
        x = _as_float(x)
        if x.shape[-1] != self.dim:
            raise ConfigError(
                f"{self.name}: expected candidates with last axis {self.dim}, got shape {x.shape}"
            )
        return self.spec.function(x)

    __call__ = evaluate

    num_objectives = 1

    @property
    def optimum_value(self) -> float:
        return self.spec.optimum_value

    def optimum_x(self) -> tuple[float, ...]:
        """A known global minimiser (of the unconstrained function; custom bounds may exclude it)."""
        return (self.spec.optimum_coord,) * self.dim


def make_problem(name: str, dim: int, lb: BoundsLike = None, ub: BoundsLike = None) -> NumericalProblem:
    """The problem ``name`` in ``dim`` dimensions; bounds default to its conventional domain."""
    if name not in PROBLEMS:
        raise _unknown_name(name)
    spec = PROBLEMS[name]
    if isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise ConfigError(f"{name}: dim must be an integer, got {dim!r}")
    dim = dim.__index__()  # numpy integers become int, so instances hash and compare alike
    if dim < spec.min_dim:
        raise ConfigError(
            f"{name}: dim must be >= {spec.min_dim}, got {dim}"
            + (" (it couples neighbouring coordinates)" if name == "rosenbrock" else "")
        )
    return NumericalProblem(
        name=name,
        dim=dim,
        lb=_bounds(name, "lb", lb, spec.lb, dim),
        ub=_bounds(name, "ub", ub, spec.ub, dim),
    )
