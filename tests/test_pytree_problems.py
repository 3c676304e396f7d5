"""Parameters as pytrees (``hpcevo.problems.pytree_problem``): the flat layout is ravel_pytree's,
a network trained through Loop, run and Archipelago is bitwise the same at every rank count and
the same as the function flattened by hand, and bad input is refused naming the argument."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import hpcevo
from hpcevo.algorithms import CSO, PSO, OpenES
from hpcevo.errors import ConfigError
from hpcevo.problems import PytreeProblem, pytree_problem

from configs import small_config

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

HIDDEN = 8
X = jnp.linspace(-jnp.pi, jnp.pi, 32)[:, None]
Y = jnp.sin(X)
EXAMPLE = {"w1": jnp.zeros((1, HIDDEN)), "b1": jnp.zeros(HIDDEN), "w2": jnp.zeros((HIDDEN, 1)), "b2": jnp.zeros(1)}


def mlp_loss(params):
    """Mean squared error of a 1-8-1 tanh MLP on sin(x)."""
    h = jnp.tanh(X @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - Y) ** 2)


def flat_mlp_loss(x):
    """mlp_loss on a flat vector, cut by hand: the dict's keys in sorted order (b1, b2, w1, w2),
    as jax.tree_util flattens a dict."""
    b1, b2 = x[:HIDDEN], x[HIDDEN:HIDDEN + 1]
    w1 = x[HIDDEN + 1:2 * HIDDEN + 1].reshape(1, HIDDEN)
    w2 = x[2 * HIDDEN + 1:].reshape(HIDDEN, 1)
    h = jnp.tanh(X @ w1 + b1)
    return jnp.mean((h @ w2 + b2 - Y) ** 2)


class Layer(NamedTuple):
    w: jax.Array
    b: jax.Array


def nested_example():
    """A dict of a list of a tuple and a NamedTuple, a Python float, a None (no leaf) and
    leaves of several float dtypes."""
    return {"enc": [(jnp.zeros((2, 3)), jnp.zeros(3, jnp.float16)), Layer(np.zeros((3, 2)), jnp.zeros(2))],
            "scale": 0.5, "head": {"w": np.zeros((2, 1), np.float64), "skip": None}}


def leaves_sum(params):
    return sum(jnp.sum(jnp.cos(leaf)) for leaf in jax.tree_util.tree_leaves(params))


def train(ctx, problem, generations=12, seed=1):
    algo = OpenES(pop_size=16, dim=problem.dim, lb=problem.lb, ub=problem.ub, sigma_init=0.01, lr=0.005)
    return hpcevo.Loop(algo, problem, ctx).init(seed).advance(generations - 1)


# -- Loop, at every rank count ------------------------------------------------------------------
def test_an_mlp_as_a_dict_of_arrays_trains_through_loop_bitwise_at_every_rank_count(ctx, alone, references, request):
    problem = pytree_problem(mlp_loss, EXAMPLE, lb=-3.0, ub=3.0)
    assert isinstance(problem, hpcevo.Problem) and problem.dim == 3 * HIDDEN + 1
    assert problem.name == "<python: test_pytree_problems.mlp_loss>"  # what a run records

    def outcome(c):
        loop = train(c, problem)
        return {"digest": loop.digest(), "best": loop.best_fitness, "history": loop.history["best"].tolist()}

    loop = train(ctx, problem)
    here = {"digest": loop.digest(), "best": loop.best_fitness, "history": loop.history["best"].tolist()}
    assert here == references.get(request, "run", lambda: here if ctx.size == 1 else outcome(alone))
    assert ctx.comm_ctl.allgather(here["digest"]) == [here["digest"]] * ctx.size
    assert here["history"][-1] < here["history"][0] / 2  # the loss went down
    params = problem.unravel(loop.best_solution)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(EXAMPLE)
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in EXAMPLE.items()}
    np.testing.assert_allclose(float(mlp_loss(params)), loop.best_fitness, rtol=1e-5)
    # The same run as the function flattened by hand: bitwise the same fitness, the same state.
    flat = train(ctx, flat_mlp_loss_problem())
    assert flat.digest() == here["digest"]


def flat_mlp_loss_problem():
    return hpcevo.problems.as_problem(flat_mlp_loss, 3 * HIDDEN + 1, -3.0, 3.0)


# -- hpcevo.run and Archipelago -----------------------------------------------------------------
@pytest.mark.slow
def test_run_and_archipelago_take_a_pytree_problem(ctx, alone, references, request, shared_tmp):
    problem = pytree_problem(mlp_loss, EXAMPLE, lb=-3.0, ub=3.0, name="mlp")
    data = small_config(shared_tmp / "run", run={"generations": 6})
    del data["problem"]["name"], data["problem"]["dim"]  # the held problem brings its own dim and box
    result = hpcevo.run(hpcevo.load_config(data), problem=problem, ctx=ctx, quiet=True)
    assert ctx.comm_ctl.allgather(result.digest) == [result.digest] * ctx.size
    assert result.history["best"][-1] < result.history["best"][0]
    assert problem.unravel(result.best_solution)["w2"].shape == (HIDDEN, 1)
    recorded = hpcevo.open_run(result.run_dir).config["problem"]
    assert recorded["name"] == "<python: mlp>" and recorded["dim"] == problem.dim
    # a config that names the same dim is fine; another dim is refused
    same = small_config(shared_tmp / "same", run={"generations": 6}, problem={"dim": problem.dim})
    del same["problem"]["name"]
    assert hpcevo.run(hpcevo.load_config(same), problem=problem, ctx=ctx, quiet=True).digest == result.digest
    other = small_config(shared_tmp / "other")
    del other["problem"]["name"]
    with pytest.raises(ConfigError, match=f"problem.dim = 3 but the problem says its dim is {problem.dim}"):
        hpcevo.run(hpcevo.load_config(other), problem=problem, ctx=ctx, quiet=True)

    box = {"dim": problem.dim, "lb": problem.lb, "ub": problem.ub}
    algorithms = [CSO(pop_size=8, **box), PSO(pop_size=8, **box)]  # (ES islands do not migrate)

    def islands(c):
        a = hpcevo.Archipelago(algorithms, problem, c, hpcevo.Migration(every=2, migrants=1)).init(3).advance(5)
        return {"digest": a.digest(), "best": a.best_fitness, "solution": problem.ravel(
            problem.unravel(a.best_solution)).tolist()}

    here = islands(ctx)
    assert here == references.get(request, "islands", lambda: here if ctx.size == 1 else islands(alone))


# -- the layout, pure ---------------------------------------------------------------------------
@pytest.mark.single_process
def test_ravel_and_unravel_are_ravel_pytrees_layout_on_nested_trees():
    example = nested_example()
    problem = pytree_problem(leaves_sum, example)
    assert problem.dim == 6 + 3 + 6 + 2 + 1 + 2
    assert problem.paths == ("['enc'][0][0]", "['enc'][0][1]", "['enc'][1].w", "['enc'][1].b", "['head']['w']",
                             "['scale']")
    x = jnp.arange(problem.dim, dtype=jnp.float32) / 10
    tree = problem.unravel(x)
    assert jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(example)
    assert isinstance(tree["enc"][1], Layer) and tree["head"]["skip"] is None
    for got, want in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(example)):
        assert got.shape == np.shape(want) and got.dtype == jnp.float32  # every leaf in the rows' dtype
    assert np.asarray(problem.ravel(tree)).tobytes() == np.asarray(x).tobytes()
    flat, unravel = ravel_pytree(tree)
    assert np.asarray(flat).tobytes() == np.asarray(x).tobytes()  # ravel_pytree's order
    for a, b in zip(jax.tree_util.tree_leaves(unravel(x)), jax.tree_util.tree_leaves(tree)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # leading axes are kept (a population), and NumPy stays NumPy
    rows = np.arange(3 * problem.dim, dtype=np.float64).reshape(3, problem.dim)
    batch = problem.unravel(rows)
    assert batch["enc"][1].w.shape == (3, 3, 2) and isinstance(batch["enc"][1].w, np.ndarray)
    assert np.array_equal(batch["enc"][1].w[2], problem.unravel(rows[2])["enc"][1].w)
    assert np.array_equal(np.asarray(problem.ravel(problem.unravel(rows[1]))), rows[1].astype(np.float32))


@pytest.mark.single_process
def test_per_leaf_bounds_broadcast_to_each_leaf():
    example = {"layer": Layer(jnp.zeros((2, 3)), jnp.zeros(3)), "gain": 1.0}
    lb = {"layer": Layer(w=np.array([-1.0, -2.0, -3.0]), b=[-4.0, -5.0, -6.0]), "gain": 0.0}  # a list: one leaf's
    problem = pytree_problem(leaves_sum, example, lb=lb, ub=10)
    tree = problem.unravel(np.asarray(problem.lb))
    assert np.array_equal(tree["layer"].w, [[-1, -2, -3], [-1, -2, -3]])
    assert np.array_equal(tree["layer"].b, [-4, -5, -6]) and tree["gain"] == 0.0
    assert problem.ub == (10.0,) * problem.dim
    scalar = pytree_problem(leaves_sum, example, lb=np.float32(-0.5), ub=jnp.asarray(0.5))
    assert scalar.lb == (-0.5,) * 10 and scalar.ub == (0.5,) * 10


# -- the same values as by hand, pure -----------------------------------------------------------
@pytest.mark.single_process
def test_fitness_is_bitwise_that_of_the_function_flattened_by_hand():
    rows = jax.random.uniform(jax.random.PRNGKey(0), (37, 3 * HIDDEN + 1), minval=-3.0, maxval=3.0)
    by_hand = np.asarray(jax.jit(jax.vmap(flat_mlp_loss))(rows))
    problem = pytree_problem(mlp_loss, EXAMPLE)
    assert np.asarray(jax.jit(problem.evaluate)(rows)).tobytes() == by_hand.tobytes()
    assert np.asarray(jax.jit(flat_mlp_loss_problem().evaluate)(rows)).tobytes() == by_hand.tobytes()
    # a function of a batch of trees (a leading axis on every leaf) gives the same values
    batched = pytree_problem(jax.vmap(mlp_loss), EXAMPLE, batched=True)
    assert np.asarray(jax.jit(batched.evaluate)(rows)).tobytes() == by_hand.tobytes()


@pytest.mark.single_process
def test_leaves_take_the_runs_dtype_and_the_generation_reaches_fn():
    seen = []

    def loss(params, generation):
        seen.extend(leaf.dtype for leaf in jax.tree_util.tree_leaves(params))
        return leaves_sum(params) * generation

    problem = pytree_problem(loss, nested_example(), wants_generation=True)  # float16/32/64 leaves
    assert problem.wants_generation
    rows = jnp.ones((2, problem.dim))
    assert np.allclose(np.asarray(problem.evaluate(rows, jnp.int32(3))), 3 * problem.dim * np.cos(1.0))
    assert set(seen) == {jnp.dtype(jnp.float32)}
    with jax.enable_x64(True):  # a float64 run: float64 leaves, the hand-flattened values bitwise
        seen.clear()
        rows = jax.random.uniform(jax.random.PRNGKey(1), (5, problem.dim), jnp.float64)
        assert problem.evaluate(rows, jnp.int32(1)).dtype == jnp.float64 and set(seen) == {jnp.dtype(jnp.float64)}
        mlp = pytree_problem(mlp_loss, EXAMPLE)
        x64 = jax.random.uniform(jax.random.PRNGKey(2), (7, mlp.dim), jnp.float64)
        assert np.asarray(jax.jit(mlp.evaluate)(x64)).tobytes() == np.asarray(
            jax.jit(jax.vmap(flat_mlp_loss))(x64)).tobytes()


# -- bad input, pure ----------------------------------------------------------------------------
def mse_of(params):
    return jnp.mean(params["w"] ** 2)


@pytest.mark.parametrize("kwargs,key,text", [
    ({"example": {"w": jnp.zeros(3), "n": jnp.zeros(2, jnp.int32)}}, "example", "example['n'] is an array of int32"),
    ({"example": {"w": jnp.zeros(3), "layers": [4, 8]}}, "example", "example['layers'][0] is an int"),
    ({"example": {"w": jnp.zeros(3), "on": True}}, "example", "example['on'] is a bool"),
    ({"example": {}}, "example", "'example' has no leaves"),
    ({"example": {"w": jnp.zeros(0)}}, "example", "'example' holds no parameters"),
    ({"lb": {"v": -1.0}}, "lb", "'lb' must be a number or a pytree of the example's structure"),
    ({"ub": [1.0, 1.0, 1.0]}, "ub", "'ub' must be a number or a pytree of the example's structure"),
    ({"lb": {"w": np.zeros(2)}}, "lb", "lb['w'] has shape (2,), which does not broadcast to the leaf's shape (3,)"),
    ({"ub": {"w": np.inf}}, "ub", "ub['w'] must be finite"),
    ({"lb": {"w": np.array([0.0, 1.0, 0.0])}, "ub": 1.0}, "lb",
     "lb must be < ub for every parameter, but for ['w'][1] (coordinate 1) lb = 1.0 and ub = 1.0"),
    ({"lb": "-1"}, "lb", "'lb' must be a number"),
    ({"batched": "no"}, "batched", "'batched': input should be a valid boolean"),
    ({"fn": lambda p: p["w"] * 2}, "fn", "fn must map one parameter tree to a number (shape ()), but it returned "
                                        "shape (3,) (a function of a batch of trees: pass batched=True)"),
    ({"fn": mse_of, "batched": True}, "fn", "batched=True: fn must map a batch of 2 parameter trees (a leading axis "
                                           "of 2 on every leaf) to shape (2,), but it returned shape ()"),
    ({"fn": lambda p: jnp.dot(p["w"], jnp.ones(4))}, "fn", "raised TypeError: dot_general requires contracting"),
    ({"fn": lambda p: float(np.sum(p["w"]))}, "fn", "(fn runs inside the jitted step: JAX code, not NumPy)"),
])
@pytest.mark.single_process
def test_bad_input_is_a_configerror_naming_the_problem_and_the_argument(kwargs, key, text):
    kwargs = {"fn": mse_of, "example": {"w": jnp.zeros(3)}, **kwargs}
    with pytest.raises(ConfigError) as e:
        pytree_problem(kwargs.pop("fn"), kwargs.pop("example"), **kwargs)
    assert e.value.key == key and text in str(e.value), str(e.value)
    assert str(e.value).startswith("problem '<python: test_pytree_problems.mse_of>': ") or key == "fn"
    assert str(e.value).startswith("problem '<python: ")


@pytest.mark.single_process
def test_bad_arguments_of_the_function_itself_and_of_ravel_and_unravel(ctx):
    with pytest.raises(ConfigError, match="'fn' must be a function of a parameter tree, got dict") as e:
        pytree_problem({"w": 1.0}, {"w": jnp.zeros(3)})
    assert e.value.key == "fn"
    with pytest.raises(ConfigError, match="'name' must be a non-empty line of text") as e:
        pytree_problem(mse_of, {"w": jnp.zeros(3)}, name="")
    assert e.value.key == "name"
    problem = pytree_problem(mse_of, {"w": jnp.zeros(3)}, name="three")
    assert isinstance(problem, PytreeProblem) and problem.name == "<python: three>"
    with pytest.raises(ConfigError, match=r"problem '<python: three>': unravel: 'x' must end in an axis of 3 "
                                          r"\(the problem's dim\), got shape \(4,\)"):
        problem.unravel(np.zeros(4))
    with pytest.raises(ConfigError, match=r"ravel: 'tree' has structure PyTreeDef\(\{'v': \*\}\)"):
        problem.ravel({"v": np.zeros(3)})
    with pytest.raises(ConfigError, match=r"ravel: tree\['w'\] has shape \(2,\), the example's is \(3,\)"):
        problem.ravel({"w": np.zeros(2)})
    with pytest.raises(ConfigError, match="problem '<python: three>' has dim 3, the algorithm 4") as e:
        hpcevo.Loop(CSO(pop_size=8, dim=4, lb=(-1.0,) * 4, ub=(1.0,) * 4), problem, ctx)
    assert e.value.key == "problem"
