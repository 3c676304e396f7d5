"""Run by the multi-node tests under srun: where MPI's bytes go. Every rank reports its host
(MPI_Get_processor_name), its node communicator's size (MPI_COMM_TYPE_SHARED) and its launcher's
local rank; then rank 0 sends SIZE bytes to a rank on its own node and to one on another node,
and reads its network interface's byte counter around each send. Rank 0 prints one JSON line:

    MPI-HOSTS {"ranks": [...], "same_node": {"peer": 1, "eth0_tx": 1234}, "other_node": {...}}

With ``ring``: hpcevo's parallel context is made, then each rank talks only to its ring
neighbours and exits (MPI_Finalize then needs every pair of ranks connected: see
hpcevo.parallel.context.connect_every_pair). Rank 0 prints RING-DONE.

With ``startup``: what hpcevo's start-up costs at this rank count: the time of
``connect_every_pair`` alone, then of ``context_for(COMM_WORLD)`` (node split, probes, and the
pairs again, now connected), the file descriptors MPI holds after MPI_Init and after the context
(counted from before MPI was imported), and the fd limits before and after hpcevo raises the
soft one. Rank 0 prints STARTUP and a JSON object (the maximum over ranks of each figure).

With ``gpu-binding``: the GPU each rank would take, decided by hpcevo's binding rules from what
the rank really sees (Slurm's CUDA_VISIBLE_DEVICES, its node's ranks), as if JAX's CUDA plugin
were installed. Rank 0 prints GPU-BINDING and a JSON list, one entry per rank.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

FDS_BEFORE_MPI = len(os.listdir("/proc/self/fd"))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

SIZE = 64 * 2**20


def tx_bytes() -> int:
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def main() -> None:
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    me = {"rank": comm.rank, "host": MPI.Get_processor_name(), "hostname": socket.gethostname(),
          "node_size": node.size, "local_rank": os.environ.get("SLURM_LOCALID")}
    ranks = comm.allgather(me)
    hosts = [r["host"] for r in ranks]
    same = next((i for i, h in enumerate(hosts) if i and h == hosts[0]), None)
    other = next((i for i, h in enumerate(hosts) if h != hosts[0]), None)
    buf = np.ones(SIZE, dtype=np.uint8)
    report = {"ranks": ranks}
    for name, peer in (("same_node", same), ("other_node", other)):
        if peer is None:
            continue
        comm.Barrier()
        if comm.rank == 0:
            before = tx_bytes()
            comm.Send(buf, dest=peer)
            comm.recv(source=peer)  # the peer has it all
            report[name] = {"peer": peer, "bytes": SIZE, "eth0_tx": tx_bytes() - before}
        elif comm.rank == peer:
            comm.Recv(buf, source=0)
            comm.send("done", dest=0)
    if comm.rank == 0:
        print("MPI-HOSTS " + json.dumps(report), flush=True)
    # Ranks 0-3 and 1-2 never talked: MPI_Finalize then hangs now and then over TCP (the job stayed
    # RUNNING for 5 minutes after this line in a CI run), as hpcevo.parallel.context explains.
    from hpcevo.parallel.context import connect_every_pair

    connect_every_pair(comm)


def ring() -> None:
    from hpcevo.parallel.context import discover

    comm = discover().comm_ctl
    buf = np.zeros(1000)
    for _ in range(50):
        comm.Sendrecv(buf.copy(), dest=(comm.rank + 1) % comm.size, recvbuf=buf, source=(comm.rank - 1) % comm.size)
    comm.Barrier()
    if comm.rank == 0:
        print("RING-DONE", flush=True)


def startup() -> None:
    import resource
    import time

    from hpcevo.parallel.context import connect_every_pair, context_for, raise_fd_limit

    comm = MPI.COMM_WORLD
    before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    raise_fd_limit()
    at_init = len(os.listdir("/proc/self/fd"))
    comm.Barrier()
    t = time.perf_counter()
    probe = comm.Clone()
    connect_every_pair(probe)  # alone first: its own cost (context_for's is then a repeat)
    connect = time.perf_counter() - t
    probe.Free()
    comm.Barrier()
    t = time.perf_counter()
    ctx = context_for(comm)
    seconds = time.perf_counter() - t
    after = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    worst = np.zeros(4)
    comm.Allreduce(np.array([seconds, at_init - FDS_BEFORE_MPI, after - FDS_BEFORE_MPI, connect], dtype=float),
                   worst, op=MPI.MAX)
    if comm.rank == 0:
        print("STARTUP " + json.dumps({"ranks": comm.size, "hosts": len(ctx.hosts), "connect_s": worst[3],
                                       "context_s": worst[0],
                                       "fds_mpi_init": int(worst[1]), "fds_after_context": int(worst[2]),
                                       "fd_soft_before": before, "fd_soft": soft, "fd_hard": hard}),
              flush=True)


def gpu_binding() -> None:
    import dataclasses

    from hpcevo.parallel.binding import Request, decide
    from hpcevo.parallel.context import discover

    ctx = discover()
    node = [dataclasses.replace(p, cuda_runtime=True) for p in ctx.node_probes]
    b = decide(node, ctx.node_index, Request("gpu"), ctx.host)
    rows = ctx.comm_ctl.gather({"rank": ctx.rank, "host": ctx.host, "local_rank": b.local_rank,
                                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu": b.gpu,
                                "source": b.gpu_source, "env": dict(b.env)})
    if ctx.rank == 0:
        print("GPU-BINDING " + json.dumps(rows), flush=True)


if __name__ == "__main__":
    import sys

    {"ring": ring, "gpu-binding": gpu_binding, "startup": startup}.get(sys.argv[1] if sys.argv[1:] else "", main)()
