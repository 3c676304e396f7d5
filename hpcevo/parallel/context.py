"""Who am I in the job, and which device is mine.

``parallel.init()`` (``job.py``) is the way in for a program: this process's
``ParallelContext`` (rank, size, local rank, device, hosts), bound to its device. Under it,
``discover()`` initialises MPI and finds rank, size, and what every rank on this node sees
(``binding.probe``); ``bind()`` must run before
JAX creates its backend (the first array or device query): it applies ``binding.decide``: hides
all GPUs but this rank's own from JAX, or, on CPU nodes, caps XLA's thread pool so N ranks on C
cores do not each spawn C threads and fight.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from .binding import Binding, Probe, Request, decide, probe, resolve_local_rank

ABORT_GRACE_SECONDS = 1.0
# os._exit as Python defines it: while user code runs, os._exit is replaced by a guard that ends
# the whole job (control.user_code); hpcevo's own exits must not go through it.
real_exit = os._exit


@dataclasses.dataclass
class ParallelContext:
    """This rank's place in the job. The same on every rank but for the rank's own fields."""

    rank: int  # 0 .. size - 1
    size: int  # ranks in the job (in the communicator this context was made for)
    local_rank: int  # this rank's number on its node (see binding.resolve_local_rank)
    local_size: int  # ranks on this node
    host: str  # this rank's host name
    local_rank_source: str  # where local_rank came from (a launcher variable, or the communicator)
    comm_jax: Any  # for mpi4jax ops inside jitted code only
    comm_ctl: Any  # for Python-side control (agreement, digests, metadata)
    node_probes: tuple[Probe, ...] = ()  # what each rank on this node saw, in node order
    node_index: int = 0  # this rank's place among them
    device_kind: str = "unbound"  # "cpu" | "gpu" after bind()
    device: str = ""  # human-readable: "cpu, 2 threads", "cuda:1"
    binding: Binding | None = None
    rank_hosts: tuple[str, ...] = ()  # the host of every rank, in rank order
    # Set where ranks were found in different collective calls: its communicators' call sequence
    # is broken, so the end of the program does not agree on it (``_end_together``).
    broken: bool = False
    # This context's ranks on this rank's node (the ranks that share its CPUs and disk), for
    # turns between them (compiling.py); None where it is not kept (a context made by hand).
    node_comm: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def hosts(self) -> list[str]:
        """The job's host names, each once, sorted."""
        return sorted(set(self.rank_hosts))

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed): one line per job, not one per rank."""
        if self.is_root:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def split(self, color: int | None, key: int | None = None) -> "ParallelContext | None":
        """The context of this rank's part of the job: the ranks that pass the same ``color``
        (ordered by ``key``, default their rank here), as ``MPI_Comm_split`` makes them; None for
        ``color=None`` (this rank takes part in no part). Collective: every rank calls it. What
        ``run``, ``Loop`` and ``Archipelago`` take, like the job's own context: a run on it is the
        run alone on that many ranks. (``hpcevo.parallel.split`` makes groups of equal size, with
        their leaders' point-to-point exchange.)"""
        from mpi4py import MPI

        from ..errors import UsageError

        def fit(v: Any) -> bool:
            return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)

        bad = self.comm_ctl.allreduce(0 if fit(color) and fit(key) else self.rank + 1, op=MPI.MAX)
        if bad:  # (every rank hears of it: one rank's bad color must not leave the others in Split)
            raise UsageError(f"ParallelContext.split: 'color' and 'key' must be whole numbers >= 0 (color may be "
                             f"None), rank {bad - 1} passed something else")
        sub = self.comm_ctl.Split(MPI.UNDEFINED if color is None else color, self.rank if key is None else key)
        if sub == MPI.COMM_NULL:
            return None
        try:
            return context_for(sub)
        finally:
            sub.Free()

    def abort(self, code: int) -> None:
        """End the whole job now. With one rank a plain exit is cleaner than MPI_Abort's banner."""
        if self.size == 1:
            real_exit(code)
        from mpi4py import MPI

        # MPICH's launcher kills every process the moment Abort reaches it, and what this rank
        # has just written to stderr (the reason) may still sit in the pipe to it, unforwarded:
        # one run in ten lost its traceback. A second's grace lets the launcher drain it.
        time.sleep(ABORT_GRACE_SECONDS)

        # The whole job, also where hpcevo was given part of it (parallel.init(comm=...)): the
        # job's other ranks would otherwise wait for these ones forever.
        MPI.COMM_WORLD.Abort(code)


