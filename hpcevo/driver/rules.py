"""The rules across keys that a run's config must satisfy once its problem is known, in one place.

The schema (``config.py``) checks each key alone, and ``build.check`` builds the algorithm and
the problem to run their own checks; what is left are rules that tie keys to each other and to
the problem: a target needs a single objective, a target precision needs a known optimum,
COCO's data needs a BBOB problem.
They are checked here, before anything is written, deleted or compiled: by ``build.check`` (the
CLI, ``hpcevo.load_config``, ``study plan``) and again by ``Run.start`` before it prepares the run
directory, where a problem held in Python or built only on the ranks is known. A refusal here
never costs a run that ``--overwrite`` would have replaced.

Pure: no MPI, no files; ``problem`` is only asked for its name, objectives and optimum.
"""

from __future__ import annotations

import math
from typing import Any

from ..config import RunConfig
from ..errors import ConfigError


def check(cfg: RunConfig, problem: Any) -> None:
    """ConfigError naming the source and the key of the first rule ``cfg`` breaks with ``problem``."""
    run, where = cfg.run, cfg.source
    name = getattr(problem, "name", "the problem")
    objectives = getattr(problem, "num_objectives", 1)
    if run.reevaluate and objectives > 1:
        raise ConfigError(f"{where}: run.reevaluate = {run.reevaluate}: problem {name} has {objectives} objectives; "
                          "re-evaluating 'the best' needs one (set run.reevaluate = 0)", "run.reevaluate")
    if run.target is not None and math.isnan(run.target):
        raise ConfigError(f"{where}: 'run.target' must be a number, got nan", "run.target")
    if run.target is not None and run.target_precision is not None:
        raise ConfigError(f"{where}: 'run.target' and 'run.target_precision' both set a target: give one",
                          "run.target_precision")
    ends = [k for k, v in (("run.evaluations", run.evaluations), ("run.target", run.target),
                           ("run.target_precision", run.target_precision),
                           ("run.stagnation_generations", run.stagnation_generations)) if v is not None]
    about_fitness = [k for k in ends if k != "run.evaluations"]
    if about_fitness and objectives > 1:
        raise ConfigError(f"{where}: '{about_fitness[0]}' is about a fitness value; problem {name} has "
                          f"{objectives} objectives", about_fitness[0])
    if run.target_precision is not None and getattr(problem, "optimum_value", None) is None:
        raise ConfigError(f"{where}: 'run.target_precision': problem {name} does not know its optimal value; set "
                          "run.target (a fitness) instead", "run.target_precision")
    if cfg.log.coco:
        if not is_bbob(problem):
            raise ConfigError(f"{where}: 'log.coco' writes COCO's bbob data: it needs a BBOB problem ([problem] "
                              f"name = \"bbob\"), not {name}", "log.coco")


def is_bbob(problem: Any) -> bool:
    """A problem COCO's bbob data can describe: a function number, an instance and f_opt."""
    return all(hasattr(problem, k) for k in ("function", "instance", "fopt"))


def target(cfg: RunConfig, problem: Any) -> float | None:
    """run.target, or the problem's optimal value plus run.target_precision (``check`` first)."""
    run = cfg.run
    if run.target_precision is None:
        return run.target
    return float(problem.optimum_value) + run.target_precision
