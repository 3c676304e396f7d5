"""The pycma habit in one call: ``hpcevo.minimize(f, x0, sigma0)``, alone or under MPI.

    python examples/minimize.py
    mpiexec -n 3 python examples/minimize.py          # the same result, bit for bit

As ``cma.fmin2(f, x0, sigma0)``: CMA-ES from ``x0`` with step size ``sigma0``, stopping on
pycma's TolFun, then again with BIPOP restarts on a multimodal function under a budget. Each
call is an ordinary hpcevo run (metrics, checkpoints, summary) in ``runs/minimize``.
"""

import jax.numpy as jnp

import hpcevo


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rastrigin(x):
    return 10.0 * x.shape[-1] + jnp.sum(x * x - 10.0 * jnp.cos(2.0 * jnp.pi * x))


ctx = hpcevo.parallel.init()
result = hpcevo.minimize(rosenbrock, [0.5] * 8, 0.3)
ctx.print(f"rosenbrock, 8 variables: f = {result.best_fitness:.3g} after {result.evaluations} evaluations "
          f"({result.summary['stopped_by'].split(':')[0]}); digest {result.digest[:16]}")
result = hpcevo.minimize(rastrigin, [2.0] * 5, 1.5, bounds=(-5.12, 5.12), restarts="bipop", evaluations=40_000)
ctx.print(f"rastrigin, 5 variables, BIPOP: f = {result.best_fitness:.3g} after {result.evaluations} evaluations "
          f"in {result.run_dir}")
