"""Checkpoint write time and bandwidth for a large population, next to a plain sequential write.

    python benchmarks/checkpoint_io.py                      # 1 and 2 ranks, pop 100,000 x dim 1,000
    python benchmarks/checkpoint_io.py --pop 20000 --dim 500 --ranks 1 2 4
Writes benchmarks/results/checkpoint_io.json and prints a table.

The state is a real CSO state (position and velocity, each pop x dim float32, plus fitness,
loser indices and the PRNG key) and a 1,000-generation history. In the same job, on the same
disk, one after the other and alternating, it measures:
  - ``checkpoint``: hpcevo's collective parallel-HDF5 write (every rank writes its row blocks,
    checksums, flush with MPI_File_sync, atomic rename, directory fsync);
  - ``plain``: rank 0 alone writing the same bytes with numpy ``tofile`` into one file, then fsync:
    the sequential baseline a checkpoint cannot beat by much on one disk.
Both include fsync, so page-cache speed does not flatter either side.

It then measures the time of one CSO generation on Ackley for this population and reports the
checkpoint's share of run time at the default interval (``checkpoint.every`` = 1000
generations, or ``every_seconds`` = 900 s, whichever comes first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(pop: int, dim: int, repeats: int, gens: int, where: str) -> dict:
    from hpcevo.parallel import barrier, bcast_from_root, bind, discover

    ctx = bind(discover(), device="cpu", threads=1)
    import jax
    import numpy as np

    from hpcevo import checkpoint
    from hpcevo.algorithms import CSO
    from hpcevo.checkpoint.layout import flatten_state
    from hpcevo.config import CheckpointSection
    from hpcevo.driver.recording import History
    from hpcevo.problems import make_problem
    from hpcevo.driver.engine import DeviceEngine

    problem = make_problem("ackley", dim)
    algo = CSO(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub)
    wf = DeviceEngine(algo, problem.evaluate, ctx)
    wf.compile(0)
    state, _ = wf.start(0)
    jax.block_until_ready(state)
    t = time.perf_counter()
    state, _ = wf.advance(state, gens)
    gen_s = (time.perf_counter() - t) / gens
    state = jax.device_get(state)
    hist = {k: np.zeros(1000, np.int32 if k == "nonfinite" else np.float64) for k in History._fields}
    snap = checkpoint.Snapshot(1000, 1000 * algo.num_ask, 0, "[run]\n", state, hist, algo.num_init, algo.num_ask)
    leaves = [a for _, a, _ in flatten_state(state)] + list(hist.values())
    nbytes = sum(a.nbytes for a in leaves)

    root_dir = bcast_from_root(ctx, tempfile.mkdtemp(prefix="hpcevo-ckbench-", dir=where) if ctx.is_root else None)
    ckdir = Path(root_dir) / "ck"
    plain = Path(root_dir) / "plain.bin"
    ck_s, plain_s = [], []
    for _ in range(repeats):
        barrier(ctx)
        t = time.perf_counter()
        path = checkpoint.write(ctx, ckdir, snap, keep=1)
        barrier(ctx)
        ck_s.append(time.perf_counter() - t)
        if ctx.is_root:
            size = path.stat().st_size
            path.unlink()
            t = time.perf_counter()
            with open(plain, "wb") as fh:
                for a in leaves:
                    np.ascontiguousarray(a).tofile(fh)
                fh.flush()
                os.fsync(fh.fileno())
            plain_s.append(time.perf_counter() - t)
            plain.unlink()
        barrier(ctx)
    if ctx.is_root:
        shutil.rmtree(root_dir, ignore_errors=True)
    defaults = CheckpointSection()
    interval = min(defaults.every * gen_s, defaults.every_seconds)
    ck_med = statistics.median(ck_s)
    return {
        "ranks": ctx.size,
        "pop_size": pop,
        "dim": dim,
        "state_bytes": int(nbytes),
        "file_bytes": int(size) if ctx.is_root else None,
        "checkpoint_s": ck_s,
        "plain_s": plain_s,
        "checkpoint_s_median": ck_med,
        "plain_s_median": statistics.median(plain_s) if plain_s else None,
        "checkpoint_MBps": nbytes / ck_med / 1e6,
        "plain_MBps": nbytes / statistics.median(plain_s) / 1e6 if plain_s else None,
        "generation_s": gen_s,
        "default_interval_s": interval,
        "checkpoint_share_at_default_interval": ck_med / (ck_med + interval),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pop", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=1_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gens", type=int, default=3, help="generations timed for the per-generation cost")
    ap.add_argument("--dir", default=str(HERE / "results"), help="where the files are written (the disk measured)")
    ap.add_argument("--out", default=str(HERE / "results" / "checkpoint_io.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    if args.worker:
        res = worker(args.pop, args.dim, args.repeats, args.gens, args.dir)
        if res["file_bytes"] is not None:
            print("RESULT " + json.dumps(res), flush=True)
        return
    mpiexec = os.environ.get("MPIEXEC", "mpiexec")
    rows = []
    for n in args.ranks:
        cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker", "--pop", str(args.pop), "--dim",
               str(args.dim), "--repeats", str(args.repeats), "--gens", str(args.gens), "--dir", args.dir]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            sys.exit(f"benchmark at {n} ranks failed:\n{r.stderr}")
        rows.append(json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "checkpoint_io", "host": os.uname().nodename,
                                          "cores": os.cpu_count(), "results": rows}, indent=2) + "\n")
    r0 = rows[0]
    print(f"Checkpoint of a CSO state, pop {r0['pop_size']} x dim {r0['dim']} float32 "
          f"({r0['state_bytes'] / 1e6:.0f} MB of state), median of {args.repeats}, fsync'd, disk of {args.dir}")
    print(f"{'ranks':>5} {'checkpoint s':>13} {'MB/s':>7} {'plain write s':>14} {'MB/s':>7} {'ckpt/plain':>11} "
          f"{'gen s':>7} {'share @ default interval':>25}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['checkpoint_s_median']:>13.2f} {r['checkpoint_MBps']:>7.0f} "
              f"{r['plain_s_median']:>14.2f} {r['plain_MBps']:>7.0f} "
              f"{r['checkpoint_s_median'] / r['plain_s_median']:>11.2f} {r['generation_s']:>7.3f} "
              f"{100 * r['checkpoint_share_at_default_interval']:>24.2f}%")
    print(f"(JSON: {args.out})")


if __name__ == "__main__":
    main()
