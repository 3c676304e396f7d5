"""Every algorithm, run from a TOML config on this job's ranks, equals the same run on one rank.

Under CTest's np3 pass this is the "same digest at 1 and 3 ranks" check for the whole library.
Sizes are tiny (the cost is compilation) and most populations are odd, so the micro-batches split
unevenly over the ranks.
"""

from __future__ import annotations

import jax
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import ALGORITHMS
from hpcevo.parallel import context_for

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
    # the distributed ES mode from a config (no rank holds the population; hpcevo/parallel/es.py),
    # small blocks so they split over the ranks. SNES and PGPE: tests/test_distributed_es.py shows
    # their distributed mode equals the replicated one, which is rank-count invariant here.
    ("openes", 10, {"distributed": True, "block": 2}, "sphere", 4),
    # multi-objective: the summary holds the front and its indicators instead of a best point
    ("nsga2", 9, {}, "zdt1", 5),
    ("moead", 10, {"neighbours": 4}, "dtlz2", 5),
]
IDS = [f"{c[0]}-pop{c[1]}" + ("-" + "-".join(f"{k}={v}" for k, v in c[2].items()) if c[2] else "") for c in CASES]
# The quick tier (scripts/test.sh -L quick) keeps one of each kind: a swarm, the distributed ES
# mode, a multi-objective run.
QUICK = {"cso-pop7", "openes-pop10-distributed=True-block=2", "nsga2-pop9"}
PARAMS = [pytest.param(c, id=i, marks=() if i in QUICK else pytest.mark.slow) for c, i in zip(CASES, IDS)]


@pytest.mark.single_process
def test_every_registered_algorithm_is_covered():
    assert {c[0] for c in CASES} == set(ALGORITHMS) and QUICK <= set(IDS)


def _config(name, pop, extra, problem, dim, out, generations=12, dtype="float32"):
    return hpcevo.load_config({
        "run": {"name": "digest", "seed": 11, "generations": generations, "out": str(out), "dtype": dtype},
        "algorithm": {"name": name, "pop_size": pop, **extra},
        "problem": {"name": problem, "dim": dim},
        "log": {"every": 5},
    })


# What the comparison needs of a summary (the rest holds timings).
OUTCOME = ("ranks", "state_digest", "best_fitness", "best_solution", "front_f", "front_x", "hypervolume", "igd")


def _digest_here_and_alone(ctx, references, request, shared_tmp, case, **kw):
    """The summary on this job's ranks, and the summary of the same run on one rank: rank 0
    alone on MPI.COMM_SELF (every rank doing so would only repeat the same work), or in a suite
    run the one the 1-rank pass made (conftest.References). At one rank the job's run is it."""
    name, pop, extra, problem, dim = case
    here = hpcevo.run(_config(name, pop, extra, problem, dim, shared_tmp / "here", **kw), quiet=True, ctx=ctx).summary
    here = {k: here[k] for k in OUTCOME if k in here}

    def one_rank():
        if ctx.size == 1:
            return here
        cfg = _config(name, pop, extra, problem, dim, shared_tmp / "alone", **kw)
        alone = hpcevo.run(cfg, quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        return {k: alone[k] for k in OUTCOME if k in alone}

    return here, references.get(request, "summary", one_rank)


@pytest.mark.parametrize("case", PARAMS)
def test_same_digest_on_all_ranks_as_on_one(ctx, references, request, shared_tmp, case):
    here, alone = _digest_here_and_alone(ctx, references, request, shared_tmp, case)
    assert here["ranks"] == ctx.size and alone["ranks"] == 1
    assert here["state_digest"] == alone["state_digest"]
    keys = ("best_fitness", "best_solution") if "best_fitness" in here else ("front_f", "front_x", "hypervolume", "igd")
    for k in keys:
        assert here[k] == alone[k], k
    assert ctx.comm_ctl.allgather(here["state_digest"]) == [here["state_digest"]] * ctx.size


@pytest.mark.slow
def test_cmaes_float64_same_digest_on_all_ranks_as_on_one(ctx, references, request, shared_tmp):
    try:
        here, alone = _digest_here_and_alone(ctx, references, request, shared_tmp, ("cmaes", 9, {}, "ellipsoid", 6),
                                             dtype="float64")
    finally:
        jax.config.update("jax_enable_x64", False)  # execute() switched it on for float64
    assert here["state_digest"] == alone["state_digest"]
