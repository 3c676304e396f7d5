"""ask / evaluate / tell under MPI: your own logic between asking and telling, evosax-style.

    python examples/api_ask_tell.py
    mpiexec -n 3 python examples/api_ask_tell.py         # the same digest on 3 ranks

``loop.ask()`` gives the generation's candidates (the same on every rank), ``loop.evaluate(x)``
splits their evaluation over the ranks and gathers the values (the same bits at any rank count),
and ``loop.tell(x, f)`` ends the generation: together, bitwise one ``loop.advance(1)``. Between
them is Python of your own; here, a constraint handled by a penalty. The second half runs the
same generations as pure functions inside a ``jax.lax.scan`` of your own (``loop.functions()``),
one dispatch for many generations, and hands the state back to the loop (``loop.adopt``).
"""

import argparse

import jax
import jax.numpy as jnp

import hpcevo


def penalty(x):
    """Candidates must satisfy sum(x) >= 1: each unit of violation costs 100."""
    return 100.0 * jnp.maximum(1.0 - jnp.sum(x, axis=1), 0.0)


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=200)
    args.add_argument("--out", default="runs/api-ask-tell", help="(unused: this example writes nothing)")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    problem = hpcevo.problems.make_problem("sphere", 30)
    algorithm = hpcevo.algorithms.DE(pop_size=256, dim=30, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algorithm, problem, ctx).init(seed=7)   # generation 1

    half = args.generations // 2
    while loop.generation < half:
        x = loop.ask()                       # (256, 30), replicated
        f = loop.evaluate(x) + penalty(x)    # evaluated in shares over the ranks, then gathered
        loop.tell(x, f)                      # every rank tells the same values (checked)
        if loop.generation % 25 == 0:
            ctx.print(f"gen {loop.generation:4d}  best {loop.best_fitness:.6e}")

    # The same, as pure functions in one jitted scan: no host round trip per generation.
    ask, evaluate, tell, row = loop.functions()

    @jax.jit
    def generations(state, params):
        def one(s, _):
            x, algo = ask(s, params)
            s2 = tell(s, x, algo, evaluate(x) + penalty(x), params)
            return s2, row(s, s2)   # the generation's history row
        return jax.lax.scan(one, state, None, length=args.generations - half)

    state, rows = generations(loop.state, loop.params_data())
    loop.adopt(state, rows)                  # the loop goes on from there, history included
    x = loop.best_solution
    ctx.print(f"gen {loop.generation:4d}  best {loop.best_fitness:.6e}  sum(x) = {x.sum():.4f} (>= 1)")
    ctx.print(f"digest {loop.digest()}")


if __name__ == "__main__":
    main()
