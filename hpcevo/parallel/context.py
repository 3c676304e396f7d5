"""Who am I in the job, and which device is mine.

``discover()`` initialises MPI and finds rank, size, local rank and local size.
``bind()`` must run before JAX creates its backend (the first array or device query): it hides
all GPUs but this rank's own from JAX, or, on CPU-only machines, caps XLA's thread pool so N
ranks on C cores do not each spawn C threads and fight.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from typing import Any

from ..errors import UsageError

# Launchers publish the node-local rank under different names (first match wins). Checked
# against the communicator's own view, so a stale variable from an outer job cannot mislead.
LOCAL_RANK_VARS = (
    "MPI_LOCALRANKID",  # MPICH hydra
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI
    "SLURM_LOCALID",  # srun
    "PALS_LOCAL_RANKID",  # Cray PALS
    "PMI_LOCAL_RANK",  # Cray / some PMI
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH
)


@dataclasses.dataclass
class ParallelContext:
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    local_rank_source: str
    comm_jax: Any  # for mpi4jax ops inside jitted code only
    comm_ctl: Any  # for Python-side control (agreement, digests, metadata)
    device_kind: str = "unbound"  # "cpu" | "gpu" after bind()
    device: str = ""  # human-readable: "cpu, 2 threads", "cuda:1"

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def abort(self, code: int) -> None:
        """End the whole job now. With one rank a plain exit is cleaner than MPI_Abort's banner."""
        if self.size == 1:
            os._exit(code)
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)


_CONTEXT: ParallelContext | None = None


def discover() -> ParallelContext:
    """Initialise MPI (a singleton job without a launcher) and describe this rank. Idempotent."""
    global _CONTEXT
    if _CONTEXT is None:
        from mpi4py import MPI

        _CONTEXT = context_for(MPI.COMM_WORLD)
    return _CONTEXT


def context_for(comm: Any) -> ParallelContext:
    """A context over any communicator (collective on it); e.g. COMM_SELF for a one-rank run
    inside a larger job. Clones the communicator twice: mpi4jax and mpi4py traffic never mix."""
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    local_rank, local_size, source = shared.rank, shared.size, "MPI_COMM_TYPE_SHARED"
    shared.Free()
    if comm.size == MPI.COMM_WORLD.size and comm.size > 1:
        for var in LOCAL_RANK_VARS:
            value = os.environ.get(var, "")
            if value.isdigit() and int(value) < local_size:
                local_rank, source = int(value), var
                break
    ctx = ParallelContext(
        rank=comm.rank,
        size=comm.size,
        local_rank=local_rank,
        local_size=local_size,
        host=MPI.Get_processor_name(),
        local_rank_source=source,
        comm_jax=comm.Clone(),
        comm_ctl=comm.Clone(),
    )
    if _CONTEXT is not None:  # binding is per process: a later context inherits it
        ctx.device_kind, ctx.device = _CONTEXT.device_kind, _CONTEXT.device
    return ctx


def _cuda_plugin_installed() -> bool:
    return any(
        importlib.util.find_spec(name) is not None
        for name in ("jax_cuda13_plugin", "jax_cuda12_plugin")
    )


def _visible_gpus() -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    return sorted(
        (p.removeprefix("/dev/nvidia") for p in glob.glob("/dev/nvidia[0-9]*")), key=int
    )


def cpu_threads_for(local_size: int) -> int:
    """Threads for one rank: its launcher binding if it has one, else a fair share of the node."""
    mine = len(os.sched_getaffinity(0))
    total = os.cpu_count() or mine
    if mine < total:  # the launcher bound us (srun --cpu-bind, mpiexec -bind-to): trust it
        return mine
    return max(1, total // max(1, local_size))


def bind(ctx: ParallelContext, device: str = "auto", threads: int | str = 1) -> ParallelContext:
    """Choose and pin this rank's device. Must run before JAX initialises a backend.

    Raises UsageError (identically on every rank of a homogeneous job) for an impossible request.
    """
    gpus = _visible_gpus() if _cuda_plugin_installed() else []
    if device == "gpu" and not gpus:
        raise UsageError(
            "parallel.device = 'gpu' but no GPU is usable on "
            f"{ctx.host} (jax CUDA plugin installed: {_cuda_plugin_installed()}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
            "allowed: 'auto', 'cpu', 'gpu'"
        )
    if gpus and device != "cpu":
        if len(gpus) == 1:
            mine = gpus[0]  # the launcher already gave this rank exactly one GPU
        else:
            # One GPU per local rank; with more ranks than GPUs, ranks share round-robin.
            mine = gpus[ctx.local_rank % len(gpus)]
        os.environ["CUDA_VISIBLE_DEVICES"] = mine
        if ctx.local_size > 1:
            # Default preallocation takes 75% of the GPU for the first process on it.
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        ctx.device_kind, ctx.device = "gpu", f"cuda:{mine}"
    else:
        n = cpu_threads_for(ctx.local_size) if threads == "auto" else int(threads)
        # XLA's CPU client sizes its thread pool from NPROC; its thread flags are ignored.
        os.environ["NPROC"] = str(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        ctx.device_kind, ctx.device = "cpu", f"cpu, {n} threads"
    return ctx


def mpi_library() -> tuple[str, str]:
    """(first line of the MPI library's version string, MPI standard version)."""
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip(), "{}.{}".format(*MPI.Get_version())
