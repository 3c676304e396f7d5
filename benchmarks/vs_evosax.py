"""One generation of PSO, DE, CMA-ES, OpenES and SNES on Ackley, hpcevo next to evosax.

    pip install -c requirements/stack.txt -e '.[bench]'     # evosax, an optional extra
    python benchmarks/vs_evosax.py                          # pop 1024, dim 100
    python benchmarks/vs_evosax.py --gens 50 --repeats 3    # quicker
Writes benchmarks/results/vs_evosax.json and prints a table (ratio = evosax time / hpcevo time;
>= 1 means hpcevo is at least as fast).

Like with like: both sides run ask -> evaluate -> tell for ``--gens`` generations inside one
``lax.scan`` in one jitted call, on one process and one XLA thread (the toolkit's default), with
the same objective (hpcevo's Ackley), the same population and dimension, each library's default
hyper-parameters. Timed: the best of ``--repeats`` calls after a warm-up call (compilation
excluded), the two sides alternating call by call, divided by the generation count. No MPI here:
this compares the algorithms' own cost (hpcevo's workflow around them: benchmarks/perf_suite.py).

PSO: evosax draws r1 and r2 once per particle and shares them across coordinates; hpcevo's
default draws them per coordinate, as the papers do (dim times more random numbers, which
dominate a PSO generation on a CPU). The "pso" row compares like with like (hpcevo's
``coefficients = "per_particle"``); "pso/coord" shows the paper's variant against the same evosax.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hpcevo_loop(name, pop, dim, gens, **hyper):
    import jax
    import jax.numpy as jnp

    from hpcevo.algorithms import ALGORITHMS
    from hpcevo.problems import ackley, make_problem

    prob = make_problem("ackley", dim)
    cls = ALGORITHMS[name]
    algo = cls(pop_size=pop, dim=dim, lb=prob.lb, ub=prob.ub, **hyper)

    @jax.jit
    def run(key):
        s = algo.init(key)
        x, s = algo.init_ask(s)
        s = algo.init_tell(s, ackley(x))

        def body(s, _):
            x, s = algo.ask(s)
            f = ackley(x)
            return algo.tell(s, f), f.min()

        return jax.lax.scan(body, s, None, gens)

    return run


def evosax_loop(name, pop, dim, gens):
    import jax
    import jax.numpy as jnp
    from evosax import algorithms as ev

    from hpcevo.problems import ackley

    cls = {"pso": ev.PSO, "de": ev.DifferentialEvolution, "cmaes": ev.CMA_ES, "openes": ev.Open_ES,
           "snes": ev.SNES}[name]
    es = cls(population_size=pop, solution=jnp.zeros((dim,), jnp.float32))
    params = es.default_params
    lb, ub = -32.768, 32.768
    population_based = name in ("pso", "de")

    @jax.jit
    def run(key):
        key, k_init, k_x = jax.random.split(key, 3)
        if population_based:
            x0 = jax.random.uniform(k_x, (pop, dim), jnp.float32, lb, ub)
            state = es.init(k_init, x0, ackley(x0), params)
        else:
            state = es.init(k_init, jax.random.uniform(k_x, (dim,), jnp.float32, lb, ub), params)

        def body(c, _):
            key, state = c
            key, k_ask, k_tell = jax.random.split(key, 3)
            x, state = es.ask(k_ask, state, params)
            f = ackley(x)
            state, _ = es.tell(k_tell, x, f, state, params)
            return (key, state), f.min()

        return jax.lax.scan(body, (key, state), None, gens)

    return run


def timed_pair(ours, theirs, repeats):
    """Best seconds per call of each, the two alternating call by call (noise hits both alike)."""
    import jax

    for run in (ours, theirs):
        jax.block_until_ready(run(jax.random.PRNGKey(0)))  # compile and warm up
    best = [float("inf"), float("inf")]
    for i in range(repeats):
        for j, run in enumerate((ours, theirs)):
            t = time.perf_counter()
            jax.block_until_ready(run(jax.random.PRNGKey(i + 1)))
            best[j] = min(best[j], time.perf_counter() - t)
    return best


# row label -> (hpcevo algorithm, its hyper-parameters, evosax algorithm)
ROWS = {
    "pso": ("pso", {"coefficients": "per_particle"}, "pso"),
    "pso/coord": ("pso", {}, "pso"),
    "de": ("de", {}, "de"),
    "cmaes": ("cmaes", {}, "cmaes"),
    "openes": ("openes", {}, "openes"),
    "snes": ("snes", {}, "snes"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pop", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--gens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--algorithms", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = ap.parse_args()

    from hpcevo.parallel import bind, discover

    bind(discover(), device="cpu", threads=1)
    import evosax  # noqa: F401  (fail early with the install hint below)
    import jax

    rows = []
    print(f"{'algorithm':<10}{'hpcevo ms/gen':>15}{'evosax ms/gen':>15}{'evosax/hpcevo':>15}")
    for name in args.algorithms:
        ours_name, hyper, theirs_name = ROWS[name]
        ours, theirs = timed_pair(hpcevo_loop(ours_name, args.pop, args.dim, args.gens, **hyper),
                                  evosax_loop(theirs_name, args.pop, args.dim, args.gens), args.repeats)
        ours, theirs = ours / args.gens, theirs / args.gens
        rows.append({"algorithm": name, "hpcevo": ours_name, "hyper": hyper, "hpcevo_s_per_gen": ours,
                     "evosax_s_per_gen": theirs, "ratio_evosax_over_hpcevo": theirs / ours})
        print(f"{name:<10}{ours * 1e3:>15.3f}{theirs * 1e3:>15.3f}{theirs / ours:>15.2f}", flush=True)
    from importlib.metadata import version

    out = HERE / "results" / "vs_evosax.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pop": args.pop, "dim": args.dim, "gens": args.gens, "repeats": args.repeats,
                               "jax": jax.__version__, "evosax": version("evosax"), "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    try:
        main()
    except ModuleNotFoundError as e:
        if e.name == "evosax":
            raise SystemExit("evosax is not installed: pip install -c requirements/stack.txt -e '.[bench]'") from None
        raise
