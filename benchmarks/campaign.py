"""A BBOB campaign as its users run it: hpcevo's study against pycma on cocoex, the same cores.

    python benchmarks/campaign.py                         # dim 5, 24 functions x 15 instances (360 runs), 2 ranks
    python benchmarks/campaign.py --dims 2 3 --instances 1 2 3 --functions 1 8 15
    python benchmarks/campaign.py --batch 1 4 16          # study.batch values beside the default
Writes benchmarks/results/campaign-<time>.json and prints a table.

The work is COCO's BBOB experiment with BIPOP-CMA-ES, budget 1,000 x dim evaluations, final
target f - f_opt <= 1e-8, COCO data written on both sides (what cocopp reads):

  - hpcevo: ``mpiexec -n R python -m hpcevo study FILE`` on examples/bbob.toml cut to the slice
    (groups of one rank take the runs). Each way twice, over an empty cache directory of its own:
    a first launch (every program compiled) and again over it (``--overwrite``: what every later
    launch of the same programs pays, e.g. the next seed, algorithm setting or a resumed
    campaign). The ways: JAX's compilation cache alone (``HPCEVO_PROGRAM_CACHE=0``: a launch
    traces and lowers every program again, then looks it up) and hpcevo's programs kept on disk
    as well (the default: loaded as they are, hpcevo/driver/programs.py).
  - pycma: R processes side by side, each running its share of the problems (every R-th) the way
    COCO's example experiment does: ``cocoex.Suite`` and ``cocoex.Observer``, ``cma.fmin2(problem,
    x0, 2, {maxfevals, termination_callback: the final target hit}, restarts=9, bipop=True)``, x0
    uniform in [-4, 4]^n (Hansen's BIPOP setting).

Both walls include the processes' start-up. The seeds differ (they cannot be shared), so each side
reaches other targets on a given problem: the runs solved (f - f_opt <= 1e-8) and the mean
fraction of COCO's 51 targets (10^2 .. 10^-8) each run reached are printed beside the times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGETS = 10.0 ** np.linspace(2, -8, 51)

STUDY = """
[study]
name = "campaign"
out = "{out}"
seeds = 1
batch = {batch}

[base]
run.target_precision = 1e-8
algorithm.name = "cmaes"
algorithm.sigma_init = 0.2
algorithm.restart = "bipop"
problem.name = "bbob"
log.coco = true
log.every = 1000
checkpoint.every = 0

[[axis]]
key = "problem.function"
values = {functions}

[[axis]]
zip = {{ "problem.dim" = {dims}, "run.evaluations" = {budgets} }}
role = "problem"

