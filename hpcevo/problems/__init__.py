"""Benchmark problems: pure JAX objective functions (minimised) and their registry.

Single-objective problems (``numerical.py``) return one value per candidate; multi-objective
ones (``multiobjective.py``: ZDT, DTLZ) return ``num_objectives`` values.
"""

import difflib

from . import numerical
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


def make_problem(name: str, dim: int, lb=None, ub=None, objectives: int | None = None):
    """The problem ``name`` in ``dim`` dimensions (``objectives``: for the scalable DTLZ problems);
    bounds default to its conventional domain. Raises ValueError naming what is allowed."""
    if name in MO_PROBLEMS:
        return make_mo_problem(name, dim, lb, ub, objectives)
    if name not in PROBLEMS:
        near = difflib.get_close_matches(str(name), [*PROBLEMS, *MO_PROBLEMS], n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise ValueError(f"unknown problem {name!r}{hint} (valid: {', '.join(sorted(PROBLEMS))}; "
                         f"multi-objective: {', '.join(MO_PROBLEMS)})")
    if objectives not in (None, 1):
        raise ValueError(f"{name} is single-objective; objectives = {objectives} applies to the "
                         f"multi-objective problems ({', '.join(MO_PROBLEMS)})")
    return numerical.make_problem(name, dim, lb, ub)


__all__ = [
    "MO_PROBLEMS",
    "MOProblem",
    "PROBLEMS",
    "NumericalProblem",
    "ProblemSpec",
    "make_problem",
    "ackley",
    "ellipsoid",
    "griewank",
    "rastrigin",
    "rosenbrock",
    "schwefel",
    "sphere",
]
