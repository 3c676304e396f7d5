"""hpcevo's CMA-ES as a gest-api generator, driven by libEnsemble (pip install libensemble).

    python examples/libensemble_cmaes.py --nworkers 2 --comms local
    mpiexec -n 3 python examples/libensemble_cmaes.py          # libEnsemble over MPI: 2 workers

libEnsemble's workers evaluate the points (here a NumPy Rosenbrock of 4 variables, as a
simulation would be run); hpcevo's CMA-ES (``hpcevo.gest.Generator``) suggests them a generation
at a time and learns from their values. The run it makes is hpcevo's own loop, bit for bit
(tests/test_gest.py). Prints one JSON line: the generations done, the best point and value, and
the loop's state digest.
"""

from __future__ import annotations

import json

import numpy as np
from gest_api.vocs import VOCS
from libensemble import Ensemble
from libensemble.alloc_funcs.start_only_persistent import only_persistent_gens
from libensemble.specs import AllocSpecs, ExitCriteria, GenSpecs, LibeSpecs, SimSpecs

from hpcevo.gest import Generator

NAMES = ["x0", "x1", "x2", "x3"]
GENERATIONS = 150


def rosenbrock(x: np.ndarray) -> float:
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def simulation(H_in):
    """libEnsemble's sim_f: one point's value (what a real simulation would compute)."""
    out = np.zeros(1, dtype=[("f", float)])
    out["f"] = rosenbrock(np.array([H_in[k][0] for k in NAMES]))
    return out


if __name__ == "__main__":
    vocs = VOCS(variables={k: [-2.0, 2.0] for k in NAMES}, objectives={"f": "MINIMIZE"})
    gen = Generator(vocs, "cmaes", seed=7)
    ensemble = Ensemble(
        parse_args=True,
        libE_specs=LibeSpecs(gen_on_manager=True),
        sim_specs=SimSpecs(sim_f=simulation, vocs=vocs),
        # a generation at a time: its values all come back before the next is suggested
        gen_specs=GenSpecs(generator=gen, initial_batch_size=gen.batch_size, batch_size=gen.batch_size, vocs=vocs),
        alloc_specs=AllocSpecs(alloc_f=only_persistent_gens),
        exit_criteria=ExitCriteria(sim_max=GENERATIONS * gen.batch_size),
    )
    ensemble.run()
    if ensemble.is_manager:
        gen.finalize()  # (libEnsemble calls it when the gen ends; again is harmless)
        print(json.dumps({"generations": gen.generation, "best_fitness": gen.best_fitness,
                          "best_solution": gen.best_solution, "digest": gen.loop.digest(),
                          "evaluated": int(len(ensemble.H))}), flush=True)
