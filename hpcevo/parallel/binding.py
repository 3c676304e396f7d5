"""Rank binding as a pure decision: what a rank sees of its node in, a binding out.

``probe()`` reads what one rank sees (launcher variables, visible GPUs, CPU affinity, cores);
the context gathers the probes of all ranks on a node (one ``Split_type(COMM_TYPE_SHARED)``
communicator), and ``decide()`` turns them and the request into a ``Binding``: the local rank
and where it came from, the GPU or the CPU thread cap, and the environment variables that carry
the decision into JAX. ``decide`` reads no global state, so every launcher, GPU count and CPU
layout can be tested by handing it simulated probes; ``context.bind`` applies its result.

The rules, in the order they apply:

* Local rank: the first launcher variable in ``LOCAL_RANK_VARS`` that the rank has, provided
  the values on the node are exactly 0..n-1 (one per rank); otherwise the rank's place in the
  node communicator. A stale variable inherited from an outer job (a batch shell's
  ``SLURM_LOCALID=0`` seen by every rank of an inner ``mpiexec``) fails that check and is ignored.
* GPUs are used when the JAX CUDA plugin is installed, a GPU is visible and the request is not
  ``cpu``. Ranks whose ``CUDA_VISIBLE_DEVICES`` differ from their node peers' (``srun
  --gpus-per-task=1``, ``--gpu-bind``) were bound by the scheduler: each keeps its first GPU.
  Otherwise rank ``i`` takes the node's visible GPU ``i``; more ranks than GPUs is refused unless
  ``share_gpus`` asks for round-robin sharing.
* CPU ranks get a thread cap (XLA sizes its CPU pool from ``NPROC``): the requested number, or
  for ``"auto"`` the CPUs the launcher bound the rank to, or a fair share of the node's cores.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import platform
from typing import Literal, Mapping, Sequence

from ..errors import UsageError

# Launchers publish the node-local rank under different names; the first one present wins.
# Launchers that start other launchers come first: hydra or Open MPI's mpirun inside a Slurm
# allocation leave the batch step's SLURM_LOCALID in every rank's environment.
LOCAL_RANK_VARS = (
    "MPI_LOCALRANKID",  # MPICH hydra, Intel MPI
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH
    "PALS_LOCAL_RANKID",  # Cray PALS (PBS on HPE/Cray)
    "PMI_LOCAL_RANK",  # Cray PMI
    "SLURM_LOCALID",  # srun
)
COMM_SOURCE = "MPI_COMM_TYPE_SHARED"


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one rank sees of its node before it is bound (picklable: it is gathered)."""

    env_local_rank: tuple[str, int] | None  # (variable, value) of the first launcher variable
    cuda_visible_devices: str | None  # as set in the environment; None when unset
    device_files: tuple[str, ...]  # GPU numbers from /dev/nvidiaN
    cuda_runtime: bool  # a JAX CUDA plugin is installed
    affinity: tuple[int, ...]  # CPUs this process may run on
    cores: int  # CPUs of the node
    machine: str = "x86_64"  # platform.machine()
    xla_flags: str = ""  # XLA_FLAGS as set in the environment

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPUs this rank can see: CUDA_VISIBLE_DEVICES when set (ids or UUIDs), else /dev."""
        if self.cuda_visible_devices is None:
            return self.device_files
        ids = (d.strip() for d in self.cuda_visible_devices.split(","))
        out = []
        for d in ids:
            if not d or d == "-1":  # CUDA stops at the first invalid entry
                break
            out.append(d)
        return tuple(out)


def env_local_rank(env: Mapping[str, str]) -> tuple[str, int] | None:
    for var in LOCAL_RANK_VARS:
        value = env.get(var, "").strip()
        if value.isdigit():
            return var, int(value)
    return None


def probe(env: Mapping[str, str] | None = None, *, device_files: Sequence[str] | None = None,
          affinity: Sequence[int] | None = None, cores: int | None = None,
          cuda_runtime: bool | None = None) -> Probe:
    """What this process sees; any part can be given instead (tests simulate nodes this way)."""
    env = os.environ if env is None else env
    if device_files is None:
        found = glob.glob("/dev/nvidia[0-9]*")
        device_files = sorted((p.removeprefix("/dev/nvidia") for p in found), key=int)
    if affinity is None:
        affinity = os.sched_getaffinity(0)
    if cuda_runtime is None:
        cuda_runtime = any(
            importlib.util.find_spec(m) is not None for m in ("jax_cuda13_plugin", "jax_cuda12_plugin")
        )
    return Probe(
        env_local_rank=env_local_rank(env),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        device_files=tuple(device_files),
        cuda_runtime=cuda_runtime,
        affinity=tuple(sorted(affinity)),
        cores=cores or os.cpu_count() or len(affinity),
        machine=platform.machine(),
        xla_flags=env.get("XLA_FLAGS", ""),
    )


def resolve_local_rank(node: Sequence[Probe], index: int) -> tuple[int, str]:
    """(local rank, its source) of rank ``index`` among the probes of one node's ranks.

    The launcher's number is used when every rank on the node has one from the same variable
    and together they are 0..n-1 (the scheduler's GPU and CPU binding follows that numbering);
    a sub-communicator's ranks, or an outer job's stale variable, fail that check.
    """
    found = [p.env_local_rank for p in node]
    if all(f is not None for f in found):
        names = {f[0] for f in found}  # type: ignore[index]
        values = sorted(f[1] for f in found)  # type: ignore[index]
        if len(names) == 1 and values == list(range(len(node))):
            var, value = found[index]  # type: ignore[misc]
            return value, var
    return index, COMM_SOURCE


@dataclasses.dataclass(frozen=True)
class Request:
    device: Literal["auto", "cpu", "gpu"] = "auto"
    threads: int | Literal["auto"] = 1
    share_gpus: bool = False


@dataclasses.dataclass(frozen=True)
class Binding:
    local_rank: int
    local_size: int
    local_rank_source: str
    kind: Literal["cpu", "gpu"]
    gpu: str | None  # the CUDA_VISIBLE_DEVICES entry this rank keeps
    gpu_source: str  # "scheduler" (kept as given), "local rank", "shared"; "" on CPU
    threads: int | None  # XLA CPU thread cap (CPU ranks)
    affinity: tuple[int, ...]
    env: Mapping[str, str]  # set unconditionally
    env_defaults: Mapping[str, str]  # set unless the user already set them
    notes: tuple[str, ...] = ()  # not errors, but worth a look (shown by `hpcevo info`)
    xla_flags: tuple[str, ...] = ()  # appended to XLA_FLAGS (never one the user set already)

    @property
    def device(self) -> str:
        if self.kind == "gpu":
            return f"cuda:{self.gpu}"
        return f"cpu, {self.threads} thread{'s' if self.threads != 1 else ''}"


def decide(node: Sequence[Probe], index: int, request: Request = Request(), host: str = "") -> Binding:
    """The binding of rank ``index`` of a node whose ranks saw ``node``. Pure.

    Raises UsageError for an impossible request. Every rank of the node computes it from the
    same probes, so they raise together.
    """
    me = node[index]
    local_rank, source = resolve_local_rank(node, index)
    where = f" on {host}" if host else ""
    gpus = me.gpus if me.cuda_runtime else ()
    if request.device == "gpu" and not gpus:
        raise UsageError(
            f"parallel.device = 'gpu' but no GPU is usable{where} (JAX CUDA plugin installed: "
            f"{'yes' if me.cuda_runtime else 'no'}, CUDA_VISIBLE_DEVICES="
            f"{me.cuda_visible_devices if me.cuda_visible_devices is not None else '<unset>'}, "
            f"/dev/nvidia*: {len(me.device_files)}); allowed: 'auto', 'cpu', 'gpu'"
        )
    if gpus and request.device != "cpu":
        return _gpu_binding(node, index, local_rank, source, gpus, request, where)
    return _cpu_binding(node, index, local_rank, source, request)


def _gpu_binding(node, index, local_rank, source, gpus, request, where) -> Binding:
    local_size = len(node)
    views = [p.cuda_visible_devices for p in node]
    # Per-task GPU lists (srun --gpus-per-task, --gpu-bind, a site wrapper) differ between the
    # node's ranks; one list shared by all ranks (--gpus-per-node) is the node's, to divide.
    scheduler_bound = None not in views and len(set(views)) == local_size
    notes: tuple[str, ...] = ()
    if scheduler_bound:
        mine, how = gpus[0], "scheduler"
        if len(gpus) > 1:
            notes = (f"the scheduler gave this rank {len(gpus)} GPUs; hpcevo uses the first",)
    elif local_size > len(gpus) and not request.share_gpus:
        raise UsageError(
            f"{local_size} ranks{where} but {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} visible "
            f"({', '.join(gpus)}): one rank per GPU is the layout hpcevo binds. Start "
            f"{len(gpus)} rank{'s' if len(gpus) != 1 else ''} per node (srun --ntasks-per-node, "
            "mpiexec -ppn), or set parallel.share_gpus = true to let ranks share GPUs "
            "round-robin, or parallel.device = 'cpu'"
        )
    else:
        mine = gpus[local_rank % len(gpus)]
        how = "shared" if local_size > len(gpus) else "local rank"
    env = {"CUDA_VISIBLE_DEVICES": mine}
    defaults = {}
    if local_size > 1:
        # By default XLA takes 75% of a GPU's memory for the first process on it.
        defaults["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if how == "shared":
        notes = (f"{local_size} ranks share {len(gpus)} GPU(s) on this node",)
    return Binding(local_rank, local_size, source, "gpu", mine, how, None, node[index].affinity,
                   env, defaults, notes, GPU_DETERMINISM_FLAGS)


# XLA on GPU is not deterministic by default: scatters may add with atomics, in whatever order
# the threads arrive, and the autotuner times several kernels for a GEMM or a fusion and keeps
# the fastest, which can change from one compilation to the next (and between ranks). This flag
# makes scatters deterministic and has the autotuner take the first candidate instead of the
# fastest (XLA's debug_options_flags.cc; registered in jaxlib 0.10 and 0.11): two runs of the
# same seed give the same bits. A user who sets it in XLA_FLAGS keeps their value.
GPU_DETERMINISM_FLAGS = ("--xla_gpu_deterministic_ops=true",)


def _cpu_binding(node, index, local_rank, source, request) -> Binding:
    me = node[index]
    local_size = len(node)
    bound = len(me.affinity) < me.cores  # srun --cpu-bind, mpiexec -bind-to, taskset
    if request.threads == "auto":
        threads = len(me.affinity) if bound else max(1, me.cores // local_size)
    else:
        threads = int(request.threads)
    notes = []
    if bound and threads > len(me.affinity):
        notes.append(f"{threads} threads on the {len(me.affinity)} CPU(s) this rank is bound to")
    if not bound and threads * local_size > me.cores:
        notes.append(f"{local_size} ranks x {threads} threads > {me.cores} cores on this node")
    overlap = [i for i, p in enumerate(node) if i != index and set(p.affinity) & set(me.affinity)]
    if bound and overlap:
        notes.append(f"CPU binding overlaps with {len(overlap)} other rank(s) on this node")
    env = {"NPROC": str(threads)}  # XLA's CPU client sizes its thread pool from NPROC
    defaults = {"OMP_NUM_THREADS": str(threads), "JAX_PLATFORMS": "cpu"}
    return Binding(local_rank, local_size, source, "cpu", None, "", threads, me.affinity,
                   env, defaults, tuple(notes), cpu_isa_flags(me))


# XLA compiles CPU code for the instruction set of the machine it runs on, and the vector width
# decides the last bits: with AVX-512 the same Rastrigin block gave other bits inside a fused
# generation than in a program of its own (CMA-ES's ask/evaluate/tell against advance(1)), where
# AVX2 gave equal bits. One instruction set for every x86-64 machine keeps a run's bits the same
# whatever CPU each rank has (clusters mix generations of nodes); AVX2 is the newest that all of
# them have had since 2015. A user who sets xla_cpu_max_isa in XLA_FLAGS keeps that choice.
CPU_ISA = "AVX2"


def cpu_isa_flags(me: Probe) -> tuple[str, ...]:
    if me.machine.lower() not in ("x86_64", "amd64") or "xla_cpu_max_isa" in me.xla_flags:
        return ()
    return (f"--xla_cpu_max_isa={CPU_ISA}",)


def cpu_list(cpus: Sequence[int]) -> str:
    """0,1,2,3,8,9 -> '0-3,8-9' (the notation of taskset and /proc/*/status)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