_CONTEXT: ParallelContext | None = None
_GIVEN: Any = None  # the communicator the process's context was made over (None: COMM_WORLD)


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit; (soft, hard) after.

    Across hosts, MPICH over UCX/TCP holds a socket for every remote peer a rank has talked to,
    and ``connect_every_pair`` talks to all of them: n - 1 descriptors per rank, beside the
    ones Python, JAX and HDF5 hold. The usual soft limit, 1024, runs out near 1,000 ranks; the
    hard limit (often 4096 to 1,048,576) is each process's to take."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a container that forbids it: the limit stays what it was
    return soft, hard


def discover(comm: Any = None) -> ParallelContext:
    """Initialise MPI (a singleton job without a launcher) and describe this rank: the process's
    context, over ``comm`` (an mpi4py communicator) or, by default, COMM_WORLD. Idempotent: the
    first call fixes the process's communicator (collective on it); later calls return that
    context, and one that names another communicator is a UsageError (``context_for`` or
    ``ParallelContext.split`` make contexts over others)."""
    global _CONTEXT, _GIVEN
    if _CONTEXT is None:
        raise_fd_limit()
        from mpi4py import MPI

        _CONTEXT = context_for(MPI.COMM_WORLD if comm is None else comm)
        _GIVEN = comm
        if _CONTEXT.size > 1:
            _abort_on_uncaught(_CONTEXT)
            for hook in ON_DISCOVER:
                hook(_CONTEXT)
    elif comm is not None and comm != (_world() if _GIVEN is None else _GIVEN):
        from ..errors import UsageError

        raise UsageError(f"parallel.init(comm=...): this process's context is already over "
                         f"{'another communicator' if _GIVEN is not None else 'COMM_WORLD'} (the first init "
                         "or run fixes it); call init(comm=...) before anything else of hpcevo's")
    return _CONTEXT


def _world() -> Any:
    from mpi4py import MPI

    return MPI.COMM_WORLD


# What a multi-rank job does once discovered (control.py adds the agreement at exit: it needs
# the agreement, which lives there).
ON_DISCOVER: list = []


def _abort_on_uncaught(ctx: ParallelContext) -> None:
    """An exception that nothing catches ends the whole job, as ``python -m mpi4py`` arranges:
    a script (``mpiexec -n 4 python study.py``) that fails on one rank, say before a collective
    call, would otherwise end that rank alone and leave the others waiting for it forever."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        previous(kind, value, tb)
        if not issubclass(kind, KeyboardInterrupt):
            sys.stderr.write(f"[rank {ctx.rank}] an uncaught {kind.__name__} ends the job (MPI_Abort)\n")
        sys.stderr.flush()
        ctx.abort(1)

    sys.excepthook = hook


def context_for(comm: Any) -> ParallelContext:
    """A context over any communicator (collective on it); e.g. COMM_SELF for a one-rank run
    inside a larger job. Clones the communicator twice: mpi4jax and mpi4py traffic never mix."""
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    probes = tuple(shared.allgather(probe()))
    index = shared.rank
    local_rank, source = resolve_local_rank(probes, index)
    host = MPI.Get_processor_name()
    ctx = ParallelContext(
        rank=comm.rank,
        size=comm.size,
        local_rank=local_rank,
        local_size=len(probes),
        host=host,
        local_rank_source=source,
        comm_jax=_jax_comm(comm),
        comm_ctl=comm.Clone(),
        node_probes=probes,
        node_index=index,
        rank_hosts=tuple(comm.allgather(host)),
        node_comm=shared,
    )
    if _CONTEXT is not None:  # binding is per process: a later context inherits it
        ctx.device_kind, ctx.device, ctx.binding = _CONTEXT.device_kind, _CONTEXT.device, _CONTEXT.binding
    if len(ctx.hosts) > 1:
        connect_every_pair(ctx.comm_ctl)
    return ctx


def _jax_comm(comm: Any) -> Any:
    """The communicator of the collectives inside compiled programs: COMM_WORLD or COMM_SELF
    themselves, any other a clone of its own. mpi4jax writes the communicator's handle into the
    program, and a predefined communicator's handle is one number in every process (MPICH and
    its kin: 0x44000000 for COMM_WORLD), while a clone's is whatever each process allocated next
    (rank 0 allocates more than the others: its node-roots communicators). Over a clone every rank
    compiled a program of its own; over COMM_WORLD the ranks of a node compile one program, which
    one of them compiles and the others load from the compilation cache (compiling.py). hpcevo's
    own control traffic keeps its clone (``comm_ctl``); a script's own collectives over
    COMM_WORLD, if any, are matched with the programs' in call order, as MPI matches any
    collectives of one communicator (every rank makes the same calls in the same order)."""
    from mpi4py import MPI

    if comm == MPI.COMM_WORLD or comm == MPI.COMM_SELF:
        return comm
    return comm.Clone()


_ALONE: list[ParallelContext] = []


def alone() -> ParallelContext:
    """This process by itself (COMM_SELF), inside whatever job it belongs to: for work of one
    process's own, such as a generator that an outside engine drives (``hpcevo.gest``). Made
    once per process; not collective. Bound as the process's context is, if it is."""
    if not _ALONE:
        raise_fd_limit()
        from mpi4py import MPI

        _ALONE.append(context_for(MPI.COMM_SELF))
    return _ALONE[0]


