"""Dynamic vs static scheduling of host evaluations whose cost varies 10x between candidates.

    python benchmarks/host_dynamic.py                        # 2 and 3 ranks
    python benchmarks/host_dynamic.py --ranks 2 3 4 --pop 96 --base-ms 2 --concurrency 2
Writes benchmarks/results/host_dynamic.json and prints a table.

The problem is a host problem of one candidate that sleeps ``base_ms * (1 + 9 u)`` and returns
the sphere value: every evaluation costs between 1x and 10x the base. Three cost models, ``u`` in
[0, 1]:
  - ``hash``: a hash of the candidate's bytes: costs independent of each other and of the index;
  - ``x0``: the first coordinate's place in the box, (x0 - lb) / (ub - lb): a simulator whose run
    time grows with a parameter. DE's trial i descends from individual i, so dear candidates
    tend to stay at the same indices from one generation to the next, as they do in practice.
  - ``index``: the candidate's place in the population, index / (pop - 1): costs correlated with
    the position (a population kept in some order, a sweep). The case fixed contiguous blocks
    handle worst: the last rank gets all the dear candidates.
Sleeping stands in for a simulator process: it takes no CPU, so the figures measure scheduling,
not contention for the cores of a shared machine.

In one MPI job per rank count, both host workflows (``evaluation.schedule`` = static: fixed
contiguous blocks; dynamic: a rank takes the next candidate when it is free) run the same
seed, so they evaluate the very same candidates, alternately, ``--repeats`` times; the table
gives median wall time per generation, the ratio dynamic / static, and two references from the
costs actually drawn: ``ideal`` (the total cost shared perfectly) and the static schedule's own
bound (its most loaded rank). A second pair of runs with no sleep at all measures what the
dispatcher costs per task. Both schedules must end in the same state (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent


LB, UB = -5.0, 5.0
COSTS = ("hash", "x0", "index")


def cost_s(x, index: int, pop: int, base_ms: float, model: str) -> float:
    if model == "hash":
        u = (zlib.crc32(x.tobytes()) % 10_000) / 9_999
    elif model == "x0":
        u = min(max((x[0] - LB) / (UB - LB), 0.0), 1.0)
    else:
        u = index / max(pop - 1, 1)
    return base_ms * 1e-3 * (1 + 9 * u)


def worker(pop: int, dim: int, gens: int, repeats: int, base_ms: float, concurrency: int, model: str) -> dict | None:
    from hpcevo.parallel import barrier, bind, context_for, discover, shard_of

    ctx = bind(discover(), device="cpu", threads=1)
    import numpy as np
    from mpi4py import MPI

    from hpcevo.algorithms import DE
    from hpcevo.driver.host_engine import HostEngine
    from hpcevo.problems.host import CallableProblem
    from hpcevo.driver.engine import state_digest

    box = ((LB,) * dim, (UB,) * dim)
    algo = DE(pop_size=pop, dim=dim, lb=box[0], ub=box[1])

    class Costly(CallableProblem):
        """The sphere, one candidate per call, after ``pay(cost in seconds)``."""

        pay = staticmethod(time.sleep)

        def evaluate_rows(self, x, first, generation):
            for i, row in enumerate(x):
                self.pay(cost_s(row, first + i, pop, self.base_ms, model))
            return super().evaluate_rows(x, first, generation)

    def problem(pay, base: float):
        p = Costly("slow_sphere", dim, *box, lambda x: float(np.sum(x * x)), batched=False)
        object.__setattr__(p, "pay", pay)
        object.__setattr__(p, "base_ms", base)
        return p

    def run(wf) -> tuple[float, str]:
        barrier(ctx)
        t = time.perf_counter()
        state, _ = wf.start(0)
        state, _ = wf.advance(state, gens - 1)
        barrier(ctx)
        return (time.perf_counter() - t) / gens, state_digest(state)

    out = {"ranks": ctx.size, "cost_model": model, "pop_size": pop, "dim": dim, "generations": gens,
           "base_ms": base_ms, "concurrency": concurrency}
    for label, base in (("slow", base_ms), ("no_sleep", 0.0)):
        wfs = {s: HostEngine(algo, problem(time.sleep, base), ctx, concurrency=concurrency, schedule=s)
               for s in ("static", "dynamic")}
        for wf in wfs.values():
            wf.compile(0)
        times: dict[str, list[float]] = {s: [] for s in wfs}
        digests = {}
        for _ in range(repeats):
            for s, wf in wfs.items():
                dt, digests[s] = run(wf)
                times[s].append(dt)
        for wf in wfs.values():
            wf.close()
        med = {s: statistics.median(v) for s, v in times.items()}
        out[label] = {"static_s_per_gen": med["static"], "dynamic_s_per_gen": med["dynamic"],
                      "ratio": med["dynamic"] / med["static"], "all_s": times,
                      "same_state": digests["static"] == digests["dynamic"]}
    if not ctx.is_root:
        return None
    # The costs the runs drew: the same run on one rank, pricing each candidate instead of sleeping
    # (one rank, static, one at a time: candidates come in generation and index order).
    costs: list[float] = []

    wf = HostEngine(algo, problem(costs.append, base_ms), context_for(MPI.COMM_SELF))
    state, _ = wf.start(0)
    wf.advance(state, gens - 1)
    wf.close()
    per_gen = np.asarray(costs).reshape(gens, pop)
    static_bound = sum(max(g[f : f + k].sum() for f, k in (shard_of(pop, 1, ctx.size, r) for r in range(ctx.size)))
                       for g in per_gen)
    out["ideal_s_per_gen"] = per_gen.sum() / ctx.size / concurrency / gens
    out["static_bound_s_per_gen"] = static_bound / concurrency / gens
    out["cost_ms_min_max"] = [1e3 * per_gen.min(), 1e3 * per_gen.max()]
    ns = out["no_sleep"]
    out["dispatch_us_per_task"] = 1e6 * (ns["dynamic_s_per_gen"] - ns["static_s_per_gen"]) / pop
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--pop", type=int, default=24)
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base-ms", type=float, default=5.0, help="cheapest evaluation; the dearest is 10x")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--costs", nargs="+", choices=COSTS, default=list(COSTS), help="cost models (see above)")
    ap.add_argument("--out", default=str(HERE / "results" / "host_dynamic.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        for model in args.costs:
            res = worker(args.pop, args.dim, args.gens, args.repeats, args.base_ms, args.concurrency, model)
            if res is not None:
                print("RESULT " + json.dumps(res), flush=True)
        return
    mpiexec = os.environ.get("MPIEXEC", "mpiexec")
    rows = []
    for n in args.ranks:
        cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker", "--pop", str(args.pop), "--dim",
               str(args.dim), "--gens", str(args.gens), "--repeats", str(args.repeats), "--base-ms",
               str(args.base_ms), "--concurrency", str(args.concurrency), "--costs", *args.costs]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            sys.exit(f"benchmark at {n} ranks failed:\n{r.stderr}")
        rows += [json.loads(x[7:]) for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "host_dynamic", "host": os.uname().nodename,
                                          "cores": os.cpu_count(), "results": rows}, indent=2) + "\n")
    r0 = rows[0]
    print(f"DE, pop {r0['pop_size']}, dim {r0['dim']}, {r0['generations']} generations; an evaluation sleeps "
          f"{r0['base_ms']:g}..{10 * r0['base_ms']:g} ms, concurrency {r0['concurrency']}; median of "
          f"{args.repeats}, seconds per generation")
    print(f"{'ranks':>5} {'costs':>5} {'static':>8} {'dynamic':>8} {'dyn/static':>11} {'ideal':>8} {'static bound':>13} "
          f"{'same state':>11} {'dispatch us/task':>17}")
    for r in rows:
        s = r["slow"]
        print(f"{r['ranks']:>5} {r['cost_model']:>5} {s['static_s_per_gen']:>8.3f} {s['dynamic_s_per_gen']:>8.3f} {s['ratio']:>11.3f} "
              f"{r['ideal_s_per_gen']:>8.3f} {r['static_bound_s_per_gen']:>13.3f} "
              f"{str(s['same_state'] and r['no_sleep']['same_state']):>11} {r['dispatch_us_per_task']:>17.0f}")
    print(f"(JSON: {args.out})")


if __name__ == "__main__":
    main()
