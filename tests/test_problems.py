"""The numerical benchmark problems: values, dtypes, the registry, and bitwise block invariance.

Pure computation, no MPI: passes identically on every rank. float64 checks run inside
``jax.enable_x64(True)`` (a context manager in jax 0.10), never by flipping the global flag,
since other tests share the process.
"""

from __future__ import annotations

import math
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hpcevo.problems import (
    PROBLEMS,
    NumericalProblem,
    ackley,
    ellipsoid,
    griewank,
    make_problem,
    rastrigin,
    rosenbrock,
    schwefel,
    sphere,
)

NAMES = sorted(PROBLEMS)
DTYPES = ["float32", "float64"]

pytestmark = pytest.mark.single_process


def x64(dtype: str):
    return jax.enable_x64(dtype == "float64")


def value(fn, x, dtype="float64") -> float:
    with x64(dtype):
        return float(fn(jnp.asarray(x, dtype)))


# -- optimum ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name,dim", [(n, d) for n in NAMES for d in (1, 2, 10, 100) if d >= PROBLEMS[n].min_dim]
)
def test_value_at_optimum(name, dim, dtype):
    p = make_problem(name, dim)
    assert p.optimum_value == 0.0
    with x64(dtype):
        block = np.asarray(p.evaluate(jnp.asarray([p.optimum_x()] * 3, dtype)))
    assert block.dtype == np.dtype(dtype)
    assert block[0] == block[1] == block[2]
    at_optimum = float(block[0])
    if name == "schwefel":
        # 418.9828872724338 is the per-coordinate maximum of x sin(sqrt|x|) to float64
        # precision: at x = 420.968746359982 the float64 value is 5.7e-14 per coordinate (one
        # ulp of 419); float32 comes out at exactly 0 with this formulation, but one float32
        # ulp of 419 (3e-5) per coordinate is what can honestly be promised.
        tol = (1e-13 if dtype == "float64" else 1e-4) * dim
        assert abs(at_optimum) <= tol, at_optimum
    else:
        assert at_optimum == 0.0


def test_optimum_lies_in_default_domain():
    for name, spec in PROBLEMS.items():
        p = make_problem(name, 3)
        assert len(p.optimum_x()) == 3
        assert all(lo <= xi <= hi for lo, xi, hi in zip(p.lb, p.optimum_x(), p.ub)), name


def test_schwefel_optimum_is_a_local_minimum():
    # A step of 1e-3 either way from the optimum coordinate increases the value (float64).
    x = PROBLEMS["schwefel"].optimum_coord
    at = value(schwefel, [x])
    assert value(schwefel, [x - 1e-3]) > at
    assert value(schwefel, [x + 1e-3]) > at
    # x sin(sqrt|x|) is odd, so the mirror point scores 2 * 418.98...
    assert value(schwefel, [-x]) == pytest.approx(2 * 418.9828872724338, abs=1e-9)


# -- hand-computed values (float64) ------------------------------------------------------------


def test_sphere_values():
    assert value(sphere, [1.0, 2.0, 3.0]) == 1 + 4 + 9
    assert value(sphere, [-3.0]) == 9.0
    assert value(sphere, [0.5, -0.5, 0.5, -0.5]) == 1.0


def test_rastrigin_values():
    # cos(2 pi k) = 1 for integers k: only the x^2 terms remain.
    assert value(rastrigin, [1.0, 2.0]) == pytest.approx(1 + 4, abs=1e-12)
    # cos(pi) = -1: 10 + 0.25 - 10 * (-1).
    assert value(rastrigin, [0.5]) == pytest.approx(0.25 + 20, abs=1e-12)
    # 10 D + sum(x^2 - 10 cos(2 pi x)) with cos(pi / 2) = 0, cos(pi) = -1.
    assert value(rastrigin, [0.25, 0.5]) == pytest.approx(20 + (0.0625 - 0) + (0.25 + 10), abs=1e-12)


