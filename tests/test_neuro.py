"""Neuroevolution on gymnax: parameter layout, returns against gymnax's own loop, episode seeds,
bitwise N ranks == 1 rank, the four classic-control environments, errors. Small and short."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

from hpcevo.algorithms import PSO
from hpcevo.parallel import context_for
from hpcevo.problems import create
import hpcevo

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

SMALL = {"env": "CartPole-v1", "hidden": [4], "episodes": 2, "max_steps": 25}


def theta(p, n, seed=0):
    return jax.random.uniform(jax.random.PRNGKey(seed), (n, p.dim), minval=-1.0, maxval=1.0)


@pytest.mark.single_process
def test_dim_is_the_number_of_mlp_parameters():
    assert create("neuro", None, args={"env": "CartPole-v1"}).dim == 4 * 16 + 16 + 16 * 2 + 2
    p = create("neuro", None, args={"env": "Pendulum-v1", "hidden": [8, 8]})
    assert p.layers == (3, 8, 8, 1) and p.dim == 3 * 8 + 8 + 8 * 8 + 8 + 8 * 1 + 1
    assert not p.discrete and (p.action_low, p.action_high) == (-2.0, 2.0)
    assert p.lb == (-1.0,) * p.dim  # default box; problem.lb / ub override it
    assert create("neuro", None, -3.0, 3.0, {"env": "CartPole-v1"}).ub == (3.0,) * 114


@pytest.mark.single_process
def test_unflatten_layout_and_policy():
    p = create("neuro", None, args={"env": "CartPole-v1", "hidden": [3]})
    t = jnp.arange(p.dim, dtype=jnp.float32)
    (w1, b1), (w2, b2) = p.unflatten(t)
    assert w1.shape == (4, 3) and b1.shape == (3,) and w2.shape == (3, 2) and b2.shape == (2,)
    assert float(w1[0, 1]) == 1.0 and float(b1[0]) == 12.0 and float(w2[0, 0]) == 15.0
    obs = jnp.asarray([0.1, -0.2, 0.3, 0.05])
    h = jnp.tanh(obs @ w1 + b1) @ w2 + b2
    assert int(p.policy(p.unflatten(t), obs)) == int(jnp.argmax(h))


def reference_return(p, th, key):
    """One episode with gymnax's own auto-resetting step, stopped at the first end."""
    params = p.unflatten(th)
    k_reset, k_steps = jax.random.split(key)
    obs, state = p.env.reset(k_reset, p.env_params)
    total = 0.0
    for k in jax.random.split(k_steps, p.max_steps):
        obs, state, reward, terminated, truncated, _ = p.env.step(k, state, p.policy(params, obs), p.env_params)
        total += float(reward)
        if terminated or truncated:
            break
    return total


@pytest.mark.single_process
@pytest.mark.slow
def test_returns_match_gymnax_episode_loop(my_turn):
    if not my_turn:
        return  # another rank of this job runs it (see conftest.my_turn)
    p = create("neuro", None, args=SMALL)
    x = theta(p, 3, seed=1)
    fitness = np.asarray(jax.jit(p.evaluate)(x, jnp.int32(4)))
    keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(p.seed), 4), p.episodes)
    for i in range(3):
        mean = np.mean([reference_return(p, x[i], k) for k in keys])
        assert fitness[i] == pytest.approx(-mean, abs=1e-5)


@pytest.mark.single_process
def test_episodes_depend_on_generation_and_seed_not_on_position(my_turn):
    if not my_turn:
        return  # another rank of this job runs it (see conftest.my_turn)
    p = create("neuro", None, args={**SMALL, "episodes": 3})
    f = jax.jit(p.evaluate)
    x = theta(p, 6, seed=2)
    a = np.asarray(f(x, jnp.int32(1)))
    assert np.array_equal(a, np.asarray(f(x, jnp.int32(1))))
    np.testing.assert_allclose(np.asarray(f(x[::-1], jnp.int32(1)))[::-1], a)  # position-free
    assert not np.array_equal(a, np.asarray(f(x, jnp.int32(2))))  # new episodes each generation
    other = create("neuro", None, args={**SMALL, "episodes": 3, "seed": 9})
    assert not np.array_equal(a, np.asarray(jax.jit(other.evaluate)(x, jnp.int32(1))))


@pytest.mark.slow
def test_rollouts_bitwise_equal_to_one_rank(ctx, references, request):
    p = create("neuro", None, args=SMALL)
    algo = PSO(pop_size=7, dim=p.dim, lb=p.lb, ub=p.ub)

    def run(c):
        loop = hpcevo.Loop(algo, p, c).compile(11).init(11).advance(2)
        return [loop.digest(), loop.best_fitness]

    here = run(ctx)
    assert here == references.get(request, "run", lambda: here if ctx.size == 1 else run(context_for(MPI.COMM_SELF)))
    assert -25.0 <= here[1] < 0.0  # minus a mean return of at most max_steps rewards of 1


@pytest.mark.single_process
@pytest.mark.parametrize("env", ["Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"])
def test_other_classic_control_environments(env, my_turn):
    if not my_turn:
        return  # another rank of this job runs it (see conftest.my_turn)
    p = create("neuro", None, args={"env": env, "hidden": [4], "episodes": 1, "max_steps": 10})
    f = np.asarray(jax.jit(p.evaluate)(theta(p, 2), jnp.int32(1)))
    assert f.shape == (2,) and np.all(np.isfinite(f))
    if env == "Acrobot-v1":
        assert np.all(f == 10.0)  # -1 per step until the goal, which 10 steps cannot reach


@pytest.mark.parametrize("args,message", [
    ({}, "problem.args.env is required"),
    ({"env": "CartPole-v2"}, "unknown gymnax environment 'CartPole-v2'; did you mean 'CartPole-v1'?"),
    ({"env": "CartPole-v1", "hidden": [0]}, "hidden must be a list of positive integers"),
    ({"env": "CartPole-v1", "activation": "swish"}, "activation 'swish' is not one of tanh"),
    ({"env": "CartPole-v1", "episodes": 0}, "episodes must be an integer >= 1"),
    ({"env": "CartPole-v1", "layers": [3]}, "unknown key problem.args.layers (valid: env, hidden"),
])
@pytest.mark.single_process
def test_bad_arguments(args, message):
    with pytest.raises(ValueError) as e:
        create("neuro", None, args=args)
    assert message in str(e.value)
    with pytest.raises(ValueError, match="MLP 4-16-2 has 114 parameters; leave problem.dim out"):
        create("neuro", 100, args={"env": "CartPole-v1"})
