"""CSO and PSO: protocol behaviour, and convergence through the real (distributed) workflow."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hpcevo.algorithms import CSO, PSO
from hpcevo.problems import make_problem
import hpcevo


@pytest.mark.single_process
def test_cso_moves_only_losers_and_winners_pass_unchanged():
    algo = CSO(pop_size=9, dim=3, lb=(-5.0,) * 3, ub=(5.0,) * 3)
    s = algo.init(jax.random.PRNGKey(0))
    x0, s = algo.init_ask(s)
    assert x0.shape == (9, 3) and algo.num_init == 9 and algo.num_ask == 4
    s = algo.init_tell(s, jnp.sum(x0 * x0, -1))
    cand, s2 = algo.ask(s)
    losers = np.asarray(s2.losers)
    assert cand.shape == (4, 3) and len(set(losers.tolist())) == 4
    moved = np.any(np.asarray(s2.position) != np.asarray(s.position), axis=1)
    assert set(np.nonzero(moved)[0]) <= set(losers.tolist())
    # each loser had fitness >= some partner that stayed: 5 particles unchanged (4 winners + 1 odd)
    assert (~moved).sum() >= 5
    np.testing.assert_array_equal(np.asarray(s2.position)[losers], np.asarray(cand))
    fit = np.asarray(jnp.sum(cand * cand, -1))
    s3 = algo.tell(s2, jnp.asarray(fit))
    np.testing.assert_array_equal(np.asarray(s3.fitness)[losers], fit)


@pytest.mark.single_process
def test_cso_loser_update_follows_the_paper():
    """phi=0, zero velocity: the loser lands on x_l + r2 * (x_w - x_l), between it and the winner."""
    algo = CSO(pop_size=2, dim=4, lb=(-10.0,) * 4, ub=(10.0,) * 4, phi=0.0)
    s = algo.init(jax.random.PRNGKey(3))
    x0, s = algo.init_ask(s)
    s = algo.init_tell(s, jnp.array([1.0, 2.0]))  # particle 0 wins
    cand, s2 = algo.ask(s)
    assert int(s2.losers[0]) == 1
    lo, hi = np.minimum(x0[0], x0[1]), np.maximum(x0[0], x0[1])
    assert np.all(np.asarray(cand[0]) >= lo) and np.all(np.asarray(cand[0]) <= hi)
    np.testing.assert_array_equal(np.asarray(s2.position[0]), np.asarray(x0[0]))


@pytest.mark.single_process
def test_pso_personal_and_global_bests_never_worsen():
    algo = PSO(pop_size=16, dim=5, lb=(-5.0,) * 5, ub=(5.0,) * 5)
    s = algo.init(jax.random.PRNGKey(1))
    prev_p, prev_g = np.full(16, np.inf), np.inf
    for _ in range(20):
        x, s = algo.ask(s)
        assert np.all(np.abs(np.asarray(x)) <= 5.0)
        s = algo.tell(s, jnp.sum(x * x, -1))
        p, g = np.asarray(s.pbest_fitness), float(s.gbest_fitness)
        assert np.all(p <= prev_p) and g <= prev_g and g == p.min()
        prev_p, prev_g = p, g


@pytest.mark.single_process
def test_bad_hyperparameters_refused():
    with pytest.raises(ValueError, match="phi"):
        CSO(pop_size=4, dim=1, lb=(0.0,), ub=(1.0,), phi=-0.5)
    with pytest.raises(ValueError, match="pop_size >= 2"):
        CSO(pop_size=1, dim=1, lb=(0.0,), ub=(1.0,))
    with pytest.raises(ValueError, match="w must be"):
        PSO(pop_size=4, dim=1, lb=(0.0,), ub=(1.0,), w=1.5)


@pytest.mark.parametrize("cls,prob,dim,pop,gens,target", [
    (CSO, "sphere", 30, 100, 300, 1e-3),
    (CSO, "ackley", 30, 100, 400, 1e-1),
    (PSO, "sphere", 10, 40, 300, 1e-6),
    (PSO, "ackley", 10, 40, 400, 1e-1),
])
@pytest.mark.slow
@pytest.mark.ranks(1, 2)
def test_converges_under_the_distributed_workflow(ctx, cls, prob, dim, pop, gens, target):
    problem = make_problem(prob, dim)
    algo = cls(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algo, problem, ctx).compile(0).init(0)
    first = loop.best_fitness
    best = loop.advance(gens - 1).best_fitness
    assert best < target, f"{cls.__name__} on {prob}: best {best:.3e} after {gens} generations"
    assert best < first
