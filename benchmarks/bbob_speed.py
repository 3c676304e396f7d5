"""BBOB evaluations per second: hpcevo's JAX functions against COCO's and IOHprofiler's C code.

    python benchmarks/bbob_speed.py                        # f1, f8, f15, f21, f24 at D = 10, 40
    python benchmarks/bbob_speed.py --functions 1 23 --dims 5 --pop 4096

A population of ``--pop`` (1,024) uniform points of [-5, 5]^D, instance 1, evaluated by:

  - ``hpcevo f32`` / ``hpcevo f64``: ``BBOBProblem.evaluate`` jitted with the problem as a
    static argument (its data compile in as constants), as a run's step holds it; warmed up,
    ``block_until_ready`` after each call;
  - ``cocoex``: a ``cocoex.Suite("bbob")`` problem called once per point, the way COCO's
    experiments call it (a Suite problem takes one point a call: a 2-D array is an error);
  - ``cocoex batch``: ``cocoex.BareProblem`` with the whole 2-D array (a Cython loop over the rows
    calling the same C function);
  - ``ioh``: ``ioh.get_problem(f, 1, D, ioh.ProblemClass.BBOB)`` once per point;
  - ``ioh batch``: the same problem given the 2-D array (IOH loops over the rows in C++).

Each is timed in rounds of at least --min-time seconds; the median of --rounds rounds is
reported. The process is bound as one rank of a run is (``hpcevo.parallel.bind``: one XLA
thread, and on x86-64 ``--xla_cpu_max_isa=AVX2`` in XLA_FLAGS, hpcevo's default for runs), so the
JAX numbers are what a run's evaluation costs on one core; the C libraries are single-threaded
anyway. The values of all five are compared on the benchmark's points (largest relative
difference to cocoex's). Writes benchmarks/results/bbob_speed.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script from anywhere: the hpcevo beside it


def _bind():
    # Before JAX starts its backend: XLA reads NPROC and XLA_FLAGS once.
    from hpcevo.parallel import bind, discover

    return bind(discover(), device="cpu", threads=1)


def _rate(fn, pop: int, rounds: int, min_time: float) -> float:
    """Median evaluations per second of ``fn()`` (one call evaluates ``pop`` points)."""
    fn()  # warm: compilation, caches
    rates = []
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        rates.append(calls * pop / elapsed)
    return statistics.median(rates)


def measure(function: int, dim: int, pop: int, rounds: int, min_time: float) -> dict:
    import cocoex
    import ioh
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hpcevo.problems.bbob import make_bbob

    x = np.random.default_rng([function, dim]).uniform(-5.0, 5.0, (pop, dim))
    out: dict = {"function": function, "dim": dim, "pop": pop}

    evaluate = jax.jit(lambda problem, x: problem.evaluate(x), static_argnums=0)
    values = {}
    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            problem = make_bbob(function, 1, dim)
            xj = jnp.asarray(x, dtype)
            values[dtype] = np.asarray(evaluate(problem, xj), np.float64)
            out[f"hpcevo_{dtype}"] = _rate(lambda: evaluate(problem, xj).block_until_ready(), pop, rounds, min_time)

    suite = cocoex.Suite("bbob", "instances: 1", f"dimensions: {dim}")
    coco = suite.get_problem_by_function_dimension_instance(function, dim, 1)
    bare = cocoex.BareProblem("bbob", function, dim, 1)
    rows = list(x)  # one C-contiguous float64 array per point, made outside the timing
    values["cocoex"] = np.array([coco(r) for r in rows])
    out["cocoex"] = _rate(lambda: [coco(r) for r in rows], pop, rounds, min_time)
    values["cocoex_batch"] = bare(x)
    out["cocoex_batch"] = _rate(lambda: bare(x), pop, rounds, min_time)

    ih = ioh.get_problem(function, 1, dim, ioh.ProblemClass.BBOB)
    values["ioh"] = np.array([ih(r) for r in rows])
    out["ioh"] = _rate(lambda: [ih(r) for r in rows], pop, rounds, min_time)
    values["ioh_batch"] = np.asarray(ih(x))
    out["ioh_batch"] = _rate(lambda: ih(x), pop, rounds, min_time)

    want = values["cocoex"]
    scale = np.abs(want - problem.fopt) + max(1.0, abs(problem.fopt))
    out["max_rel_diff_to_cocoex"] = {k: float(np.max(np.abs(v - want) / scale)) for k, v in values.items()}
    return out


COLUMNS = (("hpcevo_float32", "hpcevo f32"), ("hpcevo_float64", "hpcevo f64"), ("cocoex", "cocoex"),
           ("cocoex_batch", "cocoex batch"), ("ioh", "ioh"), ("ioh_batch", "ioh batch"))


def table(rows: list[dict]) -> str:
    head = "| f | D | " + " | ".join(name for _, name in COLUMNS) + " | f64 / cocoex |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for r in rows:
        cells = " | ".join(f"{r[key] / 1e6:.3g}" for key, _ in COLUMNS)
        lines.append(f"| f{r['function']} | {r['dim']} | {cells} | {r['hpcevo_float64'] / r['cocoex']:.0f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=int, nargs="+", default=[1, 8, 15, 21, 24])
    ap.add_argument("--dims", type=int, nargs="+", default=[10, 40])
    ap.add_argument("--pop", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timed round")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bbob_speed.json")
    args = ap.parse_args(argv)

    ctx = _bind()
    import jax

    rows = []
    for dim in args.dims:
        for function in args.functions:
            rows.append(measure(function, dim, args.pop, args.rounds, args.min_time))
            print(f"f{function} D={dim} done", file=sys.stderr, flush=True)
    result = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "threads": ctx.binding.threads if ctx.binding else None,
        "rounds": args.rounds,
        "min_time_s": args.min_time,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"million evaluations per second, pop {args.pop}, instance 1, one core "
          f"(XLA_FLAGS={result['xla_flags'] or 'none'})")
    print(table(rows))
    worst = {k: max(r["max_rel_diff_to_cocoex"][k] for r in rows) for k in rows[0]["max_rel_diff_to_cocoex"]}
    print("largest difference to cocoex's values, relative to |f - fopt| + max(1, |fopt|): "
          + ", ".join(f"{k} {v:.1e}" for k, v in worst.items() if k != "cocoex"))


if __name__ == "__main__":
    main()
