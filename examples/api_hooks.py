"""Hooks: watch a run at its log boundaries, change its hyper-parameters, stop it on your terms.

    python examples/api_hooks.py
    mpiexec -n 3 python examples/api_hooks.py            # the same digest on 3 ranks

``hpcevo.run(..., hooks=[...], stop_when=[...])``. A hook gets each boundary's metrics record
(and the loop) on rank 0; one marked ``every_rank`` runs on every rank, as a hook that changes
hyper-parameters must (``loop.set_params`` is collective). A stop criterion ends the run at the
boundary where it says so: complete, with a checkpoint, ``summary["stopped_by"]`` naming it.
With tensorboardX installed, ``hpcevo.hooks.TensorBoard("tb/")`` logs the same records.
"""

import argparse

import hpcevo
from hpcevo.hooks import Stagnation, Target, every_rank


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=400)
    args.add_argument("--out", default="runs/api-hooks", help="the run directory")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()
    cfg = {"run": {"name": "api-hooks", "seed": 5, "generations": args.generations, "out": args.out},
           "algorithm": {"name": "de", "pop_size": 128, "F": 0.9},
           "problem": {"name": "rastrigin", "dim": 10}, "log": {"every": 10}}

    def show(record, loop):  # rank 0
        if record["generation"] % 50 == 0:
            ctx.print(f"gen {record['generation']:4d}  best {record['best']:.6e}  F {record['params.F']:.3f}")

    @every_rank
    def anneal(record, loop):  # F from 0.9 towards 0.5 over the run: data, so nothing recompiles
        progress = record["generation"] / args.generations
        loop.set_params(F=round(0.9 - 0.4 * progress, 4))

    result = hpcevo.run(cfg, overwrite=True, quiet=True, hooks=[show, anneal],
                        stop_when=[Target(1e-4), Stagnation(generations=150, tolerance=1e-9)])
    s = result.summary
    ctx.print(f"{s['status']} at generation {s['generations']} of {args.generations}: best {s['best_fitness']:.6e}, "
              f"stopped by {s['stopped_by'] or 'nothing (ran to the end)'}")
    ctx.print(f"digest {result.digest}")


if __name__ == "__main__":
    main()
