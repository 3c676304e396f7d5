"""hpcevo against evosax, EvoX and pycma, each run the way its own documentation runs it.

    pip install -c requirements/stack.txt -e '.[bench]'   # evosax, EvoX 0.9 (JAX), pycma: optional
    python -m benchmarks peers                # every shared algorithm, pop 64/1,024/16,384, dim 10/100
    python -m benchmarks peers --quick        # two rows, toy sizes (the suite's smoke test)
    python -m benchmarks peers --only evosax:pso --pops 1024 --dims 100 --repeats 9
    python -m benchmarks peers --construction # why the old harness (state built inside jit) misled

Writes ``benchmarks/results/vs_peers-<date>-<host>.json`` (every sample) and prints a table:
milliseconds per generation, medians with [min, max] over the repeats, and the ratio peer / hpcevo
(>= 1: hpcevo at least as fast as the peer, as each one's users run it).

How each side runs (and why: the old harness built the state inside the timed ``jit``, which
slowed both libraries' scans and turned a loss into a reported lead; docs/performance.md):

- **evosax 0.3** (PSO, DE, CMA-ES, OpenES, SNES): ``es.init`` once, outside ``jit``; then one
  jitted ``lax.scan`` of ``ask -> evaluate -> tell`` over the generations, called again and again
  on the carried, donated ``(key, state)`` (its README and notebooks). Objective: hpcevo's
  Ackley, the same function on both sides. CMA-ES starts with hpcevo's step size (0.3 of the box
  width, evosax's default 1.0): its generation is mostly an eigendecomposition whose time depends
  on the covariance matrix, so the two must follow comparable runs.
- **EvoX 0.9** (CSO, PSO; its last JAX release, 1.0 is PyTorch): ``StdWorkflow(algorithm,
  problem, monitors=[EvalMonitor()])``, ``state = workflow.init(key)``, then a Python loop of
  ``state = workflow.step(state)`` (one jitted call a generation, as its tutorials). Objective:
  EvoX's own Ackley. EvoX 0.9 imports ``jax.sharding.PositionalSharding``, which jax has since
  removed; the worker defines that name (EvoX's single-device workflow never uses it), so EvoX
  runs on the same jax and XLA as hpcevo. Warmed 3 steps (``init_ask`` and ``init_tell`` compile
  apart from ``step``).
- **pycma** (CMA-ES, pop 64 and 1,024): ``CMAEvolutionStrategy(x0, sigma0, {'popsize': n,
  'verbose': -9})``, ``X = es.ask(); es.tell(X, f)``, the objective a NumPy Ackley on the whole
  batch. ``es.stop()`` is not consulted (a converged run would end the sample early).
- **hpcevo**, in a process bound as ``hpcevo run`` binds a rank (one XLA thread, AVX2: the
  bitwise promise's cost is counted): ``Loop.advance(n)`` (the API: the whole generation with
  micro-batches, the fitness exchange, best-so-far and history) and the **bare step** (ask,
  the whole batch evaluated, tell, in a jitted scan on the carried, donated state, initialised
  outside ``jit``), which is what the framework's overhead is measured against. ``hpcevo run``
  (the CLI, a process per run; its per-generation time from the run's own ``wall_s`` records
  between generation 100 and the last) for the rows of ``--cli-pops``.

Each side lives in its own long-lived worker process (its own XLA flags: the peers' are their
defaults; every side gets one XLA thread, ``NPROC=1``). After a row's programs are built, each is
called twice on the state it will receive (compilation excluded), then the sides are timed in
turn, ``--repeats`` rounds, the order rotating each round. Samples are about ``--sample-s``
seconds of generations. The CPU model, the XLA flags and every version are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (peer, algorithm): hpcevo's hyper-parameters that make it the peer's algorithm
PAIRS = {
    ("evosax", "pso"): {"coefficients": "per_particle"},  # evosax draws r1, r2 once per particle
    ("evosax", "de"): {},
    ("evosax", "cmaes"): {},
    ("evosax", "openes"): {},
    ("evosax", "snes"): {},
    ("evox", "cso"): {},
    ("evox", "pso"): {},  # EvoX draws them per coordinate, as hpcevo's default
    ("pycma", "cmaes"): {},
}
POPS, DIMS = (64, 1024, 16384), (10, 100)
OBJECTIVES = {"builtin": "hpcevo's Ackley on the hpcevo and evosax sides (bitwise block invariant), EvoX's own on EvoX's",
              "user": "a plain JAX Ackley as a user writes it (user_ackley), the same function on the hpcevo and "
                      "evosax sides; EvoX keeps its own Ackley object, the same plain formula; pycma NumPy's"}
PYCMA_POPS = (64, 1024)  # "at small populations": NumPy's CMA-ES at 16,384 is not its users' case
ACKLEY_BOX = 32.768
SLOW_SAMPLE, MIN_REPEATS = 20, 3  # a sample over 20x --sample-s: 3 samples of that side


def generations_for(pop: int, dim: int, sample_s: float, peer: str = "") -> int:
    """Generations per timed sample: about ``sample_s`` seconds on one core of this machine's kind
    (a cost model: a fixed 30 us plus 15 ns per coordinate; pycma about 10x that)."""
    per_gen = 3e-5 + 1.5e-8 * pop * dim
    if peer == "pycma":
        per_gen *= 10
    return int(min(2000, max(10, sample_s / per_gen)))


# -- workers: one process per side, commands on stdin, one JSON line each on stdout ---------------
def user_ackley(x):
    """Ackley as a user writes it for either library (a block, the last axis reduced): no
    block-invariance tricks, the plain means. ``--objective user`` gives it to every side."""
    import jax.numpy as jnp

    return (-20.0 * jnp.exp(-0.2 * jnp.sqrt(jnp.mean(x * x, axis=-1)))
            - jnp.exp(jnp.mean(jnp.cos(2.0 * jnp.pi * x), axis=-1)) + 20.0 + jnp.e)


def _objective(name: str, dim: int):
    """(what hpcevo's Loop is given, the function both bare loops call)."""
    from hpcevo.problems import make_problem

    if name == "user":
        return user_ackley, user_ackley
    problem = make_problem("ackley", dim)
    return problem, problem.evaluate


def _ackley_np(x):
    import numpy as np

    d = x.shape[1]
    return (-20.0 * np.exp(-0.2 * np.sqrt((x * x).sum(1) / d)) - np.exp(np.cos(2 * np.pi * x).sum(1) / d)
            + 20.0 + np.e)


def _side_hpcevo(ctx, algorithm: str, pop: int, dim: int, gens: int, hyper: dict, objective: str = "builtin") -> dict:
    import jax
    from jax import lax

    from hpcevo import Loop
    from hpcevo.algorithms import ALGORITHMS

    problem, evaluate = _objective(objective, dim)
    box_lb, box_ub = (-ACKLEY_BOX,) * dim, (ACKLEY_BOX,) * dim
    algo = ALGORITHMS[algorithm](pop_size=pop, dim=dim, lb=box_lb, ub=box_ub, **hyper)

    def scan(state):
        def step(s, _):
            x, s = algo.ask(s)
            return algo.tell(s, evaluate(x)), None
        return lax.scan(step, state, None, length=gens)[0]

    bare = jax.jit(scan, donate_argnums=0)
    s = algo.init(jax.random.PRNGKey(1))
    x0, s = algo.init_ask(s)
    box = {"s": algo.init_tell(s, evaluate(x0))}

    def run_bare():
        box["s"] = jax.block_until_ready(bare(box["s"]))

    loop = Loop(algo, problem, ctx).init(1)
    sides = {"hpcevo bare step": run_bare, "hpcevo Loop.advance": lambda: loop.advance(gens),
             "_close": loop.close, "_notes": [f"{loop.engine.microbatches} micro-batches"]}
    if objective == "user" and loop.engine.microbatches > 1:
        # The user's lever: the evaluation in one call (parallel.microbatch = pop), which leaves
        # one rank evaluating at any rank count (the default lets up to 64 ranks share it).
        one = Loop(algo, problem, ctx, microbatch=pop).init(1)
        sides["hpcevo, one micro-batch"] = lambda: one.advance(gens)
        sides["_close"] = lambda: (loop.close(), one.close())
    return sides


def _side_evosax(algorithm: str, pop: int, dim: int, gens: int, objective: str = "builtin") -> dict:
    import jax
    import jax.numpy as jnp
    from evosax import algorithms as ev

    class problem:  # noqa: N801  (the objective, as the rest of this function calls it)
        evaluate = staticmethod(_objective(objective, dim)[1])
    cls = {"pso": ev.PSO, "de": ev.DifferentialEvolution, "cmaes": ev.CMA_ES, "openes": ev.Open_ES,
           "snes": ev.SNES}[algorithm]
    es = cls(population_size=pop, solution=jnp.zeros((dim,), jnp.float32))
    params = es.default_params
    if algorithm == "cmaes":
        # A CMA-ES generation at dim 100 is mostly LAPACK's eigendecomposition, whose time
        # depends on the matrix: both sides start as hpcevo's does (sigma 0.3 of the box width,
        # pycma's advice) so that they follow comparable runs (evosax's default is 1.0).
        params = params.replace(std_init=0.3 * 2 * ACKLEY_BOX)
    key, k_init, k_x = jax.random.split(jax.random.PRNGKey(2), 3)
    if algorithm in ("pso", "de"):  # population-based: init from a population and its fitness
        x0 = jax.random.uniform(k_x, (pop, dim), jnp.float32, -ACKLEY_BOX, ACKLEY_BOX)
        state = es.init(k_init, x0, problem.evaluate(x0), params)
    else:  # distribution-based: init from a mean
        state = es.init(k_init, jax.random.uniform(k_x, (dim,), jnp.float32, -ACKLEY_BOX, ACKLEY_BOX), params)

    def scan(carry):
        def step(c, _):
            key, state = c
            key, k_ask, k_tell = jax.random.split(key, 3)
            x, state = es.ask(k_ask, state, params)
            state, _ = es.tell(k_tell, x, problem.evaluate(x), state, params)
            return (key, state), None
        return jax.lax.scan(step, carry, None, length=gens)[0]

    run = jax.jit(scan, donate_argnums=0)
    box = {"c": (key, state)}

    def go():
        box["c"] = jax.block_until_ready(run(box["c"]))
    return {"evosax": go}


def _evox_import():
    import jax.sharding

    if not hasattr(jax.sharding, "PositionalSharding"):  # removed from jax; EvoX 0.9 only names it
        class PositionalSharding:  # noqa: D401  (a placeholder type)
            pass
        jax.sharding.PositionalSharding = PositionalSharding
    import evox  # noqa: F401

    return evox


def _side_evox(algorithm: str, pop: int, dim: int, gens: int) -> dict:
    import jax
    import jax.numpy as jnp

    evox = _evox_import()
    from evox import algorithms, monitors, problems, workflows

    lb, ub = jnp.full((dim,), -ACKLEY_BOX), jnp.full((dim,), ACKLEY_BOX)
    algo = {"cso": algorithms.CSO, "pso": algorithms.PSO}[algorithm](lb=lb, ub=ub, pop_size=pop)
    workflow = workflows.StdWorkflow(algo, problems.numerical.Ackley(), monitors=[monitors.EvalMonitor()])
    box = {"s": workflow.init(jax.random.PRNGKey(3))}
    for _ in range(3):  # init_ask / init_tell, then step's own program
        box["s"] = workflow.step(box["s"])

    def go():
        s = box["s"]
        for _ in range(gens):
            s = workflow.step(s)
        box["s"] = jax.block_until_ready(s)
    return {"evox": go, "_notes": [f"evox {getattr(evox, '__version__', '0.9')}"]}


def _side_pycma(algorithm: str, pop: int, dim: int, gens: int) -> dict:
    import cma
    import numpy as np

    rng = np.random.default_rng(4)
    es = cma.CMAEvolutionStrategy(rng.uniform(-ACKLEY_BOX, ACKLEY_BOX, dim), 0.3 * 2 * ACKLEY_BOX,
                                  {"popsize": pop, "verbose": -9, "seed": 4})

    def go():
        for _ in range(gens):
            x = es.ask()
            es.tell(x, _ackley_np(np.asarray(x)).tolist())
    return {"pycma": go}


def worker(side: str) -> None:
    """Serve one side: {"op": "setup", ...} builds and warms a row's programs; {"op": "time",
    "variant": v} runs one sample; {"op": "drop"} frees the row; {"op": "quit"}."""
    ctx = None
    if side == "hpcevo":
        from hpcevo.parallel import bind, discover

        ctx = bind(discover(), device="cpu", threads=1)  # as `hpcevo run` binds one rank
    import jax

    variants: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "setup":
                args = (cmd["algorithm"], cmd["pop"], cmd["dim"], cmd["gens"])
                objective = cmd.get("objective", "builtin")
                variants = {"hpcevo": lambda: _side_hpcevo(ctx, *args, cmd.get("hyper", {}), objective),
                            "evosax": lambda: _side_evosax(*args, objective), "evox": lambda: _side_evox(*args),
                            "pycma": lambda: _side_pycma(*args)}[side]()
                first, warm = {}, {}
                for name, fn in variants.items():
                    if not name.startswith("_"):
                        t = time.perf_counter()
                        fn()
                        first[name] = time.perf_counter() - t
                        t = time.perf_counter()
                        fn()
                        warm[name] = time.perf_counter() - t
                reply = {"variants": [k for k in variants if not k.startswith("_")], "first_call_s": first,
                         "warm_s": warm, "notes": variants.get("_notes", [])}
            elif cmd["op"] == "time":
                fn = variants[cmd["variant"]]
                t = time.perf_counter()
                fn()
                reply = {"s": time.perf_counter() - t}
            elif cmd["op"] == "drop":
                variants.get("_close", lambda: None)()
                variants = {}
                jax.clear_caches()
                reply = {}
            elif cmd["op"] == "info":
                reply = _versions()
            else:
                break
        except Exception as e:  # noqa: BLE001  (a peer broken on this jax: recorded, the rest runs)
            reply = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print(json.dumps(reply), flush=True)


def _versions() -> dict:
    from importlib import metadata

    out = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "nproc": os.environ.get("NPROC", "")}
    for dist in ("jax", "jaxlib", "numpy", "evosax", "evox", "cma", "flax", "optax"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


class Worker:
    def __init__(self, side: str):
        env = {**os.environ, "NPROC": "1", "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.side = side
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.vs_peers", "--worker", side],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.side} worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)


# -- why the old harness misled: evosax's PSO timed with its state built inside the call ---------------
def construction(repeats: int = 7, gens: int = 100, pop: int = 1024, dim: int = 100) -> dict:
    """evosax's PSO, ``gens`` generations a call: the state built inside the timed jitted call
    (the old benchmarks/vs_evosax.py), carried from call to call (donated or not), and carried but
    restarted from the same fresh state every call (generations 1..gens each time); and how far
    out of the box its particles fly in the first generations. Runs in this process."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from evosax import algorithms as ev

    from hpcevo.problems import make_problem

    problem = make_problem("ackley", dim)
    es = ev.PSO(population_size=pop, solution=jnp.zeros((dim,)))
    params = es.default_params

    def step(c, _):
        key, state = c
        key, ka, kt = jax.random.split(key, 3)
        x, state = es.ask(ka, state, params)
        state, _ = es.tell(kt, x, problem.evaluate(x), state, params)
        return (key, state), None

    def fresh(key):
        key, k_init, k_x = jax.random.split(key, 3)
        x0 = jax.random.uniform(k_x, (pop, dim), jnp.float32, -ACKLEY_BOX, ACKLEY_BOX)
        return key, es.init(k_init, x0, problem.evaluate(x0), params)

    def run(c, n=gens):
        return lax.scan(step, c, None, length=n)[0]

    key = jax.random.PRNGKey(0)
    start = jax.jit(fresh)(key)
    inside, donated, kept = jax.jit(lambda k: run(fresh(k))), jax.jit(run, donate_argnums=0), jax.jit(run)
    box = {"d": jax.tree_util.tree_map(jnp.copy, start), "k": jax.tree_util.tree_map(jnp.copy, start)}
    def carry(slot, fn):
        box[slot] = fn(box[slot])
        return box[slot]

    variants = {"state built inside the timed call (the old harness)": lambda: inside(key),
                "carried from call to call, donated": lambda: carry("d", donated),
                "carried, not donated": lambda: carry("k", kept),
                "carried, from the same fresh state every call": lambda: kept(start)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    for _ in range(repeats):
        for name, fn in variants.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append((time.perf_counter() - t) / gens * 1e3)
    spread = {n: float(jnp.abs(jax.jit(run, static_argnums=1)(start, n)[1].population).max()) for n in (1, 10, 50)}
    spread["later"] = float(jnp.abs(box["k"][1].population).max())
    return {"ms_per_generation": {k: _stats(v) for k, v in times.items()}, "max_abs_x_after": spread}


# -- the driver -------------------------------------------------------------------------------------
def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _calibrated(w: "Worker", peer: str, algorithm: str, pop: int, dim: int, args) -> int:
    """Generations per sample for the peer: the cost model's, unless two generations of it show
    a far slower peer (evosax's DE is quadratic in the population: 2.4 s a generation at 16,384)."""
    model = generations_for(pop, dim, args.sample_s, peer)
    got = w.ask(op="setup", algorithm=algorithm, pop=pop, dim=dim, gens=2, hyper={}, objective=args.objective)
    w.ask(op="drop")
    if "error" in got or not got["warm_s"]:
        return model
    per_generation = max(got["warm_s"].values()) / 2
    return max(1, min(model, int(args.sample_s / per_generation)))


def measure_row(workers: dict, peer: str, algorithm: str, pop: int, dim: int, args) -> dict:
    """One row: the peer's and hpcevo's programs built, warmed, then timed in turn."""
    row = {"peer": peer, "algorithm": algorithm, "pop": pop, "dim": dim, "objective": args.objective}
    gens = generations_for(pop, dim, args.sample_s)
    sides = {"hpcevo": gens, peer: _calibrated(workers[peer], peer, algorithm, pop, dim, args)}
    row["gens"] = sides
    timed, slow = [], set()
    for side, g in sides.items():
        got = workers[side].ask(op="setup", algorithm=algorithm, pop=pop, dim=dim, gens=g,
                                hyper=PAIRS[(peer, algorithm)], objective=args.objective)
        if "error" in got:
            row["error"] = f"{side}: {got['error']}"
            break
        row.setdefault("first_call_s", {}).update(got["first_call_s"])
        row.setdefault("notes", []).extend(got["notes"])
        timed += [(side, v, g) for v in got["variants"]]
        # A side far slower than the cost model thought (evosax's DE is quadratic in the
        # population) gets MIN_REPEATS samples, not a run of many minutes.
        slow.update(v for v, t in got["warm_s"].items() if t > SLOW_SAMPLE * args.sample_s)
    samples: dict[str, list[float]] = {v: [] for _, v, _ in timed}
    if "error" not in row:
        for r in range(args.repeats):  # in turn, the order rotating: drift falls on every side alike
            for side, variant, g in timed[r % len(timed):] + timed[:r % len(timed)]:
                if variant in slow and r >= MIN_REPEATS:
                    continue
                got = workers[side].ask(op="time", variant=variant)
                if "error" in got:
                    row["error"] = f"{variant}: {got['error']}"
                    break
                samples[variant].append(got["s"] / g * 1e3)
    for side in sides:
        workers[side].ask(op="drop")
    if "error" in row:
        return row
    row["ms"] = {v: _stats(xs) for v, xs in samples.items()}
    med = {v: s["median"] for v, s in row["ms"].items()}
    row["peer_over_hpcevo"] = med[peer] / med["hpcevo Loop.advance"]
    row["overhead"] = med["hpcevo Loop.advance"] / med["hpcevo bare step"]
    row["peer_over_bare"] = med[peer] / med["hpcevo bare step"]
    return row


def cli_row(workers: dict, peer: str, algorithm: str, pop: int, dim: int, args) -> dict:
    """``hpcevo run`` as a user runs it (its own process, binding, log every 100 generations), its
    time per generation from its records between generation 100 and the last; alternated with
    samples of the bare step, run after each."""
    gens = generations_for(pop, dim, args.sample_s)
    total = 100 + 100 * max(2, -(-2 * gens * args.repeats // 100))  # about 2 s of generations
    hyper = PAIRS[(peer, algorithm)]
    got = workers["hpcevo"].ask(op="setup", algorithm=algorithm, pop=pop, dim=dim, gens=gens, hyper=hyper,
                                objective=args.objective)
    if "error" in got:
        return {"peer": peer, "algorithm": algorithm, "pop": pop, "dim": dim, "error": got["error"]}
    # the user's function by import path, as a config names one (README, "Your own problem")
    name = "benchmarks.vs_peers:user_ackley" if args.objective == "user" else "ackley"
    run_ms, bare_ms = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.cli_repeats):
            cfg = Path(tmp) / f"run{r}.toml"
            extra = "".join(f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {v}\n" for k, v in hyper.items())
            cfg.write_text(f'[run]\nname = "peers"\nseed = {r + 1}\ngenerations = {total}\nout = "{tmp}/run{r}"\n'
                           f'[algorithm]\nname = "{algorithm}"\npop_size = {pop}\n{extra}'
                           f'[problem]\nname = "{name}"\ndim = {dim}\nlb = {-ACKLEY_BOX}\nub = {ACKLEY_BOX}\n'
                           f'[log]\nevery = 100\n')
            proc = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(cfg)], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
            if proc.returncode:
                return {"peer": peer, "algorithm": algorithm, "pop": pop, "dim": dim,
                        "error": f"hpcevo run: exit {proc.returncode}: {proc.stderr[-400:]}"}
            recs = [json.loads(x) for x in (Path(tmp) / f"run{r}" / "metrics.jsonl").read_text().splitlines()]
            a = next(x for x in recs if x["generation"] == 100)
            b = recs[-1]
            run_ms.append((b["wall_s"] - a["wall_s"]) / (b["generation"] - 100) * 1e3)
            bare_ms.append(workers["hpcevo"].ask(op="time", variant="hpcevo bare step")["s"] / gens * 1e3)
    workers["hpcevo"].ask(op="drop")
    return {"peer": peer, "algorithm": algorithm, "pop": pop, "dim": dim, "generations": total,
            "objective": args.objective,
            "ms": {"hpcevo run": _stats(run_ms), "hpcevo bare step": _stats(bare_ms)},
            "overhead": statistics.median(run_ms) / statistics.median(bare_ms)}


def _fmt(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"


def _ratio(ms: dict, a: str, b: str) -> str:
    return f"{ms[a]['median'] / ms[b]['median']:.2f}" if a in ms and b in ms else "-"


def table(rep: dict) -> str:
    one = "hpcevo, one micro-batch"
    lines = [f"objective: {OBJECTIVES[rep.get('objective', 'builtin')]}", "",
             "| peer | algorithm | pop | dim | peer ms | hpcevo `Loop.advance` ms | hpcevo bare step ms | "
             "peer / hpcevo | hpcevo / bare |" + (f" {one} ms | peer / it |" if rep.get("objective") == "user" else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if rep.get("objective") == "user" else "")]
    for r in rep["rows"]:
        if "error" in r:
            lines.append(f"| {r['peer']} | {r['algorithm']} | {r['pop']} | {r['dim']} | error: {r['error'][:120]} |||||")
            continue
        ms = r["ms"]
        lines.append(f"| {r['peer']} | {r['algorithm']} | {r['pop']:,} | {r['dim']} | {_fmt(ms[r['peer']])} | "
                     f"{_fmt(ms['hpcevo Loop.advance'])} | {_fmt(ms['hpcevo bare step'])} | "
                     f"{'**' if r['peer_over_hpcevo'] < 1 else ''}{r['peer_over_hpcevo']:.2f}"
                     f"{'**' if r['peer_over_hpcevo'] < 1 else ''} | {r['overhead']:.3f} |"
                     + (f" {_fmt(ms.get(one))} | {_ratio(ms, r['peer'], one)} |" if rep.get("objective") == "user" else ""))
    if rep.get("cli"):
        lines += ["", "| algorithm | hyper | pop | dim | `hpcevo run` ms | bare step ms | run / bare |", "|---|---|---|---|---|---|---|"]
        for r in rep["cli"]:
            if "error" in r:
                lines.append(f"| {r['algorithm']} | | {r['pop']} | {r['dim']} | error: {r['error'][:120]} |||")
                continue
            hyper = ", ".join(f"{k}={v}" for k, v in PAIRS[(r["peer"], r["algorithm"])].items()) or "defaults"
            lines.append(f"| {r['algorithm']} | {hyper} | {r['pop']:,} | {r['dim']} | {_fmt(r['ms']['hpcevo run'])} | "
                         f"{_fmt(r['ms']['hpcevo bare step'])} | {r['overhead']:.3f} |")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="PEER:ALGORITHM", help="e.g. evosax:pso evox:cso (default: all pairs)")
    p.add_argument("--pops", nargs="+", type=int, default=list(POPS))
    p.add_argument("--dims", nargs="+", type=int, default=list(DIMS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--sample-s", type=float, default=0.15, help="seconds of generations per timed sample")
    p.add_argument("--cli-pops", nargs="*", type=int, default=[1024], help="rows also run as `hpcevo run`")
    p.add_argument("--cli-repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="toy sizes, two repeats (a smoke run)")
    p.add_argument("--construction", action="store_true",
                   help="only: evosax's PSO timed with its state built inside the call (the old harness) and carried")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--objective", choices=sorted(OBJECTIVES), default="builtin",
                   help="builtin: hpcevo's Ackley (EvoX's own on its side); user: a plain Ackley as a user writes it, "
                        "on both sides")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.pops, args.dims, args.repeats, args.sample_s = [64], [10], 2, 0.01
        args.cli_pops, args.cli_repeats = [64], 1
    pairs = list(PAIRS)
    if args.only:
        want = [tuple(x.split(":", 1)) for x in args.only]
        bad = [":".join(x) for x in want if x not in PAIRS]
        if bad:
            p.error(f"unknown pair(s) {', '.join(bad)}; known: {', '.join(':'.join(k) for k in PAIRS)}")
        pairs = want
    args.pairs = pairs
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.construction:
        os.environ.setdefault("NPROC", "1")
        got = construction(repeats=args.repeats)
        for name, s in got["ms_per_generation"].items():
            print(f"{name:55s} {_fmt(s)} ms per generation")
        print("max |x| of the swarm after generations " + ", ".join(f"{k}: {v:,.0f}" for k, v in got["max_abs_x_after"].items()))
        return 0
    t0 = time.perf_counter()
    sides = ["hpcevo"] + sorted({peer for peer, _ in args.pairs})
    workers = {side: Worker(side) for side in sides}
    try:
        rep = {"when": time.strftime("%Y-%m-%d-%H%M"), "host": platform.node(), "cpu": _cpu_model(),
               "objective": args.objective,
               "cores": os.cpu_count(), "argv": sys.argv[1:], "repeats": args.repeats, "sample_s": args.sample_s,
               "sides": {s: w.ask(op="info") for s, w in workers.items()}, "rows": [], "cli": []}
        for peer, algorithm in args.pairs:
            for pop in args.pops:
                if peer == "pycma" and pop not in PYCMA_POPS and not args.quick:
                    continue
                for dim in args.dims:
                    row = measure_row(workers, peer, algorithm, pop, dim, args)
                    rep["rows"].append(row)
                    print(f"[peers] {peer}:{algorithm} pop {pop} dim {dim}: " + (row.get("error") or (
                        f"peer/hpcevo {row['peer_over_hpcevo']:.2f}, hpcevo/bare {row['overhead']:.3f}")),
                        file=sys.stderr, flush=True)
        done = set()
        for peer, algorithm in args.pairs:
            key = (algorithm, tuple(sorted(PAIRS[(peer, algorithm)].items())))
            if key in done:
                continue
            done.add(key)
            for pop in args.cli_pops:
                for dim in args.dims:
                    rep["cli"].append(cli_row(workers, peer, algorithm, pop, dim, args))
    finally:
        for w in workers.values():
            w.close()
    rep["seconds"] = time.perf_counter() - t0
    out = args.out or HERE / "results" / f"vs_peers-{rep['when']}-{rep['host']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1))
    print(f"hpcevo vs its peers on {rep['cpu']} ({rep['cores']} cores), one XLA thread each; "
          f"ms per generation, median [min, max] of {args.repeats}; peer / hpcevo >= 1: hpcevo at least as fast\n")
    print(table(rep))
    print(f"\n{rep['seconds'] / 60:.1f} min; JSON {out}")
    return 1 if any("error" in r for r in rep["rows"] + rep["cli"]) else 0


if __name__ == "__main__":
    sys.exit(main())
