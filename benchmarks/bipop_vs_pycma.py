"""BIPOP-CMA-ES, hpcevo's next to pycma's, on COCO's BBOB functions at the same budget.

    python benchmarks/bipop_vs_pycma.py                       # 12 functions, dims 2/5/10, instances 1-3
    python benchmarks/bipop_vs_pycma.py --budget 2000 --dims 2 5 10 20 --instances 1 2 3 4 5
Writes benchmarks/results/bipop_vs_pycma.json and prints a table.

What is compared: the fraction of COCO's 51 targets (f - f_opt <= 10^k, k = 2, 1.8, ..., -8)
each run reached within ``budget x dim`` evaluations, averaged per dimension over functions and
instances (the last point of COCO's runtime ECDF), and the mean of log10 of the final
f - f_opt (floored at 1e-9). Same setting on both sides, Hansen's for BIPOP on BBOB [H09]:
lambda0 = 4 + floor(3 ln n), sigma0 = 2, every run's mean uniform in [-4, 4]^n, pycma's
``fmin2(..., restarts=9, bipop=True)`` (up to 9 large restarts; hpcevo's default population
cap lambda0 * 2^9 allows as many). Both stop at f - f_opt <= 1e-8 or at the budget; both count
the evaluations their strategy used. pycma evaluates COCO's own problems (cocoex); hpcevo its
JAX functions, whose values equal cocoex's (tests/test_bbob.py), in float64. The seeds differ
(they cannot be shared), so per-problem results differ; the averages are what to compare, with
the per-dimension spread of instances as the noise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TARGETS = 10.0 ** np.linspace(2, -8, 51)
FUNCTIONS = (1, 2, 3, 6, 8, 10, 12, 15, 17, 20, 21, 23)


def reached(delta: float) -> float:
    return float(np.mean(delta <= TARGETS))


def hpcevo_run(function: int, instance: int, dim: int, budget: int, out: Path) -> dict:
    import hpcevo

    cfg = {"run": {"name": "b", "seed": instance, "out": str(out), "evaluations": budget, "target_precision": 1e-8,
                   "dtype": "float64"},
           "algorithm": {"name": "cmaes", "restart": "bipop", "sigma_init": 0.25},
           "problem": {"name": "bbob", "function": function, "instance": instance, "dim": dim, "lb": -4.0,
                       "ub": 4.0},
           "log": {"every": 10**6}, "checkpoint": {"every": 0, "every_seconds": 0, "final": False}}
    t = time.perf_counter()
    s = hpcevo.run(cfg, quiet=True, overwrite=True).summary
    from hpcevo.problems.bbob import make_bbob

    fopt = make_bbob(function, instance, dim).fopt
    return {"delta": max(s["best_fitness"] - fopt, 0.0), "evaluations": s["evaluations"],
            "wall_s": time.perf_counter() - t}


def pycma_run(function: int, instance: int, dim: int, budget: int) -> dict:
    import cma
    import cocoex

    suite = cocoex.Suite("bbob", "", f"function_indices:{function} dimensions:{dim} instance_indices:{instance}")
    problem = suite.get_problem_by_function_dimension_instance(function, dim, instance)
    from hpcevo.problems.bbob import make_bbob

    fopt = make_bbob(function, instance, dim).fopt
    rng = np.random.default_rng(instance)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cma.fmin2(problem, lambda: rng.uniform(-4, 4, dim), 2.0,
                  {"maxfevals": budget, "ftarget": fopt + 1e-8, "verbose": -9, "seed": instance},
                  restarts=9, bipop=True)
    best = problem.best_observed_fvalue1
    return {"delta": max(best - fopt, 0.0), "evaluations": int(problem.evaluations),
            "wall_s": time.perf_counter() - t}


def summarise(rows: list[dict], who: str) -> dict:
    fr = [reached(r[who]["delta"]) for r in rows]
    logs = [math.log10(max(r[who]["delta"], 1e-9)) for r in rows]
    per_instance = {}
    for r, v in zip(rows, fr):
        per_instance.setdefault(r["instance"], []).append(v)
    spread = [float(np.mean(v)) for v in per_instance.values()]
    return {"targets_reached": float(np.mean(fr)), "mean_log10_delta": float(np.mean(logs)),
            "instance_min": min(spread), "instance_max": max(spread),
            "solved": sum(r[who]["delta"] <= 1e-8 for r in rows), "runs": len(rows),
            "evaluations": int(sum(r[who]["evaluations"] for r in rows)),
            "wall_s": float(sum(r[who]["wall_s"] for r in rows))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 5, 10])
    ap.add_argument("--functions", type=int, nargs="+", default=list(FUNCTIONS))
    ap.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--budget", type=int, default=1000, help="evaluations per dimension")
    ap.add_argument("--out", default=str(HERE / "results" / "bipop_vs_pycma.json"))
    args = ap.parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dim in args.dims:
            for function in args.functions:
                for instance in args.instances:
                    budget = args.budget * dim
                    row = {"function": function, "dim": dim, "instance": instance, "budget": budget,
                           "hpcevo": hpcevo_run(function, instance, dim, budget, Path(tmp) / "run"),
                           "pycma": pycma_run(function, instance, dim, budget)}
                    rows.append(row)
                    print(f"f{function:<2} d{dim:<2} i{instance}: hpcevo {row['hpcevo']['delta']:.2e} "
                          f"({row['hpcevo']['evaluations']}), pycma {row['pycma']['delta']:.2e} "
                          f"({row['pycma']['evaluations']})", flush=True)
    table = {dim: {who: summarise([r for r in rows if r["dim"] == dim], who) for who in ("hpcevo", "pycma")}
             for dim in args.dims}
    import cma
    import cocoex
    import jax

    record = {"budget_per_dim": args.budget, "functions": args.functions, "instances": args.instances,
              "versions": {"cma": cma.__version__, "cocoex": cocoex.__version__, "jax": jax.__version__},
              "summary": table, "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"\nBIPOP-CMA-ES at {args.budget} x dim evaluations, functions {args.functions}, instances "
          f"{args.instances}: fraction of the 51 targets reached (range over instances), mean log10(f - f_opt), "
          "problems solved to 1e-8")
    print("| dim | hpcevo reached | pycma reached | hpcevo log10 | pycma log10 | solved hpcevo / pycma |")
    print("|---|---|---|---|---|---|")
    for dim, t in table.items():
        h, p = t["hpcevo"], t["pycma"]
        print(f"| {dim} | {h['targets_reached']:.3f} ({h['instance_min']:.3f}-{h['instance_max']:.3f}) | "
              f"{p['targets_reached']:.3f} ({p['instance_min']:.3f}-{p['instance_max']:.3f}) | "
              f"{h['mean_log10_delta']:.2f} | {p['mean_log10_delta']:.2f} | {h['solved']} / {p['solved']} of {h['runs']} |")


if __name__ == "__main__":
    main()
