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

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from .algorithms.base import Algorithm
from .config import RunConfig, config_from_dict, read_config
from .driver import build
from .driver.execute import execute
from .driver.result import Result
from .driver.stopping import StopSource
from .parallel import ParallelContext

__all__ = ["load_config", "open_run", "run"]


def load_config(source: str | os.PathLike | Mapping[str, Any], overrides: Sequence[str] = ()) -> RunConfig:
    """A run config from a TOML file or a dict (the TOML document's tables), after ``overrides``
    (``"run.generations=50"``: a key path and a TOML value, as the CLI's ``--set``). Checks
    everything that can be checked without importing a user's code: the schema, the algorithm's
    name and hyper-parameters, and a built-in problem with the algorithm's own checks against
    it. Raises ``ConfigError`` naming the source, the key and what is allowed."""
    if isinstance(source, Mapping):
        cfg = config_from_dict(dict(source), "config", list(overrides))
    else:
        cfg = read_config(source, list(overrides))
    build.check(cfg)
    return cfg


def run(config: RunConfig | str | os.PathLike | Mapping[str, Any], *, problem: Any = None,
        algorithm: Algorithm | None = None, host: bool | None = None, ctx: ParallelContext | None = None,
        overwrite: bool = False, resume: bool = False, quiet: bool = False, deadline: str | None = None,
        stop: StopSource | None = None, stream: TextIO | None = None) -> Result:
    """Run ``config`` on every rank of the job (collective: every rank calls it alike).

    ``problem``: a JAX function you hold (of one candidate, ``(dim,) -> ()``, or of a block,
    ``(n, dim) -> (n,)``) or a problem object, in place of the config's ``[problem]`` name; its
    dim and bounds come from the config, else from the object, else from ``algorithm``. With
    ``host=True`` it is NumPy code, evaluated on the host. ``algorithm``: an algorithm object
    (``hpcevo.algorithms.CSO(...)``) in place of the config's ``[algorithm]`` section. What they
    were is recorded in the run's resolved config, so ``resume`` works for them from Python.

    ``ctx``: the ranks to run on (default: ``hpcevo.parallel.init()`` as ``[parallel]`` asks).
    ``overwrite`` replaces a run already in the run directory; ``resume`` continues it from its
    newest valid checkpoint, bitwise as if it had never stopped, at any rank count. ``quiet``:
    print nothing but warnings (rank 0 prints progress lines otherwise, to ``stream``).
    ``deadline``: stop with a checkpoint before this (seconds, "90m", "01:30:00", a local time).
    ``stop``: what is polled for a stop request (default: SIGTERM, SIGUSR1, SIGINT).
    A run stopped early returns with ``status == "stopped"``.
    """
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    if ctx is None:
        from .parallel import init

        par = cfg.parallel
        ctx = init(par.device, par.threads_per_rank, par.share_gpus)
    summary, history = execute(ctx, cfg, problem=problem, algorithm=algorithm, host=host, overwrite=overwrite,
                               resume=resume, quiet=quiet, stream=stream, deadline=deadline, stop=stop)
    return Result(summary, history, Path(cfg.out_dir))



