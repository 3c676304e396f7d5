"""Hyper-parameters as data: change them while the loop runs, with no recompilation.

    python examples/api_params.py
    mpiexec -n 3 python examples/api_params.py           # the same digest on 3 ranks

An algorithm's dynamic hyper-parameters (``type(algorithm).dynamic``: DE's F and CR, PSO's w,
c1, c2...) are passed into the jitted step as data, evosax's ``params`` beside the state:
``loop.set_params(F=...)`` takes effect at the next dispatch without compiling anything, the
metrics and checkpoints record the values, and a loop loaded from a checkpoint continues with the
values it had. A static one (``pop_size``, ``strategy``) shapes the program: changing it raises.
"""

import argparse
from pathlib import Path

import hpcevo


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=300)
    args.add_argument("--out", default="runs/api-params", help="where the checkpoint goes")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    problem = hpcevo.problems.make_problem("rastrigin", 20)
    de = hpcevo.algorithms.DE(pop_size=200, dim=20, lb=problem.lb, ub=problem.ub, F=0.9, CR=0.9)
    ctx.print(f"DE's dynamic hyper-parameters: {', '.join(type(de).dynamic)}")
    loop = hpcevo.Loop(de, problem, ctx).init(seed=11)

    # F from 0.9 down to 0.4 in ten steps: explore first, then exploit.
    steps, done = 10, 1
    for i in range(steps):
        n = (args.generations - 10) * (i + 1) // steps + 1 - done
        loop.set_params(F=round(0.9 - 0.05 * i, 3)).advance(n)
        done += n
        ctx.print(f"gen {loop.generation:4d}  F {loop.params['F']:.2f}  best {loop.best_fitness:.6e}")

    path = loop.save(Path(args.out) / "checkpoints", keep=1)
    again = hpcevo.Loop(de, problem, ctx).load(path)  # built with F = 0.9; continues with the saved 0.45
    assert again.params == loop.params, (again.params, loop.params)
    loop.advance(10)
    again.advance(10)
    assert again.digest() == loop.digest(), "a loaded loop continues with the hyper-parameters it had"
    try:
        loop.set_params(pop_size=100)
    except hpcevo.UsageError as e:
        ctx.print(f"refused, as it should be: {str(e)[:90]}...")
    ctx.print(f"gen {loop.generation}: best {loop.best_fitness:.6e} with F = {loop.params['F']}")
    ctx.print(f"digest {loop.digest()}")


if __name__ == "__main__":
    main()
