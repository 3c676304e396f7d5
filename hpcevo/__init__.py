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
    arch = hpcevo.Archipelago([CSO(...), DE(...)], problem, ctx,   # islands, the same way
                              hpcevo.Migration(every=20, migrants=5)).init(seed=0)

Protocols: ``Algorithm``, ``Problem``, ``HostProblem``. Errors: ``ConfigError``, ``UsageError``,
``CheckpointError``, ``CheckpointDamaged``, ``DivergenceError``, ``UserCodeExit``. Names load on
first use, so ``import hpcevo`` (and the command line's start) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES = {
    "load_config": "hpcevo.api",
    "run": "hpcevo.api",
    "open_run": "hpcevo.driver.result",
    "Result": "hpcevo.driver.result",
    "RunRecord": "hpcevo.driver.result",
    "RunConfig": "hpcevo.config",
    "Loop": "hpcevo.driver.loop",
    "Archipelago": "hpcevo.driver.archipelago",
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
_SUBMODULES = ("algorithms", "problems", "parallel", "checkpoint")

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
