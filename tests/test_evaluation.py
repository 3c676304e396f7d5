"""evaluation.batch_size: pieces bound the rows a problem sees; chunked == unchunked, bitwise."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import CSO, PSO
from hpcevo.driver.build import probe_batch_size
from hpcevo.parallel import context_for
from hpcevo.parallel.evaluate import chunking_is_exact
from hpcevo.problems import create

# Splits of rows over 1, 2 and 3 ranks (3: uneven); a 4th rank splits them evenly again and
# adds nothing but collectives (tests/test_parallel.py and the digest matrix run at 4).
pytestmark = pytest.mark.ranks(1, 2, 3)


def run(ctx, algo, evaluate, batch_size=None, microbatch=None, generations=5):
    loop = hpcevo.Loop(algo, evaluate, ctx, microbatch=microbatch, batch_size=batch_size).compile(4)
    loop.init(4).advance(generations - 1)
    return [loop.digest(), loop.best_fitness]


CASES = [
    # (algorithm, pop, problem, dim, microbatch, batch_size): pieces that divide the micro-batch
    # and pieces that do not (padded); the run on all ranks of this job against the run unchunked
    ("cso", 40, "rastrigin", 7, None, 3),
    ("pso", 24, "cec2022_f1", 10, 12, 4),
]


@pytest.mark.parametrize("name,pop,prob,dim,microbatch,batch_size", CASES)
@pytest.mark.slow
def test_chunked_equals_unchunked_bitwise(ctx, references, request, name, pop, prob, dim, microbatch, batch_size):
    """In pieces on this job's ranks, bitwise what the run without pieces gives (on one rank:
    rank-count invariance is tested on its own, so any rank count's unchunked run would do)."""
    p = create(prob, dim)
    algo = (CSO if name == "cso" else PSO)(pop_size=pop, dim=dim, lb=p.lb, ub=p.ub)
    chunked = run(ctx, algo, p.evaluate, batch_size, microbatch, generations=3)
    unchunked = references.get(request, "unchunked", lambda: run(
        ctx if ctx.size == 1 else context_for(MPI.COMM_SELF), algo, p.evaluate, None, microbatch, generations=3))
    assert chunked == unchunked


@pytest.mark.single_process
@pytest.mark.parametrize("name", ["cec2022_f7", "cec2022_f12"])
@pytest.mark.slow
def test_cec_hybrid_and_composition_are_block_invariant(name, my_turn):
    if not my_turn:
        return  # another rank of this job runs it (see conftest.my_turn)
    # The most involved members of the suite (shuffles, Katsuura, Schaffer F7 / log-space
    # weights, modified Schwefel); the others share their pieces.
    p = create(name, 10)
    x = jax.random.uniform(jax.random.PRNGKey(1), (9, 10), minval=-100.0, maxval=100.0)
    assert chunking_is_exact(p.evaluate, x, 4)


def test_no_call_sees_more_rows_than_batch_size(ctx):
    seen = set()

    def evaluate(x):
        seen.add(x.shape[0])  # runs while tracing: the shapes the problem is compiled for
        return jnp.sum(x * x, axis=-1)

    algo = PSO(pop_size=50, dim=3, lb=(-1.0,) * 3, ub=(1.0,) * 3)
    for batch_size, rows in ((4, 4), (None, 10)):
        loop = hpcevo.Loop(algo, evaluate, ctx, microbatch=10, batch_size=batch_size)
        seen.clear()  # (telling a batch function from a per-candidate one traced it on probes)
        loop.init(4)
        assert seen == {rows}


def block_dependent(x):
    # Each row's value includes the mean of its block: exactly what chunking would change.
    return jnp.sum(x, axis=-1) + jnp.mean(x)


@pytest.mark.single_process
def test_probe_tells_exact_from_block_dependent():
    x = jax.random.uniform(jax.random.PRNGKey(0), (12, 4))
    assert chunking_is_exact(lambda a: jnp.sum(a * a, axis=-1), x, 5)
    assert not chunking_is_exact(block_dependent, x, 5)


@pytest.mark.ranks(1, 2)
def test_run_with_a_block_dependent_problem_warns_and_says_so(ctx, shared_tmp, capsys):
    cfg = hpcevo.load_config({
        "run": {"name": "t", "generations": 2, "out": str(shared_tmp / "run")},
        "algorithm": {"name": "pso", "pop_size": 16},
        "problem": {"dim": 3, "lb": -1.0, "ub": 1.0},
        "parallel": {"microbatch": 8},
        "evaluation": {"batch_size": 3},
    })
    summary = hpcevo.run(cfg, problem=block_dependent, overwrite=True, ctx=ctx).summary
    out = capsys.readouterr().out
    assert summary["batch_size_exact"] is False
    if ctx.rank == 0:
        assert "warning: evaluation.batch_size = 3" in out
        assert json.loads((shared_tmp / "run" / "summary.json").read_text())["batch_size_exact"] is False
    # hpcevo's own functions are exact by construction: no probe, no compilation
    algo = PSO(pop_size=16, dim=3, lb=(-1.0,) * 3, ub=(1.0,) * 3)
    assert probe_batch_size(cfg, create("sphere", 3), algo) is True
    assert probe_batch_size(cfg.model_copy(update={"evaluation": type(cfg.evaluation)(batch_size=8)}),
                            create("sphere", 3), algo) is None  # pieces as large as the micro-batch
