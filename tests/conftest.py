"""MPI-aware test harness.

Every test here passes at any rank count. Run the suite as
    mpiexec -n N python -m mpi4py -m pytest -m "not launcher"
(`-m mpi4py` turns an error exit on one rank into MPI_Abort of the job: no hang), and the tests
that start their own mpiexec jobs without a launcher: python -m pytest -m launcher.
CTest does both (see CMakeLists.txt). Markers:

* ``single_process``: pure computation that never touches MPI; runs in the one-rank pass only
  (at more ranks every rank would repeat the same work).
* ``slow``: longer runs (whole runs, convergence, oracles); the quick tier
  (``scripts/test.sh -L quick``) leaves them out.
* ``launcher``, ``slurm``, ``nodes``: start their own jobs (see CMakeLists.txt).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest

# Programs kept on disk (hpcevo/driver/programs.py) are keyed by hpcevo's own source: after every
# edit the first run compiles each program by XLA to keep it (the quick tier took 400 s instead
# of 170). The suite runs without them, in its processes and the ones it starts;
# tests/test_programs.py turns them on where it tests them (runs with them bitwise the runs
# without, for every algorithm).
os.environ.setdefault("HPCEVO_PROGRAM_CACHE", "0")

from hpcevo.parallel import bind, discover  # noqa: E402

from profile_plugin import install as install_profile  # noqa: E402

# Bind before any test touches JAX: one XLA thread per rank, as runs do by default.
CTX = bind(discover(), device="cpu", threads=1)
ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run every N-th selected test from the I-th on (0 <= I < N): CTest splits the one-process "
                          "tiers into shards that share the cores beside the other tiers")


def pytest_configure(config):
    config.addinivalue_line("markers", "launcher: starts its own mpiexec jobs; run without a launcher")
    config.addinivalue_line("markers", "slurm: starts a private Slurm cluster; runs only when -m names it")
    config.addinivalue_line("markers", "nodes: starts a Slurm cluster of simulated nodes; runs only when -m names it")
    config.addinivalue_line("markers", "gpu_kit: gathers wheels and installs offline (GPU kit); runs only when -m names it")
    config.addinivalue_line(
        "markers", "single_process: pure computation that never touches MPI; runs in the one-rank pass only"
    )
    config.addinivalue_line("markers", "slow: a longer test, left out of the quick tier")
    config.addinivalue_line(
        "markers", "ranks(*counts): an MPI test whose subject does not depend on the rank count runs only at these "
        "counts (HPCEVO_TEST_EVERY_RANK_COUNT=1 runs it at any)"
    )
    _PROFILE[:] = [install_profile(config, CTX.size, CTX.rank)]
    config.pluginmanager.register(_Shard(), "hpcevo-shard")
    if CTX.size > 1:
        # Ranks must not share pytest's numbered temp directories.
        config.option.basetemp = Path(tempfile.gettempdir()) / f"hpcevo-pytest-{os.getpid()}"
        if CTX.rank > 0:
            config.option.verbose = -1


_PROFILE: list = [None]
_OUTCOMES: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    profile = _PROFILE[0]
    if profile is not None:
        profile.start(item.nodeid)
    yield
    if profile is not None:
        profile.finish(item.nodeid, _OUTCOMES.pop(item.nodeid, "passed"))


def pytest_runtest_logreport(report):
    if report.outcome != "passed" and _OUTCOMES.get(report.nodeid) != "failed":
        _OUTCOMES[report.nodeid] = report.outcome


def pytest_collection_modifyitems(config, items):
    for marker in ("slurm", "nodes", "gpu_kit"):
        if marker not in (config.option.markexpr or ""):
            # Starting a Slurm cluster is for the CTest test that asks for it (-m slurm, -m nodes).
            _deselect(config, items, marker)
    if os.environ.get("HPCEVO_TEST_EVERY_RANK_COUNT", "") in ("", "0"):
        # The rank matrix where it pays: tests of splits and collectives run at every count the
        # suite runs (1-4); a test marked ranks(1, 2) checks logic that is the same at any count
        # (every rank agreeing included) and would only repeat it, slower, at 3 and 4 ranks on
        # the suite's oversubscribed cores.
        dropped = [i for i in items if i.get_closest_marker("ranks") is not None
                   and CTX.size not in i.get_closest_marker("ranks").args]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if i not in dropped]
    if CTX.size > 1:
        # Launching mpiexec from inside an MPI rank is not portable; these run in the
        # launcher-free pass (CTest's pytest_launcher).
        _deselect(config, items, "launcher")
        # single_process tests would only repeat the same work on every rank.
        _deselect(config, items, "single_process")


class _Shard:
    """--shard I/N: every N-th test from the I-th on, of those every other selection (-m, the
    rank matrix) kept: hence a hook that runs last."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        shard = config.getoption("shard")
        if not shard:
            return
        # Round robin, not by file: a file's slow tests (CLI subprocesses, mostly) spread over the
        # shards. Collection order is the same in every shard, so the shards partition the tests.
        i, n = (int(x) for x in shard.split("/"))
        if not 0 <= i < n:
            raise pytest.UsageError(f"--shard {shard}: needs 0 <= I < N")
        dropped = items[:i] + [t for k, t in enumerate(items[i:]) if k % n]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = items[i::n]


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


