"""Problems: pure JAX objective functions (minimised) and the registry the config names them by.

Every problem has ``name``, ``dim``, ``lb`` and ``ub`` (tuples, one bound per coordinate),
``num_objectives`` (1 unless it says otherwise) and ``evaluate(x)``: ``(n, dim) -> (n,)``.
A problem with ``wants_generation = True`` is called ``evaluate(x, generation)`` instead, with
the number of the generation being evaluated (1 for the initial population): for problems that
draw fresh random scenarios each generation, identically on every rank (neuroevolution).

Multi-objective problems (``multiobjective.py``: ZDT 1-4, 6 and DTLZ 1-7) return
``num_objectives`` values per candidate, ``(n, dim) -> (n, m)``.

Names: the classic functions of ``numerical.py`` (``sphere``, ``ackley``...), ZDT and DTLZ, the CEC 2022 suite
(``cec2022_f1``..``cec2022_f12``), COCO's BBOB suite (``bbob`` with ``function`` 1-24 and
``instance``: ``bbob.py``, equal to COCO's own values), ``neuro`` (an MLP policy on a gymnax environment), and a
user's own problem by import path (``package.module:function`` or ``path/file.py:function``).

Host problems (``host.py``) are not JAX: a NumPy function by import path (``host = True``) or an
external command (``command``). They carry ``host = True`` and ``evaluate_rows`` instead of
``evaluate``, and run under ``hpcevo.driver.host_engine.HostEngine``.

A function of a pytree of parameters (a network's weights as a dict of arrays, a Flax or Haiku
params tree), ``pytree_problem(fn, example)`` (``pytree.py``): a problem on the flattened
parameters, with ``unravel`` and ``ravel`` between a flat solution and the tree.

The protocols every problem follows, with the defaults of their optional members: ``base.py``.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, did_you_mean
from . import numerical
from .base import HostProblem, Problem
from .cec2022 import NAMES as CEC2022_NAMES
from .multiobjective import MO_PROBLEMS, MOProblem, make_mo_problem
from .numerical import (
    PROBLEMS,
    NumericalProblem,
    ProblemSpec,
    ackley,
    ellipsoid,
    griewank,
    rastrigin,
    rosenbrock,
    schwefel,
    sphere,
)
from .pytree import PytreeProblem, pytree_problem
from .user import is_held_name, is_import_path

__all__ = [
    "CEC2022_NAMES",
    "HostProblem",
    "Problem",
    "MO_PROBLEMS",
    "MOProblem",
    "PROBLEMS",
    "NumericalProblem",
    "ProblemSpec",
    "PytreeProblem",
    "ackley",
    "as_problem",
    "create",
    "ellipsoid",
    "griewank",
    "is_deferred",
    "make_problem",
    "pytree_problem",
    "rastrigin",
    "rosenbrock",
    "schwefel",
    "sphere",
]


def _unknown_name(name: object) -> ConfigError:
    hint = did_you_mean(name, [*PROBLEMS, *MO_PROBLEMS])
    return ConfigError(f"unknown problem {name!r}{hint} (valid: {', '.join(sorted(PROBLEMS))}; "
                      f"multi-objective: {', '.join(MO_PROBLEMS)})")


def make_problem(name: str, dim: int, lb=None, ub=None, objectives: int | None = None):
    """The built-in problem ``name`` in ``dim`` dimensions (``objectives``: for the scalable DTLZ
    problems); bounds default to its conventional domain. Raises ConfigError naming what is allowed."""
    if name in MO_PROBLEMS:
        return make_mo_problem(name, dim, lb, ub, objectives)
    if name not in PROBLEMS:
        raise _unknown_name(name)
    if objectives not in (None, 1):
        raise ConfigError(f"{name} is single-objective; objectives = {objectives} applies to the "
                         f"multi-objective problems ({', '.join(MO_PROBLEMS)})")
    return numerical.make_problem(name, dim, lb, ub)


def is_deferred(name: str) -> bool:
    """Problems whose construction imports user code or an environment library, which may touch
    JAX's backend: they are built once the rank is bound to its device, not while a config is
    only being validated (and a problem object held in Python, which only Python can supply)."""
    return is_import_path(name) or name == "neuro" or is_held_name(name)


def create(name: str, dim: int | None, lb=None, ub=None, args: dict[str, Any] | None = None,
           batched: bool | None = None, dtype: str = "float32", host: bool | None = None,
           objectives: int | None = None, function: int | None = None, instance: int | None = None):
    """The problem the config's ``[problem]`` section describes; ``ConfigError`` for bad input."""
    args = dict(args or {})
    if name == "bbob":
        return _bbob(dim, lb, ub, args, batched, host, function, instance)
    for key, value in (("function", function), ("instance", instance)):
        if value is not None:
            raise ConfigError(f"{name}: problem.{key} applies to name = \"bbob\" (COCO's functions), not to this "
                              "problem")
    if is_held_name(name):
        raise ConfigError(f"{name} was a Python object handed to hpcevo.run(problem=...): only Python can "
                         "run it (or resume its run) again, passing the same object")
    if objectives is not None and name not in MO_PROBLEMS:
        raise ConfigError(f"{name}: problem.objectives applies to the scalable multi-objective problems "
                         f"({', '.join(n for n in MO_PROBLEMS if n.startswith('dtlz'))}), not to this one")
    if name == "command":
        from .host import make_command

        return make_command(dim, lb, ub, args, batched)
    if host:
        if not is_import_path(name):
            raise ConfigError(f"{name}: problem.host = true is for a NumPy function named by import path "
                             "('package.module:function' or 'path/to/file.py:function'); an external "
                             "program is name = \"command\"")
        from .host import load_host_callable

        return load_host_callable(name, dim, lb, ub, args, batched)
    if is_import_path(name):
        from .user import load_user_problem

        return load_user_problem(name, dim, lb, ub, args, batched, dtype)
    if batched is not None:
        raise ConfigError(f"{name}: problem.batched is for problems named by import path only")
    if name == "neuro":
        from .neuro import make_neuro

        return make_neuro(dim, lb, ub, args)
    if args:
        raise ConfigError(f"{name}: takes no [problem.args] (got {', '.join(sorted(args))})")
    if name in MO_PROBLEMS:
        return make_mo_problem(name, dim, lb, ub, objectives)
    if name in CEC2022_NAMES:
        from .cec2022 import make_cec2022

        return make_cec2022(name, dim, lb, ub)
    if name not in PROBLEMS:
        err = _unknown_name(name)
        raise ConfigError(f"{err}; also cec2022_f1..cec2022_f12, bbob (COCO's suite), neuro, command (an external "
                         "program), or your own as 'package.module:function' or 'path/to/file.py:function'")
    if dim is None:
        raise ConfigError(f"{name}: problem.dim is required")
    return make_problem(name, dim, lb, ub)


