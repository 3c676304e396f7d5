"""A problem you hold in Python: a JAX function defined here, with an algorithm object.

    python examples/api_function.py
    mpiexec -n 3 python examples/api_function.py        # the same digest on 3 ranks

hpcevo vectorises a function of one candidate (``(dim,) -> ()``) with ``jax.vmap``; a function
of a block (``(n, dim) -> (n,)``) is used as it is. The config says only what has no default.
"""

import argparse
import json

import jax.numpy as jnp

import hpcevo
from hpcevo.algorithms import CSO


def levy(x):
    """Levy function (Laguna & Marti 2005): minimum 0 at x = (1, ..., 1)."""
    w = 1.0 + (x - 1.0) / 4.0
    middle = jnp.sum((w[:-1] - 1.0) ** 2 * (1.0 + 10.0 * jnp.sin(jnp.pi * w[:-1] + 1.0) ** 2))
    last = (w[-1] - 1.0) ** 2 * (1.0 + jnp.sin(2.0 * jnp.pi * w[-1]) ** 2)
    return jnp.sin(jnp.pi * w[0]) ** 2 + middle + last


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=300)
    args.add_argument("--out", default="runs/api-levy", help="run directory (replaced if it exists)")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    dim = 30
    cfg = hpcevo.load_config({
        "run": {"name": "api-levy", "seed": 7, "generations": args.generations, "out": args.out},
        "problem": {"dim": dim, "lb": -10.0, "ub": 10.0},
        "log": {"every": 50},
    })
    algorithm = CSO(pop_size=256, dim=dim, lb=(-10.0,) * dim, ub=(10.0,) * dim, phi=0.05)
    result = hpcevo.run(cfg, problem=levy, algorithm=algorithm, overwrite=True, quiet=True)

    ctx.print(f"levy in {dim} dimensions: best {result.best_fitness:.6e} at x[:3] = "
              f"{json.dumps([round(float(v), 4) for v in result.best_solution[:3]])} on {ctx.size} rank(s)")
    ctx.print(f"resolved as: {hpcevo.open_run(result.run_dir).config['problem']}")
    ctx.print(f"digest {result.digest}")


if __name__ == "__main__":
    main()
