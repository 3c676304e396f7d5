"""Benchmark problems: pure JAX objective functions (minimised) and their registry."""

from .numerical import (
    PROBLEMS,
    NumericalProblem,
    ProblemSpec,
    ackley,
    ellipsoid,
    griewank,
    make_problem,
    rastrigin,
    rosenbrock,
    schwefel,
    sphere,
)

__all__ = [
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
