"""Algorithms: pure JAX, no MPI, no I/O. One file per family; see base.py for the protocol."""

from .base import Algorithm, MultiObjectiveAlgorithm
from .cmaes import CMAES, CMAState, SepCMAES
from .cso import CSO, CSOState
from .de import DE, JADE, DEState, JADEState
from .ga import GA, GAState
from .moead import MOEAD, MOEADState
from .nsga2 import NSGA2, NSGA2State
from .nes import SNES, XNES, SNESState, XNESState
from .openes import OpenES, OpenESState
from .pgpe import PGPE, PGPEState
from .pso import PSO, SLPSO, PSOState, SLPSOState

# Config names ([algorithm] name = ...).
ALGORITHMS: dict[str, type[Algorithm]] = {
    "cso": CSO,
    "pso": PSO,
    "slpso": SLPSO,
    "de": DE,
    "jade": JADE,
    "cmaes": CMAES,
    "sep_cmaes": SepCMAES,
    "openes": OpenES,
    "snes": SNES,
    "xnes": XNES,
    "pgpe": PGPE,
    "ga": GA,
    "nsga2": NSGA2,
    "moead": MOEAD,
}

__all__ = [
    "ALGORITHMS", "Algorithm", "MultiObjectiveAlgorithm", "MOEAD", "MOEADState", "NSGA2", "NSGA2State",
    "CMAES", "CMAState", "SepCMAES", "CSO", "CSOState", "DE", "DEState", "JADE", "JADEState",
    "GA", "GAState", "OpenES", "OpenESState", "PGPE", "PGPEState", "PSO", "PSOState",
    "SLPSO", "SLPSOState", "SNES", "SNESState", "XNES", "XNESState",
]
