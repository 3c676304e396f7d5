"""Each benchmark problem at its optimum and at hand-computed points (float32, as runs use)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from hpcevo.problems import PROBLEMS, make_problem

pytestmark = pytest.mark.single_process


def f(name, x):
    x = jnp.asarray(x, jnp.float32)
    return float(make_problem(name, x.shape[-1]).evaluate(x[None])[0])


@pytest.mark.parametrize("name", sorted(PROBLEMS))
@pytest.mark.parametrize("dim", [2, 10, 100])
def test_optimum(name, dim):
    p = make_problem(name, dim)
    value = float(p.evaluate(jnp.asarray([p.optimum_x()], jnp.float32))[0])
    tol = 2e-3 * dim if name == "schwefel" else 1e-6
    assert abs(value - p.optimum_value) <= tol, (name, dim, value)


def test_hand_computed_values():
    assert f("sphere", [1.0, 2.0, 3.0]) == 14.0
    assert f("rastrigin", [1.0, 2.0]) == pytest.approx(5.0, abs=1e-5)  # 20 + (1-10) + (4-10)
    assert f("rosenbrock", [0.0, 0.0]) == 1.0
    assert f("rosenbrock", [1.0, 2.0]) == 100.0
    assert f("ellipsoid", [1.0, 1.0]) == pytest.approx(1.0 + 1e6, rel=1e-7)
    assert f("ellipsoid", [2.0]) == 4.0
    x = [1.0, -0.5]
    ack = -20 * math.exp(-0.2 * math.sqrt((1 + 0.25) / 2)) - math.exp((math.cos(2 * math.pi) + math.cos(-math.pi)) / 2) + 20 + math.e
    assert f("ackley", x) == pytest.approx(ack, rel=1e-6)
    grie = 1 + (1 + 0.25) / 4000 - math.cos(1.0) * math.cos(-0.5 / math.sqrt(2))
    assert f("griewank", x) == pytest.approx(grie, rel=1e-6)
    sch = 418.9828872724338 * 2 - (1.0 * math.sin(1.0) + -0.5 * math.sin(math.sqrt(0.5)))
    assert f("schwefel", x) == pytest.approx(sch, rel=1e-6)


def test_block_of_candidates_matches_one_by_one():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.uniform(-2, 2, (7, 5)), jnp.float32)
    for name in PROBLEMS:
        p = make_problem(name, 5)
        block = np.asarray(p.evaluate(X))
        single = np.array([float(p.evaluate(X[i : i + 1])[0]) for i in range(7)], np.float32)
        np.testing.assert_allclose(block, single, rtol=1e-6)


def test_bad_problem_arguments():
    with pytest.raises(ValueError, match="ackley"):
        make_problem("ackly", 3)
    with pytest.raises(ValueError, match=">= 2"):
        make_problem("rosenbrock", 1)
    with pytest.raises(ValueError):
        make_problem("sphere", 2, lb=1.0, ub=-1.0)
    with pytest.raises(ValueError):
        make_problem("sphere", 3, lb=[0.0, 0.0], ub=1.0)
