"""COCO's 24 noiseless BBOB functions (``problems/bbob.py``) against COCO's own C code (``cocoex``).

Every function is checked in float64 at D = 2, 3, 5, 10, 20, 40 and instances 1, 2, 5, 15, 100,
2023 on 200 uniform points of [-5, 5]^D, 6 points far outside the box (the penalties), the
optimum and 6 points near it, against ``cocoex.BareProblem`` (which builds its problems with
``coco_get_bbob_problem``, as ``cocoex.Suite("bbob")`` does; one test checks the Suite itself).

Tolerance, float64: |f - f_coco| <= rtol |f_coco - fopt| + 1e-12 max(1, |fopt|).
  * rtol = 1e-12 for 19 functions (largest error measured, relative to |f - fopt|: 7e-14,
    f11). The two implementations round differently only where COCO sums sequentially and
    hpcevo in a tree, and where XLA's exp/log/sin/pow differ from glibc's by an ulp or two.
  * rtol = 1e-10 for f16 (Weierstrass), f19 (Griewank-Rosenbrock) and f23 (Katsuura), whose
    formulas cancel terms of size ~1 to leave f - fopt (10 (s/D - f0)^3, 10 + 10 s/(D-1),
    prod - 1), so COCO's own value carries that much rounding error relative to f - fopt
    (measured: up to 6e-12, f19); and for f17/f18 (Schaffer), whose sin(50 s^0.1) of
    s = z_i^2 + z_{i+1}^2 amplifies rounding by 50 s^0.1, ~5,000 at the points far outside
    the box (measured: 1.1e-11, f18; 4e-14 inside it).
  * The absolute part covers what COCO's value cannot resolve near the optimum: adding fopt
    rounds at ulp(|fopt|) (1.1e-13 for |fopt| near 1000), and Rastrigin-like sums cancel
    (10 (D - sum cos)). Measured: 1.1e-13 max(1, |fopt|) (f24).
No value used more than 11% of its tolerance (f18). xopt equals COCO's stored optimum bit for
bit and fopt its best value exactly, except f20: COCO stores the 1-D minimiser 420.96874633
rather than 100 x 4.2096874637/2 (~2e-10 apart), with a best value ~1e-15 above fopt.

float32 is checked against float64 (the same instance data rounded once to float32):
|f32 - f64| <= rtol |f64 - fopt| + 1e-5 max(1, |fopt|), rtol = 1e-3, 1e-2 for f16 and f19
(float32 cancellation in the formulas above). Measured: median 1e-7 relative to f - fopt
(2e-5 to 2e-4 for f16, f19, f23); no value used more than 21% of its tolerance (f11).

Compilation dominates the cost, so every evaluation is a block of 64 rows (padded): one compiled
program per (function, dimension, dtype) serves every instance and every test here
(``evaluate_bbob`` takes the instance data as arguments).
"""

from __future__ import annotations

from functools import partial

import cocoex  # a test dependency (requirements/stack.txt): without it these tests fail, not skip
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hpcevo.errors import ConfigError
from hpcevo.problems import bbob
from hpcevo.problems.bbob import BBOBProblem, make_bbob

FUNCTIONS = tuple(range(1, 25))
DIMS = (2, 3, 5, 10, 20, 40)
INSTANCES = (1, 2, 5, 15, 100, 2023)
ROWS = 64
RTOL64 = {16: 1e-10, 17: 1e-10, 18: 1e-10, 19: 1e-10, 23: 1e-10}
RTOL32 = {16: 1e-2, 19: 1e-2}
SMALL_D = 5  # the dimension of the float32, block and NaN tests: programs compiled once


def _evaluate(p: BBOBProblem, x: np.ndarray) -> np.ndarray:
    """Values of the rows of x, in blocks of ROWS rows (the last one padded with zeros)."""
    n = len(x)
    x = np.concatenate([x, np.zeros((-n % ROWS, x.shape[1]), x.dtype)])
    out = [np.asarray(p.evaluate(x[i : i + ROWS])) for i in range(0, len(x), ROWS)]
    return np.concatenate(out)[:n]


def _points(p: BBOBProblem, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = p.dim
    return np.concatenate([
        rng.uniform(-5.0, 5.0, (200, d)),
        rng.uniform(-100.0, 100.0, (6, d)),  # far outside: the boundary penalties
        p.xopt[None],
        p.xopt + rng.normal(0.0, 1e-6, (3, d)),
        p.xopt + rng.normal(0.0, 1e-3, (3, d)),
    ])


def _assert_close(got, want, fopt, rtol, atol, what):
    err = np.abs(got - want)
    bound = rtol * np.abs(want - fopt) + atol * max(1.0, abs(fopt))
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{what}: {bad.sum()} values differ beyond tolerance, e.g. row {np.flatnonzero(bad)[0]}: "
        f"{got[bad][0]!r} vs {want[bad][0]!r} (fopt {fopt})")


