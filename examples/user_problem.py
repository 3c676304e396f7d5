"""A problem of your own for hpcevo: plain JAX, one candidate in, one number out (minimised).

Named in the config as  problem.name = "examples/user_problem.py:styblinski_tang"  (a path
relative to the working directory) or, for an importable module, "package.module:function".
hpcevo vectorises it with jax.vmap; a function that takes a block (n, dim) and returns (n,)
is used as is (say so with `batched = True` on it, or problem.batched = true in the config).
Keyword arguments come from the config's [problem.args] table.
"""

import jax.numpy as jnp


def styblinski_tang(x, scale=0.5):
    """Styblinski-Tang: scale * sum(x^4 - 16 x^2 + 5 x); minimum -39.166 * dim at x_i = -2.9035."""
    return scale * jnp.sum(x**4 - 16.0 * x**2 + 5.0 * x)


# Optional: bounds the config may leave out (problem.lb / problem.ub win when given).
styblinski_tang.lb = -5.0
styblinski_tang.ub = 5.0
