"""Neuroevolution on a network's own parameters: a dict of weight and bias arrays, no flattening.

    python examples/api_pytree.py
    mpiexec -n 3 python examples/api_pytree.py          # the same digest on 3 ranks

``hpcevo.problems.pytree_problem`` turns a function of a parameter tree into a problem on flat
vectors (``dim`` = the number of parameters); ``unravel`` gives the tree of a solution back.
Here OpenAI-ES fits a small MLP to sin(x) on [-pi, pi], and the trained network is saved.
"""

import argparse
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import hpcevo
from hpcevo.algorithms import OpenES

HIDDEN = 16
X = jnp.linspace(-jnp.pi, jnp.pi, 64)[:, None]  # (64, 1): the training inputs
Y = jnp.sin(X)


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss(params):
    """Mean squared error of the MLP on sin: a function of one parameter tree, vmapped for you."""
    return jnp.mean((mlp(params, X) - Y) ** 2)


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=300)
    args.add_argument("--out", default="runs/api-pytree", help="where the trained parameters go (mlp.npz)")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    # Only the example's structure and shapes count (never its values): the tree fn receives.
    example = {"w1": jnp.zeros((1, HIDDEN)), "b1": jnp.zeros(HIDDEN),
               "w2": jnp.zeros((HIDDEN, 1)), "b2": jnp.zeros(1)}
    problem = hpcevo.problems.pytree_problem(loss, example, lb=-3.0, ub=3.0)
    algorithm = OpenES(pop_size=128, dim=problem.dim, lb=problem.lb, ub=problem.ub, sigma_init=0.01, lr=0.005)
    loop = hpcevo.Loop(algorithm, problem, ctx).init(seed=5)
    first = loop.best_fitness
    step = max(1, -(-(args.generations - 1) // 3))  # three progress lines
    while loop.generation < args.generations:
        loop.advance(min(step, args.generations - loop.generation))
        ctx.print(f"gen {loop.generation:4d}  best mse {loop.best_fitness:.4e}")

    params = problem.unravel(loop.best_solution)  # {"w1": (1, 16), "b1": (16,), ...}, NumPy arrays
    shapes = {k: v.shape for k, v in params.items()}
    ctx.print(f"{problem.dim} parameters {shapes}: mse {first:.4e} -> {loop.best_fitness:.4e} "
              f"(recomputed {float(loss(params)):.4e}) on {ctx.size} rank(s)")
    if ctx.is_root:  # the same tree on every rank: one writes it
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.out) / "mlp.npz", **params)
    ctx.print(f"digest {loop.digest()}")


if __name__ == "__main__":
    main()
