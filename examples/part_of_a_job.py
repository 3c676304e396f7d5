"""hpcevo as one task of a larger MPI job: it runs on the ranks it is given, never on COMM_WORLD.

    mpiexec -n 4 .venv/bin/python examples/part_of_a_job.py

Rank 0 stands for what a workflow engine keeps for itself (dask-mpi's scheduler, a Parsl or Flux
task's coordinator): it does its own work and never calls hpcevo. The other ranks hand hpcevo
their own communicator with ``hpcevo.parallel.init(comm=...)``; every collective call of the
run (the fitness exchange, checkpoints, the agreement at exit) then stays among them, and the
result has the digest of the same run at one rank (``python -m hpcevo run examples/cso.toml
--set run.generations=50``). With one rank in all, rank 0 runs it alone.
"""

from __future__ import annotations

import time
from pathlib import Path

from mpi4py import MPI

import hpcevo

HERE = Path(__file__).resolve().parent
world = MPI.COMM_WORLD
engine_rank = world.size > 1 and world.rank == 0
workers = world.Split(MPI.UNDEFINED if engine_rank else 1, world.rank)

if engine_rank:
    end, t0 = world.Ibarrier(), time.monotonic()  # its own work, until the workers are done
    while not end.Test():
        time.sleep(0.05)
    print(f"rank 0: served the job for {time.monotonic() - t0:.1f} s")
else:
    ctx = hpcevo.parallel.init(comm=workers)
    config = hpcevo.load_config(HERE / "cso.toml", ["run.generations=50", "run.out=runs/part-of-a-job"])
    result = hpcevo.run(config, overwrite=True, quiet=True)
    ctx.print(f"hpcevo on {ctx.size} of the job's {world.size} ranks: best {result.best_fitness:.6g}, "
              f"digest {result.digest}")
    world.Ibarrier().Wait()
