"""A host problem for hpcevo: plain NumPy, evaluated outside JAX (problem.host = true).

By default the function takes a block of candidates, a float64 array (n, dim), and returns n
values (minimised). hpcevo calls it on fixed slices of the population on every rank, with
`evaluation.concurrency` calls at a time per rank (threads: NumPy releases the GIL in its
array kernels). Keyword arguments come from the config's [problem.args] table.
"""

import numpy as np


def rosenbrock(x, a=1.0, b=100.0):
    """Rosenbrock's valley, sum_i b (x_{i+1} - x_i^2)^2 + (a - x_i)^2; minimum 0 at x = (a, ..., a)."""
    return np.sum(b * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (a - x[:, :-1]) ** 2, axis=1)


# Optional, as for JAX problems: bounds the config may leave out (problem.lb / ub win).
rosenbrock.lb = -2.048
rosenbrock.ub = 2.048
