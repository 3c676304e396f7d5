"""hpcevo: MPI-first evolutionary computation with JAX.

The public API (every name in ``__all__``; the docstrings are the reference)::

    import hpcevo
    ctx = hpcevo.parallel.init()                   # rank, size, local_rank, device, hosts, print
    cfg = hpcevo.load_config("examples/cso.toml", overrides=["run.generations=50"])
    result = hpcevo.run(cfg)                       # or hpcevo.run(cfg, problem=f, algorithm=...)
    result.best_fitness, result.best_solution, result.digest, result.run_dir, result.history
    run = hpcevo.open_run(result.run_dir)          # .config, .summary, .metrics, .checkpoints

    loop = hpcevo.Loop(algorithm, problem, ctx).init(seed=0)   # the step-level API
    loop.advance(100); loop.best_fitness; loop.save("ckpt/")
    x = loop.ask(); loop.tell(x, loop.evaluate(x))             # ask/tell, bitwise one advance(1)
    batch = hpcevo.Batch([hpcevo.Loop(algorithm, problem, ctx) for s in seeds]).init(seeds)
    batch.advance(100)                                         # one program for all: each run bitwise alone
    loop.set_params(F=0.9)                                     # hyper-parameters as data
    hpcevo.run(cfg, hooks=[...], stop_when=[hpcevo.hooks.Target(1e-6)])   # hooks at log boundaries
    arch = hpcevo.Archipelago([CSO(...), DE(...)], problem, ctx,   # islands, the same way
                              hpcevo.Migration(every=20, migrants=5)).init(seed=0)
    result = hpcevo.study("examples/study.toml", resume=True)   # many runs on groups of ranks
    result = hpcevo.minimize(f, x0, sigma0)                     # CMA-ES in one call, as cma.fmin2
    groups = hpcevo.parallel.split(ctx, ranks_per_group=2)      # groups of your own

Protocols: ``Algorithm``, ``Problem``, ``HostProblem``. Errors: ``ConfigError``, ``UsageError``,
``CheckpointError``, ``CheckpointDamaged``, ``DivergenceError``, ``UserCodeExit``. Names load on
first use, so ``import hpcevo`` (and the command line's start) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    # What type checkers see (``__getattr__`` below would give them Any for every name): each
    # name of _NAMES from its module, re-exported by name. Never executed, so ``import hpcevo``
    # still loads nothing (tests/test_typing.py checks that the two lists agree).
    from . import (algorithms as algorithms, checkpoint as checkpoint, hooks as hooks, parallel as parallel,
                   problems as problems)
    from .algorithms.base import Algorithm as Algorithm
    from .algorithms.migration import Migration as Migration
    from .api import (load_config as load_config, load_study as load_study, minimize as minimize, run as run,
                      study as study)
    from .config import RunConfig as RunConfig
    from .driver.archipelago import Archipelago as Archipelago
    from .driver.batch import Batch as Batch
    from .driver.loop import Loop as Loop
    from .driver.result import Result as Result, RunRecord as RunRecord, open_run as open_run
    from .driver.stopping import StopFlag as StopFlag
    from .errors import (EXIT_STOPPED as EXIT_STOPPED, CheckpointDamaged as CheckpointDamaged,
                         CheckpointError as CheckpointError, ConfigError as ConfigError,
                         DivergenceError as DivergenceError, UsageError as UsageError, UserCodeExit as UserCodeExit)
    from .parallel.context import ParallelContext as ParallelContext
    from .problems.base import HostProblem as HostProblem, Problem as Problem

_NAMES = {
    "load_config": "hpcevo.api",
    "run": "hpcevo.api",
    "minimize": "hpcevo.api",
    "load_study": "hpcevo.api",
    "study": "hpcevo.api",
    "open_run": "hpcevo.driver.result",
    "Result": "hpcevo.driver.result",
    "RunRecord": "hpcevo.driver.result",
    "RunConfig": "hpcevo.config",
    "Loop": "hpcevo.driver.loop",
    "Archipelago": "hpcevo.driver.archipelago",
    "Batch": "hpcevo.driver.batch",
    "Migration": "hpcevo.algorithms.migration",
    "StopFlag": "hpcevo.driver.stopping",
    "Algorithm": "hpcevo.algorithms.base",
    "Problem": "hpcevo.problems.base",
    "HostProblem": "hpcevo.problems.base",
    "ParallelContext": "hpcevo.parallel.context",
    "ConfigError": "hpcevo.errors",
    "UsageError": "hpcevo.errors",
    "CheckpointError": "hpcevo.errors",
    "DivergenceError": "hpcevo.errors",
    "CheckpointDamaged": "hpcevo.errors",
    "UserCodeExit": "hpcevo.errors",
    "EXIT_STOPPED": "hpcevo.errors",
}
_SUBMODULES = ("algorithms", "problems", "parallel", "checkpoint", "hooks")

__all__ = ["__version__", *_NAMES, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"hpcevo.{name}")
    else:
        raise AttributeError(f"module 'hpcevo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
