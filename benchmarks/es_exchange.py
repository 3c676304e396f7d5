"""The distributed ES exchange alone: bitwise-OR allreduce of zero-padded buffers (the first
design) against the slot allgather hpcevo uses (``hpcevo.parallel.evaluate.gather_slots``).

    mpiexec -n 2 python benchmarks/es_exchange.py            # 64 partials of 10^6 floats
    mpiexec -n 4 python benchmarks/es_exchange.py --dim 20000
Prints one line on rank 0 (min of --repeats calls, each between barriers) and writes
benchmarks/results/es_exchange-<ranks>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import mpi4jax
    from mpi4py import MPI

    from hpcevo.parallel import context_for
    from hpcevo.parallel.evaluate import gather_slots, slot_layout

    ctx = context_for(MPI.COMM_WORLD)
    k, d = args.blocks, args.dim
    slots, order = slot_layout(k, ctx.size)
    padded = jnp.zeros((k, 1, d), jnp.uint32)
    mine = jnp.zeros((slots, 1, d), jnp.float32)
    or_merge = jax.jit(lambda v: mpi4jax.allreduce(v, op=MPI.BOR, comm=ctx.comm_jax))
    gather = jax.jit(lambda v: gather_slots(v, order, ctx))

    def timed(f, v):
        f(v).block_until_ready()
        best = float("inf")
        for _ in range(args.repeats):
            ctx.comm_ctl.Barrier()
            t = time.perf_counter()
            f(v).block_until_ready()
            best = min(best, time.perf_counter() - t)
        return max(ctx.comm_ctl.allgather(best))

    t_or, t_gather = timed(or_merge, padded), timed(gather, mine)
    if ctx.is_root:
        r = {"ranks": ctx.size, "blocks": k, "dim": d, "or_allreduce_s": t_or, "allgather_s": t_gather}
        print(f"{ctx.size} ranks, {k} x {d} floats: OR allreduce {t_or * 1e3:.1f} ms, "
              f"slot allgather {t_gather * 1e3:.1f} ms, ratio {t_or / t_gather:.2f}")
        out = HERE / "results" / f"es_exchange-{ctx.size}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    main()
