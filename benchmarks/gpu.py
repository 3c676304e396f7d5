"""Every GPU check and measurement in one command, for a machine that is lent for minutes.

    python -m benchmarks gpu                  # on a GPU node, after scripts/gpu-node-setup.sh
    python -m benchmarks gpu --smoke          # the same steps at toy sizes on the CPU (the suite runs it)
    python -m benchmarks gpu --budget 300 --out DIR

Writes ``gpu-<date>-<host>.json`` and ``.md`` to ``--out`` (default benchmarks/results) after every
part, so a run cut short keeps what it measured, and prints the Markdown last. Each part runs in
its own processes with a time limit; a part that fails is recorded with the end of its output
and the next part runs.

1. ``env``: Python, JAX and its devices, the XLA flags in effect, MPI, mpi4jax (and whether it has
   its CUDA bridge), h5py (with MPI or not), the GPU (nvidia-smi).
2. ``info``: ``hpcevo info`` at 1 rank and at 2 ranks sharing the GPU (``parallel.share_gpus``).
3. ``digests``: ``hpcevo run`` of CSO, PSO and OpenES (Ackley) at 1 rank, again at 1 rank, and at
   2 ranks sharing the GPU; CSO also stopped at half way at 2 ranks and resumed at 1. Every
   digest of one algorithm must be equal.
4. ``speed`` (1 rank, one process): per generation, the bare jitted step (ask, the problem on the
   whole population, tell, in a ``lax.scan`` on the carried state, initialised outside ``jit``,
   as evosax's users run theirs) against hpcevo's generation (``Loop.advance``: the micro-batch
   loop, the exchange, the best and history bookkeeping), hpcevo with one micro-batch (one call of
   the problem per rank), and evosax's PSO and OpenES run the way its documentation runs them.
   CSO, PSO, OpenES at pop 1,024 / 16,384 / 262,144 and dim 100 / 1,000, in order of interest,
   until the part's share of the budget is spent (what was left out is listed). Warm-up calls
   first; then the variants alternate, several repeats, median and range.
5. ``allgather`` (2 ranks sharing the GPU): the fitness exchange as hpcevo does it (mpi4jax's
   allgather of device arrays in a jitted loop) against mpi4py's Allgather of host buffers.
6. ``command_buffers`` (GPU only): part 4 at pop 16,384, dim 100 again, with XLA's command
   buffers for while loops and conditionals (``COMMAND_BUFFERS``), with what time is left.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = ("env", "info", "digests", "speed", "allgather", "command_buffers")
# XLA on GPU runs a while loop whose trip count it does not know by copying the condition to
# the host every iteration (WhileThunk); hpcevo's micro-batch loop and its generation loop are
# such loops. Command buffers (CUDA graphs) with conditional nodes keep the loop on the device.
COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"

# (algorithm, pop, dim) in the order they are measured: the sizes a GPU is for first.
SPEED_CONFIGS = [(a, p, d) for p, d in ((16384, 100), (262144, 100), (1024, 100), (16384, 1000),
                                        (262144, 1000), (1024, 1000)) for a in ("cso", "pso", "openes")]
# hpcevo's loops shaped otherwise than the device's default (driver/engine.py, loop_shape)
LOOP_SHAPES = {"hpcevo, loops of data trip counts": "data", "hpcevo, fixed, blocks of 1": "fixed:1",
               "hpcevo, fixed, blocks of 32": "fixed:32"}
SPEED_COLUMNS = ("bare step", "bare + allgather", "bare, loop of unknown length", "hpcevo", *LOOP_SHAPES,
                 "hpcevo, 1 micro-batch", "evosax")
SMOKE_CONFIGS = [(a, p, 10) for p in (64, 256) for a in ("cso", "pso", "openes")]


def _env(device: str) -> dict[str, str]:
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MPI4JAX_USE_CUDA_MPI", "0")  # host copies: mpi4jax#309, and a fitness vector is small
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # two ranks share one GPU here
    env["HPCEVO_BENCH_DEVICE"] = device
    return env


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"  # the MPICH wheel's, in a gpu-node-setup venv
    return str(here) if here.exists() else os.environ.get("MPIEXEC", "mpiexec")


class Runner:
    def __init__(self, device: str, deadline: float, log: Path):
        self.device, self.deadline, self.log = device, deadline, log

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list[str], ranks: int | None = None, timeout: float = 300, cwd: Path | None = None,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
        if ranks is not None:
            cmd = [_mpiexec(), "-n", str(ranks), *cmd]
        env = _env(self.device) | (extra_env or {})
        timeout = max(5.0, min(timeout, self.left()))
        t = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or ROOT)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            r = subprocess.CompletedProcess(cmd, 124, out, err + f"\n[timed out after {timeout:.0f} s]")
        with self.log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}  # rc {r.returncode}, {time.monotonic() - t:.1f} s\n{r.stdout}\n{r.stderr}\n")
        return r

    def worker(self, name: str, *args: str, ranks: int | None = None, timeout: float = 300,
               extra_env: dict | None = None) -> dict:
        r = self.run([sys.executable, "-m", "benchmarks.gpu", "--worker", name, *args], ranks, timeout,
                     extra_env=extra_env)
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if not lines or r.returncode not in (0, 124):
            raise RuntimeError(f"worker {name} ({ranks or 1} rank(s)) failed, rc {r.returncode}: "
                               f"{(r.stderr or r.stdout)[-1500:]}")
        out = json.loads(lines[-1][7:])
        if r.returncode == 124:  # out of time: what the worker had finished (it reports as it goes)
            out["timed_out"] = True
        return out


# -- workers (each in its own process) ------------------------------------------------------------
def _bind():
    from hpcevo.parallel import bind, discover

    return bind(discover(), device=os.environ.get("HPCEVO_BENCH_DEVICE", "auto"), threads="auto",
                share_gpus=True)


def _emit(ctx, obj) -> None:
    if ctx is None or ctx.is_root:
        print("RESULT " + json.dumps(obj), flush=True)


def w_env() -> None:
    ctx = _bind()
    import h5py
    import jax
    import jaxlib
    import mpi4jax
    import mpi4py
    import numpy

    from hpcevo.parallel.context import mpi_library
    from hpcevo.provenance import parallel_hdf5

    try:
        from mpi4jax._src.xla_bridge import HAS_CUDA_EXT as bridge
    except ImportError:
        bridge = None
    smi = shutil.which("nvidia-smi")
    gpu = None
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                           capture_output=True, text=True)
        gpu = q.stdout.strip() or q.stderr.strip()
    _emit(ctx, {
        "host": platform.node(), "python": sys.version.split()[0], "jax": jax.__version__,
        "jaxlib": jaxlib.__version__, "numpy": numpy.__version__, "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind, "binding": ctx.device,
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "mpi": mpi_library()[0], "mpi4py": mpi4py.__version__,
        "mpi4jax": mpi4jax.__version__, "mpi4jax_cuda_bridge": bridge, "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version, "h5py_mpi": parallel_hdf5(), "nvidia_smi": gpu,
        "cpu": _cpu_model(), "cores": os.cpu_count(),
    })


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _median_range(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def w_speed(configs: str, gens: int, repeats: int, budget: float) -> None:
    """One rank. ``configs``: JSON list of [algorithm, pop, dim]."""
    ctx = _bind()
    try:
        import evosax  # noqa: F401
        have_evosax: bool | str = True
    except Exception as e:  # noqa: BLE001  (not installed, or broken on this JAX)
        have_evosax = f"{type(e).__name__}: {e}"
    end = time.monotonic() + budget
    rows, skipped = [], []
    for algo_name, pop, dim in json.loads(configs):
        if time.monotonic() > end:
            skipped.append([algo_name, pop, dim])
            continue
        try:
            rows.append(_speed_row(ctx, algo_name, pop, dim, gens, repeats, have_evosax is True))
        except Exception as e:  # noqa: BLE001  (out of memory, say: recorded, the next size runs)
            rows.append({"algorithm": algo_name, "pop": pop, "dim": dim, "error": f"{type(e).__name__}: {str(e)[:500]}"})
            print(f"[speed] {algo_name} pop {pop} dim {dim}: {rows[-1]['error']}", file=sys.stderr, flush=True)
        # After every row: a worker stopped by its time limit still hands over what it measured.
        _emit(ctx, {"rows": rows, "skipped": skipped, "evosax": have_evosax, "device": ctx.device})
    _emit(ctx, {"rows": rows, "skipped": skipped, "evosax": have_evosax, "device": ctx.device})


def _bare_parts(ctx, algo, problem, s0, gens: int) -> dict:
    """The bare step with one of hpcevo's fixed costs added, to tell them apart: the fitness
    through mpi4jax's allgather (as hpcevo exchanges it; at one rank on a GPU, a copy through the
    host), and the generations in a loop whose trip count is data (as in hpcevo's one program for
    any chunk length), which XLA on a GPU runs with a host round trip per iteration."""
    import jax
    import mpi4jax
    from jax import lax

    def gathered(state):
        def step(s, _):
            x, s = algo.ask(s)
            f = mpi4jax.allgather(problem.evaluate(x), comm=ctx.comm_jax)[0]
            return algo.tell(s, f), None
        return lax.scan(step, state, None, length=gens)[0]

    def dynamic(state, n):
        return lax.fori_loop(0, n, lambda i, s: _one(algo, problem, s), state)

    out = {}
    for name, fn, extra in (("bare + allgather", jax.jit(gathered, donate_argnums=0), ()),
                            ("bare, loop of unknown length", jax.jit(dynamic, donate_argnums=0),
                             (jax.numpy.asarray(gens, jax.numpy.int32),))):
        box = {"s": jax.tree_util.tree_map(lambda a: a.copy(), s0)}

        def go(fn=fn, box=box, extra=extra):
            box["s"] = jax.block_until_ready(fn(box["s"], *extra))
        out[name] = go
    return out


def _one(algo, problem, s):
    x, s = algo.ask(s)
    return algo.tell(s, problem.evaluate(x))


def _speed_row(ctx, algo_name: str, pop: int, dim: int, gens: int, repeats: int, with_evosax: bool) -> dict:
    import jax
    from jax import lax

    from hpcevo import Loop
    from hpcevo.algorithms import ALGORITHMS
    from hpcevo.problems import make_problem

    problem = make_problem("ackley", dim)
    hyper = {"coefficients": "per_particle"} if algo_name == "pso" else {}  # evosax's PSO draws r1, r2 per particle
    algo = ALGORITHMS[algo_name](pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub, **hyper)
    variants = {}

    # the bare step, as a user of a JAX library runs one: state made once, then a jitted
    # scan of generations called again and again on the carried (donated) state
    def scan(state, n=gens):
        def step(s, _):
            x, s = algo.ask(s)
            return algo.tell(s, problem.evaluate(x)), None
        return lax.scan(step, state, None, length=n)[0]

    bare = jax.jit(scan, donate_argnums=0)
    s = algo.init(jax.random.PRNGKey(1))
    x0, s = algo.init_ask(s)
    s = algo.init_tell(s, problem.evaluate(x0))
    box = {"bare": s}

    def run_bare():
        box["bare"] = jax.block_until_ready(bare(box["bare"]))
    variants["bare step"] = run_bare
    variants |= _bare_parts(ctx, algo, problem, s, gens)

    # hpcevo's default micro-batches (on a GPU: at least GPU_MICROBATCH rows), the CPU's (64 of
    # at least 8 rows), and one call of the problem per rank
    # and the loops' shapes (HPCEVO_LOOPS, read when a loop builds its engine): the trip counts as
    # data (the default before 2026-11-27), fixed with blocks of 1 and 32 generations
    loops = {"hpcevo": Loop(algo, problem, ctx),
             "hpcevo, 1 micro-batch": Loop(algo, problem, ctx, microbatch=pop)}
    before = os.environ.get("HPCEVO_LOOPS")
    for name, shape in LOOP_SHAPES.items():
        os.environ["HPCEVO_LOOPS"] = shape
        try:
            loops[name] = Loop(algo, problem, ctx)
        finally:
            os.environ.pop("HPCEVO_LOOPS")
            if before is not None:
                os.environ["HPCEVO_LOOPS"] = before
    for name, loop in loops.items():
        loop.init(1)
        variants[name] = (lambda lp: lambda: lp.advance(gens))(loop)
    notes = [f"hpcevo's default here: {loops['hpcevo'].engine.microbatches} micro-batches"]
    if with_evosax and algo_name in ("pso", "openes"):
        try:
            variants["evosax"] = _evosax(algo_name, pop, dim, gens, problem)
        except Exception as e:  # noqa: BLE001  (evosax on this JAX: recorded, hpcevo still measured)
            notes.append(f"evosax: {type(e).__name__}: {str(e)[:300]}")
    times = {k: [] for k in variants}
    t_compile = {}
    for k, fn in variants.items():  # compile and warm up: twice, on the state each will get
        t = time.perf_counter()
        fn()
        t_compile[k] = time.perf_counter() - t
        fn()
    for _ in range(repeats):
        for k, fn in variants.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) / gens)
    for loop in loops.values():
        loop.close()
    row = {"algorithm": algo_name, "pop": pop, "dim": dim, "gens": gens, "notes": notes,
           "ms": {k: _median_range([x * 1e3 for x in v]) for k, v in times.items()},
           "first_call_s": t_compile}
    base = statistics.median(times["bare step"])
    row["ratio_to_bare"] = {k: statistics.median(v) / base for k, v in times.items()}
    print(f"[speed] {algo_name} pop {pop} dim {dim}: " + ", ".join(
        f"{k} {row['ms'][k]['median']:.3f} ms" for k in times), file=sys.stderr, flush=True)
    return row


def _evosax(name: str, pop: int, dim: int, gens: int, problem):
    """evosax's documented loop: ``init`` once, then a jitted ``lax.scan`` of ask/evaluate/tell
    called again and again on the carried state (its README and notebooks); the same side as
    ``python -m benchmarks peers`` runs (``problem``: Ackley of ``dim``, as there)."""
    from .vs_peers import _side_evosax

    del problem
    return _side_evosax(name, pop, dim, gens)["evosax"]


def w_allgather(repeats: int) -> None:
    """Two ranks: hpcevo's exchange (mpi4jax allgather of device arrays, in a jitted loop) against
    mpi4py's Allgather of host buffers, per call, for fitness vectors of several sizes."""
    ctx = _bind()
    import jax
    import jax.numpy as jnp
    import mpi4jax
    import numpy as np

    comm = ctx.comm_ctl
    R = 200
    rows = []
    for n in (1024, 16384, 262144):
        share = n // ctx.size
        x = jnp.zeros(share, jnp.float32)

        @jax.jit
        def loop(x):
            def body(i, x):  # the gathered vector feeds the next call: nothing is hoisted
                return x + mpi4jax.allgather(x, comm=ctx.comm_jax)[-1, 0] * 0
            return jax.lax.fori_loop(0, R, body, x)

        jax.block_until_ready(loop(x))
        send, recv = np.zeros(share, np.float32), np.empty(share * ctx.size, np.float32)
        ours, raw = [], []
        for _ in range(repeats):
            comm.Barrier()
            t = time.perf_counter()
            jax.block_until_ready(loop(x))
            ours.append((time.perf_counter() - t) / R)
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(R):
                comm.Allgather(send, recv)
            raw.append((time.perf_counter() - t) / R)
        rows.append({"fitness_values": n, "bytes_per_rank": share * 4,
                     "mpi4jax_device_us": _median_range([v * 1e6 for v in ours]),
                     "mpi4py_host_us": _median_range([v * 1e6 for v in raw]),
                     "ratio": statistics.median(ours) / statistics.median(raw)})
    _emit(ctx, {"ranks": ctx.size, "device": ctx.device, "rows": rows})