# -- one-rank references, shared by the passes of one suite run ---------------------------------
def _tree_digest() -> str:
    """What a one-rank result can depend on: hpcevo's and the tests' sources, the examples, and
    the versions of the stack they run on."""
    import jax
    import mpi4jax

    h = hashlib.sha256(f"{jax.__version__} {mpi4jax.__version__}".encode())
    for folder in ("hpcevo", "tests", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".toml", ".sh", ".json"):
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:32]


class References:
    """One-rank results for tests that compare an N-rank run with the same run on one rank.

    ``get(request, key, compute)`` returns ``compute()`` run by rank 0 alone (on
    ``MPI.COMM_SELF``), broadcast to every rank. In a suite run under CTest
    (``HPCEVO_TEST_REFERENCES`` names a directory) the result is also kept there under the
    digest of the sources it came from, so the 2-, 3- and 4-rank passes compare with the result
    the 1-rank pass computed instead of computing it again; a change to any source file starts
    a new store. ``compute`` must return JSON data; what ``get`` returns has been through JSON
    (tuples come back as lists), whether it was stored or not.
    """

    def __init__(self, ctx, directory: str | None):
        self.ctx = ctx
        self.path = Path(directory) / f"{_tree_digest()}.json" if directory and ctx.rank == 0 else None

    def _load(self) -> dict[str, Any]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            return json.loads(self.path.read_text())
        except ValueError:
            return {}  # a store torn by a killed pass: start again

    def get(self, request, key: str, compute: Callable[[], Any]) -> Any:
        name = f"{request.node.nodeid}::{key}"
        value, error = None, None
        if self.ctx.rank == 0:
            stored = self._load()
            try:
                value = stored[name] if name in stored else json.loads(json.dumps(compute()))
            except Exception as e:  # noqa: BLE001 - every rank must hear of it
                error = e
            if error is None and name not in stored and self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({**self._load(), name: value}))
                os.replace(tmp, self.path)
        _idle_until_all_arrive(self.ctx.comm_ctl)
        value, failed = self.ctx.comm_ctl.bcast((value, error is not None), root=0)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"rank 0 failed to compute the one-rank reference {name}")
        return value


def _idle_until_all_arrive(comm) -> None:
    # MPICH's blocking collectives spin; sleeping on a non-blocking barrier leaves the cores to
    # the rank that is working (2 cores, up to 4 ranks in CTest).
    from hpcevo.parallel.control import wait

    wait(comm.Ibarrier())


@pytest.fixture(scope="session")
def references(ctx):
    return References(ctx, os.environ.get("HPCEVO_TEST_REFERENCES"))


@pytest.fixture
def alone(ctx):
    """A one-rank context (COMM_SELF), made once per process: runs on it compile the same
    programs again only when their inputs differ."""
    return _alone()


def _alone():
    from hpcevo.parallel import alone

    return alone()


