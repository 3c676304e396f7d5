"""The user's own ask/evaluate/tell loop against ``Loop.advance``: what research code costs.

    python benchmarks/ask_tell.py                    # one rank
    mpiexec -n 2 python benchmarks/ask_tell.py       # the evaluation split over 2 ranks

For each algorithm (pop 1,024, dim 100, Rastrigin), milliseconds per generation of:

  - ``advance``: ``Loop.advance(256)``, hpcevo's own loop (one jitted dispatch of 256 generations);
  - ``scan``: the user's ``jax.jit`` of a ``lax.scan`` over ``loop.functions()`` (ask, evaluate,
    tell), 256 generations a call, the state carried from call to call as evosax users do;
  - ``python``: ``x = loop.ask(); loop.tell(x, loop.evaluate(x))`` in a Python loop, three
    dispatches and the ranks' agreement on the inputs every generation.

Every program is warmed (compiled and run once) before timing; the variants alternate, 5 rounds,
each round's time per generation; the median and the range are reported, and the ratios of the
medians to ``advance``. All three give bitwise the same state (checked). Writes
benchmarks/results/ask_tell.json and prints a table (rank 0).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POP, DIM, CHUNK, PY_GENS, ROUNDS = 1024, 100, 256, 32, 5


def main() -> None:
    import jax

    import hpcevo
    from hpcevo.algorithms import CSO, DE, PSO

    ctx = hpcevo.parallel.init()
    problem = hpcevo.problems.make_problem("rastrigin", DIM)
    rows = []
    for cls in (PSO, DE, CSO):
        algorithm = cls(pop_size=POP, dim=DIM, lb=problem.lb, ub=problem.ub)
        adv = hpcevo.Loop(algorithm, problem, ctx).init(0)
        own = hpcevo.Loop(algorithm, problem, ctx).init(0)
        py = hpcevo.Loop(algorithm, problem, ctx).init(0)
        ask, evaluate, tell, row = own.functions()

        @jax.jit
        def generations(state, params):
            def one(s, _):
                x, algo = ask(s, params)
                s2 = tell(s, x, algo, evaluate(x), params)
                return s2, row(s, s2)
            return jax.lax.scan(one, state, None, length=CHUNK)

        def run_advance():
            adv.advance(CHUNK)
            jax.block_until_ready(adv.state)
            return CHUNK

        def run_scan():
            state, hist = generations(own.state, own.params_data())
            own.adopt(state, hist)
            jax.block_until_ready(own.state)
            return CHUNK

        def run_python():
            for _ in range(PY_GENS):
                x = py.ask()
                py.tell(x, py.evaluate(x))
            jax.block_until_ready(py.state)
            return PY_GENS

        variants = {"advance": run_advance, "scan": run_scan, "python": run_python}
        for f in variants.values():  # warm: compile and run every program once
            f()
        times = {k: [] for k in variants}
        for _ in range(ROUNDS):
            for k, f in variants.items():
                t = time.perf_counter()
                n = f()
                times[k].append((time.perf_counter() - t) / n * 1e3)
        # bitwise: the scan loop and hpcevo's own loop are at the same generation
        same = adv.generation == own.generation and adv.digest() == own.digest()
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"algorithm": cls.__name__, "pop": POP, "dim": DIM, "ranks": ctx.size, "bitwise_equal": same,
                     **{f"{k}_ms": {"median": med[k], "min": min(v), "max": max(v)} for k, v in times.items()},
                     "scan_over_advance": med["scan"] / med["advance"],
                     "python_over_advance": med["python"] / med["advance"]})
    if ctx.is_root:
        out = HERE / "results" / "ask_tell.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"cpu": platform.processor() or platform.machine(), "ranks": ctx.size,
                                   "jax": jax.__version__, "rows": rows}, indent=1) + "\n")
        print(f"ms per generation, pop {POP}, dim {DIM}, {ctx.size} rank(s); median [min-max] of {ROUNDS} rounds")
        print(f"{'algorithm':<10}{'advance':>22}{'scan (own jit)':>22}{'python ask/tell':>22}"
              f"{'scan/adv':>10}{'py/adv':>9}{'bitwise':>9}")
        for r in rows:
            cells = "".join(f"{r[k + '_ms']['median']:>9.3f} [{r[k + '_ms']['min']:.2f}-{r[k + '_ms']['max']:.2f}]"
                            .rjust(22) for k in ("advance", "scan", "python"))
            print(f"{r['algorithm']:<10}{cells}{r['scan_over_advance']:>10.2f}{r['python_over_advance']:>9.2f}"
                  f"{str(r['bitwise_equal']):>9}")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
