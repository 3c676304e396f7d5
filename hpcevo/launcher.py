"""What the launcher's environment says about this process, read without MPI (and without
importing JAX: the command line asks before it knows whether it needs either)."""

from __future__ import annotations

import os


def launcher_rank() -> int:
    """This process's rank as mpiexec, srun or PMIx says (0 when alone)."""
    return _first(("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"), 0)


def launcher_size() -> int:
    """The job's ranks as mpiexec, srun or PMIx says (1 when alone)."""
    return _first(("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS"), 1)


def _first(names: tuple[str, ...], default: int) -> int:
    for var in names:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return default
