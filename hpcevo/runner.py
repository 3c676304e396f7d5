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

import numpy as np

from . import __version__, checkpoint, startup
from .config import RunConfig, build_algorithm, build_problem, build_recorder, dump_config, resume_conflicts
from .errors import EXIT_STOPPED, CheckpointError, UsageError
from .parallel import (ParallelContext, agree_max, agree_on_error, bcast_from_root, check_replicas,
                       microbatch_rows, mpi_library)
from .stopping import Deadline, StopFlag, parse_deadline, scheduler_end_time
from .stopping import signal_name as stop_signal_name

FAILURES_LOG = "failures.jsonl"  # host problems: one JSON line per failed evaluation
RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", FAILURES_LOG)


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


def prepare_run_dir(ctx: ParallelContext, cfg: RunConfig, overwrite: bool, resume: bool = False) -> Path:
    """Rank 0 checks and creates the run and checkpoint directories; every rank learns the outcome.

    An existing run is continued only with ``resume``, replaced only with ``overwrite``: never
    silently. Both directories are probed for writing now, not an hour into the run.
    """
    out, ckdir = cfg.out_dir, cfg.checkpoint_dir
    error: BaseException | None = None
    if ctx.is_root:
        try:
            existing = [f for f in RUN_FILES if (out / f).exists()]
            checkpoints = checkpoint.list_checkpoints(ckdir)
            if checkpoints:
                existing.append(f"{len(checkpoints)} checkpoint(s) in {ckdir}")
            if existing and not (overwrite or resume):
                raise UsageError(
                    f"run directory '{out}' already holds a run ({', '.join(existing)}); pass --resume "
                    "to continue it, --overwrite to replace it, or choose another with --set run.out=DIR"
                )
            if existing and overwrite:
                for f in RUN_FILES:
                    (out / f).unlink(missing_ok=True)
                for path in checkpoints:
                    path.unlink()
            for d in (out, ckdir):
                d.mkdir(parents=True, exist_ok=True)
                probe = d / f".write-test-{os.getpid()}"
                probe.write_text("")
                probe.unlink()
            checkpoint.remove_partials(ckdir)
        except UsageError as e:
            error = e
        except OSError as e:
            where = e.filename or out
            error = UsageError(f"run directory '{where}' cannot be written: {e.strerror}")
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
    if not piece or piece >= mb or cfg.is_host:  # host functions are not probed: they may be costly
        return None
    if getattr(problem, "block_invariant", False):
        return True
    x = algorithm.uniform_in_bounds(jax.random.PRNGKey(cfg.run.seed), mb)
    args = (jnp.asarray(1, jnp.int32),) if getattr(problem, "wants_generation", False) else ()
    return chunking_is_exact(problem.evaluate, x, piece, *args)


def run_config_path(run_dir: str | Path) -> Path:
    """The resolved config a run directory holds (for `hpcevo resume RUN_DIR`)."""
    path = Path(run_dir) / "config.toml"
    if not Path(run_dir).is_dir():
        raise UsageError(f"run directory '{run_dir}' not found")
    if not path.is_file():
        raise UsageError(f"'{run_dir}' is not a run directory: it has no config.toml")
    return path


