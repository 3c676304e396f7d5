"""Per-generation time of CSO on Ackley (pop 1024, dim 100) next to raw MPI on the same bytes.

    python benchmarks/cso_step.py                 # runs jobs at 1 and 2 ranks, prints a table
    python benchmarks/cso_step.py --ranks 1 2 4   # other rank counts
Writes benchmarks/results/cso_step.json. Both sides are measured inside the same job, one after
the other, so the ratio is meaningful on a noisy machine; absolute times are not.

The step's exchange is one allgather of each rank's fitness in whole micro-batch slots (padded to
the busiest rank's count); the raw baselines are mpi4py's buffer Allgather of the per-rank share
of the same fitness bytes (what a plain block split would send) and of the padded slots.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POP, DIM, GENS, REPEATS = 1024, 100, 200, 7


def worker() -> dict:
    from hpcevo.parallel import bind, discover

    ctx = bind(discover(), device="cpu", threads=1)
    import jax
    import numpy as np
    from mpi4py import MPI

    from hpcevo.algorithms import CSO
    from hpcevo.problems import make_problem
    from hpcevo.driver.engine import DeviceEngine

    problem = make_problem("ackley", DIM)
    algo = CSO(pop_size=POP, dim=DIM, lb=problem.lb, ub=problem.ub)
    wf = DeviceEngine(algo, problem.evaluate, ctx)
    wf.compile(0)
    state, _ = wf.start(0)
    state, _ = wf.advance(state, 10)
    jax.block_until_ready(state)
    step = []
    for _ in range(REPEATS):
        ctx.comm_ctl.Barrier()
        t = time.perf_counter()
        state, _ = wf.advance(state, GENS)  # returns after the history reached the host
        jax.block_until_ready(state)
        step.append((time.perf_counter() - t) / GENS)

    comm = ctx.comm_ctl
    ev = wf.generation.later
    n_fit = algo.num_ask
    share = -(-n_fit // ctx.size)
    send = np.zeros(share, np.float32)
    recv = np.empty(share * ctx.size, np.float32)
    padded = np.zeros(ev.slots * ev.mb, np.float32)
    padded_out = np.empty(padded.size * ctx.size, np.float32)

    def timed(fn, reps=2000):
        samples = []
        for _ in range(REPEATS):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t) / reps)
        return statistics.median(samples)

    allgather = timed(lambda: comm.Allgather(send, recv))
    allgather_padded = timed(lambda: comm.Allgather(padded, padded_out))
    return {
        "ranks": ctx.size,
        "pop_size": POP,
        "dim": DIM,
        "evaluations_per_generation": n_fit,
        "fitness_bytes": n_fit * 4,
        "step_s_median": statistics.median(step),
        "step_s_min": min(step),
        "raw_allgather_s": allgather,
        "raw_allgather_padded_s": allgather_padded,
        "allgather_bytes_per_rank": share * 4,
        "allgather_padded_bytes_per_rank": int(padded.nbytes),
        "microbatch_rows": ev.mb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "cso_step.json"))
    args = ap.parse_args()
    if args.worker:
        res = worker()
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print("RESULT " + json.dumps(res), flush=True)
        return
    mpiexec = os.environ.get("MPIEXEC", "mpiexec")
    rows = []
    for n in args.ranks:
        r = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--worker"],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            sys.exit(f"benchmark at {n} ranks failed:\n{r.stderr}")
        rows.append(json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "cso_step", "host": os.uname().nodename,
                                          "cores": os.cpu_count(), "results": rows}, indent=2) + "\n")
    print(f"CSO on Ackley, pop {POP}, dim {DIM}: time per generation vs raw MPI on the same fitness bytes")
    print(f"{'ranks':>5} {'step (us)':>10} {'Allgather (us)':>15} {'padded Allgather (us)':>22} "
          f"{'step/Allgather':>15} {'step/padded':>12}")
    for r in rows:
        us = lambda s: s * 1e6
        print(f"{r['ranks']:>5} {us(r['step_s_median']):>10.1f} {us(r['raw_allgather_s']):>15.2f} "
              f"{us(r['raw_allgather_padded_s']):>22.2f} {r['step_s_median'] / r['raw_allgather_s']:>15.1f} "
              f"{r['step_s_median'] / r['raw_allgather_padded_s']:>12.1f}")
    print(f"(JSON: {args.out})")


if __name__ == "__main__":
    main()
