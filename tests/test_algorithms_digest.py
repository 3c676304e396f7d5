"""Every algorithm, run from a TOML config on this job's ranks, equals the same run on one rank.

Under CTest's np3 pass this is the "same digest at 1 and 3 ranks" check for the whole library.
Sizes are tiny (the cost is compilation) and most populations are odd, so the micro-batches split
unevenly over the ranks.
"""

from __future__ import annotations

import time

import jax
import pytest
from mpi4py import MPI

from hpcevo.algorithms import ALGORITHMS
from hpcevo.config import config_from_dict
from hpcevo.parallel import context_for
from hpcevo.runner import execute

# (algorithm name, pop_size, extra hyper-parameters, problem, dim)
CASES = [
    ("cso", 7, {}, "rastrigin", 4),
    ("pso", 5, {}, "ackley", 3),
    ("pso", 6, {"coefficients": "per_particle"}, "sphere", 3),
    ("slpso", 9, {}, "sphere", 4),
    ("de", 9, {}, "rastrigin", 3),
    ("de", 6, {"strategy": "current-to-best/1/bin", "CR": 0.5}, "sphere", 4),
    ("jade", 11, {}, "ackley", 4),
    ("cmaes", 7, {}, "rosenbrock", 4),
    ("cmaes", 13, {"restart": "ipop", "lambda0": 3}, "sphere", 2),
    ("sep_cmaes", 5, {"clip": True}, "ellipsoid", 5),
    ("openes", 6, {"sigma_decay": 0.99}, "sphere", 4),
    ("snes", 7, {}, "griewank", 4),
    ("xnes", 5, {}, "sphere", 3),
    ("pgpe", 6, {"optimizer": "clipup"}, "ackley", 4),
    ("pgpe", 8, {}, "sphere", 3),
    ("ga", 9, {}, "schwefel", 4),
]
IDS = [f"{c[0]}-pop{c[1]}" + ("-" + "-".join(f"{k}={v}" for k, v in c[2].items()) if c[2] else "") for c in CASES]


def test_every_registered_algorithm_is_covered():
    assert {c[0] for c in CASES} == set(ALGORITHMS)


def _config(name, pop, extra, problem, dim, out, generations=12, dtype="float32"):
    return config_from_dict({
        "run": {"name": "digest", "seed": 11, "generations": generations, "out": str(out), "dtype": dtype},
        "algorithm": {"name": name, "pop_size": pop, **extra},
        "problem": {"name": problem, "dim": dim},
        "log": {"every": 5},
    })


def _idle_until_all_arrive(comm):
    # MPICH's blocking collectives spin; sleeping on a non-blocking barrier leaves the cores to
    # the rank that is working (2 cores, up to 4 ranks in CTest).
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.01)


def _digest_here_and_alone(ctx, shared_tmp, case, **kw):
    """The summary on this job's ranks, and rank 0's summary of the same run on one rank.

    At one rank the job's run is the one-rank run. Otherwise rank 0 alone repeats the run on
    MPI.COMM_SELF (every rank doing so would only repeat the same work) and shares the result.
    """
    name, pop, extra, problem, dim = case
    here = execute(ctx, _config(name, pop, extra, problem, dim, shared_tmp / "here", **kw), quiet=True)
    if ctx.size == 1:
        return here, here
    alone = None
    if ctx.rank == 0:
        cfg = _config(name, pop, extra, problem, dim, shared_tmp / "alone", **kw)
        alone = execute(context_for(MPI.COMM_SELF), cfg, quiet=True)
    _idle_until_all_arrive(ctx.comm_ctl)
    return here, ctx.comm_ctl.bcast(alone, root=0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_same_digest_on_all_ranks_as_on_one(ctx, shared_tmp, case):
    here, alone = _digest_here_and_alone(ctx, shared_tmp, case)
    assert here["ranks"] == ctx.size and alone["ranks"] == 1
    assert here["state_digest"] == alone["state_digest"]
    assert here["best_fitness"] == alone["best_fitness"]
    assert here["best_solution"] == alone["best_solution"]
    assert ctx.comm_ctl.allgather(here["state_digest"]) == [here["state_digest"]] * ctx.size


def test_cmaes_float64_same_digest_on_all_ranks_as_on_one(ctx, shared_tmp):
    try:
        here, alone = _digest_here_and_alone(ctx, shared_tmp, ("cmaes", 9, {}, "ellipsoid", 6), dtype="float64")
    finally:
        jax.config.update("jax_enable_x64", False)  # execute() switched it on for float64
    assert here["state_digest"] == alone["state_digest"]
