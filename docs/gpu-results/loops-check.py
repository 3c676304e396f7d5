"""Issue 42's bits check on a GPU: with the GPU's loops of fixed trip counts (blocks of
generations, driver/engine.py loop_shape), one run is the same whether its generations come in one
dispatch or in pieces, at 1 rank and at 2 ranks sharing the GPU, a stop inside a block ends the
run at that generation with the state of a run advanced exactly that far, and ask/evaluate/tell
equals advance. tests/test_loop_shapes.py checks the same on CPUs.

    python docs/gpu-results/loops-check.py            (and under mpiexec -n 2)
Prints one JSON line per check (rank 0) and exits 1 if any fails.
"""
import json
import sys

import jax.numpy as jnp

import hpcevo
from hpcevo.algorithms import CSO, PSO, OpenES
from hpcevo.parallel import bind, discover
from hpcevo.problems import make_problem

ctx = bind(discover(), device="auto", share_gpus=True)
ackley = make_problem("ackley", 20)


def user_f(x):
    return jnp.sum((x - 0.5) ** 2, axis=-1) + jnp.cos(x[:, 0])


CASES = {
    "pso": (lambda: PSO(pop_size=4097, dim=20, lb=ackley.lb, ub=ackley.ub), ackley, {}),
    "cso": (lambda: CSO(pop_size=4097, dim=20, lb=ackley.lb, ub=ackley.ub), ackley, {}),
    "openes-distributed": (lambda: OpenES(pop_size=4096, dim=20, lb=ackley.lb, ub=ackley.ub, distributed=True,
                                          block=512), ackley, {}),
    "user-function": (lambda: PSO(pop_size=3000, dim=8, lb=-2.0, ub=2.0), user_f, {"microbatch": 700}),
}
failed = []


def report(check, ok, **kw):
    if not ok:
        failed.append(check)
    if ctx.rank == 0:
        print(json.dumps({"check": check, "ok": bool(ok), "ranks": ctx.size, "device": ctx.device, **kw}), flush=True)


def run(name, pieces, **limits):
    make, problem, kw = CASES[name]
    loop = hpcevo.Loop(make(), problem, ctx, **kw).init(5)
    if limits:
        loop.limit(**limits)
    for n in pieces:
        loop.advance(n)
    return loop


for name in CASES:
    whole, split = run(name, [29]), run(name, [1, 5, 7, 16])
    report(f"{name}: 29 generations at once == 1+5+7+16", whole.digest() == split.digest(),
           shape=[whole.engine.fixed, whole.engine.block], digest=whole.digest()[:16])

free = run("pso", [40])
best = free.history["best"]
block = free.engine.block
j = next((j for j in range(3, 39) if best[j] < best[j - 1] and (j + 1) % block != 1), None)
if j is not None:
    stopped = run("pso", [40], target=float(best[j]))
    exact = run("pso", [j])
    report("pso: a target met inside a block", stopped.generation == j + 1 and stopped.digest() == exact.digest(),
           generation=stopped.generation, expected=j + 1)
stopped = run("pso", [40], evaluations=4097 * 11 + 5)
exact = run("pso", [stopped.generation - 1])
report("pso: a budget met inside a block", stopped.generation == 12 and stopped.digest() == exact.digest(),
       generation=stopped.generation)
a = run("cso", [7])
make, problem, kw = CASES["cso"]
b = hpcevo.Loop(make(), problem, ctx).init(5)
for _ in range(7):
    x = b.ask()
    b.tell(x, b.evaluate(x))
report("cso: ask/evaluate/tell == advance", a.digest() == b.digest())
sys.exit(1 if failed else 0)