def test_rosenbrock_values():
    assert value(rosenbrock, [0.0, 0.0]) == 100 * 0**2 + 1**2
    assert value(rosenbrock, [1.0, 2.0]) == 100 * (2 - 1) ** 2 + 0**2
    assert value(rosenbrock, [-1.0, 1.0]) == 100 * (1 - 1) ** 2 + 2**2
    # Two terms: (x1, x2) = (0, 1) gives 100 + 1, (x2, x3) = (1, 2) gives 100 + 0.
    assert value(rosenbrock, [0.0, 1.0, 2.0]) == 101 + 100


def test_griewank_values():
    # cos(pi/2) = 0 kills the product.
    assert value(griewank, [math.pi / 2, 0.0]) == pytest.approx(1 + (math.pi / 2) ** 2 / 4000, rel=1e-14)
    # cos(pi / 1) * cos(pi sqrt 2 / sqrt 2) = (-1)(-1) = 1.
    x = [math.pi, math.pi * math.sqrt(2)]
    assert value(griewank, x) == pytest.approx(3 * math.pi**2 / 4000, rel=1e-12)
    # A generic point against the formula in Python's math.
    x = [1.0, -0.5, 3.0]
    expected = (
        1
        + (1 + 0.25 + 9) / 4000
        - math.cos(1.0) * math.cos(-0.5 / math.sqrt(2)) * math.cos(3.0 / math.sqrt(3))
    )
    assert value(griewank, x) == pytest.approx(expected, rel=1e-13)


def test_ackley_values():
    x = [1.0, -0.5, 0.25]
    mean_sq = (1 + 0.25 + 0.0625) / 3
    mean_cos = (math.cos(2 * math.pi) + math.cos(-math.pi) + math.cos(math.pi / 2)) / 3
    expected = -20 * math.exp(-0.2 * math.sqrt(mean_sq)) - math.exp(mean_cos) + 20 + math.e
    assert value(ackley, x) == pytest.approx(expected, rel=1e-13)
    # Far out the exp terms vanish: -20 e^-0.2r - e^mean_cos + 20 + e -> 20 + e - e^{cos}.
    big = 1e4  # an integer, so cos(2 pi x) = 1
    assert value(ackley, [big, big]) == pytest.approx(
        -20 * math.exp(-0.2 * big) - math.exp(1) + 20 + math.e, rel=1e-12
    )


def test_schwefel_values():
    c = 418.9828872724338
    assert value(schwefel, [0.0, 0.0]) == pytest.approx(2 * c, rel=1e-15)
    assert value(schwefel, [1.0]) == pytest.approx(c - math.sin(1.0), rel=1e-15)
    x = [100.0, -250.0]
    expected = 2 * c - (100 * math.sin(10.0) + -250 * math.sin(math.sqrt(250)))
    assert value(schwefel, x) == pytest.approx(expected, rel=1e-14)


def test_ellipsoid_values():
    assert value(ellipsoid, [1.0, 1.0]) == 1 + 1e6
    assert value(ellipsoid, [1.0, 1.0, 1.0]) == 1 + 1e3 + 1e6  # weights 1e6^(0, 1/2, 1)
    assert value(ellipsoid, [0.0, 0.0, 2.0]) == 4e6
    assert value(ellipsoid, [3.0]) == 9.0  # D = 1: exponent 0, weight 1


def _textbook(name: str, x: np.ndarray) -> np.ndarray:
    """The formulas as written in the literature, in NumPy float64, for (B, D) blocks."""
    d = x.shape[-1]
    if name == "sphere":
        return np.sum(x**2, axis=-1)
    if name == "ackley":
        return (
            -20 * np.exp(-0.2 * np.sqrt(np.mean(x**2, axis=-1)))
            - np.exp(np.mean(np.cos(2 * np.pi * x), axis=-1))
            + 20
            + np.e
        )
    if name == "rastrigin":
        return 10 * d + np.sum(x**2 - 10 * np.cos(2 * np.pi * x), axis=-1)
    if name == "rosenbrock":
        return np.sum(100 * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (1 - x[:, :-1]) ** 2, axis=-1)
    if name == "griewank":
        i = np.arange(1, d + 1)
        return 1 + np.sum(x**2, axis=-1) / 4000 - np.prod(np.cos(x / np.sqrt(i)), axis=-1)
    if name == "schwefel":
        return 418.9828872724338 * d - np.sum(x * np.sin(np.sqrt(np.abs(x))), axis=-1)
    if name == "ellipsoid":
        w = 1e6 ** (np.arange(d) / (d - 1)) if d > 1 else np.ones(1)
        return np.sum(w * x**2, axis=-1)
    raise AssertionError(name)


