"""What a run needs against what the machine has: refuse at start-up what cannot fit, with the
size it would need, instead of a MemoryError (or the kernel's OOM killer) in the middle of one."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

# Copies of a (pop_size, dim) array every algorithm holds at once at the least: the population
# and the candidates of a generation. Algorithms with velocities or archives hold more; this is
# a floor, so that no run that fits is refused.
_MIN_COPIES = 2
# Environment variables launchers set to the number of ranks on this node.
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def available_bytes() -> int | None:
    """Memory this process may still take: MemAvailable, capped by the cgroup's limit."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        usage = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            found.append(int(limit) - usage)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def ranks_on_node() -> int:
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").split("(")[0]  # Slurm writes "4(x2)" for uneven layouts
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**29 else f"{n / 2**20:.3g} MiB"


def check_memory(where: str, pop_size: int, dim: int, dtype: str, available: int | None = None,
                 ranks: int | None = None) -> None:
    """Raise ConfigError when the population of this run cannot fit in this node's memory, shared
    by the ranks on it (each rank holds the whole algorithm state: it is replicated)."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    ranks = ranks_on_node() if ranks is None else ranks
    itemsize = 8 if dtype == "float64" else 4
    need = _MIN_COPIES * pop_size * dim * itemsize
    share = available // max(ranks, 1)
    if need > share:
        per = f"; {ranks} ranks on this node share {gib(available)}" if ranks > 1 else ""
        raise ConfigError(
            f"{where}: algorithm.pop_size = {pop_size} x problem.dim = {dim} needs at least {gib(need)} per rank "
            f"({_MIN_COPIES} arrays of {pop_size} x {dim} {dtype}), more than the {gib(share)} available{per}: "
            "lower pop_size or dim, or use run.dtype = \"float32\" or fewer ranks per node", "algorithm.pop_size")
