"""Your own loop: the step-level API. Advance, look, save a checkpoint, continue from it.

    python examples/api_loop.py
    mpiexec -n 3 python examples/api_loop.py            # the same digest on 3 ranks

``hpcevo.Loop`` is the loop ``hpcevo.run`` drives: every ``advance`` runs its generations in
jitted dispatches with the evaluation split over the ranks, and the host wakes only when it returns.
"""

import argparse
from pathlib import Path

import hpcevo


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=250)
    args.add_argument("--out", default="runs/api-loop", help="where the checkpoint goes")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    problem = hpcevo.problems.make_problem("rastrigin", 50)
    algorithm = hpcevo.algorithms.PSO(pop_size=512, dim=50, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algorithm, problem, ctx).init(seed=3)  # generation 1: the initial population
    step = max(1, (args.generations - 1) // 5)
    while loop.generation + step <= args.generations - 10:
        loop.advance(step)
        ctx.print(f"gen {loop.generation:5d}  best {loop.best_fitness:.6e}  "
                  f"generation mean {loop.history['gen_mean'][-1]:.6e}")

    path = loop.save(Path(args.out) / "checkpoints", keep=1)  # every rank writes its share
    again = hpcevo.Loop(algorithm, problem, ctx).load(path)   # at any rank count
    loop.advance(10)
    again.advance(10)
    assert again.digest() == loop.digest(), "a loop continued from a checkpoint must equal one never stopped"

    positions, fitness = loop.population()  # PSO: the swarm's personal bests
    ctx.print(f"gen {loop.generation}: best {loop.best_fitness:.6e}; swarm spread {positions.std(axis=0).mean():.3e}, "
              f"mean personal best {fitness.mean():.3e}; continued from {path.name}: the same state")
    ctx.print(f"digest {loop.digest()}")


if __name__ == "__main__":
    main()