# The quick tier (scripts/test.sh -L quick) checks a few functions of each kind; the slow one all.
QUICK_FUNCTIONS = (1, 8, 15, 21)
TIERED = [pytest.param(f, marks=() if f in QUICK_FUNCTIONS else pytest.mark.slow) for f in FUNCTIONS]


@pytest.mark.single_process
@pytest.mark.parametrize("function", TIERED)
def test_matches_cocoex(function):
    with jax.enable_x64(True):
        for dim in DIMS:
            for instance in INSTANCES:
                p = make_bbob(function, instance, dim)
                ref = cocoex.BareProblem("bbob", function, dim, instance)
                what = f"f{function} i{instance} D={dim}"
                assert p.name == ref.id
                best = ref.best_parameter()
                if function == 20:  # see the module docstring
                    np.testing.assert_allclose(p.xopt, best, rtol=0, atol=1e-9)
                    assert abs(p.fopt - ref.best_value()) <= 1e-13 * max(1.0, abs(p.fopt))
                else:
                    np.testing.assert_array_equal(p.xopt, best, err_msg=what)
                    assert p.fopt == ref.best_value(), what
                # fopt is COCO's value at its own optimum (to COCO's rounding there)
                assert abs(ref(best) - p.fopt) <= 1e-12 * max(1.0, abs(p.fopt)), what
                x = _points(p, [function, dim, instance])
                got = _evaluate(p, x)
                assert got.dtype == np.float64
                _assert_close(got, ref(x), p.fopt, RTOL64.get(function, 1e-12), 1e-12, what)


@pytest.mark.single_process
def test_matches_the_cocoex_suite():
    # The values above come from cocoex.BareProblem; the Suite, as experiments use it, agrees.
    suite = cocoex.Suite("bbob", "instances: 1, 2023", "dimensions: 2, 5")
    rng = np.random.default_rng(7)
    with jax.enable_x64(True):
        for ref in suite:
            f, d, i = ref.id_function, ref.dimension, ref.id_instance
            p = make_bbob(f, i, d)
            assert p.name == ref.id
            x = rng.uniform(-5.0, 5.0, (10, d))
            want = np.array([ref(row) for row in x])
            _assert_close(_evaluate(p, x), want, p.fopt, RTOL64.get(f, 1e-12), 1e-12, ref.id)


@pytest.mark.single_process
@pytest.mark.parametrize("function", TIERED)
def test_float32_follows_float64(function):
    with jax.enable_x64(True):
        for instance in (1, 2):
            p = make_bbob(function, instance, SMALL_D)
            rng = np.random.default_rng([function, instance, 32])
            x = np.concatenate([rng.uniform(-5.0, 5.0, (120, SMALL_D)), p.xopt[None],
                                p.xopt + rng.normal(0.0, 1e-2, (7, SMALL_D))])
            f64 = _evaluate(p, x)
            f32 = _evaluate(p, x.astype(np.float32))
            assert f32.dtype == np.float32
            _assert_close(f32.astype(np.float64), f64, p.fopt, RTOL32.get(function, 1e-3), 1e-5,
                          f"f{function} i{instance} float32")


@pytest.mark.single_process
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("function", TIERED)
def test_block_invariance_is_bitwise(function, dtype):
    """A row's value is the same bits alone, in a block of 3 and in a block of 64; inside a
    jitted step where the problem is a static argument (its data then compile in as constants);
    and in a program that takes the data as an argument, as a run's engine does (``evaluate_with``
    with ``program_data``, shared by all functions and instances), also one built for another function."""

    @partial(jax.jit, static_argnums=0)
    def step(problem, x):
        return problem.evaluate(x)

    @partial(jax.jit, static_argnums=0)
    def program(problem, x, data):
        return problem.evaluate_with(x, data)

    with jax.enable_x64(dtype == "float64"):
        p = make_bbob(function, 3, SMALL_D)
        rng = np.random.default_rng([function, 64])
        x = np.concatenate([rng.uniform(-5.0, 5.0, (58, SMALL_D)), rng.uniform(-50.0, 50.0, (3, SMALL_D)),
                            p.xopt[None], p.xopt + rng.normal(0.0, 1e-4, (2, SMALL_D))]).astype(dtype)
        whole = np.asarray(p.evaluate(x))
        assert whole.shape == (ROWS,) and whole.dtype == np.dtype(dtype)
        alone = np.concatenate([np.asarray(p.evaluate(x[i : i + 1])) for i in range(ROWS)])
        threes = np.concatenate([np.asarray(p.evaluate(x[i : i + 3])) for i in range(0, ROWS, 3)])
        in_step = np.asarray(step(p, jnp.asarray(x)))
        with_data = np.asarray(program(p, jnp.asarray(x), p.program_data))
        # The function is data too: the program made for another function's problem (every
        # function of a dimension is one program) gives this function's values.
        other = make_bbob(function % 24 + 1, 1, SMALL_D)
        assert other.program == p.program
        through_other = np.asarray(program(other, jnp.asarray(x), p.program_data))
        for name, parts in (("alone", alone), ("in blocks of 3", threes), ("in a jitted step", in_step),
                            ("with its data as an argument", with_data),
                            ("in the program of another function", through_other)):
            assert np.array_equal(parts, whole), (
                f"f{function} {dtype}: rows evaluated {name} differ from the block of {ROWS} in rows "
                f"{np.flatnonzero(parts != whole)[:10].tolist()}")


