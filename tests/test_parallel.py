"""Sharded evaluation, determinism across rank counts, the divergence guard, agreement."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcevo.algorithms import CSO, PSO
from hpcevo.errors import ConfigError, DivergenceError
from hpcevo.parallel import agree_on_error, check_replicas, context_for, microbatch_rows, shard_of
from hpcevo.problems import make_problem
from hpcevo.workflow import Workflow, state_digest


@pytest.mark.parametrize("n", [1, 2, 3, 10, 37, 64, 100, 1000, 1024])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 16, 100])
def test_shards_cover_every_microbatch_once(n, size):
    mb = microbatch_rows(n)
    k = -(-n // mb)
    seen = []
    for r in range(size):
        start, count = shard_of(n, mb, size, r)
        seen.extend(range(start, start + count))
    assert seen == list(range(k))
    counts = [shard_of(n, mb, size, r)[1] for r in range(size)]
    assert max(counts) - min(counts) <= 1


def test_microbatch_depends_on_batch_size_only():
    assert microbatch_rows(1024) == 16 and microbatch_rows(10) == 8 and microbatch_rows(3) == 3
    assert microbatch_rows(1000, requested=50) == 50


def run(ctx, algo, problem, generations=12, every=5, seed=7, microbatch=None):
    wf = Workflow(algo, problem.evaluate, ctx, microbatch)
    out = None
    for b in wf.run(seed, generations, every):
        if b.generation == generations:
            out = (state_digest(b.state), float(b.state.best_f), int(b.state.nonfinite))
    return out


def self_ctx():
    return context_for(MPI.COMM_SELF)


CASES = [
    # (algorithm, pop, problem, dim): uneven splits, more ranks than individuals, odd CSO swarm
    ("cso", 10, "sphere", 5),
    ("cso", 7, "rastrigin", 8),
    ("pso", 3, "ackley", 7),
    ("pso", 2, "rosenbrock", 4),
    ("cso", 256, "ackley", 100),
    ("pso", 100, "griewank", 30),
]


@pytest.mark.parametrize("name,pop,prob,dim", CASES)
def test_bitwise_equal_to_one_rank(ctx, name, pop, prob, dim):
    """The run on all ranks of this job equals, bit for bit, the same run on one rank."""
    problem = make_problem(prob, dim)
    cls = CSO if name == "cso" else PSO
    algo = cls(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub)
    here = run(ctx, algo, problem)
    alone = run(self_ctx(), algo, problem)
    assert here == alone
    # and every rank holds the same result
    assert ctx.comm_ctl.allgather(here[0]) == [here[0]] * ctx.size


def test_float64_bitwise_equal_to_one_rank(ctx):
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        problem = make_problem("ellipsoid", 9)
        algo = CSO(pop_size=33, dim=9, lb=problem.lb, ub=problem.ub, dtype="float64")
        assert run(ctx, algo, problem) == run(self_ctx(), algo, problem)
    finally:
        jax.config.update("jax_enable_x64", False)


def test_nan_fitness_counted_as_worst_and_never_poisons(ctx):
    import jax.numpy as jnp

    sphere = make_problem("sphere", 4)

    class Flaky:
        dim, lb, ub = sphere.dim, sphere.lb, sphere.ub

        @staticmethod
        def evaluate(x):
            f = jnp.sum(x * x, -1)
            return jnp.where(x[:, 0] > 0, jnp.nan, f)  # about half the candidates fail

    algo = PSO(pop_size=20, dim=4, lb=sphere.lb, ub=sphere.ub)
    digest, best, nonfinite = run(ctx, algo, Flaky, generations=10)
    assert np.isfinite(best)
    assert 0 < nonfinite < 200
    assert (digest, best, nonfinite) == run(self_ctx(), algo, Flaky, generations=10)


def test_divergence_is_detected_on_every_rank(ctx):
    fp = np.arange(5, dtype=np.uint32)
    check_replicas(ctx, fp, 10)  # identical everywhere: passes
    if ctx.size == 1:
        return  # one replica cannot diverge from itself
    if ctx.rank == ctx.size - 1:
        fp = fp.copy()
        fp[3] ^= 1
    with pytest.raises(DivergenceError, match=f"generation 10: ranks {ctx.size - 1} differ"):
        check_replicas(ctx, fp, 10)


def test_error_on_one_rank_reaches_all(ctx):
    err = ConfigError("boom") if ctx.rank == ctx.size - 1 else None
    got = agree_on_error(ctx, err)
    assert isinstance(got, ConfigError) and "boom" in str(got)
    assert agree_on_error(ctx, None) is None


def test_error_with_stranded_after_reaches_all_when_everyone_arrives(ctx):
    err = OSError(28, "No space left on device") if ctx.rank == ctx.size - 1 else None
    got = agree_on_error(ctx, err, stranded_after=60.0)
    assert isinstance(got, OSError if ctx.rank == ctx.size - 1 else RuntimeError)
    assert "No space left on device" in str(got) and not getattr(got, "stranded", False)
    assert agree_on_error(ctx, None, stranded_after=60.0) is None


def test_rank_with_an_error_gives_up_on_ranks_that_never_arrive(ctx):
    """The other ranks are held elsewhere (as inside HDF5's own collective) past the deadline: the
    rank with the error returns it marked stranded instead of waiting for them forever."""
    if ctx.size == 1:
        pytest.skip("needs other ranks to be absent")
    last = ctx.rank == ctx.size - 1
    if last:
        t0 = time.monotonic()
        got = agree_on_error(ctx, OSError(28, "No space left on device"), stranded_after=0.5)
        waited = time.monotonic() - t0
        assert getattr(got, "stranded", False) and "No space left" in str(got)
        assert 0.5 <= waited < 3.0, waited  # gave up at the deadline, not at the others' return
        ctx.comm_ctl.allgather(None)  # the exchange the stranded rank skipped, so the test can go on
    else:
        time.sleep(4.0)  # held past the deadline; then arrive as a late, healthy rank would
        got = agree_on_error(ctx, None, stranded_after=0.5)
        assert got is None  # the stranded rank said nothing: it is the one that ends the job
