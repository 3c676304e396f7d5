"""Run a validated config: the collective driver behind ``hpcevo run`` and ``hpcevo.run``.

Collective: every rank calls ``execute`` with the same config. Rank 0 alone prints and writes
files; every rank computes, and every rank checks that its replica matches the others' at each
log boundary. ``execute`` is the loop; the named pieces it calls (``Run``) each do one thing:
building, the run directory, the schedule, the checkpoint policy, stop control, the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from .. import checkpoint, schema
from ..algorithms.base import Algorithm
from ..config import RunConfig, parse_deadline
from ..errors import EXIT_STOPPED, CheckpointError, UsageError
from ..hooks import Hooks
from ..parallel import ParallelContext, bcast_from_root, collective_stage, user_code
from ..parallel.control import rank_local
from ..parallel.info import oversubscription
from ..parallel.watchdog import Watchdog
from ..provenance import versions
from . import build, noisy, programs, rules, startup
from .archipelago import Archipelago
from .coco_log import CocoLog
from .engine import MAX_CHUNK
from .loop import Loop
from .policy import CheckpointPolicy, PhaseLimits, Schedule, next_chunk
from .report import Reporter
from .resume import FREE, FREE_IF_BLOCK_INVARIANT, resume_point
from .rundir import FACES, RecordWriter, RunDir, RunPaths, option
from .stopping import STOP_SIGNALS, Decision, StopControl, StopFlag, StopSource, find_deadline, signal_name


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run is started, beside its config: ``hpcevo run``'s flags, ``hpcevo.run``'s keyword
    arguments. ``overwrite`` replaces a run already in the run directory; ``resume`` continues
    it; ``quiet``: no progress; ``deadline``: stop with a checkpoint before it; ``stop``: what is
    polled for a stop request (default: a ``StopFlag`` on SIGTERM, SIGUSR1, SIGINT); ``stream``:
    where rank 0 prints (default: stdout). ``face``: who passed them, "api" (``hpcevo.run``) or
    "cli" (``hpcevo run``): messages name the options in its words (``resume=True``,
    ``--resume``; ``rundir.speaking``)."""

    overwrite: bool = False
    resume: bool = False
    quiet: bool = False
    deadline: str | int | float | None = None
    stop: StopSource | None = None
    stream: TextIO | None = None
    face: str = "api"
    # Pieces built for earlier runs of this process, by program (build.program_key): a study's
    # group passes one dict to all its runs, and runs of one program share problem, algorithm
    # and so their compiled programs (loop.device_engine). None: build everything.
    reuse: dict | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def checked(cls, where: str, **given: Any) -> "RunOptions":
        """The options ``given``, each checked: UsageError names the first that is wrong."""
        out = {}
        face = given.get("face", "api")
        if face not in FACES:
            raise UsageError(f"{where}: 'face' must be one of {', '.join(FACES)}, got {schema.short(face)}")
        for name in ("overwrite", "resume", "quiet"):
            out[name] = schema.check(bool, given.get(name, False), name, where)
        if out["overwrite"] and out["resume"]:
            raise UsageError(f"{where}: {option('overwrite', face)} and {option('resume', face)} exclude each "
                             "other: resume continues the run "
                             "in the run directory, overwrite replaces it")
        deadline = schema.plain(given.get("deadline"))
        if deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, (str, int, float)):
                raise UsageError(f"{where}: 'deadline' must be seconds, a duration or a time (\"90m\", "
                                 f"\"01:30:00\"), got {type(deadline).__name__}")
            try:
                parse_deadline(deadline, time.time())
            except ValueError as e:
                raise UsageError(f"{where}: 'deadline': {e}") from None
        stop, stream = given.get("stop"), given.get("stream")
        if stop is not None and not all(hasattr(stop, m) for m in ("signum", "__enter__", "__exit__")):
            raise UsageError(f"{where}: 'stop' must be a StopSource (a signum attribute, usable in a with "
                             f"statement; e.g. hpcevo.StopFlag()), got {type(stop).__name__}")
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise UsageError(f"{where}: 'stream' must be a text stream (with write), got {type(stream).__name__}")
        return cls(**out, deadline=deadline, stop=stop, stream=stream, face=face)

    def shared(self) -> dict[str, Any]:
        """What every rank must be given alike (the rest is each rank's own)."""
        return {"overwrite": self.overwrite, "resume": self.resume, "deadline": self.deadline}


@dataclasses.dataclass(frozen=True)
class Held:
    """Objects handed over from Python in place of the config's ``[problem]`` name (``problem``; a
    NumPy function with ``host=True``) and ``[algorithm]`` section (``algorithm``)."""

    problem: Any = None
    algorithm: Algorithm | None = None
    host: bool | None = None


