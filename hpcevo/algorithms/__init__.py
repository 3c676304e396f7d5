"""Algorithms: pure JAX, no MPI, no I/O. One file per family; see base.py for the protocol."""

from .base import Algorithm
from .cso import CSO, CSOState
from .pso import PSO, PSOState

ALGORITHMS: dict[str, type[Algorithm]] = {"cso": CSO, "pso": PSO}

__all__ = ["ALGORITHMS", "Algorithm", "CSO", "CSOState", "PSO", "PSOState"]
