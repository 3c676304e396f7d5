"""MPI-aware test harness.

Every test here passes at any rank count. Run the suite as
    mpiexec -n N python -m mpi4py -m pytest -m "not launcher"
(`-m mpi4py` turns an error exit on one rank into MPI_Abort of the job: no hang), and the tests
that start their own mpiexec jobs without a launcher: python -m pytest -m launcher.
CTest does both (see CMakeLists.txt). Tests marked `single_process` (pure JAX, no MPI) run in
the one-rank pass only: at more ranks every rank would repeat the same work.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import pytest

from hpcevo.parallel import bind, discover

# Bind before any test touches JAX: one XLA thread per rank, as runs do by default.
CTX = bind(discover(), device="cpu", threads=1)


def pytest_configure(config):
    config.addinivalue_line("markers", "launcher: starts its own mpiexec jobs; run without a launcher")
    config.addinivalue_line("markers", "slurm: starts a private Slurm cluster; runs only when -m names it")
    config.addinivalue_line(
        "markers", "single_process: pure computation that never touches MPI; runs in the one-rank pass only"
    )
    if CTX.size > 1:
        # Ranks must not share pytest's numbered temp directories.
        config.option.basetemp = Path(tempfile.gettempdir()) / f"hpcevo-pytest-{os.getpid()}"
        if CTX.rank > 0:
            config.option.verbose = -1


def pytest_collection_modifyitems(config, items):
    if "slurm" not in (config.option.markexpr or ""):
        # Starting a Slurm cluster is for the one CTest test that asks for it (-m slurm).
        _deselect(config, items, "slurm")
    if CTX.size > 1:
        # Launching mpiexec from inside an MPI rank is not portable; these run in the
        # launcher-free pass (CTest's pytest_launcher).
        _deselect(config, items, "launcher")
        # single_process tests would only repeat the same work on every rank.
        _deselect(config, items, "single_process")


def _deselect(config, items, marker: str) -> None:
    dropped = [i for i in items if marker in i.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if marker not in i.keywords]


@pytest.fixture(scope="session")
def ctx():
    return CTX


@pytest.fixture
def shared_tmp(ctx):
    """One temporary directory that every rank sees (rank 0 creates it)."""
    path = tempfile.mkdtemp(prefix="hpcevo-test-") if ctx.rank == 0 else None
    path = ctx.comm_ctl.bcast(path, root=0)
    yield Path(path)
    ctx.comm_ctl.Barrier()
    if ctx.rank == 0:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def my_turn(ctx, request):
    """For pure, compile-heavy computations that involve no MPI: True on exactly one rank of the
    job (chosen from the test's id, so such tests spread over the ranks). Every pass still runs
    the check once, and a pass at N ranks costs what one rank costs instead of N times that."""
    return ctx.rank == zlib.crc32(request.node.nodeid.encode()) % ctx.size
