"""What a migration costs: hpcevo's island migration beside a raw MPI exchange of the same bytes.

    python benchmarks/islands_migration.py                    # 2, 3 and 4 ranks, 100 migrants x dim 100
    python benchmarks/islands_migration.py --ranks 2 4 --migrants 50 --dim 1000
Writes benchmarks/results/islands_migration.json and prints a table.

One island per rank (CSO, population 2 x migrants, Rastrigin). In the same job, one after the
other, each call between barriers, the fastest of --repeats (slowest rank):
  - ``in the step``: what migration adds to a generation where it runs inside the jitted
    step, as it does in a run: 200 generations migrating after every one, less 200 without
    migration, over 200 (choose the emigrants by a sort, one mpi4jax allgather, pick the
    immigrants by the topology, replace the worst);
  - ``migration call``: the same migration as a jitted call of its own (adds one dispatch);
  - ``exchange call``: its allgather alone as a jitted call (``gather_islands``);
  - ``raw allgather``: mpi4py ``Allgather`` of the same bytes from NumPy buffers, no JAX;
  - ``raw ring``: mpi4py ``Sendrecv`` of one island's emigrants to the next rank, the cheapest
    a ring topology could be (the alternative the allgather was measured against);
and one generation of one island, for the share of a run migration takes at migrate_every = 50.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENS = 200  # generations per timed dispatch of the in-step measurement


def _best_time(ctx, call, repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        ctx.comm_ctl.Barrier()
        t = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t)
    return max(ctx.comm_ctl.allgather(best))


def worker(migrants: int, dim: int, repeats: int) -> None:
    from hpcevo.parallel import bind, discover

    ctx = bind(discover(), device="cpu", threads=1)
    import jax
    import numpy as np

    import hpcevo
    from hpcevo.algorithms import CSO
    from hpcevo.parallel.islands import gather_islands
    from hpcevo.problems import make_problem

    problem = make_problem("rastrigin", dim)
    algorithms = [CSO(pop_size=2 * migrants, dim=dim, lb=problem.lb, ub=problem.ub) for _ in range(ctx.size)]
    arch = hpcevo.Archipelago(algorithms, problem, ctx, hpcevo.Migration(every=50, migrants=migrants)).init(0)
    every = hpcevo.Archipelago(algorithms, problem, ctx, hpcevo.Migration(every=1, migrants=migrants)).init(0)
    never = hpcevo.Archipelago(algorithms, problem, ctx, hpcevo.Migration(every=1, migrants=0)).init(0)
    t_every = t_never = float("inf")
    for _ in range(max(3, repeats // 5)):  # alternating, so a slow spell of the machine hits both
        t_every = min(t_every, _best_time(ctx, lambda: every.advance(GENS), 1))
        t_never = min(t_never, _best_time(ctx, lambda: never.advance(GENS), 1))
    eng, key = arch.engine, jax.random.PRNGKey(0)
    migrate = jax.jit(lambda s: eng._migrate(s, key, jax.numpy.asarray(50, jax.numpy.int32)))
    rows = jax.numpy.zeros((1, migrants, dim + 1), jax.numpy.float32)
    exchange = jax.jit(lambda r: gather_islands(r, eng.layout, ctx))
    send = np.zeros((migrants, dim + 1), np.float32)
    recv = np.empty((ctx.size, migrants, dim + 1), np.float32)
    ring = np.empty_like(send)
    right, left = (ctx.rank + 1) % ctx.size, (ctx.rank - 1) % ctx.size
    r = {
        "ranks": ctx.size, "migrants": migrants, "dim": dim, "bytes_per_island": send.nbytes,
        "in_step_s": (t_every - t_never) / GENS, "generation_s": t_never / GENS,
        "migration_s": _best_time(ctx, lambda: jax.block_until_ready(migrate(arch.state)), repeats),
        "exchange_s": _best_time(ctx, lambda: jax.block_until_ready(exchange(rows)), repeats),
        "raw_allgather_s": _best_time(ctx, lambda: ctx.comm_ctl.Allgather(send, recv), repeats),
        "raw_ring_s": _best_time(ctx, lambda: ctx.comm_ctl.Sendrecv(send, right, 0, ring, left, 0), repeats),
    }
    if ctx.is_root:
        print("RESULT " + json.dumps(r), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--migrants", type=int, default=100)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.migrants, args.dim, args.repeats)
    mpiexec = os.environ.get("HPCEVO_MPIEXEC", "mpiexec")
    rows = []
    for n in args.ranks:
        out = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--worker", "--migrants",
                              str(args.migrants), "--dim", str(args.dim), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[7:]))
    path = HERE / "results" / "islands_migration.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    print("| ranks | migration in the step (ms) | as its own call (ms) | its allgather as a call (ms) | "
          "raw Allgather (ms) | raw ring Sendrecv (ms) | in the step / raw Allgather | one generation (ms) | "
          "share of a run at migrate_every 50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = r["in_step_s"] / (50 * r["generation_s"] + r["in_step_s"])
        print(f"| {r['ranks']} | {r['in_step_s'] * 1e3:.3f} | {r['migration_s'] * 1e3:.3f} | {r['exchange_s'] * 1e3:.3f} | "
              f"{r['raw_allgather_s'] * 1e3:.3f} | {r['raw_ring_s'] * 1e3:.3f} | "
              f"{r['in_step_s'] / r['raw_allgather_s']:.1f} | {r['generation_s'] * 1e3:.3f} | {share:.2%} |")
    print(f"({args.migrants} migrants x dim {args.dim} per island, one island per rank, "
          f"{rows[0]['bytes_per_island']} bytes each; {path})")


if __name__ == "__main__":
    main()
