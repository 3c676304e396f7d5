"""Many small runs as one program: CMA-ES on five BBOB instances x two seeds, batched.

    python examples/api_batch.py
    mpiexec -n 3 python examples/api_batch.py           # the same digest on 3 ranks

``hpcevo.Batch`` advances runs of one compiled program together (the instances of a BBOB
function share it: their data are arguments). Each run is an ordinary ``Loop`` with its own
budget and target, which ends it at its exact generation while the others go on, and each is
bitwise the run alone: the script checks one against a loop advanced by itself.
"""

import argparse
import hashlib
from pathlib import Path

import jax

import hpcevo
from hpcevo.problems.bbob import make_bbob


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=400)
    args.add_argument("--out", default="runs/api-batch", help="where one run's checkpoint goes")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    with jax.enable_x64(True):  # float64, as COCO's targets (1e-8) need
        run(ctx, args)


def run(ctx, args):
    dim, budget = 5, 1000 * 5
    problems = [make_bbob(8, instance, dim) for instance in (1, 2, 3, 4, 5)]  # Rosenbrock, 5 instances
    algorithm = hpcevo.algorithms.CMAES(pop_size=8, dim=dim, lb=problems[0].lb, ub=problems[0].ub, dtype="float64")
    runs = [(p, seed) for p in problems for seed in (1, 2)]
    loops = [hpcevo.Loop(algorithm, p, ctx).limit(evaluations=budget, target=p.fopt + 1e-8) for p, _ in runs]
    batch = hpcevo.Batch(loops).init([seed for _, seed in runs])
    batch.advance(args.generations - 1)

    ctx.print(f"{'problem':20s} {'seed':>4s} {'gens':>5s} {'evals':>6s} {'f - fopt':>10s}  ended by")
    for (p, seed), loop in zip(runs, batch):
        ctx.print(f"{p.name:20s} {seed:4d} {loop.generation:5d} {loop.evaluations:6d} "
                  f"{loop.best_fitness - p.fopt:10.3e}  {loop.met or 'generations'}")

    # Any run of the batch is the run alone: the same loop, advanced by itself.
    p, seed = runs[3]
    alone = hpcevo.Loop(algorithm, p, ctx).limit(evaluations=budget, target=p.fopt + 1e-8)
    alone.init(seed).advance(args.generations - 1)
    assert alone.digest() == batch[3].digest(), "a batched run must equal the run alone"
    batch[3].save(Path(args.out) / "checkpoints", keep=1)  # and it checkpoints as a Loop does

    digest = hashlib.sha256("".join(batch.digests()).encode()).hexdigest()
    ctx.print(f"digest {digest}")


if __name__ == "__main__":
    main()
