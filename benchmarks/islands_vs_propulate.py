"""hpcevo's island model next to Propulate's: evaluations per second and final best on Rastrigin,
same problem, same evaluation budget, 2 MPI ranks, one island per rank.

    python benchmarks/islands_vs_propulate.py                          # 3 seeds, 20,000 evaluations, D = 20
    python benchmarks/islands_vs_propulate.py --evals 2000 --seeds 1   # a quick look
    python benchmarks/islands_vs_propulate.py --dim 50 --algorithm de
Writes benchmarks/results/islands_vs_propulate.json and prints a table: per side, the evaluations,
the median wall time and evaluations per second, and the median (min, max) final best over seeds.

Each (side, seed) is a fresh ``mpiexec -n 2`` job (``mpiexec`` on PATH, or $HPCEVO_MPIEXEC) running
this script as a worker; rank 0 prints one ``RESULT {json}`` line. Propulate is a benchmark-only
dependency, never a runtime one: ``pip install -e .[bench]``. Propulate 1.1 is the release that
fits hpcevo's stack (1.2 pins matplotlib 3.8 and GPy 1.13, which needs numpy < 2).

The problem: Rastrigin in D dimensions, x_i in [-5.12, 5.12], f = 10 D + sum(x_i^2 - 10 cos(2 pi x_i)),
minimised, optimum 0. Both sides compute it as sum(x_i^2 + 20 sin^2(pi x_i)) (the same function,
hpcevo's form); hpcevo in float32 (its default), Propulate in float64 (Python floats).

The budget (--evals, total over the job) is met exactly on the Propulate side and as closely as
the generation structure allows on the hpcevo side; the table shows each side's real count.

- Propulate (``Islands``, asynchronous): 2 islands of one worker each; a worker breeds and
  evaluates one individual per generation, in Python, so generations = evals / 2 per rank.
  Operators: ``get_default_propagator`` with the values of Propulate's tutorials (crossover 0.7,
  point mutation 0.4, random re-initialisation 0.1, interval-mutation sigma 0.05 x width) and a
  breeding pool of --propulate-pop (16) best individuals. Migration as in the tutorials: fully
  connected topology, 1 migrant (the island's best, ``SelectMin``) to every other island with
  probability 0.9 after each generation, real migration (the emigrant leaves its island) unless
  --pollination (a copy leaves and replaces the target's worst, ``SelectMax``). Islands run
  unsynchronised, migrants arrive whenever they arrive: a run is not reproducible even with a fixed
  seed (each rank's ``random.Random`` is seeded from seed and rank). Propulate pickles its island's
  whole population to a checkpoint after every generation; that is how it runs, so it is timed, in
  a fresh temporary directory per rank (a leftover checkpoint there would be resumed from).
  Timed: ``propulate()`` alone, between barriers. Best: the minimum loss over every individual
  each rank holds (its own and immigrants), reduced over ranks.
- hpcevo (``Archipelago``, synchronous): 2 islands of --algorithm (CSO by default), population
  --pop (100) each, generations in lock step; each generation is jitted and evaluates a whole batch
  (CSO: the population in generation 1, then only the pop/2 losers; DE and PSO: the population
  every generation), so G is chosen from ``num_init`` and ``num_ask``. Migration: --migrants (2)
  best per island to the next island after every --migrate-every (20) generations, replacing its
  worst (ring; with 2 islands the same as fully connected); a small budget can leave fewer
  generations than that, and no migration (the driver says so). Bitwise reproducible for a seed.
  CPU, one XLA thread per rank, as Propulate's workers have one core each. Timed: ``init`` +
  ``advance`` (compilation done before, by ``compile``) and reading the best, between barriers.

Propulate's cost per evaluation grows with the run: each generation pickles the island's whole
history and scans it (breeding pool, migration), so its time grows about quadratically with --evals
(here, 2 cores: ~7 s at 2,000 evaluations, ~40 s at 4,000; expect on the order of a quarter of an
hour per run at the default 20,000). Its evaluations per second are therefore quoted at a budget.
Two things done to Propulate here, neither changing what it computes: a send it makes to its own
rank is posted non-blocking (see ``_SelfSendAsIsend``: with one worker per island it deadlocks on
MPICH 4 otherwise), and a pkg_resources stand-in for its import (see ``_import_propulate``).
Its banner goes to the worker's stdout, which the driver reads only for the RESULT line.

What the comparison is not: the two sides search differently (Propulate: a steady-state GA over
its whole evaluated history; hpcevo: a swarm or DE generation after generation), and one Rastrigin
evaluation costs microseconds, so evaluations per second measure each framework's overhead per
evaluation, not a problem's cost. With an expensive problem (seconds per evaluation) the overheads
vanish, and Propulate's asynchrony (no rank waits for a slow evaluation) is what it is made for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOUND = 5.12
SIDES = ("propulate", "hpcevo")


# -- workers (run under mpiexec) -------------------------------------------------------------------
def _import_propulate():
    """Propulate 1.1 reads its own version through pkg_resources, which setuptools 81+ no longer
    ships (hpcevo's stack pins setuptools 84); answer that one call from importlib.metadata."""
    try:
        import pkg_resources  # noqa: F401

        import propulate
        return propulate
    except ModuleNotFoundError as e:
        if e.name != "pkg_resources":
            raise
    import importlib.metadata
    import types

    shim = types.ModuleType("pkg_resources")
    shim.DistributionNotFound = importlib.metadata.PackageNotFoundError
    shim.get_distribution = lambda name: types.SimpleNamespace(version=importlib.metadata.version(name))
    sys.modules["pkg_resources"] = shim
    try:
        import propulate
    finally:
        del sys.modules["pkg_resources"]
    return propulate


class _SelfSendAsIsend:
    """An island's communicator for Propulate, unchanged but for sends to the sender itself.

    Propulate hands its checkpoint token to the island's next worker with a blocking ``send``
    and receives it later; on a one-worker island that is a send to itself, which MPICH 4 (ch4)
    does not buffer, so the worker blocks forever in its first generation. Such sends are posted
    as ``isend`` here (the token's receive follows in the same generation) and waited for at the end.
    """

    def __init__(self, comm):
        self._comm, self._pending = comm, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def send(self, obj, dest, tag=0):
        if dest != self._comm.rank:
            return self._comm.send(obj, dest=dest, tag=tag)
        self._pending = [r for r in self._pending if not r.Test()]
        self._pending.append(self._comm.isend(obj, dest=dest, tag=tag))

    def finish(self) -> None:
        from mpi4py import MPI

        MPI.Request.Waitall(self._pending)
        self._pending = []


def propulate_worker(args: argparse.Namespace) -> None:
    import random

    import numpy as np
    from mpi4py import MPI

    propulate = _import_propulate()
    comm = MPI.COMM_WORLD
    dim = args.dim
    names = [f"x{i}" for i in range(dim)]
    limits = {n: (-BOUND, BOUND) for n in names}
    count = 0

    def loss(params) -> float:
        nonlocal count
        count += 1
        x = np.fromiter((params[n] for n in names), np.float64, dim)
        s = np.sin(np.pi * x)
        return float(np.sum(x * x + 20.0 * s * s))

    # seed * size + rank: distinct streams for every (seed, rank), unlike the tutorials' seed + rank
    rng = random.Random(args.seed * comm.size + comm.rank)
    propagator = propulate.get_default_propagator(args.propulate_pop, limits, mate_prob=0.7, mut_prob=0.4,
                                                  random_prob=0.1, sigma_factor=0.05, rng=rng)
    generations = args.evals // comm.size
    with tempfile.TemporaryDirectory(prefix="propulate-ckpt-") as ckpt:
        islands = propulate.Islands(loss, propagator, rng, generations=generations, num_islands=comm.size,
                                    migration_probability=0.9, pollination=args.pollination,
                                    checkpoint_path=ckpt)
        island_comm = islands.propulator.comm = _SelfSendAsIsend(islands.propulator.comm)
        comm.Barrier()
        t = time.perf_counter()
        # propulate() without Islands.evolve's summarize: its unique-individual scan is quadratic in
        # the history and would dwarf the run at this budget; the best is read below instead.
        islands.propulator.propulate(logging_interval=generations + 1, debug=0)
        comm.Barrier()
        wall = time.perf_counter() - t
        island_comm.finish()
        best = comm.allreduce(min(ind.loss for ind in islands.propulator.population), op=MPI.MIN)
        evaluations = comm.allreduce(count)
    if comm.rank == 0:
        _report({"side": "propulate", "seed": args.seed, "algorithm": "propulate-default",
                 "version": propulate.__version__, "ranks": comm.size, "islands": comm.size,
                 "pop": args.propulate_pop, "generations_per_rank": generations,
                 "pollination": args.pollination, "evaluations": evaluations, "wall_s": wall,
                 "evals_per_s": evaluations / wall, "best": float(best)})


def hpcevo_generations(algorithms, budget: int) -> int:
    """G with sum(num_init + (G - 1) num_ask) over the islands nearest to ``budget`` (G >= 1)."""
    first = sum(a.num_init for a in algorithms)
    later = sum(a.num_ask for a in algorithms)
    return 1 + max(0, round((budget - first) / later))


def hpcevo_worker(args: argparse.Namespace) -> None:
    import hpcevo

    # bind before JAX starts: one XLA thread per rank, like Propulate's one core per worker
    ctx = hpcevo.parallel.init(device=args.device, threads=1)
    from hpcevo.algorithms import CSO, DE, PSO
    from hpcevo.problems import make_problem

    cls = {"cso": CSO, "de": DE, "pso": PSO}[args.algorithm]
    problem = make_problem("rastrigin", args.dim)
    algorithms = [cls(pop_size=args.pop, dim=args.dim, lb=problem.lb, ub=problem.ub) for _ in range(ctx.size)]
    arch = hpcevo.Archipelago(algorithms, problem, ctx,
                              hpcevo.Migration(every=args.migrate_every, migrants=args.migrants))
    generations = hpcevo_generations(algorithms, args.evals)
    arch.compile(args.seed)
    ctx.comm_ctl.Barrier()
    t = time.perf_counter()
    arch.init(args.seed)
    arch.advance(generations - 1)
    best = arch.best_fitness
    ctx.comm_ctl.Barrier()
    wall = time.perf_counter() - t
    if ctx.is_root:
        _report({"side": "hpcevo", "seed": args.seed, "algorithm": args.algorithm, "version": hpcevo.__version__,
                 "ranks": ctx.size, "islands": len(algorithms), "pop": args.pop, "generations": generations,
                 "migrate_every": args.migrate_every, "migrants": args.migrants, "device": ctx.device_kind,
                 "evaluations": arch.evaluations, "wall_s": wall, "evals_per_s": arch.evaluations / wall,
                 "best": float(best)})


def _report(row: dict) -> None:
    print("RESULT " + json.dumps(row), flush=True)


# -- driver ----------------------------------------------------------------------------------------
def run_job(side: str, seed: int, args: argparse.Namespace) -> dict:
    mpiexec = os.environ.get("HPCEVO_MPIEXEC", "mpiexec")
    cmd = [mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--worker", side, "--seed", str(seed),
           "--evals", str(args.evals), "--dim", str(args.dim), "--algorithm", args.algorithm, "--pop", str(args.pop),
           "--migrate-every", str(args.migrate_every), "--migrants", str(args.migrants),
           "--propulate-pop", str(args.propulate_pop), "--device", args.device]
    if args.pollination:
        cmd.append("--pollination")
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise SystemExit(f"{side} worker (seed {seed}) failed with exit status {out.returncode}: {' '.join(cmd)}")
    return json.loads(lines[-1][len("RESULT "):])


def summarize(rows: list[dict]) -> dict:
    best = [r["best"] for r in rows]
    return {"runs": len(rows), "evaluations": rows[0]["evaluations"],
            "wall_s": statistics.median(r["wall_s"] for r in rows),
            "evals_per_s": statistics.median(r["evals_per_s"] for r in rows),
            "best_median": statistics.median(best), "best_min": min(best), "best_max": max(best)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=20_000, help="evaluations per run, over the whole job")
    ap.add_argument("--seeds", type=int, default=3, help="runs per side, seeds 0 .. SEEDS-1")
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2, help="MPI ranks, one island each")
    ap.add_argument("--algorithm", choices=["cso", "de", "pso"], default="cso", help="hpcevo's islands")
    ap.add_argument("--pop", type=int, default=100, help="hpcevo: population per island")
    ap.add_argument("--migrate-every", type=int, default=20, help="hpcevo: generations between migrations")
    ap.add_argument("--migrants", type=int, default=2, help="hpcevo: migrants per island and migration")
    ap.add_argument("--propulate-pop", type=int, default=16, help="Propulate: breeding pool per island")
    ap.add_argument("--pollination", action="store_true", help="Propulate: pollination, not real migration")
    ap.add_argument("--device", default="cpu", help="hpcevo: cpu, gpu or auto")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "propulate":
        return propulate_worker(args)
    if args.worker == "hpcevo":
        return hpcevo_worker(args)
    if args.evals < args.ranks:
        ap.error(f"--evals must be at least --ranks ({args.ranks})")

    runs = []
    for seed in range(args.seeds):
        for side in SIDES:
            r = run_job(side, seed, args)
            runs.append(r)
            print(f"seed {seed} {side:<9} {r['evaluations']:>8} evaluations {r['wall_s']:>9.3f} s "
                  f"{r['evals_per_s']:>11.0f} evals/s  best {r['best']:.6g}", flush=True)
    summary = {side: summarize([r for r in runs if r["side"] == side]) for side in SIDES}
    path = HERE / "results" / "islands_vs_propulate.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("evals", "seeds", "dim", "ranks", "algorithm", "pop", "migrate_every",
                                             "migrants", "propulate_pop", "pollination", "device")}
    path.write_text(json.dumps({"problem": "rastrigin", "config": config, "cores": os.cpu_count(),
                               "summary": summary, "runs": runs}, indent=1) + "\n")

    labels = {"propulate": f"Propulate {runs[0]['version']} (async, pool {args.propulate_pop})",
              "hpcevo": f"hpcevo {args.algorithm.upper()} (sync, pop {args.pop})"}
    print()
    print("| side | evaluations | wall s (median) | evals/s (median) | best: median | min | max |")
    print("|---|---|---|---|---|---|---|")
    for side in SIDES:
        s = summary[side]
        print(f"| {labels[side]} | {s['evaluations']} | {s['wall_s']:.3f} | {s['evals_per_s']:.0f} | "
              f"{s['best_median']:.6g} | {s['best_min']:.6g} | {s['best_max']:.6g} |")
    if summary["hpcevo"]["evaluations"] != summary["propulate"]["evaluations"]:
        print(f"note: hpcevo's generations cannot meet {args.evals} evaluations exactly "
              f"(num_init + (G - 1) num_ask per island); it ran {summary['hpcevo']['evaluations']}")
    gens = min(r["generations"] for r in runs if r["side"] == "hpcevo")
    if gens < args.migrate_every:
        print(f"note: hpcevo ran {gens} generations, fewer than --migrate-every {args.migrate_every}: "
              "its islands never migrated")
    ratio = summary["hpcevo"]["evals_per_s"] / summary["propulate"]["evals_per_s"]
    print(f"(Rastrigin D = {args.dim}, {args.ranks} ranks, one island each, {args.seeds} seed(s); "
          f"hpcevo / Propulate evaluations per second: {ratio:.1f}x; {path})")


if __name__ == "__main__":
    main()
