"""Run a validated config: build the pieces, drive the workflow, write the run directory.

Collective: every rank calls ``execute`` with the same config. Rank 0 alone prints and writes
files; every rank computes, and every rank checks that its replica matches the others' at each
log boundary.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from . import __version__
from .config import RunConfig, build_algorithm, build_problem, dump_config
from .errors import UsageError
from .parallel import ParallelContext, agree_on_error, check_replicas, microbatch_rows, mpi_library

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json")


def versions() -> dict[str, str]:
    import h5py
    import jax
    import jaxlib
    import mpi4jax
    import mpi4py

    return {
        "hpcevo": __version__,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "mpi4jax": mpi4jax.__version__,
        "mpi4py": mpi4py.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": mpi_library()[0],
    }


def prepare_run_dir(ctx: ParallelContext, cfg: RunConfig, overwrite: bool) -> Path:
    """Rank 0 checks and creates the run directory; every rank learns the outcome."""
    out = cfg.out_dir
    error: BaseException | None = None
    if ctx.is_root:
        try:
            existing = [f for f in RUN_FILES if (out / f).exists()]
            if existing and not overwrite:
                raise UsageError(
                    f"run directory '{out}' already holds a run ({', '.join(existing)}); "
                    "choose another with --set run.out=DIR or run.name, or pass --overwrite"
                )
            if existing:
                for f in RUN_FILES:
                    (out / f).unlink(missing_ok=True)
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except UsageError as e:
            error = e
        except OSError as e:
            error = UsageError(f"run directory '{out}' cannot be written: {e.strerror}")
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    return out


def probe_batch_size(cfg: RunConfig, problem, algorithm) -> bool | None:
    """With ``evaluation.batch_size`` below the micro-batch: does evaluating in pieces give the
    unchunked values bit for bit, on one micro-batch of random candidates? (None: no pieces.)

    A problem whose row values depend on its block's shape would otherwise change the run's last
    bits silently when a user bounds memory. Problems that are block invariant by construction
    say so (``block_invariant``: the numerical and CEC 2022 functions, tested bitwise); for the
    others the probe costs two compilations of the problem."""
    import jax
    import jax.numpy as jnp

    from .parallel.evaluate import chunking_is_exact

    mb = microbatch_rows(algorithm.num_ask, cfg.parallel.microbatch or None)
    piece = cfg.evaluation.batch_size
    if not piece or piece >= mb:
        return None
    if getattr(problem, "block_invariant", False):
        return True
    x = algorithm.uniform_in_bounds(jax.random.PRNGKey(cfg.run.seed), mb)
    args = (jnp.asarray(1, jnp.int32),) if getattr(problem, "wants_generation", False) else ()
    return chunking_is_exact(problem.evaluate, x, piece, *args)


class Reporter:
    """Rank 0's voice: a progress bar on a terminal, plain lines in a batch job, nothing if quiet."""

    def __init__(self, ctx: ParallelContext, cfg: RunConfig, quiet: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.on = ctx.is_root and not quiet
        mode = cfg.log.progress
        use_bar = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self.bar = None
        if self.on and use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.run.generations, unit="gen", file=self.stream, dynamic_ncols=True)

    def line(self, text: str) -> None:
        if not self.on:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def boundary(self, rec: dict[str, Any]) -> None:
        if not self.on:
            return
        text = (
            f"gen {rec['generation']:>7}  best {rec['best']:.6e}  mean {rec['gen_mean']:.6e}  "
            f"evals/s {rec['evals_per_s']:.3e}"
        )
        if rec["nonfinite"]:
            text += f"  non-finite {rec['nonfinite']}"
        if self.bar is not None:
            self.bar.update(rec["generation"] - self.bar.n)
            self.bar.set_postfix(best=f"{rec['best']:.4e}", refresh=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def execute(ctx: ParallelContext, cfg: RunConfig, *, overwrite: bool = False, quiet: bool = False,
            stream: TextIO | None = None) -> dict[str, Any]:
    """Run ``cfg`` to the end on the ranks of ``ctx``; return the summary (on every rank)."""
    import jax

    if cfg.run.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    from .workflow import Workflow, state_digest

    problem, algorithm, error = None, None, None
    try:  # a user's problem file may exist on some nodes only: every rank learns of a failure
        problem = build_problem(cfg)
        algorithm = build_algorithm(cfg, problem)
    except UsageError as e:
        error = e
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    out = prepare_run_dir(ctx, cfg, overwrite)
    report = Reporter(ctx, cfg, quiet, stream)
    if ctx.is_root:
        (out / "config.toml").write_text(dump_config(cfg))
    report.line(
        f"hpcevo {cfg.algorithm.name} on {cfg.problem.name} (dim {problem.dim}, pop {algorithm.pop_size}), "
        f"{cfg.run.generations} generations on {ctx.size} rank{'s' if ctx.size > 1 else ''} "
        f"[{ctx.device}] -> {out}"
    )

    wf = Workflow(algorithm, problem.evaluate, ctx, cfg.parallel.microbatch or None,
                  cfg.evaluation.batch_size or None, getattr(problem, "wants_generation", False))
    exact = probe_batch_size(cfg, problem, algorithm)
    if exact is False:
        report.line(
            f"warning: evaluation.batch_size = {cfg.evaluation.batch_size}: problem {cfg.problem.name} "
            "gives other last bits in pieces than in whole micro-batches (its values depend on the "
            "block's shape). This run is reproducible at any rank count with this batch_size, "
            "but not bitwise equal to a run without it."
        )
    t0 = time.perf_counter()
    wf.compile(cfg.run.seed)
    compile_s = time.perf_counter() - t0

    metrics = open(out / "metrics.jsonl", "w") if ctx.is_root else None
    t_start = t_prev = time.perf_counter()
    gen_prev = 0
    state = None
    try:
        for b in wf.run(cfg.run.seed, cfg.run.generations, cfg.log.every):
            state = b.state
            last = jax.device_get(state.last)
            best = float(state.best_f)
            nonfinite = int(state.nonfinite)
            check_replicas(ctx, wf.fingerprint(state), b.generation)
            now = time.perf_counter()
            evals = wf.evaluations(b.generation)
            rec = {
                "generation": b.generation,
                "evaluations": evals,
                "best": best,
                "gen_best": float(last[0]),
                "gen_mean": float(last[1]),
                "gen_std": float(last[2]),
                "nonfinite": nonfinite,
                "wall_s": now - t_start,
                "evals_per_s": (evals - wf.evaluations(gen_prev)) / max(now - t_prev, 1e-12),
            }
            t_prev, gen_prev = now, b.generation
            if metrics is not None:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
            report.boundary(rec)
            if b.generation == cfg.run.generations:
                final = state_digest(state), jax.device_get(state.best_x)
    finally:
        report.close()
        if metrics is not None:
            metrics.close()
    wall = time.perf_counter() - t_start
    digest, best_x = final
    evals = wf.evaluations(cfg.run.generations)
    summary = {
        "name": cfg.run.name,
        "algorithm": cfg.algorithm.name,
        "problem": cfg.problem.name,
        "dim": problem.dim,
        "pop_size": algorithm.pop_size,
        "seed": cfg.run.seed,
        "dtype": cfg.run.dtype,
        "best_fitness": best,
        "best_solution": [float(v) for v in best_x],
        "generations": cfg.run.generations,
        "evaluations": evals,
        "nonfinite_evaluations": nonfinite,
        "batch_size_exact": exact,
        "wall_s": wall,
        "compile_s": compile_s,
        "evals_per_s": evals / max(wall, 1e-12),
        "ranks": ctx.size,
        "device": ctx.device_kind,
        "state_digest": digest,
        "versions": versions(),
    }
    if ctx.is_root:
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, out / "summary.json")
    report.line(f"done: best fitness {best:.10e} after {evals} evaluations in {wall:.2f} s  ({out / 'summary.json'})")
    return summary
