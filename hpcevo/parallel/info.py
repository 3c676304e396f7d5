"""``hpcevo info``: what this job sees, gathered from every rank."""

from __future__ import annotations

import os
from typing import Any

from ..provenance import parallel_hdf5, versions
from .binding import cpu_list
from .context import ParallelContext, mpi_library
from .control import gather_to_root


def describe(ctx: ParallelContext) -> dict[str, Any] | None:
    """Collective. Returns the description on rank 0, None elsewhere."""
    import jax

    b = ctx.binding
    affinity = sorted(os.sched_getaffinity(0))
    mine = {
        "rank": ctx.rank,
        "host": ctx.host,
        "local_rank": ctx.local_rank,
        "local_size": ctx.local_size,
        "local_rank_source": ctx.local_rank_source,
        "device": ctx.device,
        "gpu_source": b.gpu_source if b else "",
        "threads": b.threads if b else None,
        "jax_devices": [str(d) for d in jax.devices()],
        "cpu_affinity": cpu_list(affinity),
        "cpus": len(affinity),
        "cores": os.cpu_count(),
        "notes": list(b.notes) if b else [],
    }
    ranks = gather_to_root(ctx, mine)
    if not ctx.is_root:
        return None
    return {
        "mpi_library": mpi_library()[0],
        "mpi_standard": mpi_library()[1],
        "size": ctx.size,
        "hosts": ctx.hosts,
        "jax_backend": jax.default_backend(),
        "h5py_mpi": parallel_hdf5(),
        "versions": versions(),
        "ranks": ranks,
        "job_notes": [n for n in [oversubscription(ctx)] if n],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def oversubscription(ctx: ParallelContext) -> str | None:
    """A note when this node's CPU ranks (times their threads) outnumber its cores: they then
    take turns on the cores, and the run is slower than with fewer ranks (not different)."""
    cores = os.cpu_count() or 1
    threads = ctx.binding.threads if ctx.binding and ctx.binding.threads else 1
    if ctx.device_kind == "gpu" or ctx.local_size * threads <= cores:
        return None
    fit = max(1, cores // threads)
    return (f"{ctx.local_size} ranks x {threads} thread(s) on {cores} core(s) of {ctx.host}: the ranks take turns "
            f"on the cores, so this is slower than {fit} rank(s) would be (the result is the same at any "
            f"rank count). For speed on this machine: mpiexec -n {fit}")


def render(info: dict[str, Any] | None) -> str:
    if info is None:
        return ""
    lines = [
        f"MPI library   {info['mpi_library'].splitlines()[0]}",
        f"MPI standard  {info['mpi_standard']}",
        f"ranks         {info['size']} on {len(info['hosts'])} host(s): {', '.join(info['hosts'])}",
        f"JAX backend   {info['jax_backend']}",
        f"XLA flags     {info.get('xla_flags') or '(none)'}",
        f"h5py MPI      {'yes' if info['h5py_mpi'] else 'no (checkpoints of several ranks: written by rank 0 alone)'}",
        "versions      " + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if k != "mpi"),
        "",
        f"{'rank':>4}  {'host':<16} {'local':>5}  {'local rank from':<26} {'device':<16} "
        f"{'threads':>7}  {'cpus (affinity)':<18} jax devices",
    ]
    for r in info["ranks"]:
        device = r["device"].split(",")[0] + (f" ({r['gpu_source']})" if r["gpu_source"] else "")
        threads = "-" if r["threads"] is None else str(r["threads"])
        cpus = f"{r['cpus']}/{r['cores']}: {r['cpu_affinity']}"
        lines.append(
            f"{r['rank']:>4}  {r['host']:<16} {r['local_rank']:>2}/{r['local_size']:<2}  "
            f"{r['local_rank_source']:<26} {device:<16} {threads:>7}  {cpus:<18} {', '.join(r['jax_devices'])}"
        )
    notes = info.get("job_notes", []) + [f"rank {r['rank']}: {n}" for r in info["ranks"] for n in r["notes"]]
    if notes:
        lines += ["", "notes:"] + [f"  {n}" for n in notes]
    return "\n".join(lines)
