"""The public API's functions: ``load_config``, ``run``, ``open_run``. The CLI is built on them.

    import hpcevo
    cfg = hpcevo.load_config("examples/cso.toml", overrides=["run.generations=50"])
    result = hpcevo.run(cfg)              # alone, or under `mpiexec -n N python script.py`
    result.best_fitness, result.best_solution, result.digest, result.run_dir, result.history
    run = hpcevo.open_run(result.run_dir)  # config, summary, metrics, checkpoints

Errors are exceptions (``hpcevo.errors``), never an exit: ``ConfigError`` (bad input; its ``key``
names the config key), ``UsageError`` (a run directory or checkpoint that does not fit),
``CheckpointError``, ``DivergenceError``. Under MPI every rank raises the same one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from . import schema
from .algorithms.base import Algorithm
from .config import RunConfig, config_from_dict, read_config
from .driver import arguments, build, rundir
from .driver.execute import Held, RunOptions, execute
from .driver.result import Result
from .driver.stopping import StopSource
from .errors import ConfigError, UsageError
from .hooks import Hook, Hooks
from .parallel import ParallelContext, agreed, init
from .problems.base import HostProblem, Problem
from .problems.user import Named, held_name

__all__ = ["load_config", "load_study", "minimize", "open_run", "run", "study"]


def load_config(source: str | os.PathLike | Mapping[str, Any], overrides: Sequence[str] = ()) -> RunConfig:
    """A run config from a TOML file or a dict (the TOML document's tables), after ``overrides``
    (``"run.generations=50"``: a key path and a TOML value, as the CLI's ``--set``). Checks
    everything that can be checked without importing a user's code: the schema, the algorithm's
    name and hyper-parameters, and a built-in problem with the algorithm's own checks against
    it. Raises ``ConfigError`` naming the source, the key and what is allowed."""
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence) or not all(
            isinstance(o, str) for o in overrides):
        raise UsageError("load_config: 'overrides' must be a list of strings such as \"run.generations=50\", "
                         f"got {schema.short(overrides)}")
    if isinstance(source, Mapping):
        cfg = config_from_dict(dict(source), "config", list(overrides))
    elif isinstance(source, (str, os.PathLike)):
        cfg = read_config(source, list(overrides))
    else:
        raise UsageError("load_config: 'source' must be the path of a TOML file or a dict of its tables, got "
                         f"{type(source).__name__}")
    build.check(cfg)
    return cfg


def run(config: RunConfig | str | os.PathLike | Mapping[str, Any], *, problem: Any = None,
        problem_name: str | None = None, algorithm: Algorithm | None = None, host: bool | None = None,
        batched: bool | None = None, ctx: ParallelContext | None = None, overwrite: bool = False, resume: bool = False, quiet: bool = False,
        deadline: str | float | None = None, stop: StopSource | None = None, stream: TextIO | None = None,
        hooks: Hook | Sequence[Hook] | None = None, stop_when: Hook | Sequence[Hook] | None = None) -> Result:
    """Run ``config`` on every rank of the job (collective: every rank calls it alike).

    ``problem``: a JAX function you hold (of one candidate, ``(dim,) -> ()``, or of a block,
    ``(n, dim) -> (n,)``) or a problem object, in place of the config's ``[problem]`` name; its
    dim and bounds come from the config, else from the object, else from ``algorithm``. With
    ``host=True`` it is NumPy code, evaluated on the host. ``batched``: the function takes a block
    (True) or one candidate (False), as ``problem.batched`` says in a config (unset: a JAX
    function's shapes tell; a NumPy function is taken as a block function). ``algorithm``: an algorithm object
    (``hpcevo.algorithms.CSO(...)``) in place of the config's ``[algorithm]`` section. What they
    were is recorded in the run's resolved config, so ``resume`` works for them from Python.

    ``problem_name``: the name a held function or object is recorded under
    (``problem.name = "<python: NAME>"``), which a resume must match. Default: its
    ``module.qualname``, the qualname alone for a script's own (``__main__``) function. A
    ``Problem`` or ``HostProblem`` object is recorded by its own ``name`` and takes no
    problem_name; any other object's ``name`` attribute is not used (it means too many things).
    On resume, a name recorded without its module matches the same name with one
    (``"srr"`` matches ``"study_problem.srr"``), so a run a script started with its own ``srr``
    continues in a script that imports ``srr`` from its module; other names must be equal.

    ``ctx``: the ranks to run on (default: ``hpcevo.parallel.init()`` as ``[parallel]`` asks).
    ``overwrite`` replaces a run already in the run directory; ``resume`` continues it from its
    newest valid checkpoint, bitwise as if it had never stopped, at any rank count. ``quiet``:
    print nothing but warnings (rank 0 prints progress lines otherwise, to ``stream``).
    ``deadline``: stop with a checkpoint before this (seconds, "90m", "01:30:00", a local time).
    ``stop``: what is polled for a stop request (default: a ``StopFlag``: SIGTERM, SIGUSR1,
    SIGINT). A run stopped early returns with ``status == "stopped"``.

    ``hooks``: callables ``hook(record, loop)`` called at each log boundary with its metrics
    record, on rank 0 (``hpcevo.hooks.every_rank(hook)``: on every rank, for a hook that calls a
    collective method such as ``loop.set_params``); loggers: ``hpcevo.hooks.TensorBoard``,
    ``WandB``. ``stop_when``: criteria ``criterion(record, loop) -> bool`` asked on rank 0 at
    each boundary (``hpcevo.hooks.Target``, ``Stagnation``, ``Budget``, or your own): the first
    that says stop ends the run there, ``complete``, with a checkpoint, and names itself in
    ``result.summary["stopped_by"]``. Both are off by default and cost nothing then.

    From a thread other than the main thread (``threading.Thread``; on every rank, with all of
    the run's collective calls in that thread) the run has no signal handling, since Python
    lets only the main thread install handlers: the default ``StopFlag`` listens to nothing
    there, while ``stop=`` (a source of your own) and ``deadline`` still stop the run.

    Every argument is checked on every rank before anything runs, and the ranks agree: an
    argument that is bad on one rank (a config file missing on one node) raises the same hpcevo
    error on every rank, and so do inputs that differ between ranks. It returns on every rank
    once the run's files are written (``open_run(result.run_dir).summary`` is there). Errors
    name the options as Python passes them (``resume=True``); ``hpcevo run``'s, as flags.
    """
    world = _job(ctx)

    def inputs() -> tuple[RunConfig, Held, RunOptions, Hooks]:
        options = RunOptions.checked("run", overwrite=overwrite, resume=resume, quiet=quiet, deadline=deadline,
                                     stop=stop, stream=stream, face=rundir.face())
        if host is not None:
            schema.check(bool, host, "host", "run")
        cfg = _config(config)
        if batched is not None:
            schema.check(bool, batched, "batched", "run")
            problem_section = cfg.problem.model_copy(update={"batched": bool(batched)})
            cfg = cfg.model_copy(update={"problem": problem_section}).with_source(cfg.source)
        if algorithm is not None:
            arguments.checked_algorithm(algorithm, "run")
        return (cfg, Held(_named(problem, problem_name), algorithm, schema.plain(host)), options,
                Hooks.checked("run", hooks, stop_when))

    cfg, held, options, observers = agreed(world, "hpcevo.run's input", inputs, _canonical, arguments.differ)
    if ctx is None:
        par = cfg.parallel
        ctx = init(par.device, par.threads_per_rank, par.share_gpus)
    with rundir.speaking(options.face):
        summary, history = execute(ctx, cfg, held, options, observers)
    return Result(summary, history, Path(cfg.out_dir))


def minimize(f: Any, x0: Any, sigma0: float, *, bounds: tuple[Any, Any] | None = None,
             evaluations: int | None = None, target: float | None = None, restarts: str = "none",
             popsize: int | None = None, seed: int = 0, out: str | os.PathLike | None = None,
             overwrite: bool | None = None, ctx: ParallelContext | None = None, quiet: bool = True,
             host: bool | None = None) -> Result:
    """Minimise ``f`` from ``x0`` with step size ``sigma0``: CMA-ES as ``cma.fmin2(f, x0,
    sigma0)`` runs it (Hansen, "The CMA Evolution Strategy: A Tutorial", 2016; restarts IPOP,
    Auger and Hansen 2005, and BIPOP, Hansen 2009), in one call, at any rank count (collective:
    every rank calls it alike; the evaluation is split over the ranks, and the result is the
    same bits at any rank count).

    ``f``: a JAX function of one candidate (``(n,) -> ()``) or of a block (``(n_rows, n) ->
    (n_rows,)``), or NumPy code with ``host=True``. ``sigma0``: the initial standard deviation,
    in ``x``'s units. ``bounds``: ``(lower, upper)``, numbers or one per coordinate; candidates
    are then clipped to the box. Without bounds the search is unbounded; restarts start from a
    mean drawn within 2 sigma0 of ``x0``.

    It stops as pycma does by default: when the best value improved by no more than 1e-11 over
    the last 10 + 30 n / lambda generations (pycma's TolFun), after 100 + 150 (n + 3)^2 /
    sqrt(lambda) generations (its maxiter), at ``target`` (a value of ``f``), or at
    ``evaluations``. With ``restarts`` ("ipop", "bipop") it restarts where pycma's criteria say
    until ``evaluations`` (default 1,000 n^2) are spent. ``popsize``: lambda (the first
    lambda with restarts; default 4 + 3 ln n).

    The run is a run like any other, in ``out`` (default ``runs/minimize``, replaced on each call
    as pycma's ``outcmaes`` is; a folder you name is not replaced unless ``overwrite=True``): its
    metrics, checkpoints (``hpcevo.run(open_run(result.run_dir).config, problem=f, resume=True)``
    continues it) and summary. Returns its ``Result``: ``best_solution``, ``best_fitness``,
    ``evaluations``, ``generations``, ``run_dir``, ``summary["stopped_by"]``.
    """
    cfg = _minimize_config(x0, sigma0, bounds, evaluations, target, restarts, popsize, seed, out)
    return run(cfg, problem=f, ctx=ctx, quiet=quiet, host=host,
               overwrite=(out is None) if overwrite is None else overwrite)


def _minimize_config(x0, sigma0, bounds, evaluations, target, restarts, popsize, seed, out) -> dict[str, Any]:
    import numpy as np

    def bad(name: str, what: str) -> UsageError:
        return UsageError(f"minimize: '{name}' {what}")

    try:
        x = np.asarray(x0, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise bad("x0", f"must be a vector of numbers, got {type(x0).__name__}") from None
    if x.size < 1 or not np.all(np.isfinite(x)) or np.ndim(x0) > 1:
        raise bad("x0", "must be a non-empty vector of finite numbers")
    n = int(x.size)
    if isinstance(sigma0, bool) or not isinstance(sigma0, (int, float)) or not (math.isfinite(sigma0) and sigma0 > 0):
        raise bad("sigma0", f"must be a positive number, got {sigma0!r}")
    if restarts not in ("none", "ipop", "bipop"):
        raise bad("restarts", f"must be 'none', 'ipop' or 'bipop', got {restarts!r}")
    for name, value, least in (("evaluations", evaluations, 1), ("popsize", popsize, 2)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise bad(name, f"must be a whole number >= {least}, got {value!r}")
    if bounds is None:
        lb, ub = x - 2.0 * sigma0, x + 2.0 * sigma0
    else:
        try:
            lb, ub = (np.broadcast_to(np.asarray(b, dtype=float), (n,)) for b in bounds)
        except (TypeError, ValueError):
            raise bad("bounds", f"must be (lower, upper), each a number or {n} numbers") from None
        if not (np.all(lb < ub) and np.all(lb <= x) and np.all(x <= ub)):
            raise bad("bounds", "must have lower < upper, with x0 inside")
    lam = popsize or 4 + int(3 * math.log(n))
    algorithm: dict[str, Any] = {"name": "cmaes", "x0": x.tolist(), "restart": restarts, "clip": bounds is not None,
                                 "sigma_init": float(sigma0 / np.mean(ub - lb))}
    if popsize:
        algorithm["lambda0" if restarts != "none" else "pop_size"] = popsize
    section: dict[str, Any] = {"name": "minimize", "seed": seed, "out": os.fspath(out or Path("runs") / "minimize")}
    if restarts == "none":
        section["generations"] = 100 + 150 * (n + 3) ** 2 // max(1, int(math.sqrt(lam)))
        section["stagnation_generations"] = 10 + math.ceil(30 * n / lam)
        section["stagnation_tolerance"] = 1e-11
    else:
        section["evaluations"] = 1000 * n * n
    if evaluations is not None:
        section["evaluations"] = evaluations
    if target is not None:
        section["target"] = target
    return {"run": section, "algorithm": algorithm,
            "problem": {"dim": n, "lb": [float(v) for v in lb], "ub": [float(v) for v in ub]}}


def load_study(source: str | os.PathLike | Mapping[str, Any], overrides: Sequence[str] = ()):
    """A study from its TOML file (or a dict of its tables), after ``overrides`` (``--set`` on its
    keys: ``"base.run.generations=20"``, ``"study.seeds=3"``), expanded into its runs
    (``study.runs``: name, configuration, problem, seed, config) and checked: every run's config
    through the schema, and what ``load_config`` checks once per distinct program. Builds no
    problem and starts no MPI. Raises ``ConfigError`` naming the file, the run and the key."""
    from .studies.spec import load_study as load

    if not isinstance(source, (str, os.PathLike, Mapping)):
        raise UsageError("load_study: 'source' must be the path of a study file or a dict of its tables, got "
                         f"{type(source).__name__}")
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence) or not all(
            isinstance(o, str) for o in overrides):
        raise UsageError("load_study: 'overrides' must be a list of strings such as \"study.seeds=3\", got "
                         f"{schema.short(overrides)}")
    return load(dict(source) if isinstance(source, Mapping) else os.fspath(source), list(overrides))


def study(source: Any, *, ctx: ParallelContext | None = None, resume: bool = False, overwrite: bool = False,
          retry_failed: bool = False, quiet: bool = False, deadline: str | float | None = None,
          stop: StopSource | None = None, stream: TextIO | None = None, part: tuple[int, int] | None = None,
          overrides: Sequence[str] = (), rerun_changed: bool = False):
    """Run a study on every rank of the job (collective): the job is split into groups of the
    study's ``ranks_per_run`` ranks, which take its runs from a queue, longest first, until none
    is left. Each run is an ordinary run directory under the study's ``out``, bitwise the run
    its config gives alone. ``source``: a study file, a dict of its tables (with ``overrides``
    as ``load_study`` takes them), or ``load_study``'s result. Returns a ``StudyResult``
    (status, counts, the runs' records, idle share) on every rank once every run of this launch
    has ended and the journal is written.

    ``resume`` continues a study (done runs are skipped, interrupted ones resume from their
    checkpoints, at any rank count and ``ranks_per_run``; ``retry_failed``: failed ones run again);
    ``overwrite`` starts it again. A stop signal or ``deadline`` stops every group's run with a
    checkpoint (status "stopped"); a run that fails on its own is recorded as failed and the
    others go on. ``part=(i, k)``: only the runs whose index is i modulo k (an array task's
    share; each share keeps a journal of its own). ``quiet``, ``stop``, ``stream``: as for ``run``.

    A resume is refused (UsageError naming the keys and the runs) when the study now gives a
    begun run other settings that change results (all but where and how it logs, checkpoints
    and is bound to hardware: ``runner.STUDY_FREE``); ``rerun_changed=True`` starts those runs
    again from generation 1 instead.
    """
    from .studies.runner import StudyOptions, run_study
    from .studies.spec import Study

    world = _job(ctx)

    def inputs() -> tuple[Study, StudyOptions]:
        RunOptions.checked("study", overwrite=overwrite, resume=resume, quiet=quiet, deadline=deadline, stop=stop,
                           stream=stream)
        schema.check(bool, retry_failed, "retry_failed", "study")
        schema.check(bool, rerun_changed, "rerun_changed", "study")
        if retry_failed and not resume:
            raise UsageError("study: retry_failed applies when a study is resumed (resume=True)")
        if rerun_changed and not resume:
            raise UsageError("study: rerun_changed applies when a study is resumed (resume=True)")
        if isinstance(source, Study) and overrides:
            raise UsageError("study: 'overrides' apply to a study file or dict; load_study(source, overrides) "
                             "made this one")
        got = source if isinstance(source, Study) else load_study(source, overrides)
        return got, StudyOptions(resume, overwrite, retry_failed, quiet, deadline, stop, stream, _part(part),
                                 rundir.face(), rerun_changed)

    def canonical(given: tuple[Study, StudyOptions]) -> str:
        s, o = given
        return json.dumps({"name": s.name, "out": str(s.out), "ranks_per_run": s.ranks_per_run, "batch": s.batch,
                           "runs": [(r.name, r.data) for r in s.runs], "resume": o.resume, "overwrite": o.overwrite,
                           "retry_failed": o.retry_failed, "deadline": o.deadline, "part": o.part,
                           "rerun_changed": o.rerun_changed},
                          sort_keys=True, default=repr)

    got, options = agreed(world, "hpcevo.study's input", inputs, canonical)
    if ctx is None:
        par = got.runs[0].config().parallel
        ctx = init(par.device, par.threads_per_rank, par.share_gpus)
    return run_study(ctx, got, options)


def _part(part: Any) -> tuple[int, int] | None:
    if part is None:
        return None
    if (not isinstance(part, (tuple, list)) or len(part) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in part) or not 0 <= part[0] < part[1]):
        raise UsageError(f"study: 'part' must be (i, k) with 0 <= i < k (slice i of k), got {schema.short(part)}")
    return int(part[0]), int(part[1])


def _named(problem: Any, name: Any) -> Any:
    """``problem``, under ``name`` when one is given (``Named``), checked."""
    if name is None:
        return problem
    if not isinstance(name, str) or not name.strip() or name != name.strip() or not name.isprintable():
        raise ConfigError("run: 'problem_name' must be a non-empty line of text without surrounding spaces (e.g. "
                          f"\"srr\"), got {schema.short(name)}", "problem_name")
    if problem is None:
        raise ConfigError("run: 'problem_name' names the problem held in Python: pass it as problem= too",
                          "problem_name")
    if isinstance(problem, (Problem, HostProblem)):
        raise ConfigError(f"run: 'problem_name': problem is a {type(problem).__name__} object, recorded by its own "
                          f"name ({schema.short(problem.name)}); problem_name names a function or another object",
                          "problem_name")
    return Named(problem, name)


def _job(ctx: Any) -> ParallelContext:
    """The ranks to agree over: ``ctx``, or this process's place in the job (not bound yet:
    the config says how)."""
    if ctx is None:
        from .parallel import discover

        return discover()
    if not isinstance(ctx, ParallelContext):
        raise UsageError(f"run: 'ctx' must be a ParallelContext (hpcevo.parallel.init()), got {type(ctx).__name__}")
    return ctx


def _config(config: Any) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, (str, os.PathLike, Mapping)):
        return load_config(config)
    raise UsageError("run: 'config' must be a config from hpcevo.load_config, the path of a TOML file or a "
                     f"dict of its tables; got {type(config).__name__}")


def _canonical(given: tuple[RunConfig, Held, RunOptions, Hooks]) -> str:
    """What every rank must have been given alike, as text: the config, what the held objects
    are, the options that change what the run does, and the hooks' names."""
    cfg, held, options, hooks = given
    what = {"config": cfg.model_dump(), **options.shared(), "host": held.host, **hooks.describe(),
            "problem": None if held.problem is None else held_name(held.problem),
            "algorithm": None if held.algorithm is None else arguments.describe([held.algorithm], None)}
    return json.dumps(what, sort_keys=True, default=repr)
