"""Many small runs: one at a time, as one ``hpcevo.Batch``, vmapped, and as evosax's users batch them.

    python -m benchmarks.batch                      # the campaign sizes below, K = 256 runs
    python -m benchmarks.batch --runs 64 --generations 100 --only cmaes
    taskset -c 1 python -m benchmarks.batch         # one core, as a rank of a study gets

Each row: K runs of one algorithm on a plain Rastrigin written as a user writes it (no
block-invariance tricks), small populations and dimensions (a BBOB campaign's sizes), G
generations each. Three sides in one process, one XLA thread, the same XLA flags (hpcevo's rank
binding: AVX2), compilation excluded (every side runs once first), rounds alternating:

- **one at a time**: a Python loop over the runs, ``Loop.advance(G)`` each (what a seed sweep in a
  script, or a study today, does per run);
- **hpcevo.Batch**: the same K loops, ``Batch(loops).advance(G)``: every run's chunk dispatched
  back to back, one wait for all, each run bitwise the run alone (it runs the run alone's programs);
- **hpcevo vmap**: ``jax.vmap`` over ``Loop.functions()`` (the K loops' states and dynamic
  hyper-parameters stacked) inside one jitted ``lax.scan``, as an evosax user batches runs; works at
  any rank count with the same bits (its history rows kept; a lane is not promised to equal its
  run alone);
- **evosax vmap** (0.3, where it has the algorithm): ``jax.vmap`` of its ``ask -> evaluate -> tell``
  over K keys inside one jitted ``lax.scan`` (vectorised over the runs; no run equals its run
  alone, no history, no budgets, no checkpoints).

Prints run-generations per second, medians of ``--repeats`` rounds, and the ratios; writes every
sample to ``benchmarks/results/batch-<date>.json``. Needs evosax for its column
(``pip install -e '.[bench]'``); without it that column is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (algorithm, pop, dim): a BBOB campaign's kind of run (pycma's default lambda at dim 5 is 8)
ROWS = [("cmaes", 8, 5), ("cmaes", 12, 20), ("pso", 32, 10), ("pso-per_particle", 32, 10), ("de", 32, 10),
        ("openes", 16, 10), ("snes", 16, 10)]


# a side's name in the table -> its name on the command line (--sides)
SIDES = {"one at a time": "one", "hpcevo.Batch": "batch", "hpcevo vmap": "vmap", "evosax vmap": "evosax"}


def make(name: str, pop: int, dim: int):
    """hpcevo's algorithm of a row: ``pso-per_particle`` is PSO drawing its coefficients per
    particle, as evosax's PSO does (hpcevo's default draws them per coordinate, as the papers)."""
    from hpcevo.algorithms import ALGORITHMS

    algo, _, coefficients = name.partition("-")
    extra = {"coefficients": coefficients} if coefficients else {}
    return ALGORITHMS[algo](pop_size=pop, dim=dim, lb=(-5.12,) * dim, ub=(5.12,) * dim, **extra)


def rastrigin(x):
    """As a user writes it: one candidate or a block, the last axis summed."""
    import jax.numpy as jnp

    return 10.0 * x.shape[-1] + jnp.sum(x * x - 10.0 * jnp.cos(2.0 * jnp.pi * x), axis=-1)


def hpcevo_sides(ctx, name: str, pop: int, dim: int, runs: int, gens: int) -> dict:
    import hpcevo

    algorithm = make(name, pop, dim)
    alone = [hpcevo.Loop(algorithm, rastrigin, ctx, compile_cache="off") for _ in range(runs)]
    together = [hpcevo.Loop(algorithm, rastrigin, ctx, compile_cache="off") for _ in range(runs)]
    for j, loop in enumerate(alone):
        loop.init(j)
    batch = hpcevo.Batch(together).init(list(range(runs)))

    def one_at_a_time():
        for loop in alone:
            loop.advance(gens)

    def batched():
        batch.advance(gens)

    one_at_a_time(), batched()  # compile and warm
    # Same seeds, same generations: the batch's runs are the runs alone, bit for bit.
    assert [loop.digest() for loop in alone] == batch.digests(), "a batched run differs from its run alone"
    return {"one at a time": one_at_a_time, "hpcevo.Batch": batched}


def hpcevo_vmap_side(ctx, name: str, pop: int, dim: int, runs: int, gens: int) -> dict:
    """``jax.vmap`` over ``Loop.functions()``, as an evosax user batches runs: the K loops' states
    stacked, one jitted scan of G generations for all (history rows kept, as a Loop keeps them)."""
    import jax
    import jax.numpy as jnp

    import hpcevo

    algorithm = make(name, pop, dim)
    loops = [hpcevo.Loop(algorithm, rastrigin, ctx, compile_cache="off").init(j) for j in range(runs)]
    ask, evaluate, tell, row = loops[0].functions()

    def stack(*trees):
        return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees)

    params = stack(*[loop.params_data() for loop in loops])

    @jax.jit
    @jax.vmap
    def generations(state, p):
        def body(s, _):
            x, algo = ask(s, p)
            s2 = tell(s, x, algo, evaluate(x), p)
            return s2, row(s, s2)
        return jax.lax.scan(body, state, None, length=gens)

    box = {"s": stack(*[loop.state for loop in loops])}

    def go():
        box["s"] = jax.block_until_ready(generations(box["s"], params)[0])
    go()
    return {"hpcevo vmap": go}


def evosax_side(name: str, pop: int, dim: int, runs: int, gens: int) -> dict:
    try:
        from evosax import algorithms as ev
    except ImportError:
        return {}
    import jax
    import jax.numpy as jnp

    cls = {"pso": ev.PSO, "pso-per_particle": ev.PSO, "de": ev.DifferentialEvolution, "cmaes": ev.CMA_ES, "openes": ev.Open_ES,
           "snes": ev.SNES}.get(name)
    if cls is None:
        return {}
    es = cls(population_size=pop, solution=jnp.zeros((dim,), jnp.float32))
    params = es.default_params

    def init(key):
        k_init, k_x = jax.random.split(key)
        if name.split("-")[0] in ("pso", "de"):
            x0 = jax.random.uniform(k_x, (pop, dim), jnp.float32, -5.12, 5.12)
            return es.init(k_init, x0, rastrigin(x0), params)
        return es.init(k_init, jax.random.uniform(k_x, (dim,), jnp.float32, -5.12, 5.12), params)

    def one_run(carry):
        def step(c, _):
            key, state = c
            key, k_ask, k_tell = jax.random.split(key, 3)
            x, state = es.ask(k_ask, state, params)
            state, _ = es.tell(k_tell, x, rastrigin(x), state, params)
            return (key, state), None
        return jax.lax.scan(step, carry, None, length=gens)[0]

    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    run = jax.jit(jax.vmap(one_run), donate_argnums=0)
    box = {"c": (keys, jax.vmap(init)(keys))}

    def go():
        box["c"] = jax.block_until_ready(run(box["c"]))
    go()
    return {"evosax vmap": go}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=256)
    ap.add_argument("--generations", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="algorithms, comma-separated")
    ap.add_argument("--out", default="")
    ap.add_argument("--sides", nargs="+", default=list(SIDES.values()), choices=SIDES.values(),
                    help="the sides measured (one and batch dispatch every run: slow at K = 1,024 on a GPU)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                    help="where every side runs (gpu: the rank's GPU, evosax on JAX's default device)")
    args = ap.parse_args(argv)

    import hpcevo
    from hpcevo.parallel import bind, discover

    ctx = bind(discover(), device=args.device, threads=1)
    import jax

    rows = [r for r in ROWS if not args.only or r[0] in args.only.split(",") or r[0].split("-")[0] in args.only.split(",")]
    samples: dict[str, dict[str, list[float]]] = {}
    for name, pop, dim in rows:
        key = f"{name} pop {pop} dim {dim}"
        sides = {}
        if {"one", "batch"} & set(args.sides):
            both = hpcevo_sides(ctx, name, pop, dim, args.runs, args.generations)
            sides |= {k: v for k, v in both.items() if SIDES[k] in args.sides}
        if "vmap" in args.sides:
            sides |= hpcevo_vmap_side(ctx, name, pop, dim, args.runs, args.generations)
        if "evosax" in args.sides:
            sides |= evosax_side(name, pop, dim, args.runs, args.generations)
        got = samples[key] = {side: [] for side in sides}
        for r in range(args.repeats):
            order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
            for side in order:
                t = time.perf_counter()
                sides[side]()
                got[side].append(args.runs * args.generations / (time.perf_counter() - t))
        print(f"{key}: " + ", ".join(f"{s} {statistics.median(v):,.0f}" for s, v in got.items()), flush=True)

    head = (f"{'row':32s} {'one at a time':>14s} {'hpcevo.Batch':>13s} {'hpcevo vmap':>12s} {'evosax vmap':>12s} "
            f"{'Batch/one':>10s} {'evosax/Batch':>13s} {'evosax/vmap':>12s}")
    print(f"\nrun-generations per second (K = {args.runs} runs x {args.generations} generations, medians of "
          f"{args.repeats}; one XLA thread)\n{head}\n" + "-" * len(head))
    for key, got in samples.items():
        med = {s: statistics.median(v) for s, v in got.items()}
        one, batch, vm, ev = (med.get(s) for s in ("one at a time", "hpcevo.Batch", "hpcevo vmap", "evosax vmap"))

        def num(v):
            return f"{v:,.0f}" if v else "-"

        def ratio(a, b):
            return f"{a / b:.2f}x" if a and b else "-"
        print(f"{key:32s} {num(one):>14s} {num(batch):>13s} {num(vm):>12s} {num(ev):>12s} {ratio(batch, one):>10s} "
              f"{ratio(ev, batch):>13s} {ratio(ev, vm):>12s}")
    out = Path(args.out or HERE / "results" / f"batch-{datetime.now():%Y%m%d-%H%M}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": args.runs, "generations": args.generations, "repeats": args.repeats,
                               "cpu": platform.processor() or platform.machine(), "jax": jax.__version__,
                               "hpcevo": hpcevo.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": str(jax.devices()[0]),
                               "samples": samples}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
