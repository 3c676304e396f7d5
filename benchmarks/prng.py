"""What the random numbers cost: each algorithm's generation under JAX's PRNG implementations.

    python benchmarks/prng.py                          # the table, JSON in benchmarks/results/
    python benchmarks/prng.py --rounds 1 --only pso    # quicker

Every algorithm draws its randomness from a JAX key carried in its state. JAX's default
implementation, threefry2x32, is a counter-based hash computed in software: on a CPU core it costs
a few ns per 32-bit word, which a generation that draws per coordinate (PSO's default draws
2 x pop x dim uniforms) pays in full. ``rbg`` and ``unsafe_rbg`` hand the bits to XLA's
RngBitGenerator (Philox on CPUs and GPUs), keeping splits as threefry (``rbg``) or not
(``unsafe_rbg``). Each side runs in its own process (``JAX_DEFAULT_PRNG_IMPL``), one XLA thread,
``DeviceEngine.advance`` of GENS generations on the sphere (cheap, so the draws show),
compilation excluded, the median of REPEATS; the processes alternate over ROUNDS rounds, and the
table gives each implementation's time as a ratio to threefry's from the same round. Each worker
also reports its run's state digest at 1 rank and, with ``--ranks 2``, at 2 ranks: whether an
implementation keeps "the same bits at any rank count" on this machine.
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
IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
# (name, algorithm, hyper-parameters) x (pop, dim)
ALGOS = [("pso", "pso", {}), ("pso per particle", "pso", {"coefficients": "per_particle"}), ("cso", "cso", {}),
         ("de", "de", {}), ("cmaes", "cmaes", {}), ("openes", "openes", {}), ("snes", "snes", {})]
SIZES = [(1024, 100), (64, 10)]
GENS, REPEATS = 100, 5


def worker(only: list[str]) -> dict:
    from hpcevo.parallel import bind, discover

    ctx = bind(discover(), device="cpu", threads=1)
    import jax

    from hpcevo.algorithms import ALGORITHMS
    from hpcevo.driver.engine import DeviceEngine, state_digest
    from hpcevo.problems import make_problem

    rows = []
    for label, name, hyper in ALGOS:
        if only and label.split()[0] not in only:
            continue
        for pop, dim in SIZES:
            problem = make_problem("sphere", dim)
            algo = ALGORITHMS[name](pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub, **hyper)
            engine = DeviceEngine(algo, problem.evaluate, ctx, block_invariant=True)
            engine.compile(0)
            state, _ = engine.start(0)
            state, _ = engine.advance(state, GENS)  # warm-up
            digest = state_digest(state)
            times = []
            for _ in range(REPEATS):
                ctx.comm_ctl.Barrier()
                t = time.perf_counter()
                state, _ = engine.advance(state, GENS)
                jax.block_until_ready(state)
                times.append((time.perf_counter() - t) / GENS * 1e3)
            rows.append({"algorithm": label, "pop": pop, "dim": dim, "ms": statistics.median(times),
                         "digest": digest[:16]})
    return {"impl": jax.config.jax_default_prng_impl, "ranks": ctx.size, "rows": rows}


def _run(impl: str, ranks: int, only: list[str]) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--worker", *(["--only", *only] if only else [])]
    if ranks > 1:
        cmd = [os.environ.get("HPCEVO_MPIEXEC", "mpiexec"), "-n", str(ranks), *cmd]
    env = os.environ | {"JAX_DEFAULT_PRNG_IMPL": impl, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1], help="rank counts whose digests are compared")
    ap.add_argument("--only", nargs="+", default=[], help="algorithms by name (pso, cso, de, cmaes, openes, snes)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=HERE / "results" / f"prng-{time.strftime('%Y-%m-%d-%H%M')}.json")
    args = ap.parse_args(argv)
    if args.worker:
        res = worker(args.only)
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print("RESULT " + json.dumps(res), flush=True)
        return 0
    rounds = []
    for r in range(args.rounds):
        rounds.append({impl: _run(impl, 1, args.only) for impl in IMPLS})
        print(f"[prng] round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    digests = {impl: {n: _run(impl, n, args.only) for n in args.ranks if n > 1} for impl in IMPLS}
    table = []
    for i, row in enumerate(rounds[0]["threefry2x32"]["rows"]):
        entry = {"algorithm": row["algorithm"], "pop": row["pop"], "dim": row["dim"]}
        for impl in IMPLS:
            ms = [rd[impl]["rows"][i]["ms"] for rd in rounds]
            ratio = [rd[impl]["rows"][i]["ms"] / rd["threefry2x32"]["rows"][i]["ms"] for rd in rounds]
            same = all(d["rows"][i]["digest"] == rounds[0][impl]["rows"][i]["digest"] for d in digests[impl].values())
            entry[impl] = {"ms": statistics.median(ms), "ratio": statistics.median(ratio),
                           "digest": rounds[0][impl]["rows"][i]["digest"], "same_at_other_ranks": same}
        table.append(entry)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gens": GENS, "repeats": REPEATS, "rounds": args.rounds, "ranks": args.ranks,
                                    "table": table, "raw": rounds, "digests_at_ranks": digests}, indent=1))
    print("| algorithm | pop | dim | " + " | ".join(f"{i} (ms)" for i in IMPLS) + " | rbg / threefry | unsafe_rbg / threefry |"
          + (" same bits at " + ",".join(map(str, args.ranks)) + " ranks |" if len(args.ranks) > 1 else ""))
    print("|---" * (5 + len(IMPLS) + (len(args.ranks) > 1)) + "|")
    for e in table:
        cells = [e["algorithm"], str(e["pop"]), str(e["dim"])] + [f"{e[i]['ms']:.4f}" for i in IMPLS]
        cells += [f"{e['rbg']['ratio']:.2f}", f"{e['unsafe_rbg']['ratio']:.2f}"]
        if len(args.ranks) > 1:
            cells.append(" ".join(f"{i}: {'yes' if e[i]['same_at_other_ranks'] else 'NO'}" for i in IMPLS))
        print("| " + " | ".join(cells) + " |")
    print(f"[prng] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