def connect_every_pair(comm: Any) -> None:
    """Collective: every rank sends one byte to every other rank, so that each pair of ranks
    has a connection before the run starts.

    MPICH's ch4:ucx device (Debian's and Ubuntu's MPICH 4) closes every endpoint with a flush in
    MPI_Finalize and only then enters the launcher's barrier. Over TCP, UCX connects a pair of
    ranks on their first message; closing a pair that never exchanged one needs the peer to
    complete the handshake, and a peer already waiting in the launcher's barrier never does, so
    the job hangs after its last line of output. On a Slurm cluster of simulated nodes, 2 nodes x
    2 ranks that only talked to their ring neighbours hung in 8 jobs of 12 without this and in
    none of 12 with it (tests/test_nodes.py).
    Within one host the ranks meet through shared memory, without connections: skipped there.
    """
    import numpy as np
    from mpi4py import MPI

    others = [r for r in range(comm.size) if r != comm.rank]
    inbox = np.zeros(comm.size, dtype=np.uint8)
    one = np.ones(1, dtype=np.uint8)
    requests = [comm.Irecv(inbox[r:r + 1], source=r, tag=0) for r in others]
    requests += [comm.Isend(one, dest=r, tag=0) for r in others]
    MPI.Request.Waitall(requests)


def bind(ctx: ParallelContext, device: str = "auto", threads: int | str = 1,
         share_gpus: bool = False) -> ParallelContext:
    """Choose and pin this rank's device (see ``binding``). Must run before JAX initialises a
    backend: JAX reads CUDA_VISIBLE_DEVICES and NPROC once, when it creates it.

    Raises UsageError (identically on every rank of a node) for an impossible request.
    """
    b = decide(ctx.node_probes, ctx.node_index, Request(device, threads, share_gpus), ctx.host)  # type: ignore[arg-type]
    if b.kind == "gpu" and _jax_backend_started():
        raise RuntimeError("bind() after JAX created its backend: the GPU choice would be ignored")
    os.environ.update(b.env)
    for k, v in b.env_defaults.items():
        os.environ.setdefault(k, v)
    present = os.environ.get("XLA_FLAGS", "")
    extra = [f for f in b.xla_flags if f.split("=")[0] not in present]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([present, *extra]).strip()
    ctx.binding, ctx.device_kind, ctx.device = b, b.kind, b.device
    ctx.local_rank, ctx.local_rank_source = b.local_rank, b.local_rank_source
    return ctx


def _jax_backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def mpi_library() -> tuple[str, str]:
    """(first line of the MPI library's version string, MPI standard version)."""
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip(), "{}.{}".format(*MPI.Get_version())
