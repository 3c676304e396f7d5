"""hpcevo as one task of a larger MPI job: `hpcevo.parallel.init(comm=...)`.

A job of N ranks in which rank 0 does other work all along (a stand-in for dask-mpi's
scheduler, or a workflow engine's own rank) and hpcevo runs on the other N - 1 through the
communicator it was given: a run and a Loop (neither given a context: the process's is the
given one) must give the digests of the same work at one rank, and must never make a
collective call on COMM_WORLD (rank 0 would never join it: the job would hang, and rank 0's
guard ends it). GPUs would be bound by the ranks' order within the given communicator.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcevo.parallel.binding import COMM_SOURCE
from test_launcher import MPIEXEC, clean_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "cso.toml")
SETS = ["run.generations=12", "algorithm.pop_size=24", "problem.dim=6", "log.every=4", "checkpoint.every=6"]

JOB = r'''
import json, sys, time
from mpi4py import MPI

world = MPI.COMM_WORLD
serving = world.rank == 0  # other work on this rank all along (dask-mpi's scheduler, say)
sub = world.Split(MPI.UNDEFINED if serving else 1, world.rank)
if serving:
    # The job's end is a non-blocking barrier on COMM_WORLD; a collective call of hpcevo's on
    # COMM_WORLD would never be matched here, and this rank ends the stuck job.
    end, t0 = world.Ibarrier(), time.monotonic()
    while not end.Test():
        if time.monotonic() - t0 > 120:
            print("rank 0: the hpcevo ranks never reached the end", file=sys.stderr, flush=True)
            world.Abort(3)
        time.sleep(0.01)
else:
    import hpcevo
    from hpcevo.errors import UsageError

    out, sets = sys.argv[1], sys.argv[2:]
    ctx = hpcevo.parallel.init(comm=sub)
    assert (ctx.rank, ctx.size) == (sub.rank, sub.size), (ctx.rank, ctx.size)
    assert hpcevo.parallel.init() is ctx and hpcevo.parallel.init(comm=sub) is ctx
    try:
        hpcevo.parallel.init(comm=world)
        refused = False
    except UsageError:
        refused = True
    cfg = hpcevo.load_config("EXAMPLE", [*sets, f"run.out={out}"])
    result = hpcevo.run(cfg, quiet=True)  # no ctx: the process's, the given communicator's
    from hpcevo.algorithms import CSO
    loop = hpcevo.Loop(CSO(pop_size=24, dim=6, lb=(-5.0,) * 6, ub=(5.0,) * 6),
                       lambda x: (x * x).sum(-1)).init(3)
    loop.advance(7)
    if ctx.rank == 0:
        print(json.dumps({"run": result.digest, "loop": loop.digest(), "refused": refused,
                          "local_ranks": sub.allgather(ctx.local_rank),
                          "sources": sub.allgather(ctx.local_rank_source)}), flush=True)
    else:
        sub.allgather(ctx.local_rank), sub.allgather(ctx.local_rank_source)
    world.Ibarrier().Wait()
'''.replace("EXAMPLE", EXAMPLE)


def _alone(tmp_path: Path) -> tuple[str, str]:
    """The run and the Loop at one rank, in a process of their own."""
    code = (
        "import sys, hpcevo\n"
        "from hpcevo.algorithms import CSO\n"
        f"cfg = hpcevo.load_config({EXAMPLE!r}, [*sys.argv[2:], 'run.out=' + sys.argv[1]])\n"
        "r = hpcevo.run(cfg, quiet=True)\n"
        "loop = hpcevo.Loop(CSO(pop_size=24, dim=6, lb=(-5.0,) * 6, ub=(5.0,) * 6),"
        " lambda x: (x * x).sum(-1)).init(3)\n"
        "loop.advance(7)\n"
        "print(r.digest, loop.digest())\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "alone"), *SETS], capture_output=True,
                       text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    run, loop = r.stdout.split()
    return run, loop


@pytest.mark.launcher
def test_hpcevo_on_a_given_communicator_leaves_the_other_ranks_of_the_job_alone(tmp_path):
    run_alone, loop_alone = _alone(tmp_path)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    for n in (3, 4):  # hpcevo on 2 and on 3 of the job's ranks
        r = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(script), str(tmp_path / f"run{n}"), *SETS],
                           capture_output=True, text=True, env=clean_env(), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert (got["run"], got["loop"]) == (run_alone, loop_alone), n
        assert got["refused"]  # once given, the process's communicator stays the given one
        # one node: the given communicator's own ranks 0..n-2 (the launcher's numbering, 1..n-1
        # for these ranks, is not theirs)
        assert got["local_ranks"] == list(range(n - 1)) and set(got["sources"]) == {COMM_SOURCE}, got
        summary = json.loads((tmp_path / f"run{n}" / "summary.json").read_text())
        assert summary["ranks"] == n - 1