@pytest.mark.single_process
def test_nan_rows_are_nan_like_coco():
    with jax.enable_x64(True):
        for function in FUNCTIONS:
            p = make_bbob(function, 1, SMALL_D)
            x = np.random.default_rng(function).uniform(-5.0, 5.0, (ROWS, SMALL_D))
            x[5, 2] = np.nan
            got = np.asarray(p.evaluate(x))
            assert np.isnan(got[5]) and np.isnan(cocoex.BareProblem("bbob", function, SMALL_D, 1)(x[5]))
            assert np.isfinite(np.delete(got, 5)).all(), f"f{function}"


@pytest.mark.single_process
def test_problem_attributes_and_bounds():
    p = make_bbob(21, 7, 3)
    assert (p.function, p.instance, p.dim, p.num_objectives) == (21, 7, 3, 1)
    assert p.name == "bbob_f021_i07_d03" and p.lb == (-5.0,) * 3 and p.ub == (5.0,) * 3
    assert BBOBProblem.block_invariant and p.xopt.dtype == np.float64
    assert p.optimum_value == p.fopt and np.array_equal(p.optimum_x(), p.xopt)
    # A problem is a jit static argument: equal arguments, equal (and equally hashed) problems.
    assert make_bbob(21, 7, 3) == p and hash(make_bbob(21, 7, 3)) == hash(p)
    assert make_bbob(21, 8, 3) != p
    # Every function and instance in a dimension and box is one program, with its own data, laid
    # out alike (the same keys, shapes and dtypes).
    assert make_bbob(21, 8, 3).program == p.program == make_bbob(22, 7, 3).program == make_bbob(1, 2, 3).program
    assert make_bbob(21, 7, 3, lb=-4.0).program != p.program and make_bbob(21, 7, 4).program != p.program
    for dim in (3, 40):
        layouts = {tuple((k, np.asarray(v).shape, np.asarray(v).dtype.str)
                         for k, v in sorted(make_bbob(f, i, dim).program_data.items()))
                   for f in bbob.FUNCTIONS for i in (1, 8)}
        assert len(layouts) == 1, dim
    assert int(p.program_data["function"]) == 21 and int(make_bbob(22, 7, 3).program_data["function"]) == 22
    # Other search bounds change the box handed to the algorithm, never the function.
    q = make_bbob(21, 7, 3, lb=-10.0, ub=[10.0, 20.0, 30.0])
    assert q.lb == (-10.0,) * 3 and q.ub == (10.0, 20.0, 30.0)
    x = np.array([[7.0, -8.0, 1.0]], np.float32)
    assert np.array_equal(np.asarray(q.evaluate(x)), np.asarray(p.evaluate(x)))
    # Integers are promoted to JAX's default float.
    assert np.asarray(p.evaluate(np.array([[1, 2, 3]]))).dtype == np.float32


@pytest.mark.single_process
@pytest.mark.parametrize("args, message", [
    ((0, 1, 5), "function must be one of 1..24"),
    ((25, 1, 5), "function must be one of 1..24"),
    ((1, 0, 5), "instance must be an integer from 1"),
    ((1, 1, 1), r"dim must be >= 2"),
    ((1.5, 1, 5), "function must be an integer"),
    ((1, True, 5), "instance must be an integer"),
])
def test_bad_arguments(args, message):
    with pytest.raises(ConfigError, match=message):
        make_bbob(*args)


@pytest.mark.single_process
def test_bad_candidates_and_bounds():
    p = make_bbob(1, 1, 4)
    with pytest.raises(ConfigError, match="last axis 4"):
        p.evaluate(np.zeros((2, 5)))
    with pytest.raises(ConfigError, match="lb has 2 entries but dim is 4"):
        make_bbob(1, 1, 4, lb=[0.0, 1.0])


@pytest.mark.single_process
def test_legacy_generator():
    # The values above pin the generator down; these are its invariants: uniform numbers in
    # (0, 1], distinct over a long draw, and rotations orthogonal to rounding.
    u = bbob._unif(3, 1)
    assert np.all((u > 0) & (u <= 1)) and len(np.unique(bbob._unif(1000, 10001))) == 1000
    r = bbob._rotation(12345, 7)
    np.testing.assert_allclose(r @ r.T, np.eye(7), atol=1e-14)
    # COCO's fopt for f1 instance 1 in every dimension (the suite's published value)
    assert bbob._fopt(1, 1) == 79.48