@pytest.mark.parametrize("name", NAMES)
def test_matches_textbook_formula(name):
    # The implementations use rewritten, cancellation-free forms; in float64 they must agree
    # with the literature's formula to rounding, over the whole default domain.
    spec = PROBLEMS[name]
    rng = np.random.default_rng(7)
    for d in (spec.min_dim, 3, 30):
        x = rng.uniform(spec.lb, spec.ub, size=(50, d))
        with jax.enable_x64(True):
            got = np.asarray(spec.function(jnp.asarray(x)))
        want = _textbook(name, x)
        # Absolute slack scaled to the size of the terms that cancel in the textbook form.
        scale = {"rastrigin": 20 * d, "schwefel": 420 * d, "ackley": 25}.get(name, 0)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * scale, err_msg=name)


# -- dtype and shape ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_dtype_and_shape_are_kept(name, dtype):
    fn = PROBLEMS[name].function
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(3, 5))
    with x64(dtype):
        one = fn(jnp.asarray(x[0], dtype))
        block = fn(jnp.asarray(x, dtype))
        nested = fn(jnp.asarray(x.reshape(3, 1, 5), dtype))
    assert one.shape == () and one.dtype == np.dtype(dtype)
    assert block.shape == (3,) and block.dtype == np.dtype(dtype)
    assert nested.shape == (3, 1) and nested.dtype == np.dtype(dtype)
    assert np.array_equal(np.asarray(nested).reshape(3), np.asarray(block))


def test_integer_input_is_promoted_to_float():
    out = sphere(jnp.asarray([1, 2, 3]))
    assert jnp.issubdtype(out.dtype, jnp.floating)
    assert float(out) == 14.0


def test_scalar_input_is_rejected():
    with pytest.raises(ValueError, match="at least one axis"):
        sphere(jnp.asarray(1.0))


def test_rosenbrock_function_needs_two_coordinates():
    with pytest.raises(ValueError, match="dimension >= 2"):
        rosenbrock(jnp.zeros((3, 1)))


def test_evaluate_checks_the_last_axis():
    p = make_problem("sphere", 4)
    with pytest.raises(ValueError, match="last axis 4"):
        p.evaluate(jnp.zeros((2, 5)))


# -- bitwise block invariance -------------------------------------------------------------------
#
# The whole project's "same result at any number of MPI ranks" rests on this: a row's value
# must not depend on the other rows that share its block, bit for bit, whatever block shape XLA
# compiles for. Every evaluation is a jax.jit call, as in a run; the problem functions are
# jitted, so each block shape compiles once and every split reuses those compilations.
#
# Compilation dominates the cost (40-120 ms a shape on a CPU), so the default grid is the full
# one (wholes 1, 3, 7, 10, 64, 333; sub-blocks of every size 1..8; uneven splits) at the
# smallest dimension and a leaner one at D = 5 and D = 100. HPCEVO_TEST_EXHAUSTIVE=1 runs the
# full grid, with 112 + 111 + 110 splits, at D in {1|2, 3, 5, 8, 16, 33, 100} (a few minutes).

EXHAUSTIVE = os.environ.get("HPCEVO_TEST_EXHAUSTIVE", "") not in ("", "0")
FULL = {"wholes": (1, 3, 7, 10, 64, 333), "sizes": tuple(range(1, 9))}
LEAN = {"wholes": (10, 333), "sizes": (1, 3, 8)}
DIMS = ("small", 3, 5, 8, 16, 33, 100) if EXHAUSTIVE else ("small", 5, 100)


def _plan(d_kind) -> dict:
    return FULL if (EXHAUSTIVE or d_kind == "small") else LEAN