# -- parts (the driver) -----------------------------------------------------------------------------
def part_env(r: Runner, smoke: bool) -> dict:
    return r.worker("env", timeout=120)


def part_info(r: Runner, smoke: bool) -> dict:
    out = {}
    for ranks in (1, 2):
        p = r.run([sys.executable, "-m", "hpcevo", "info", str(ROOT / "examples" / "cso.toml"),
                   "--set", "parallel.share_gpus=true"], ranks, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"hpcevo info at {ranks} rank(s): rc {p.returncode}: {p.stderr[-1500:]}")
        out[f"{ranks} rank(s)"] = p.stdout
    return out


def _digest_runs(smoke: bool) -> list[dict]:
    """The runs of part 3, in order: algorithm, what, ranks, run directory name, --set values, resume."""
    pop, dim, gens = (64, 10, 20) if smoke else (4096, 100, 100)

    def sets(algo, g):
        return [f"algorithm.pop_size={pop}", f"problem.dim={dim}", f"run.generations={g}"]

    runs = []
    for algo in ("cso", "pso", "openes"):
        runs += [dict(algorithm=algo, run="1 rank", ranks=1, name=f"{algo}-1", sets=sets(algo, gens)),
                 dict(algorithm=algo, run="1 rank, again", ranks=1, name=f"{algo}-1-again", sets=sets(algo, gens)),
                 dict(algorithm=algo, run="2 ranks sharing the GPU", ranks=2, name=f"{algo}-2", sets=sets(algo, gens))]
    runs += [dict(algorithm="cso", run="2 ranks to half way", ranks=2, name="cso-stopped", sets=sets("cso", gens // 2)),
             dict(algorithm="cso", run="resumed at 1 rank", ranks=1, name="cso-stopped", sets=sets("cso", gens),
                  resume=True)]
    # Dispatches of another length (checkpoints every 7 generations, not 25): on a GPU a dispatch
    # runs its generations in blocks of fixed length (driver/engine.py, loop_shape), so this
    # moves every block boundary; the digest must not move. And the loops of data trip counts (the
    # CPU's, and the GPU's before 2026-11-27): the digests recorded before, a baseline apart.
    for algo in ("cso", "pso", "openes"):
        runs += [dict(algorithm=algo, run="1 rank, checkpoints every 7", ranks=1, name=f"{algo}-1-every7",
                      sets=sets(algo, gens) + ["checkpoint.every=7"]),
                 dict(algorithm=algo, run="1 rank, loops of data trip counts", ranks=1, name=f"{algo}-1-data",
                      sets=sets(algo, gens), env={"HPCEVO_LOOPS": "data"})]
    return runs


def part_digests(r: Runner, smoke: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hpcevo-gpu-digests-"))
    rows = []
    for run in _digest_runs(smoke):
        name, ranks = run["name"], run["ranks"]
        cfg = work / f"{run['algorithm']}.toml"
        cfg.write_text(f'[run]\nseed = 42\n[algorithm]\nname = "{run["algorithm"]}"\n[problem]\nname = "ackley"\n')
        args = [sys.executable, "-m", "hpcevo", "run", str(cfg), "--set", f"run.name=\"{name}\"", "--set",
                f"run.out=\"{work / name}\"", "--set", "parallel.share_gpus=true",
                *([] if any(x.startswith("checkpoint.every=") for x in run["sets"]) else ["--set", "checkpoint.every=25"]),
                "--set", f"parallel.compile_cache=\"{work / 'cache'}\"", "--quiet"]
        for s in run["sets"]:
            args += ["--set", s]
        args.append("--resume" if run.get("resume") else "--overwrite")
        p = r.run(args, ranks, timeout=300, extra_env=run.get("env"))
        summary = work / name / "summary.json"
        row = {"algorithm": run["algorithm"], "run": run["run"], "ranks": ranks, "rc": p.returncode}
        if p.returncode == 0 and summary.exists():
            s = json.loads(summary.read_text())
            row |= {"digest": s["state_digest"], "best": s["best_fitness"], "generations": s["generations"],
                    "wall_s": s["wall_s"], "compile_s": s["compile_s"], "device": s.get("device")}
        else:
            row["error"] = (p.stderr or p.stdout)[-1500:]
        rows.append(row)
    shutil.rmtree(work, ignore_errors=True)
    verdict = {}
    for algo in ("cso", "pso", "openes"):
        full = [x for x in rows if x["algorithm"] == algo and not x["run"].startswith("2 ranks to half")
                and "data trip counts" not in x["run"]]
        digests = {x.get("digest") for x in full}
        verdict[algo] = len(digests) == 1 and None not in digests
    return {"rows": rows, "equal": verdict, "all_equal": all(verdict.values())}


def _speed_configs(smoke: bool) -> list:
    """The rows to measure: HPCEVO_GPU_SPEED_CONFIGS (JSON, [[algorithm, pop, dim], ...]) if set."""
    given = os.environ.get("HPCEVO_GPU_SPEED_CONFIGS")
    return json.loads(given) if given else (SMOKE_CONFIGS if smoke else SPEED_CONFIGS)


def part_speed(r: Runner, smoke: bool, share: float) -> dict:
    configs = _speed_configs(smoke)
    gens, repeats = (5, 2) if smoke else (50, 5)
    budget = max(20.0, r.left() * share)
    return r.worker("speed", json.dumps(configs), str(gens), str(repeats), str(budget), timeout=budget + 180)


def part_command_buffers(r: Runner, smoke: bool) -> dict:
    if smoke:
        return {"skipped": "GPU only"}
    configs = [(a, 16384, 100) for a in ("cso", "pso", "openes")]
    if os.environ.get("HPCEVO_GPU_SPEED_CONFIGS"):
        configs = _speed_configs(smoke)
    budget = max(20.0, r.left() - 60)
    flags = (os.environ.get("XLA_FLAGS", "") + " " + COMMAND_BUFFERS).strip()
    out = r.worker("speed", json.dumps(configs), "50", "5", str(budget), timeout=budget + 120,
                   extra_env={"XLA_FLAGS": flags})
    return out | {"xla_flags_added": COMMAND_BUFFERS}


def part_allgather(r: Runner, smoke: bool) -> dict:
    return r.worker("allgather", "3" if smoke else "7", ranks=2, timeout=180)


# -- the report --------------------------------------------------------------------------------------
def markdown(rep: dict) -> str:
    out = [f"# hpcevo on a GPU: {rep['when']} ({'smoke, CPU' if rep['smoke'] else 'full'})", ""]
    env = rep["parts"].get("env", {})
    if "error" not in env and env:
        out += [f"- device: {env.get('nvidia_smi') or env.get('device_kind')} (JAX {env.get('backend')}: "
                f"{', '.join(env.get('devices', []))}); host CPU {env.get('cpu')}, {env.get('cores')} cores",
                f"- Python {env.get('python')}, jax {env.get('jax')}, jaxlib {env.get('jaxlib')}, numpy {env.get('numpy')}",
                f"- MPI: {env.get('mpi')}; mpi4py {env.get('mpi4py')}, mpi4jax {env.get('mpi4jax')} "
                f"(CUDA bridge: {env.get('mpi4jax_cuda_bridge')}); h5py {env.get('h5py')} (HDF5 {env.get('hdf5')}, "
                f"MPI: {env.get('h5py_mpi')})",
                f"- XLA_FLAGS after hpcevo's binding: `{env.get('xla_flags')}`", ""]
    for name in PARTS:
        part = rep["parts"].get(name)
        if part is None:
            out += [f"## {name}: not run", ""]
            continue
        if "error" in part:
            out += [f"## {name}: FAILED", "", "```", part["error"][-2000:], "```", ""]
            continue
        if name == "digests":
            out += ["## Digests (`hpcevo run`, Ackley; equal within each algorithm?)", "",
                    "| algorithm | run | ranks | state digest | best | wall s |", "|---|---|---|---|---|---|"]
            for x in part["rows"]:
                digest = x.get("digest") or "FAILED: " + x.get("error", "")[-200:].replace("\n", " ")
                wall = f"{x['wall_s']:.2f}" if "wall_s" in x else ""
                out.append(f"| {x['algorithm']} | {x['run']} | {x['ranks']} | {digest[:16]} | {x.get('best', '')} | {wall} |")
            out += ["", "equal: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in part["equal"].items()), ""]
        elif name in ("speed", "command_buffers"):
            if "skipped" in part and "rows" not in part:
                out += [f"## {name}: skipped ({part['skipped']})", ""]
                continue
            notes: list[str] = []
            title = "Speed" if name == "speed" else f"Speed with `{part.get('xla_flags_added')}`"
            out += [f"## {title}, 1 rank, ms per generation (median of repeats; ratio to the bare step) on {part['device']}", "",
                    "| algorithm | pop | dim | " + " | ".join(SPEED_COLUMNS) + " |", "|---|---|---|" + "---|" * len(SPEED_COLUMNS)]
            for x in part["rows"]:
                if "error" in x:
                    out.append(f"| {x['algorithm']} | {x['pop']} | {x['dim']} | FAILED: {x['error'][:300]} |" + " |" * (len(SPEED_COLUMNS) - 1))
                    continue
                def cell(k):
                    if k not in x["ms"]:
                        return "-"
                    return f"{x['ms'][k]['median']:.3f} ({x['ratio_to_bare'][k]:.2f}x)"
                out.append(f"| {x['algorithm']} | {x['pop']} | {x['dim']} | " + " | ".join(cell(k) for k in SPEED_COLUMNS) + " |")
                notes += [f"{x['algorithm']} {x['pop']}x{x['dim']}: {n}" for n in x.get("notes", [])]
            if notes:
                out += [""] + [f"- {n}" for n in notes]
            if part["skipped"]:
                out += ["", f"not measured (budget spent): {part['skipped']}"]
            if part.get("evosax") is not True:
                out += ["", f"evosax: {part.get('evosax')}"]
            out.append("")
        elif name == "allgather":
            out += [f"## Fitness exchange at {part['ranks']} ranks ({part['device']}), us per call", "",
                    "| values | bytes/rank | mpi4jax, device arrays, jitted | mpi4py Allgather, host | ratio |",
                    "|---|---|---|---|---|"]
            for x in part["rows"]:
                out.append(f"| {x['fitness_values']} | {x['bytes_per_rank']} | {x['mpi4jax_device_us']['median']:.1f} | "
                           f"{x['mpi4py_host_us']['median']:.1f} | {x['ratio']:.2f} |")
            out.append("")
        elif name == "info":
            for k, v in part.items():
                out += [f"## hpcevo info, {k}", "", "```", v.strip(), "```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="toy sizes, on the CPU: checks the command itself")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for everything (default 420)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.worker:
        {"env": w_env, "speed": w_speed, "allgather": w_allgather}[args.worker](
            *[_num(x) for x in rest])
        return 0
    device = "cpu" if args.smoke else "auto"
    args.out.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    stem = args.out / f"gpu-{'smoke-' if args.smoke else ''}{when}-{platform.node()}"
    r = Runner(device, time.monotonic() + args.budget, stem.with_suffix(".log"))
    rep = {"when": when, "smoke": args.smoke, "budget_s": args.budget, "argv": sys.argv, "parts": {}, "seconds": {}}
    for name in args.parts:
        t = time.monotonic()
        try:
            if name == "speed":
                # the speed part gets most of what is left, the allgather after it a little
                rep["parts"][name] = part_speed(r, args.smoke, 0.6 if "command_buffers" in args.parts else 0.85)
            else:
                rep["parts"][name] = globals()[f"part_{name}"](r, args.smoke)
        except Exception as e:  # noqa: BLE001  (recorded; the next part runs)
            rep["parts"][name] = {"error": f"{type(e).__name__}: {e}"}
        rep["seconds"][name] = round(time.monotonic() - t, 1)
        stem.with_suffix(".json").write_text(json.dumps(rep, indent=1))
        stem.with_suffix(".md").write_text(markdown(rep))
        print(f"[gpu] {name}: {'FAILED' if 'error' in rep['parts'][name] else 'done'} in {rep['seconds'][name]} s",
              file=sys.stderr, flush=True)
    print(markdown(rep))
    print(f"[gpu] wrote {stem}.json, .md, .log", file=sys.stderr)
    failed = [k for k, v in rep["parts"].items() if "error" in v]
    bad_digests = "digests" in rep["parts"] and not rep["parts"]["digests"].get("all_equal", True)
    return 1 if failed or bad_digests else 0


def _num(x: str):
    for conv in (int, float):
        try:
            return conv(x)
        except ValueError:
            pass
    return x


if __name__ == "__main__":
    sys.exit(main())
