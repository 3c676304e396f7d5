"""Peak memory per rank of OpenES in the distributed mode (no rank holds the population), next to
the replicated mode and to the size of one copy of the population.

    python benchmarks/es_distributed_memory.py              # the suite below, 2 ranks each
    python benchmarks/es_distributed_memory.py --only big   # just dim 1,000,000 x pop 4,096
Writes benchmarks/results/es_distributed_memory.json and prints a table.

Each configuration runs in a fresh ``mpiexec -n RANKS`` job (peak RSS is per process), a few
generations of OpenES on the sphere function through the real ``Workflow`` (CPU, one thread a
rank). Every rank reads its peak resident set size, ``VmHWM`` in /proc/self/status, twice: after
the start-up (imports, JAX, MPI: ``base``) and after the run (``peak``). The suite:

  - ``big``:   distributed, dim 1,000,000, pop 4,096: one copy of the population is
               4,096 x 1e6 x 4 B = 16.4 GB, more than the replicated mode could hold here;
  - ``mid-r`` / ``mid-d``: replicated and distributed at dim 20,000, pop 4,096 (a population of
               328 MB), side by side: what the replicated mode costs and what the distributed
               one saves at a size both can run.

What the distributed mode holds per rank, by design (hpcevo/parallel/es.py): the state (a few
dim-vectors), one block's noise and candidates ((copies + 1) x block x dim values, plus the
random bits they come from), and the (blocks, 1, dim) buffer of partial sums the ranks gather
(64 x dim by default): O((64 + block) x dim), independent of the population and of the rank count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUITE = {
    "big": {"distributed": True, "dim": 1_000_000, "pop": 4096, "generations": 2},
    "mid-r": {"distributed": False, "dim": 20_000, "pop": 4096, "generations": 3},
    "mid-d": {"distributed": True, "dim": 20_000, "pop": 4096, "generations": 3},
}


def _vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(distributed: bool, dim: int, pop: int, generations: int, out: str) -> None:
    from hpcevo.parallel import bind, discover

    ctx = bind(discover(), device="cpu", threads=1)
    import jax

    from hpcevo.algorithms import OpenES
    from hpcevo.problems import make_problem
    from hpcevo.driver.engine import DeviceEngine

    problem = make_problem("sphere", dim)
    algo = OpenES(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub, distributed=distributed)
    wf = DeviceEngine(algo, problem.evaluate, ctx)
    jax.block_until_ready(jax.numpy.zeros(1))
    base = _vm_hwm_bytes()
    t = time.perf_counter()
    wf.compile(0)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    state, hist = wf.start(0)
    state, more = wf.advance(state, generations - 1)
    best = float(state.best_f)
    run_s = time.perf_counter() - t
    peak = _vm_hwm_bytes()
    rows = ctx.comm_ctl.gather({"rank": ctx.rank, "base_bytes": base, "peak_bytes": peak}, root=0)
    if ctx.is_root:
        Path(out).write_text(json.dumps({
            "ranks": ctx.size, "distributed": distributed, "dim": dim, "pop": pop, "generations": generations,
            "block_rows": algo.block_rows, "blocks": wf.microbatches, "compile_s": compile_s, "run_s": run_s,
            "s_per_generation": run_s / generations, "first_best": float(hist["best"][0]), "final_best": best,
            "population_bytes": pop * dim * 4, "per_rank": rows,
        }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=list(SUITE), default=list(SUITE))
    ap.add_argument("--worker", nargs=5, metavar=("DISTRIBUTED", "DIM", "POP", "GENS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        d, dim, pop, gens, out = args.worker
        worker(d == "1", int(dim), int(pop), int(gens), out)
        return

    results = []
    print(f"{'case':<7}{'mode':>12}{'dim':>10}{'pop':>6}{'population GB':>15}{'rank':>5}{'base GB':>9}"
          f"{'peak GB':>9}{'peak/pop':>10}{'s/gen':>8}", flush=True)
    for name in args.only:
        c = SUITE[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            cmd = ["mpiexec", "-n", str(args.ranks), sys.executable, __file__, "--worker",
                   "1" if c["distributed"] else "0", str(c["dim"]), str(c["pop"]), str(c["generations"]), out]
            subprocess.run(cmd, check=True)
            r = json.loads(Path(out).read_text())
        r["case"] = name
        results.append(r)
        for p in r["per_rank"]:
            print(f"{name:<7}{'distributed' if r['distributed'] else 'replicated':>12}{r['dim']:>10}{r['pop']:>6}"
                  f"{r['population_bytes'] / 1e9:>15.3f}{p['rank']:>5}{p['base_bytes'] / 1e9:>9.3f}"
                  f"{p['peak_bytes'] / 1e9:>9.3f}{p['peak_bytes'] / r['population_bytes']:>10.3f}"
                  f"{r['s_per_generation']:>8.2f}", flush=True)
    path = HERE / "results" / "es_distributed_memory.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # keep the other cases' latest results when only some were run
    old = json.loads(path.read_text())["results"] if path.exists() else []
    ran = {r["case"] for r in results}
    merged = [r for r in old if r.get("case") not in ran] + results
    path.write_text(json.dumps({"results": sorted(merged, key=lambda r: list(SUITE).index(r["case"]))},
                               indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