def execute(ctx: ParallelContext, cfg: RunConfig, held: Held = Held(), options: RunOptions = RunOptions(),
            hooks: Hooks = Hooks()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``cfg`` on the ranks of ``ctx``; return (the summary, the per-generation history), on
    every rank, once summary.json is written.

    ``held``: objects held in Python that take the place of the config's (``build.py``). The
    summary's ``status`` is "complete", or "stopped" when a signal or the deadline ended the run
    early after writing a checkpoint (the CLI exits 75 then). With ``options.resume`` the run
    continues from the newest valid checkpoint, bitwise as if it had never stopped. ``hooks``:
    observers and stop criteria at log boundaries (``hpcevo.hooks``); a criterion that ends the
    run makes it "complete" early, with ``stopped_by`` in the summary.
    """
    startup.begin_run()
    with build.jax_mode(cfg):
        return _execute(ctx, cfg, held, options, hooks)


def _execute(ctx: ParallelContext, cfg: RunConfig, held: Held, options: RunOptions,
             hooks: Hooks) -> tuple[dict[str, Any], dict[str, Any]]:
    fault = cfg.fault
    with Watchdog.start(ctx, heartbeat_seconds=fault.heartbeat_seconds, enabled=fault.watchdog) as dog:
        limits = PhaseLimits(fault)
        dog.arm("start-up", *limits.startup())
        run = Run.start(ctx, cfg, held, options)
        try:
            drive = Drive(run, dog, limits, hooks)
            # Listening from before the compilation: a SIGTERM, SIGUSR1 or Ctrl-C that comes while
            # it runs (seconds to minutes) is kept for the first boundary (generation 1, or the
            # resumed one), which checkpoints and ends the run as at any other; before, it found
            # the default handler and killed the process on the spot.
            with run.stop:
                dog.arm("compiling and the first generation", *limits.compile())
                with _stop_while_compiling(ctx, run, options.face == "cli" and options.stop is None):
                    run.compile()
                with contextlib.ExitStack() as stack:
                    drive.open(stack)
                    while drive.boundary():
                        n = drive.target - drive.gen
                        dog.arm(f"generation {drive.target}" if n == 1 else f"generations {drive.gen + 1}-{drive.target}",
                                *limits.dispatch(n))
                        run.compiled_in_dispatch = False
                        seconds = run.advance(n)
                        drive.advanced(n, seconds, note=not run.compiled_in_dispatch)
                    outcome = drive.outcome()
            summary = drive.finish(outcome)
        except BaseException:
            run.rundir.abandon()  # (before the first generation: the run --overwrite replaced comes back)
            raise
        finally:
            run.rundir.close()
        return summary, run.loop.history


class Drive:
    """One run's way through ``execute``'s loop, a boundary at a time: at each boundary the log,
    the stop decision and the checkpoint, then the generation the run goes on to
    (``target``). ``execute`` drives one run so; a ``RunBatch`` drives several, their
    generations between boundaries dispatched together. ``limits``: the watchdog's allowances
    (a batch's own for its dispatches: ``advanced(note=False)``)."""

    def __init__(self, run: "Run", dog: Watchdog, limits: PhaseLimits, hooks: Hooks):
        self.run, self.dog, self.limits, self.hooks = run, dog, limits, hooks
        run.hooks = hooks
        run.before_hooks = lambda g: dog.arm_open(f"the hooks at generation {g}", run.cfg.fault.min_seconds,
                                                  "fault.min_seconds: hooks may take as long as they need")
        if isinstance(run.loop, Loop):
            def compiling(rows: int) -> None:
                # A restart's population needs the program of another size, compiled inside
                # the dispatch (seconds, cold): the compile's allowance, not the dispatch's.
                run.compiled_in_dispatch = True
                dog.arm(f"compiling the program of {rows} rows (a restart's population) and its generations",
                        *limits.compile())
            run.loop.on_compile = compiling
        else:
            def redispatch(n: int) -> None:
                # A target met inside a dispatch of islands: the dispatch runs again to it.
                dog.arm(f"generations {run.loop.generation + 1}-{run.loop.generation + n} again, to the limit "
                        "met inside them", *limits.dispatch(n))
            run.loop.on_redispatch = redispatch
        self.gen, self.target, self.chunk = 0, 0, MAX_CHUNK
        self.ended: str | None = None
        self.decision: Decision | None = None
        self.stopping = False
        self.metrics: RecordWriter | None = None

    def open(self, stack: contextlib.ExitStack) -> None:
        """After ``run.compile()``: the report and the metrics file opened (in ``stack``), and
        generation 1 (or the resumed state)."""
        run = self.run
        stack.enter_context(run.report)
        self.metrics = stack.enter_context(run.rundir.metrics_writer(append=run.resumed_at is not None))
        self.gen = run.first_generation()

    def boundary(self) -> bool:
        """The boundary at ``gen``: the log and the hooks, the stop decision, the checkpoint due.
        True: the run goes on, to generation ``target``; False: it ends here (``outcome``)."""
        run, dog, limits, gen = self.run, self.dog, self.limits, self.gen
        G = run.cfg.run.generations
        t = time.perf_counter()
        dog.arm(f"the boundary at generation {gen}", *limits.boundary())
        met = run.met()
        if (run.schedule.logs_at(gen) or met) and gen != run.resumed_at:
            assert self.metrics is not None
            said = run.log(gen, self.metrics)
            if self.hooks:
                dog.arm(f"the boundary at generation {gen}", *limits.boundary())
            self.ended = said if gen < G else None
        self.ended = self.ended or met
        self.decision = decision = run.stop.poll(self.chunk)
        self.stopping = gen < G and decision.stop and self.ended is None
        limits.note_boundary(time.perf_counter() - t)
        if run.policy.due(gen, stopping=self.stopping or self.ended is not None, time_due=decision.time_due,
                          soon=decision.soon):
            dog.arm(f"the checkpoint at generation {gen}", *limits.checkpoint())
            limits.note_checkpoint(run.write_checkpoint(gen))
        if gen >= G or self.stopping or self.ended is not None:
            return False
        self.target = run.schedule.next_target(gen, decision.chunk)
        return True

    def advanced(self, n: int, seconds: float, note: bool = True) -> None:
        """``n`` generations were asked for and took ``seconds`` (``note``: a measure of a
        dispatch for the watchdog's limits; not where a compile ran inside it)."""
        if note:
            self.limits.note_dispatch(n, seconds)
        self.chunk = next_chunk(n, seconds)
        self.gen = self.run.loop.generation  # (before target where run.evaluations or run.target is met)

    def outcome(self) -> dict[str, Any]:
        """The run's last state read out, its loop closed, the hooks closed."""
        self.dog.arm("finishing", *self.limits.startup())
        outcome = self.run.outcome()
        self.run.loop.close()
        with collective_stage(self.run.ctx), user_code(self.run.ctx, "a hook"):
            self.hooks.close()
        return outcome

    def finish(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """The summary (summary.json where the run completed); after ``open``'s stack is closed."""
        return self.run.finish(outcome, self.decision if self.stopping else None, self.ended)


@contextlib.contextmanager
def _stop_while_compiling(ctx: ParallelContext, run: "Run", enabled: bool) -> Iterator[None]:
    """While the programs compile (seconds to minutes of XLA, in C++: no Python signal handler
    runs on the main thread until it returns), a stop signal ends the command at once, exit 75:
    nothing has been computed since the checkpoint the run resumes from (or since generation 0),
    so there is nothing to save, and a start with --overwrite puts the replaced run back. The
    signal reaches a thread of its own through Python's wakeup file descriptor, written by the C
    handler the moment the signal comes. For the command line (``enabled``); a program of the
    user's keeps its process, and the run stops at its first boundary as at any other."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    import socket

    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except ValueError:  # (not the main thread's interpreter)
        r.close()
        w.close()
        yield
        return
    done = threading.Event()
    wanted = {int(s) for s in STOP_SIGNALS}

    def watch() -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if done.is_set() or not data:
                return
            for signum in data:
                if signum in wanted:
                    _stopped_while_compiling(ctx, run, signum)

    thread = threading.Thread(target=watch, name="hpcevo-stop-while-compiling", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(OSError):
            w.send(b"\0")
        thread.join(timeout=1.0)
        r.close()
        w.close()


def _stopped_while_compiling(ctx: ParallelContext, run: "Run", signum: int) -> None:
    from ..parallel.context import real_exit

    run.rundir.abandon()  # (rank 0, after an --overwrite: the replaced run back in its place)
    exit_file = os.environ.get("HPCEVO_EXIT_FILE")
    if exit_file:  # (what a job script reads: mpiexec may report 0 after a signal; every rank alike)
        with contextlib.suppress(OSError):
            Path(exit_file).write_text(f"{EXIT_STOPPED}\n")
    at = run.resumed_at
    where = f"generation {at} (its checkpoint stands)" if at is not None else "generation 1 (nothing to save)"
    text = (f"stopped by {signal_name(signum)} while compiling, before {where}. Continue with: hpcevo run CONFIG "
            f"--resume  (exit code {EXIT_STOPPED})")
    if ctx.is_root:
        run.report.line(text)
    else:
        # Rank 0 speaks when it was compiling too (it then ends the job before this); a rank
        # still compiling while rank 0 waits for it in generation 1 speaks for itself.
        time.sleep(0.5 + 0.1 * min(ctx.rank, 20))
        print(f"[rank {ctx.rank}] {text}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    real_exit(EXIT_STOPPED)


# checkpoint.every left at its default (1,000 generations) is a safety net, not a request: such
# checkpoints take at most this share of the run's time. Measured (PSO, pop 1,024, dim 10, 2-core
# VM): a checkpoint took 30 ms, 1,000 generations 90 ms, and `hpcevo run` was 1.30x its run without
# checkpoints. A value the user sets is kept to the letter, as are every_seconds, stops and final.
DEFAULT_EVERY_SHARE = 0.05

# Islands hosted by one rank from which start-up warns of the compile time they cost.
ISLANDS_COMPILE_WARNING = 16


class Run:
    """The pieces of one run, and the bookkeeping between boundaries (see ``execute``)."""

    def __init__(self, ctx: ParallelContext, cfg: RunConfig, loop: Loop, parts: "Built", rundir: RunDir,
                 report: Reporter, stop: StopControl):
        self.ctx, self.cfg, self.loop, self.parts, self.rundir, self.report, self.stop = (
            ctx, cfg, loop, parts, rundir, report, stop)
        self.compiled_in_dispatch = False  # (a population bucket's program compiled in the last dispatch)
        ck = cfg.checkpoint
        self.schedule = Schedule(cfg.run.generations, cfg.log.every, ck.every)
        self.resumed_at: int | None = None
        self.policy = CheckpointPolicy(ck.every, ck.final, cfg.run.generations, 0)
        self.last_checkpoint: Path | None = None
        self.checkpoint_s = self.compile_s = 0.0
        self.programs_at = (programs.loaded, programs.stored)
        self.t_start = self.t_prev = 0.0
        self.gen_prev = self.evals_prev = self.evals_start = 0
        self.hooks = Hooks()
        self.coco: CocoLog | None = None
        # Its start-up phases (startup.phases()), kept where other runs begin in this process
        # before it ends (a batch's); None: read at the summary.
        self.startup: dict[str, float] | None = None
        # Called before the hooks of a boundary: they are the user's code, of any length (the
        # watchdog then watches for lost hosts only; execute re-arms the boundary after them).
        self.before_hooks: Callable[[int], None] = lambda gen: None

    @classmethod
    def start(cls, ctx: ParallelContext, cfg: RunConfig, held: Held, options: RunOptions) -> "Run":
        """Build, prepare the run directory, find the checkpoint to resume from (``compile``
        comes next)."""
        parts = Built.of(ctx, cfg, held, options.reuse)
        rules.check(cfg, parts.problem)  # before the run directory is touched (--overwrite)
        stop_control = StopControl(ctx, options.stop if options.stop is not None else StopFlag(),
                                   find_deadline(ctx, options.deadline, cfg.checkpoint.deadline,
                                                 cfg.checkpoint.margin_seconds, time.time()),
                                   cfg.checkpoint.every_seconds,
                                   0.0 if "every" in cfg.checkpoint.model_fields_set else DEFAULT_EVERY_SHARE)
        rundir = RunDir(ctx, RunPaths.of(cfg.out_dir, cfg.checkpoint_dir))
        rundir.prepare(options.overwrite, options.resume)
        try:
            return cls._started(ctx, cfg, options, parts, rundir, stop_control)
        except BaseException:
            rundir.abandon()  # the run --overwrite set aside comes back
            rundir.close()
            raise

    @classmethod
    def _started(cls, ctx: ParallelContext, cfg: RunConfig, options: RunOptions, parts: "Built", rundir: RunDir,
                 stop_control: StopControl) -> "Run":
        report = Reporter(not options.quiet, ctx.is_root, cfg.log.progress, cfg.run.generations, options.stream)
        coco = _coco_log(ctx, cfg, parts)
        run = cls(ctx, cfg, _loop_of(ctx, cfg, parts, coco), parts, rundir, report, stop_control)
        run.coco = coco
        target, stagnation = rules.target(cfg, parts.problem), cfg.run.stagnation_generations
        if cfg.run.evaluations is not None or target is not None or stagnation is not None:
            run.loop.limit(cfg.run.evaluations, target, stagnation, cfg.run.stagnation_tolerance)
        if options.resume:
            run.resume()
        if coco is not None:
            coco.start(run.resumed_at)
        rundir.start(parts.config_text, run.resumed_at)
        run.announce()
        return run

    def resume(self) -> None:
        free = FREE + (FREE_IF_BLOCK_INVARIANT if getattr(self.parts.problem, "block_invariant", False) else ())
        loaded = resume_point(self.ctx, self.rundir.paths.checkpoints, self.parts.resolved,
                              self.cfg.run.generations, self.loop, self.report, free)
        if loaded is not None:
            self.resumed_at = self.policy.last = loaded.header.generation
            self.last_checkpoint = loaded.header.path

    def announce(self) -> None:
        """The banner, the deadline, and warnings about a layout that wastes ranks or bits."""
        cfg, ctx, loop, line = self.cfg, self.ctx, self.loop, self.report.line
        islands = f"{cfg.islands.count} islands of " if self.parts.islands else ""
        line(f"hpcevo {islands}{self.parts.algorithm_name} on {self.parts.problem.name} (dim {loop.problem.dim}, pop "
             f"{loop.algorithm.pop_size}), {cfg.run.generations} generations on {ctx.size} "
             f"rank{'s' if ctx.size > 1 else ''} [{ctx.device}] -> {self.rundir.paths.root}"
             + (f", from generation {self.resumed_at}" if self.resumed_at is not None else ""))
        d = self.stop.deadline
        if d.at is not None:
            line(f"deadline in {(d.at - time.time()) / 60:.1f} min ({d.source}); stopping {d.margin:.0f} s "
                 "before it, plus the time a chunk and a checkpoint take")
        f_opt = getattr(self.parts.problem, "fopt", None)  # (BBOB's)
        if cfg.run.dtype == "float32" and f_opt:
            spacing = float(np.spacing(np.float32(abs(f_opt))))
            line(f"warning: run.dtype = \"float32\" on {self.parts.problem.name}, whose optimal value is {f_opt}: "
                 f"float32 values there are {spacing:.1e} apart, so f - f_opt cannot get below that (COCO's "
                 "targets go to 1e-8); BBOB runs use float64 unless run.dtype says otherwise", err=True)
        crowded = oversubscription(ctx)
        if crowded:
            line(f"note: {crowded}")
        if self.parts.cache_note:
            line(self.parts.cache_note)
        serial = checkpoint.serial_note(ctx)  # (a stop signal writes a checkpoint whatever the settings)
        if serial:
            line(serial)
        hosted = loop.engine.layout.per_rank if self.parts.islands else 1
        if hosted >= ISLANDS_COMPILE_WARNING:
            line(f"warning: {hosted} islands on a rank: they compile into one program, and compiling grows with "
                 f"them (about a second per island on a 2-core machine; 64 took 99 s there). More ranks, up to "
                 f"one per island ({cfg.islands.count}), share them out", err=True)
        idle, fair = loop.idle_ranks()
        if idle:
            line(f"warning: {idle} of {ctx.size} ranks have nothing to evaluate: there are fewer micro-batches "
                 f"per generation than ranks{' in an island' if self.parts.islands else ''}. Set "
                 f"parallel.microbatch <= {fair} to give every rank work (it changes the run's last bits, but the "
                 "same setting gives the same result at any rank count)", err=True)
        if self.parts.exact is False:
            line(f"warning: evaluation.batch_size = {cfg.evaluation.batch_size}: problem {self.parts.problem.name} "
                 "gives other last bits in pieces than in whole micro-batches (its values depend on the "
                 "block's shape). This run is reproducible at any rank count with this batch_size, "
                 "but not bitwise equal to a run without it.")

    def compile(self) -> None:
        self.programs_at = (programs.loaded, programs.stored)
        startup.mark("setup")
        t0 = time.perf_counter()
        self.loop.compile(self.cfg.run.seed, first=self.resumed_at is None)
        self.compile_s = time.perf_counter() - t0
        startup.mark("compile")

    def first_generation(self) -> int:
        """Generation 1, or the resumed state checked across ranks; the generation reached."""
        self.t_start = self.t_prev = time.perf_counter()
        if self.resumed_at is None:
            self.loop.init(self.cfg.run.seed)
            startup.mark("first_generation")
            self._record_failures(0)
            if self.coco is not None:
                self.coco.flush()
            self._check_some_evaluation_worked()
            self.rundir.commit()  # the new run has started: what --overwrite set aside goes
        else:
            self.loop.check_replicas()
        self.gen_prev, self.evals_prev = self.loop.generation, self.loop.evaluations
        self.evals_start = self.loop.evaluations if self.resumed_at is not None else 0
        return self.loop.generation

    def _check_some_evaluation_worked(self) -> None:
        """A first generation in which every evaluation failed or gave no finite value means
        the problem cannot be evaluated as it is called: an error now (UsageError, exit 2),
        not a run that reports inf after its whole budget."""
        loop = self.loop
        if not isinstance(loop, Loop) or loop.engine.recorder.kind != "single-objective":
            return
        evals = loop.evaluations
        failed = loop.counters().get("failed_evaluations", 0)
        if evals == 0 or (failed < evals and loop.boundary()["nonfinite"] < evals):
            return
        first = bcast_from_root(self.ctx, loop.failures[0]["reason"] if self.ctx.is_root and loop.failures else None)
        name, p = self.parts.problem.name, loop.problem
        if failed:
            what = f"all {evals} evaluations of generation 1 failed (first: {first})"
        else:
            what = f"all {evals} evaluations of generation 1 gave NaN or infinite values"
        hint = ""
        if getattr(p, "host", False) and getattr(p, "batched", False) and self.cfg.problem.batched is None:
            hint = (". It was called with blocks of rows, shape (n, dim), as a NumPy function is unless told "
                    "otherwise: for a function of one candidate set problem.batched = false "
                    "(hpcevo.run(..., batched=False))")
        where = ""
        if self.rundir.replacing:
            where = f" (the run in {self.rundir.paths.root} that {option('overwrite')} was to replace is kept)"
        elif failed:
            where = f" (failures.jsonl in {self.rundir.paths.root} has each failure)"
        raise UsageError(f"problem '{name}': {what}{hint}. Nothing to optimise: the run stops here{where}")

    def met(self) -> str | None:
        """Why run.evaluations or run.target ends the run at this generation, or None."""
        why = self.loop.check_limits()  # (a Loop's or the whole archipelago's)
        if why == "evaluations":
            return f"run.evaluations: {self.loop.evaluations} evaluations used (budget {self.cfg.run.evaluations})"
        if why == "target" and self.cfg.run.target_precision is not None:
            f_opt = float(self.parts.problem.optimum_value)
            return (f"run.target_precision: best fitness - f_opt = {self.loop.best_fitness - f_opt:.4e} <= "
                    f"{self.cfg.run.target_precision!r}")
        if why == "target":
            return f"run.target: best fitness {self.loop.best_fitness:.10e} <= {self.cfg.run.target!r}"
        if why == "stagnation":
            r = self.cfg.run
            return (f"run.stagnation_generations: the best improved by no more than {r.stagnation_tolerance!r} over "
                    f"the last {r.stagnation_generations} generations")
        return None

    def advance(self, n: int) -> float:
        """``n`` generations; the seconds they took (the deadline learns from them too)."""
        t = time.perf_counter()
        before = len(self.loop.failures)
        self.loop.advance(n)
        seconds = time.perf_counter() - t
        self.took(seconds, before)
        return seconds

    def took(self, seconds: float, failures_before: int = 0) -> None:
        """After generations were advanced (alone, or in a batch's dispatch of ``seconds``)."""
        if self.coco is not None:
            self.coco.flush()
        startup.mark("first_generation")  # (a resumed run's first)
        self._record_failures(failures_before)
        self.stop.deadline.note_chunk(seconds)

    def _record_failures(self, since: int) -> None:
        if getattr(self.loop.problem, "host", False):  # (only host evaluations fail; the same on every rank)
            self.rundir.append_failures(self.loop.failures[since:])

    def log(self, gen: int, metrics: RecordWriter) -> str | None:
        """A log boundary: replicas checked, a metrics record, a progress line, the hooks. Rank 0
        writes and prints; its failure (a full disk) is every rank's, reported at once. Returns
        why a stop criterion ends the run here (every rank: rank 0's verdict), or None."""
        self.loop.check_replicas()
        now, evals, counts = time.perf_counter(), self.loop.evaluations, self.loop.counters()
        params = getattr(self.loop, "params", None)
        rec = {"generation": gen, "evaluations": evals, **self.loop.boundary(), "wall_s": now - self.t_start,
               "evals_per_s": (evals - self.evals_prev) / max(now - self.t_prev, 1e-12),
               **counts, **{f"params.{k}": v for k, v in (params or {}).items()}}
        self.t_prev, self.gen_prev, self.evals_prev = now, gen, evals
        with collective_stage(self.ctx), self.rundir.converting():
            metrics.write(rec)
            self.report.boundary(rec, self.loop.engine.recorder.progress(rec) + self._precision(rec.get("best")))
            for text in self.loop.detail_lines(rec):
                self.report.line(text, progress=True)
        if not self.hooks:
            return None
        self.before_hooks(gen)
        reason = None
        with collective_stage(self.ctx), user_code(self.ctx, "a hook"):
            self.hooks.observe(dict(rec), self.loop, self.ctx.is_root, alone=rank_local)
            if self.ctx.is_root:
                reason = self.hooks.reason(dict(rec), self.loop, alone=rank_local)
        return bcast_from_root(self.ctx, reason) if self.hooks.criteria else None

    def _f_opt(self) -> float | None:
        """The problem's known optimal value (BBOB's instance f_opt, a CEC function's bias, a
        built-in function's minimum), or None (a user's problem, several objectives)."""
        try:
            value = getattr(self.parts.problem, "optimum_value", None)
            return None if value is None else float(value)
        except (TypeError, ValueError, NotImplementedError):
            return None

    def _best_precision(self, outcome: dict[str, Any]) -> dict[str, float]:
        """Where the optimum is known: it and the best's precision f - f_opt, what COCO's (and
        CEC's) targets and a study's report are about (summary.json)."""
        fopt, best = self._f_opt(), outcome.get("best_fitness")
        if fopt is None or not isinstance(best, (int, float)):
            return {}
        return {"f_opt": fopt, "best_precision": float(best) - fopt}

    def _precision(self, best: Any) -> str:
        """f - f_opt beside the raw best, where the optimum is known and not 0 (BBOB, CEC): what
        their targets judge."""
        fopt = self._f_opt()
        if not fopt or not isinstance(best, (int, float)):
            return ""
        return f"  f-f_opt {best - fopt:.3e}"

    def write_checkpoint(self, gen: int) -> float:
        t = time.perf_counter()
        ck = self.cfg.checkpoint
        try:
            self.last_checkpoint = checkpoint.write(
                self.ctx, self.rundir.paths.checkpoints, self.loop.snapshot(self.parts.config_text),
                keep=ck.keep, keep_every=ck.keep_every, stuck_after=ck.stuck_seconds)
        except CheckpointError as e:
            err = CheckpointError(
                f"{e}. The checkpoints written before are intact (newest: "
                f"{self.last_checkpoint or 'none yet'}); free space or fix the directory, then --resume")
            err.stranded = e.stranded
            raise err from None
        if self.coco is not None:
            self.coco.checkpointed(gen)
        seconds = time.perf_counter() - t
        self.checkpoint_s += seconds
        self.stop.checkpoint_written(seconds)
        self.policy.last = gen
        self.report.line(f"checkpoint {self.last_checkpoint.name} written in {seconds:.2f} s", progress=True)
        return seconds

    def outcome(self) -> dict[str, Any]:
        """What the final state holds: the recorder's summary and the digest; with
        ``run.reevaluate``, the best's fitness on fresh draws in place of the one seen."""
        outcome = {**self.loop.outcome(), "state_digest": self.loop.digest()}
        k = self.cfg.run.reevaluate
        if not k:
            return outcome
        with collective_stage(self.ctx), user_code(self.ctx, f"problem '{self.parts.problem.name}'"):
            values = noisy.reevaluate(self.loop, k)
        return noisy.report(outcome, values)

    def finish(self, outcome: dict[str, Any], stopped: Decision | None, ended: str | None = None) -> dict[str, Any]:
        """The summary (written to summary.json when the run completed) and the last line.
        ``ended``: why a stop criterion ended the run early."""
        summary = self.summary(outcome, stopped)
        summary["stopped_by"] = stopped.why if stopped is not None else ended
        if ended is not None:
            self.report.line(f"{ended}: the run ends at generation {summary['generations']} of "
                             f"{self.cfg.run.generations}")
        gen, G = summary["generations"], self.cfg.run.generations
        if stopped is not None:
            self.report.line(f"stopped by {stopped.why} at generation {gen} of {G}; checkpoint "
                             f"{self.last_checkpoint}. Continue with: hpcevo run CONFIG --resume  "
                             f"(exit code {EXIT_STOPPED})")
            return summary
        if self.coco is not None:
            self.coco.close()
        self.rundir.write_summary(summary)
        if "best_fitness_seen" in summary:
            result = (f"best fitness {summary['best_fitness']:.10e} (the mean of {len(summary['reevaluations'])} "
                      f"fresh evaluations of the best; as seen: {summary['best_fitness_seen']:.10e})")
        elif "best_fitness" in summary:
            result = f"best fitness {summary['best_fitness']:.10e}"
            if summary.get("f_opt"):  # (an optimum of 0: the best is its precision)
                result += f" (f - f_opt {summary['best_precision']:.3e})"
        else:
            hv = summary["hypervolume"]
            result = f"front of {summary['front_size']}" + ("" if hv is None else f", hypervolume {hv:.10e}")
        self.report.line(f"done: {result} after {summary['evaluations']} evaluations in {summary['wall_s']:.2f} s  "
                         f"({self.rundir.paths.summary})")
        return summary

    def summary(self, outcome: dict[str, Any], stopped: Decision | None) -> dict[str, Any]:
        cfg, loop, wall = self.cfg, self.loop, time.perf_counter() - self.t_start
        digest, counts = outcome.pop("state_digest"), loop.counters()
        start = self.resumed_at or 0
        return {
            "name": cfg.run.name, "status": "stopped" if stopped else "complete",
            "algorithm": self.parts.algorithm_name, "problem": self.parts.problem.name,
            "dim": loop.problem.dim, "pop_size": loop.algorithm.pop_size, "seed": cfg.run.seed,
            "dtype": cfg.run.dtype,
            **outcome,  # best fitness and solution; or the front, its hypervolume and IGD
            **self._best_precision(outcome),
            "generations": loop.generation, "evaluations": loop.evaluations, **counts,
            "batch_size_exact": self.parts.exact, "resumed_from": start or None,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
            "wall_s": wall, "compile_s": self.compile_s, "compile_cache": self.parts.compile_cache,
            # programs this run loaded from the store on disk, and kept in it (programs.py)
            "programs_loaded": programs.loaded - self.programs_at[0], "programs_kept": programs.stored - self.programs_at[1],
            "startup_s": self.startup if self.startup is not None else startup.phases(),
            "checkpoint_s": self.checkpoint_s,
            "evals_per_s": (loop.evaluations - self.evals_start) / max(wall, 1e-12),
            "ranks": self.ctx.size, "device": self.ctx.device_kind, "state_digest": digest,
            "versions": versions(),
        }


class Built:
    """The problem, algorithm(s) and resolved config of a run, built on every rank (any rank's
    failure, such as a problem file missing on one node, is every rank's). ``islands``: every
    island's algorithm and name, with [islands]."""

    def __init__(self, problem, algorithm, resolved: dict[str, Any], exact: bool | None,
                 compile_cache: tuple[str | None, str], islands: tuple[list[Algorithm], list[str]] | None = None):
        self.problem, self.algorithm, self.resolved, self.exact = problem, algorithm, resolved, exact
        self.config_text = build.dump(resolved)
        self.islands = islands
        names = islands[1] if islands else [resolved["algorithm"]["name"]]
        self.algorithm_name = "+".join(dict.fromkeys(names))
        self.compile_cache, self.cache_note = compile_cache

    @classmethod
    def of(cls, ctx: ParallelContext, cfg: RunConfig, held: Held, reuse: dict | None = None) -> "Built":
        """``reuse``: pieces built before, by program (``RunOptions.reuse``); what is built is
        added to it."""
        key = build.program_key(cfg) if reuse is not None and held.problem is None and held.algorithm is None else None
        if key is not None and key in reuse:
            problem, algorithm, islands, exact, cache = reuse[key]
        else:
            problem = algorithm = islands = cache = None
            # Building imports and traces the user's code (a problem by import path, a function
            # held in Python), which may fail, or end its process, on some ranks only.
            with collective_stage(ctx), user_code(ctx, f"problem '{cfg.problem.name or 'problem='}'"):
                cache = build.enable_compile_cache(cfg)
                problem = build.build_problem(cfg, held.problem, host=held.host, held_algorithm=held.algorithm)
                algorithm = build.build_algorithm(cfg, problem, held.algorithm)
                if cfg.islands is not None:
                    islands = build.build_islands(cfg, problem, algorithm)
            exact = build.probe_batch_size(cfg, problem, algorithm, ctx.device_kind)
            if key is not None and not problem.host:  # (a host problem holds threads and processes)
                reuse[key] = (problem, algorithm, islands, exact, cache)
        resolved = build.resolved(cfg, problem, algorithm, held.problem is not None, held.algorithm is not None)
        return cls(problem, algorithm, resolved, exact, cache, islands)


def _coco_log(ctx: ParallelContext, cfg: RunConfig, parts: Built) -> CocoLog | None:
    if not cfg.log.coco:
        return None
    algorithm = parts.resolved.get("algorithm", {})
    comment = " ".join(f"{k}={v}" for k, v in algorithm.items() if k != "name")
    return CocoLog(ctx, parts.problem, cfg.out_dir, parts.algorithm_name, f"hpcevo {comment}", cfg.source)


def _loop_of(ctx: ParallelContext, cfg: RunConfig, parts: Built, coco: CocoLog | None = None) -> Loop | Archipelago:
    """One population's ``Loop``, or with [islands] an ``Archipelago``."""
    p, e = cfg.parallel, cfg.evaluation
    if parts.islands is not None:
        return Archipelago(parts.islands[0], parts.problem, ctx, build.migration(cfg), names=parts.islands[1],
                           microbatch=p.microbatch or None, batch_size=e.batch_size or None,
                           compile_cache="off",  # (the run's own cache is set: Built.of)
                           observe=None if coco is None else coco.observe,
                           observe_x=coco is not None and coco.with_x)
    return Loop(parts.algorithm, parts.problem, ctx, microbatch=p.microbatch or None, batch_size=e.batch_size or None,
                recorder=build.build_recorder(cfg, parts.problem), concurrency=e.concurrency, schedule=e.schedule,
                penalty=e.penalty, observe=None if coco is None else coco.observe,
                observe_x=coco is not None and coco.with_x, compile_cache="off")
