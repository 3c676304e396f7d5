"""Run a config from Python: the run `hpcevo run examples/cso.toml` makes, then read it back.

    python examples/api_run.py                          # one rank, no launcher
    mpiexec -n 4 python examples/api_run.py             # the same digest on 4 ranks
    python examples/api_run.py --generations 50 --out /tmp/api-run
"""

import argparse
import json
from pathlib import Path

import hpcevo

CONFIG = Path(__file__).resolve().parent / "cso.toml"


def main(argv=None):
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--generations", type=int, default=200)
    args.add_argument("--out", default="runs/api-run", help="run directory (replaced if it exists)")
    args = args.parse_args(argv)

    ctx = hpcevo.parallel.init()  # rank, size, device: before the first JAX computation
    cfg = hpcevo.load_config(CONFIG, overrides=[f"run.generations={args.generations}",
                                                f"run.out={json.dumps(args.out)}"])
    result = hpcevo.run(cfg, overwrite=True, quiet=True)  # every rank calls it; every rank gets it

    run = hpcevo.open_run(result.run_dir)  # what the run directory holds, read back
    metrics = run.metrics
    ctx.print(f"{cfg.algorithm.name} on {cfg.problem.name}: best fitness {result.best_fitness:.6e} after "
              f"{result.evaluations} evaluations on {ctx.size} rank(s) {ctx.hosts}")
    ctx.print(f"logged at generations {metrics['generation'].tolist()}; best there "
              f"{[f'{b:.3e}' for b in metrics['best']]}; {len(run.checkpoints)} checkpoint(s)")
    ctx.print(f"history: {len(result.history['best'])} generations, best first {result.history['best'][0]:.3e}")
    ctx.print(f"digest {result.digest}")


if __name__ == "__main__":
    main()