def _bbob(dim, lb, ub, args, batched, host, function, instance):
    from .bbob import make_bbob

    if args or batched is not None or host:
        raise ConfigError("bbob: takes function, instance and dim (and lb/ub); not "
                          f"{', '.join(k for k, v in (('args', args), ('batched', batched), ('host', host)) if v)}")
    missing = [k for k, v in (("function", function), ("instance", instance), ("dim", dim)) if v is None]
    if missing:
        raise ConfigError(f"bbob: problem.{missing[0]} is required (function 1-24, instance >= 1, dim >= 2)")
    return make_bbob(function, instance, dim, lb, ub)


def as_problem(obj: Any, dim: int | None = None, lb=None, ub=None, *, host: bool = False,
               batched: bool | None = None, dtype: str = "float32", fallback: tuple = (None, None, None)):
    """A problem held in Python, checked and ready for a loop: a ``Problem`` or ``HostProblem``
    object as it is (when the config does not change its dim or bounds); a JAX function (or
    object with ``evaluate``) wrapped like a problem named by import path (``user.py``); with
    ``host``, a NumPy function wrapped like a host problem (``host.py``). ``dim``, ``lb``,
    ``ub`` come first (the config's), then the object's attributes, then ``fallback`` (an
    algorithm's). ConfigError names what is wrong."""
    from .host import host_from_object
    from .user import from_object

    if host or isinstance(obj, HostProblem):
        return host_from_object(obj, dim, lb, ub, batched, fallback)
    if isinstance(obj, Problem) and dim in (None, obj.dim) and lb is None and ub is None and batched is None:
        return obj
    return from_object(obj, dim, lb, ub, batched, dtype, fallback)