def _splits(n: int, plan: dict):
    """Row counts of consecutive sub-blocks covering n rows."""
    sizes = plan["sizes"]
    for k in sizes:  # every size in the plan, the last block short
        yield [min(k, n - i) for i in range(0, n, k)]
    # Uneven: the sizes of the plan in a scrambled cycle, so each size meets many offsets.
    # Built only from shapes compiled anyway.
    order = [sizes[(3 * i + 1) % len(sizes)] for i in range(len(sizes))]
    out, i = [], 0
    while sum(out) < n:
        out.append(min(order[i % len(order)], n - sum(out)))
        i += 1
    yield out
    if n == 10 and 4 in sizes:
        yield [4, 3, 3]
    if n == 333 and EXHAUSTIVE:
        yield [112, 111, 110]


@pytest.mark.parametrize("d_kind", DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_block_invariance_is_bitwise(name, dtype, d_kind):
    spec = PROBLEMS[name]
    d = max(1, spec.min_dim) if d_kind == "small" else d_kind
    plan = _plan(d_kind)
    f = spec.function  # jitted; shares its compilations with the other tests here
    rng = np.random.default_rng([2024, d])
    with x64(dtype):
        # Points across the whole default domain, and some at the optimum (exact zeros and the
        # like are where a different rounding path would show first).
        x = rng.uniform(spec.lb, spec.ub, size=(max(plan["wholes"]), d)).astype(dtype)
        x[::50] = spec.optimum_coord
        for n in plan["wholes"]:
            # Sliced in NumPy: eager slicing of a JAX array would compile a slice per offset.
            whole = np.asarray(f(x[:n]))
            assert whole.shape == (n,) and whole.dtype == np.dtype(dtype)
            for sizes in _splits(n, plan):
                starts = np.cumsum([0, *sizes[:-1]])
                parts = np.concatenate(
                    [np.asarray(f(x[s : s + k])) for s, k in zip(starts, sizes)]
                )
                assert np.array_equal(parts, whole), (
                    f"{name} {dtype}: block ({n}, {d}) evaluated as sub-blocks {sizes[:8]}"
                    f"{'...' if len(sizes) > 8 else ''} differs from the whole block in rows "
                    f"{np.flatnonzero(parts != whole)[:10].tolist()}"
                )


def test_problem_evaluate_is_block_invariant_under_jit_as_a_static_argument():
    # The way the runner uses it: the (hashable) problem is a static argument of jit.
    @partial(jax.jit, static_argnums=0)
    def evaluate(problem, x):
        return problem.evaluate(x)

    problem = make_problem("griewank", 5)
    x = jnp.asarray(np.random.default_rng(1).uniform(-600, 600, size=(10, 5)), jnp.float32)
    whole = np.asarray(evaluate(problem, x))
    parts = np.concatenate([np.asarray(evaluate(problem, x[i : i + 3])) for i in range(0, 10, 3)])
    assert np.array_equal(whole, parts)
    # Equal instances are the same static argument: no recompilation.
    assert make_problem("griewank", 5) == problem
    assert hash(make_problem("griewank", 5)) == hash(problem)


# -- registry and make_problem -------------------------------------------------------------------


def test_registry_contents():
    assert set(PROBLEMS) == {
        "sphere", "ackley", "rastrigin", "rosenbrock", "griewank", "schwefel", "ellipsoid"
    }
    for name, spec in PROBLEMS.items():
        assert spec.name == name
        assert spec.lb < spec.ub
        assert spec.min_dim >= 1
        assert spec.description
        assert callable(spec.function)


def test_default_domains():
    expected = {
        "sphere": (-100, 100),
        "ackley": (-32.768, 32.768),
        "rastrigin": (-5.12, 5.12),
        "rosenbrock": (-5, 10),
        "griewank": (-600, 600),
        "schwefel": (-500, 500),
        "ellipsoid": (-100, 100),
    }
    for name, (lo, hi) in expected.items():
        p = make_problem(name, 4)
        assert p.lb == (lo,) * 4 and p.ub == (hi,) * 4, name
        assert all(isinstance(v, float) for v in p.lb + p.ub)


def test_bounds_forms():
    p = make_problem("sphere", 3, lb=-1, ub=2.5)
    assert p.lb == (-1.0, -1.0, -1.0) and p.ub == (2.5, 2.5, 2.5)
    p = make_problem("sphere", 3, lb=[-1, -2, -3], ub=np.array([1.0, 2.0, 3.0]))
    assert p.lb == (-1.0, -2.0, -3.0) and p.ub == (1.0, 2.0, 3.0)
    assert all(type(v) is float for v in p.lb + p.ub)
    p = make_problem("rastrigin", np.int64(2), ub=1.0)
    assert p.dim == 2 and type(p.dim) is int and p.lb == (-5.12, -5.12)


def test_problem_is_hashable_and_frozen():
    p = make_problem("ackley", 2)
    assert {p: 1}[make_problem("ackley", 2, lb=-32.768)] == 1
    assert p != make_problem("ackley", 2, lb=-30)
    with pytest.raises(Exception):
        p.dim = 3  # type: ignore[misc]
    assert isinstance(p, NumericalProblem)


def test_unknown_name_suggests_the_nearest():
    with pytest.raises(ValueError) as e:
        make_problem("rastrign", 3)
    msg = str(e.value)
    assert "'rastrign'" in msg and "did you mean 'rastrigin'" in msg
    for name in PROBLEMS:
        assert name in msg  # the valid names are listed
    with pytest.raises(ValueError, match="unknown problem 'zzz' \\(valid: ackley, ellipsoid"):
        make_problem("zzz", 3)  # nothing close: no suggestion


def test_dim_too_small():
    with pytest.raises(ValueError, match="rosenbrock: dim must be >= 2, got 1"):
        make_problem("rosenbrock", 1)
    with pytest.raises(ValueError, match="sphere: dim must be >= 1, got 0"):
        make_problem("sphere", 0)
    with pytest.raises(ValueError, match="sphere: dim must be an integer"):
        make_problem("sphere", 2.0)  # type: ignore[arg-type]


def test_lb_not_below_ub():
    with pytest.raises(ValueError, match="griewank: lb must be < ub .* coordinate 1 lb = 3.0 and ub = 3.0"):
        make_problem("griewank", 3, lb=[0, 3, 0], ub=[1, 3, 1])
    with pytest.raises(ValueError, match="coordinate 0 lb = 5.0 and ub = 1.0"):
        make_problem("sphere", 2, lb=5, ub=1)
    # A custom lower bound above the default upper bound is caught too.
    with pytest.raises(ValueError, match="coordinate 0 lb = 200.0 and ub = 100.0"):
        make_problem("sphere", 1, lb=200)


def test_bounds_of_wrong_length():
    with pytest.raises(ValueError, match="ellipsoid: lb has 2 entries but dim is 3"):
        make_problem("ellipsoid", 3, lb=[-1, -1])
    with pytest.raises(ValueError, match="ellipsoid: ub has 4 entries but dim is 3"):
        make_problem("ellipsoid", 3, ub=[1, 1, 1, 1])


def test_bounds_must_be_finite_numbers():
    with pytest.raises(ValueError, match=r"sphere: lb\[1\] must be finite, got -inf"):
        make_problem("sphere", 2, lb=[-1, -math.inf])
    with pytest.raises(ValueError, match=r"sphere: ub\[0\] must be finite, got nan"):
        make_problem("sphere", 2, ub=math.nan)
    with pytest.raises(ValueError, match="sphere: lb must be a number or a sequence"):
        make_problem("sphere", 2, lb="-1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sphere: ub must be a number or a sequence"):
        make_problem("sphere", 2, ub=[1, "a"])  # type: ignore[list-item]


def test_direct_construction_is_validated_too():
    with pytest.raises(ValueError, match="unknown problem"):
        NumericalProblem("spher", 2, (-1.0, -1.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="lb has 1 entries but dim is 2"):
        NumericalProblem("sphere", 2, (-1.0,), (1.0, 1.0))
