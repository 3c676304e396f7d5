"""``hpcevo info``: what this job sees, gathered from every rank."""

from __future__ import annotations

import os
from typing import Any

from .parallel import ParallelContext, gather_to_root, mpi_library


def describe(ctx: ParallelContext) -> dict[str, Any] | None:
    """Collective. Returns the description on rank 0, None elsewhere."""
    import h5py
    import jax

    from .runner import versions

    mine = {
        "rank": ctx.rank,
        "host": ctx.host,
        "local_rank": ctx.local_rank,
        "local_size": ctx.local_size,
        "local_rank_source": ctx.local_rank_source,
        "device": ctx.device,
        "jax_devices": [str(d) for d in jax.devices()],
        "cpu_affinity": len(os.sched_getaffinity(0)),
    }
    ranks = gather_to_root(ctx, mine)
    if not ctx.is_root:
        return None
    return {
        "mpi_library": mpi_library()[0],
        "mpi_standard": mpi_library()[1],
        "size": ctx.size,
        "hosts": sorted({r["host"] for r in ranks}),
        "jax_backend": jax.default_backend(),
        "h5py_mpi": bool(h5py.get_config().mpi),
        "versions": versions(),
        "ranks": ranks,
    }


def render(info: dict[str, Any] | None) -> str:
    if info is None:
        return ""
    lines = [
        f"MPI library   {info['mpi_library'].splitlines()[0]}",
        f"MPI standard  {info['mpi_standard']}",
        f"ranks         {info['size']} on {len(info['hosts'])} host(s): {', '.join(info['hosts'])}",
        f"JAX backend   {info['jax_backend']}",
        f"h5py MPI      {'yes' if info['h5py_mpi'] else 'NO (parallel checkpoints unavailable)'}",
        "versions      " + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if k != "mpi"),
        "",
        f"{'rank':>4}  {'host':<20} {'local':>5}  {'local rank from':<28} {'cpus':>4}  device / jax devices",
    ]
    for r in info["ranks"]:
        lines.append(
            f"{r['rank']:>4}  {r['host']:<20} {r['local_rank']:>2}/{r['local_size']:<2}  "
            f"{r['local_rank_source']:<28} {r['cpu_affinity']:>4}  {r['device']} / {', '.join(r['jax_devices'])}"
        )
    return "\n".join(lines)