[[axis]]
key = "problem.instance"
values = {instances}
"""


def reached(delta: float) -> float:
    return float(np.mean(max(delta, 0.0) <= TARGETS))


def hpcevo_study(args, work: Path, cache: Path, again: bool, store: bool = True, batch: str = "auto") -> dict:
    study = work / "campaign.toml"
    budgets = [1000 * d for d in args.dims]
    study.write_text(STUDY.format(out=work / "study", functions=list(args.functions), dims=list(args.dims),
                                  budgets=budgets, instances=list(args.instances),
                                  batch=json.dumps(batch if batch == "auto" else int(batch))))
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    env["HPCEVO_PROGRAM_CACHE"] = "1" if store else "0"  # (programs kept on disk: hpcevo/driver/programs.py)
    cmd = [args.mpiexec, "-n", str(args.ranks), sys.executable, "-m", "hpcevo", "study", str(study), "--quiet"]
    if again:
        cmd.append("--overwrite")
    t = time.perf_counter()
    timed_out = False
    p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:  # (a budgeted device lease) the runs that finished still count
        timed_out = True
        os.killpg(p.pid, signal.SIGTERM)  # the study stops as a user's Ctrl-C stops it
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate()
    wall = time.perf_counter() - t
    if not timed_out and p.returncode != 0:
        raise SystemExit(f"hpcevo study failed ({p.returncode}):\n{err[-3000:]}")
    deltas, compile_s = [], []
    for summary in sorted((work / "study" / "runs").glob("*/summary.json")):
        s = json.loads(summary.read_text())
        deltas.append(float(s["best_precision"]))
        compile_s.append(float(s.get("compile_s") or 0.0))
    return {"wall_s": wall, "timed_out": timed_out, "runs": len(deltas), "solved": sum(d <= 1e-8 for d in deltas),
            "targets_reached": float(np.mean([reached(d) for d in deltas])),
            "compile_s_sum": float(sum(compile_s)), "runs_over_2s_compile": sum(c > 2 for c in compile_s)}


PYCMA_SHARE = r"""
import sys, warnings, json
import numpy as np, cma, cocoex
share, of, out, functions, dims, instances = sys.argv[1:7]
share, of = int(share), int(of)
suite = cocoex.Suite("bbob", "", f"function_indices:{functions} dimensions:{dims} instance_indices:{instances}")
observer = cocoex.Observer("bbob", f"result_folder: {out}/share{share} algorithm_name: pycma-bipop")
rows = []
for i, problem in enumerate(suite):
    if i % of != share:
        continue
    problem.observe_with(observer)
    rng = np.random.default_rng(i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cma.fmin2(problem, lambda: rng.uniform(-4, 4, problem.dimension), 2.0,
                  {"maxfevals": 1000 * problem.dimension, "verbose": -9, "seed": i + 1,
                   "termination_callback": lambda es: problem.final_target_hit}, restarts=9, bipop=True)
    rows.append([problem.id_function, problem.id_instance, problem.dimension, problem.best_observed_fvalue1,
                 int(problem.evaluations)])
    problem.free()
print(json.dumps(rows))
"""


def pycma_campaign(args, work: Path) -> dict:
    csv = lambda xs: ",".join(str(x) for x in xs)  # noqa: E731
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", PYCMA_SHARE, str(k), str(args.ranks), str(work / "pycma"),
                               csv(args.functions), csv(args.dims), csv(args.instances)], cwd=work,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(args.ranks)]
    rows = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"pycma share failed:\n{err[-3000:]}")
        rows += json.loads(out.strip().splitlines()[-1])
    wall = time.perf_counter() - t
    from hpcevo.problems.bbob import make_bbob  # (f_opt, equal to COCO's: tests/test_bbob.py)

    deltas = [max(best - make_bbob(f, i, d).fopt, 0.0) for f, i, d, best, _ in rows]
    return {"wall_s": wall, "runs": len(rows), "solved": sum(d <= 1e-8 for d in deltas),
            "targets_reached": float(np.mean([reached(d) for d in deltas]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=int, nargs="+", default=[5])
    ap.add_argument("--functions", type=int, nargs="+", default=list(range(1, 25)))
    ap.add_argument("--instances", type=int, nargs="+", default=list(range(1, 16)))
    ap.add_argument("--ranks", type=int, default=2, help="hpcevo's ranks and pycma's processes")
    ap.add_argument("--mpiexec", default=os.environ.get("HPCEVO_MPIEXEC", "mpiexec"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=None, help="seconds for each hpcevo launch (the runs done count)")
    ap.add_argument("--sides", nargs="+", choices=("pycma", "hpcevo"), default=["pycma", "hpcevo"],
                    help="hpcevo alone where pycma and cocoex are not installed (a GPU node)")
    ap.add_argument("--ways", nargs="+", choices=("jax-cache", "store"), default=["jax-cache", "store"],
                    help="the launch ways measured (a device lease may afford only the default, store)")
    ap.add_argument("--batch", nargs="+", default=["1"],
                    help="study.batch values measured beside the default (\"auto\"), launched again over the "
                         "default's cache (\"1\": one run at a time, what studies did before batching)")
    args = ap.parse_args()
    runs = len(args.dims) * len(args.functions) * len(args.instances)
    with tempfile.TemporaryDirectory(prefix="hpcevo-campaign-") as tmp:
        work = Path(tmp)
        print(f"{runs} runs (dims {args.dims}, {len(args.functions)} functions, {len(args.instances)} instances), "
              f"{args.ranks} processes each", flush=True)
        rows = {}
        if "pycma" in args.sides:
            pycma = rows["pycma (cocoex, fmin2 bipop)"] = pycma_campaign(args, work)
            print(f"pycma: {pycma['wall_s']:.1f} s", flush=True)
        if "hpcevo" in args.sides:
            # Each way over its own cache: a first launch that keeps programs compiles them by
            # XLA for the store, and leaves JAX's cache without them.
            ways = [(False, "JAX's compilation cache only (HPCEVO_PROGRAM_CACHE=0)"),
                    (True, "programs kept on disk too (the default)")]
            for store, label in (w for w in ways if ("store" if w[0] else "jax-cache") in args.ways):
                cache = work / f"jax-cache-{int(store)}"
                cache.mkdir(mode=0o700)
                # (--overwrite from the second way on: the study folder holds the first way's runs)
                again = (work / "study").exists()
                cold = rows[f"hpcevo study, first launch, {label}"] = hpcevo_study(args, work, cache, again, store)
                print(f"hpcevo, first launch, {label}: {cold['wall_s']:.1f} s", flush=True)
                warm = rows[f"hpcevo study, launched again, {label}"] = hpcevo_study(args, work, cache, True, store)
                print(f"hpcevo, launched again, {label}: {warm['wall_s']:.1f} s", flush=True)
            for batch in (b for b in args.batch if b != "auto" and "store" in args.ways):
                label = f"hpcevo study, launched again, programs kept on disk, study.batch = {batch}"
                row = rows[label] = hpcevo_study(args, work, work / "jax-cache-1", True, True, batch)
                print(f"{label}: {row['wall_s']:.1f} s", flush=True)
    base = next(iter(rows.values()))
    result = {"runs": runs, "dims": args.dims, "functions": args.functions, "instances": args.instances,
              "ranks": args.ranks, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "rows": rows}
    out = Path(args.out) if args.out else HERE / "results" / f"campaign-{time.strftime('%Y%m%d-%H%M')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\n| {runs} BBOB runs, {args.ranks} processes | wall (s) | vs the first row | solved | targets reached |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        name += " (stopped at --timeout)" if r.get("timed_out") else ""
        print(f"| {name} | {r['wall_s']:.1f} | {r['wall_s'] / base['wall_s']:.2f}x | {r['solved']}/{r['runs']} "
              f"| {r['targets_reached']:.3f} |")
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