class Reporter:
    """Rank 0's voice: a progress bar on a terminal, plain lines in a batch job, nothing if quiet."""

    def __init__(self, ctx: ParallelContext, cfg: RunConfig, quiet: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.is_root = ctx.is_root
        self.on = ctx.is_root and not quiet
        mode = cfg.log.progress
        use_bar = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self.bar = None
        if self.on and use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.run.generations, unit="gen", file=self.stream, dynamic_ncols=True)

    def line(self, text: str, *, err: bool = False, progress: bool = False) -> None:
        """A message from rank 0. ``err``: a warning, to stderr even with --quiet. ``progress``:
        routine news, shown as plain lines in batch logs but not under a progress bar."""
        if err:
            if self.is_root:
                print(text, file=sys.stderr, flush=True)
            return
        if not self.on or (progress and self.bar is not None):
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def boundary(self, rec: dict[str, Any], progress: str) -> None:
        """``progress``: the recorder's account of the run so far ("best ... mean ...")."""
        if not self.on:
            return
        text = f"gen {rec['generation']:>7}  {progress}  evals/s {rec['evals_per_s']:.3e}"
        if rec["nonfinite"]:
            text += f"  non-finite {rec['nonfinite']}"
        if rec.get("failed_evaluations"):
            text += f"  failed {rec['failed_evaluations']}"
        if self.bar is not None:
            self.bar.update(rec["generation"] - self.bar.n)
            self.bar.set_postfix_str(progress.split("  ")[0], refresh=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class HistoryBuffer:
    """Per-generation history on the host, grown by doubling (appending stays O(1) amortised)."""

    def __init__(self) -> None:
        self.n = 0
        self.cols: dict[str, np.ndarray] = {}

    def append(self, part: dict[str, np.ndarray]) -> None:
        m = len(next(iter(part.values())))
        for k, v in part.items():
            col = self.cols.get(k)
            if col is None:
                col = self.cols[k] = np.zeros(max(1024, m), np.asarray(v).dtype)
            if self.n + m > len(col):
                grown = np.zeros(max(2 * len(col), self.n + m), col.dtype)
                grown[: self.n] = col[: self.n]
                col = self.cols[k] = grown
            col[self.n : self.n + m] = v
        self.n += m

    def view(self) -> dict[str, np.ndarray]:
        return {k: v[: self.n] for k, v in self.cols.items()}


def _resume_point(ctx: ParallelContext, cfg: RunConfig, wf: Any, report: "Reporter"):
    """The newest checkpoint that validates and fits ``cfg``, loaded; None if there is none.

    A damaged checkpoint is reported and skipped in favour of the one before it. One that is
    sound but was written by a different configuration stops the run (exit 2): resuming it would
    silently continue some other experiment.
    """
    ckdir = cfg.checkpoint_dir
    paths = bcast_from_root(ctx, [str(p) for p in checkpoint.list_checkpoints(ckdir)] if ctx.is_root else None)
    if not paths:
        report.line(f"no checkpoint in {ckdir}: starting from generation 1")
        return None
    damaged = []
    for p in map(Path, paths):
        try:
            header = checkpoint.read_header(ctx, p)
            conflicts = resume_conflicts(header.config_text, cfg)
            if conflicts:
                raise UsageError(
                    f"cannot resume from '{p}': settings that change the computation differ from "
                    "the checkpoint's:\n  " + "\n  ".join(conflicts) + "\n  allowed to change on resume: "
                    "run.generations, run.name, run.out, log.*, checkpoint.*, parallel.device, "
                    "parallel.threads_per_rank; or pass --overwrite to start a new run"
                )
            if header.generation > cfg.run.generations:
                raise UsageError(
                    f"cannot resume from '{p}': it is at generation {header.generation}, past "
                    f"run.generations = {cfg.run.generations}; raise run.generations to continue it"
                )
            loaded = checkpoint.load(ctx, p, wf.template(cfg.run.seed))
            if sorted(loaded.history) != sorted(wf.history_fields):
                raise UsageError(f"cannot resume from '{p}': its history has {sorted(loaded.history)}, this "
                                 f"run keeps {sorted(wf.history_fields)}: it was written by another kind of run")
        except checkpoint.CheckpointDamaged as e:
            damaged.append(f"{p.name}: {e}")
            report.line(f"warning: checkpoint '{p}' is damaged ({e}); trying the one before it", err=True)
            continue
        report.line(f"resuming from '{p}' (generation {loaded.header.generation}, written by "
                    f"{loaded.header.ranks} rank{'s' if loaded.header.ranks > 1 else ''})")
        return loaded
    raise UsageError(
        f"no usable checkpoint in '{ckdir}':\n  " + "\n  ".join(damaged)
        + "\n  pass --overwrite to start the run again from generation 1"
    )


def _truncate_metrics(path: Path, generation: int) -> None:
    """Keep the metric records up to ``generation``: the resumed run writes the rest again."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["generation"] <= generation:
                keep.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            break  # a torn last line from a killed run, and anything after it
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


# A dispatch (a chunk of generations in one jitted call) aims to last about this long, so a stop
# signal or a deadline is acted on within seconds even when generations are slow.
DISPATCH_TARGET_S = 5.0


def execute(ctx: ParallelContext, cfg: RunConfig, *, overwrite: bool = False, resume: bool = False,
            quiet: bool = False, stream: TextIO | None = None, deadline: str | None = None) -> dict[str, Any]:
    """Run ``cfg`` on the ranks of ``ctx``; return the summary (on every rank).

    The summary's ``status`` is "complete", or "stopped" when a signal or the deadline ended the
    run early after writing a checkpoint (the CLI exits 75 then). With ``resume`` the run continues
    from the newest valid checkpoint, bitwise as if it had never stopped.
    """
    import jax

    if cfg.run.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    from .workflow import MAX_CHUNK, Workflow, state_digest

    cache_dir = enable_compile_cache(cfg)
    problem, algorithm, error = None, None, None
    try:  # a user's problem file may exist on some nodes only: every rank learns of a failure
        problem = build_problem(cfg)
        algorithm = build_algorithm(cfg, problem)
    except UsageError as e:
        error = e
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    t_launch = time.time()
    stop_at = _deadline(ctx, cfg, deadline, t_launch)
    out = prepare_run_dir(ctx, cfg, overwrite, resume)
    report = Reporter(ctx, cfg, quiet, stream)
    G, log_every, ck = cfg.run.generations, cfg.log.every, cfg.checkpoint
    ckdir = cfg.checkpoint_dir
    config_text = dump_config(cfg)

    if cfg.is_host:  # NumPy functions and external commands: evaluated outside JIT, each generation
        from .host_workflow import HostWorkflow

        ev = cfg.evaluation
        wf = HostWorkflow(algorithm, problem, ctx, microbatch=cfg.parallel.microbatch or None,
                          batch_size=ev.batch_size or None, concurrency=ev.concurrency, schedule=ev.schedule,
                          penalty=ev.penalty, failures_log=out / FAILURES_LOG)
    else:
        wf = Workflow(algorithm, problem.evaluate, ctx, cfg.parallel.microbatch or None,
                      cfg.evaluation.batch_size or None, getattr(problem, "wants_generation", False),
                      recorder=build_recorder(cfg, problem))
    counters = getattr(wf, "counters", lambda state: {})
    loaded = _resume_point(ctx, cfg, wf, report) if resume else None
    start_gen = loaded.header.generation if loaded else 0
    if ctx.is_root:
        (out / "config.toml").write_text(config_text)
        if loaded:
            _truncate_metrics(out / "metrics.jsonl", start_gen)
        _truncate_metrics(out / FAILURES_LOG, start_gen)  # the failures of generations to come
    report.line(
        f"hpcevo {cfg.algorithm.name} on {cfg.problem.name} (dim {problem.dim}, pop {algorithm.pop_size}), "
        f"{G} generations on {ctx.size} rank{'s' if ctx.size > 1 else ''} [{ctx.device}] -> {out}"
        + (f", from generation {start_gen}" if loaded else "")
    )
    if stop_at.at is not None:
        left = stop_at.at - time.time()
        report.line(f"deadline in {left / 60:.1f} min ({stop_at.source}); stopping {stop_at.margin:.0f} s "
                    "before it, plus the time a chunk and a checkpoint take")
    if ctx.size > wf.microbatches:
        report.line(
            f"warning: {ctx.size} ranks but only {wf.microbatches} micro-batches per generation: "
            f"{ctx.size - wf.microbatches} rank(s) have nothing to evaluate. Set parallel.microbatch "
            f"<= {max(1, algorithm.num_ask // ctx.size)} to give every rank work (it changes the run's "
            "last bits, but the same setting gives the same result at any rank count)", err=True)
    exact = probe_batch_size(cfg, problem, algorithm)
    if exact is False:
        report.line(
            f"warning: evaluation.batch_size = {cfg.evaluation.batch_size}: problem {cfg.problem.name} "
            "gives other last bits in pieces than in whole micro-batches (its values depend on the "
            "block's shape). This run is reproducible at any rank count with this batch_size, "
            "but not bitwise equal to a run without it."
        )

    startup.mark("setup")
    t0 = time.perf_counter()
    wf.compile(cfg.run.seed, first=loaded is None)
    compile_s = time.perf_counter() - t0
    startup.mark("compile")

    history = HistoryBuffer()
    metrics = open(out / "metrics.jsonl", "a" if loaded else "w") if ctx.is_root else None
    stop = StopFlag()
    t_start = t_prev = time.perf_counter()
    gen_prev = start_gen
    last_ckpt_gen, last_ckpt_time = start_gen, time.monotonic()
    last_ckpt_path = loaded.header.path if loaded else None
    ckpt_seconds = 0.0
    stopped_by = ""
    chunk = MAX_CHUNK
    try:
        stop.install()
        if loaded is None:
            state, part = wf.start(cfg.run.seed)
            history.append(part)
            gen = 1
            startup.mark("first_generation")
        else:
            state = loaded.state
            history.append(loaded.history)
            gen = start_gen
            check_replicas(ctx, wf.fingerprint(state), gen)
        while True:
            # -- a boundary: every rank is at generation `gen` with the same state -----------
            # (A resumed run's first boundary was logged before its checkpoint was written.)
            if (gen % log_every == 0 or gen == G) and not (loaded and gen == start_gen):
                check_replicas(ctx, wf.fingerprint(state), gen)
                now = time.perf_counter()
                evals = wf.evaluations(gen)
                rec = {
                    "generation": gen,
                    "evaluations": evals,
                    **wf.recorder.boundary(state),
                    "wall_s": now - t_start,
                    "evals_per_s": (evals - wf.evaluations(gen_prev)) / max(now - t_prev, 1e-12),
                    **counters(state),
                }
                t_prev, gen_prev = now, gen
                if metrics is not None:
                    metrics.write(json.dumps(rec) + "\n")
                    metrics.flush()
                report.boundary(rec, wf.recorder.progress(rec))
            time_due = bool(ck.every_seconds) and time.monotonic() - last_ckpt_time >= ck.every_seconds
            signum, late, time_due, neg_chunk = agree_max(
                ctx, [stop.signum, stop_at.due(), time_due, -chunk])
            stop_now = gen < G and bool(signum or late)
            if gen != last_ckpt_gen and (
                stop_now or time_due or (ck.every and gen % ck.every == 0) or (gen == G and ck.final)
            ):
                t = time.perf_counter()
                snap = checkpoint.Snapshot(gen, wf.evaluations(gen), cfg.run.seed, config_text,
                                           state, history.view(), algorithm.num_init, algorithm.num_ask)
                try:
                    last_ckpt_path = checkpoint.write(ctx, ckdir, snap, keep=ck.keep, keep_every=ck.keep_every,
                                                       stuck_after=ck.stuck_seconds)
                except CheckpointError as e:
                    err = CheckpointError(
                        f"{e}. The checkpoints written before are intact (newest: "
                        f"{last_ckpt_path or 'none yet'}); free space or fix the directory, then --resume")
                    err.stranded = getattr(e, "stranded", False)
                    raise err from None
                dt = time.perf_counter() - t
                ckpt_seconds += dt
                stop_at.note_checkpoint(dt)
                last_ckpt_gen, last_ckpt_time = gen, time.monotonic()
                report.line(f"checkpoint {last_ckpt_path.name} written in {dt:.2f} s", progress=True)
            if gen >= G:
                break
            if stop_now:
                stopped_by = stop_signal_name(signum) if signum else "the deadline"
                break
            target = min((gen // log_every + 1) * log_every, G, gen - int(neg_chunk))
            if ck.every:
                target = min(target, (gen // ck.every + 1) * ck.every)
            t = time.perf_counter()
            state, part = wf.advance(state, target - gen)
            dt = time.perf_counter() - t
            startup.mark("first_generation")  # (a resumed run's first)
            history.append(part)
            stop_at.note_chunk(dt)
            # Next chunk's length: about DISPATCH_TARGET_S of work (agreed above as a minimum over
            # ranks, so every rank cuts the run at the same generations).
            chunk = int(max(1, min(MAX_CHUNK, DISPATCH_TARGET_S * (target - gen) / max(dt, 1e-9))))
            gen = target
        final = state_digest(state), wf.recorder.summary(state)
        extra = counters(state)
        getattr(wf, "close", lambda: None)()  # (collective: not on the way out with an error)
    finally:
        stop.uninstall()
        report.close()
        if metrics is not None:
            metrics.close()
    wall = time.perf_counter() - t_start
    digest, outcome = final
    evals = wf.evaluations(gen)
    summary = {
        "name": cfg.run.name,
        "status": "stopped" if stopped_by else "complete",
        "algorithm": cfg.algorithm.name,
        "problem": cfg.problem.name,
        "dim": problem.dim,
        "pop_size": algorithm.pop_size,
        "seed": cfg.run.seed,
        "dtype": cfg.run.dtype,
        **outcome,  # best fitness and solution; or the front, its hypervolume and IGD
        "generations": gen,
        "evaluations": evals,
        **extra,
        "batch_size_exact": exact,
        "resumed_from": start_gen or None,
        "checkpoint": str(last_ckpt_path) if last_ckpt_path else None,
        "wall_s": wall,
        "compile_s": compile_s,
        "compile_cache": cache_dir,
        "startup_s": startup.phases(),
        "checkpoint_s": ckpt_seconds,
        "evals_per_s": (evals - wf.evaluations(start_gen)) / max(wall, 1e-12),
        "ranks": ctx.size,
        "device": ctx.device_kind,
        "state_digest": digest,
        "versions": versions(),
    }
    if stopped_by:
        report.line(
            f"stopped by {stopped_by} at generation {gen} of {G}; checkpoint {last_ckpt_path}. "
            f"Continue with: hpcevo run CONFIG --resume  (exit code {EXIT_STOPPED})"
        )
        return summary
    if ctx.is_root:
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, out / "summary.json")
    if "best_fitness" in outcome:
        result = f"best fitness {outcome['best_fitness']:.10e}"
    else:
        hv = outcome["hypervolume"]
        result = f"front of {outcome['front_size']}" + ("" if hv is None else f", hypervolume {hv:.10e}")
    report.line(f"done: {result} after {evals} evaluations in {wall:.2f} s  ({out / 'summary.json'})")
    return summary


# Eviction keeps the cache bounded and makes JAX lock it (filelock), so ranks and concurrent jobs
# (a seed sweep compiles the same programs) never read an entry another process is writing.
COMPILE_CACHE_MAX_BYTES = 4 << 30


def enable_compile_cache(cfg: RunConfig) -> str | None:
    """Point JAX's persistent compilation cache at the configured directory (before the first
    compilation). A directory already configured (JAX_COMPILATION_CACHE_DIR) is kept."""
    import jax

    path = jax.config.jax_compilation_cache_dir
    if not path:
        setting = cfg.parallel.compile_cache
        if setting == "off":
            return None
        path = str(cfg.out_dir.parent / ".jax-cache" if setting == "auto" else Path(setting))
        jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # Most of our programs compile in well under a second each, and together they are most
        # of a launch: JAX's default (skip those under 1 s) would cache almost none of them.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if jax.config.jax_compilation_cache_max_size < 0:
        jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_MAX_BYTES)
    return path


def _deadline(ctx: ParallelContext, cfg: RunConfig, cli_value: str | None, now: float) -> Deadline:
    """The earliest of --deadline, checkpoint.deadline and the scheduler's end time (rank 0's
    reading of them, broadcast: every rank must stop at the same generation)."""
    found: tuple[float, str] | None = None
    error: BaseException | None = None
    if ctx.is_root:
        candidates = []
        try:
            if cli_value is not None:
                candidates.append((parse_deadline(cli_value, now), f"--deadline {cli_value}"))
        except ValueError as e:
            error = UsageError(f"--deadline: {e}")
        if cfg.checkpoint.deadline is not None:
            candidates.append((parse_deadline(cfg.checkpoint.deadline, now),
                               f"checkpoint.deadline = {cfg.checkpoint.deadline!r}"))
        end = scheduler_end_time()
        if end is not None:
            candidates.append((end, "the batch job's end time"))
        found = min(candidates) if candidates else None
    error = agree_on_error(ctx, error)
    if error is not None:
        raise error
    found = bcast_from_root(ctx, found)
    return Deadline(found[0] if found else None, cfg.checkpoint.margin_seconds, found[1] if found else "")
