"""Run by the multi-node tests under srun: where MPI's bytes go. Every rank reports its host
(MPI_Get_processor_name), its node communicator's size (MPI_COMM_TYPE_SHARED) and its launcher's
local rank; then rank 0 sends SIZE bytes to a rank on its own node and to one on another node,
and reads its network interface's byte counter around each send. Rank 0 prints one JSON line:

    MPI-HOSTS {"ranks": [...], "same_node": {"peer": 1, "eth0_tx": 1234}, "other_node": {...}}

With ``ring``: hpcevo's parallel context is made, then each rank talks only to its ring
neighbours and exits (MPI_Finalize then needs every pair of ranks connected: see
hpcevo.parallel.context.connect_every_pair). Rank 0 prints RING-DONE.

With ``gpu-binding``: the GPU each rank would take, decided by hpcevo's binding rules from what
the rank really sees (Slurm's CUDA_VISIBLE_DEVICES, its node's ranks), as if JAX's CUDA plugin
were installed. Rank 0 prints GPU-BINDING and a JSON list, one entry per rank.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
from mpi4py import MPI

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


def ring() -> None:
    from hpcevo.parallel.context import discover

    comm = discover().comm_ctl
    buf = np.zeros(1000)
    for _ in range(50):
        comm.Sendrecv(buf.copy(), dest=(comm.rank + 1) % comm.size, recvbuf=buf, source=(comm.rank - 1) % comm.size)
    comm.Barrier()
    if comm.rank == 0:
        print("RING-DONE", flush=True)


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

    {"ring": ring, "gpu-binding": gpu_binding}.get(sys.argv[1] if sys.argv[1:] else "", main)()
