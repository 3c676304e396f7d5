"""The micro-batch loop against one call on the whole block: why the loop prefetches.

    python benchmarks/eval_loop.py            # Ackley, sphere, Rastrigin; dim 100; one core
Writes benchmarks/results/eval_loop.json and prints a table: for each problem, population and
micro-batch size, the time of a loop over the micro-batches divided by the time of one call on
all rows, for two loops:

  - ``sliced``: the body takes ``dynamic_index(blocks, i)`` and calls the problem on it (the
    loop hpcevo had before; XLA on CPU fuses that slice into the problem's own fusions);
  - ``blockwise``: ``hpcevo.parallel.evaluate.blockwise``, which hands the problem a
    loop-carried buffer fetched one iteration ahead (what hpcevo runs now).

Both give bitwise the values of the one call (checked and reported). Pin it to one core
(``taskset -c 0``) to compare with the figures in blockwise's docstring. Timings: min of 7
batches of calls, the variants of one case measured back to back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIM = 100
CASES = ((1024, (8, 16, 64)), (16384, (256, 4096)))


def main() -> None:
    import jax
    import jax.numpy as jnp
    from jax import lax

    from hpcevo.parallel.evaluate import blockwise
    from hpcevo.problems.numerical import ackley, rastrigin, sphere

    def sliced(x, mb, fn):
        blocks = x.reshape(-1, mb, DIM)

        def body(i, out):
            return lax.dynamic_update_index_in_dim(out, fn(lax.dynamic_index_in_dim(blocks, i, keepdims=False)), i, 0)
        return lax.fori_loop(0, blocks.shape[0], body, jnp.zeros(blocks.shape[:2], x.dtype)).reshape(-1)

    def prefetched(x, mb, fn):
        blocks = x.reshape(-1, mb, DIM)
        return blockwise(fn, blocks, 0, blocks.shape[0], jnp.zeros(blocks.shape[:2], x.dtype)).reshape(-1)

    def timed(f, *a):
        f(*a).block_until_ready()
        t0 = time.perf_counter()
        f(*a).block_until_ready()
        reps = max(3, int(0.15 / (time.perf_counter() - t0)))
        best = float("inf")
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(reps):
                r = f(*a)
            r.block_until_ready()
            best = min(best, (time.perf_counter() - t) / reps)
        return best

    rows = []
    print(f"{'problem':>10} {'pop':>6} {'rows/block':>10} {'whole ms':>9} {'sliced':>8} {'blockwise':>10} {'bitwise':>8}")
    for fn in (ackley, sphere, rastrigin):
        for pop, sizes in CASES:
            x = jax.random.uniform(jax.random.key(0), (pop, DIM), minval=-30, maxval=30)
            whole = jax.jit(fn)
            ref, t_whole = whole(x), timed(whole, x)
            for mb in sizes:
                f_s = jax.jit(sliced, static_argnums=(1, 2))
                f_b = jax.jit(prefetched, static_argnums=(1, 2))
                same = bool(jnp.array_equal(f_s(x, mb, fn), ref)) and bool(jnp.array_equal(f_b(x, mb, fn), ref))
                r = {"problem": fn.__name__, "pop": pop, "rows": mb, "whole_s": t_whole,
                     "sliced_ratio": timed(f_s, x, mb, fn) / t_whole,
                     "blockwise_ratio": timed(f_b, x, mb, fn) / t_whole, "bitwise_equal": same}
                rows.append(r)
                print(f"{r['problem']:>10} {pop:>6} {mb:>10} {t_whole * 1e3:>9.3f} {r['sliced_ratio']:>7.2f}x "
                      f"{r['blockwise_ratio']:>9.2f}x {str(same):>8}", flush=True)
    out = HERE / "results" / "eval_loop.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dim": DIM, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
