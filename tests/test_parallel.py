"""Sharded evaluation, determinism across rank counts, the divergence guard, agreement."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import CSO, PSO
from hpcevo.errors import ConfigError, DivergenceError
from hpcevo.parallel import agree_on_error, check_replicas, collective_stage, context_for, microbatch_rows, shard_of
from hpcevo.problems import make_problem


@pytest.mark.single_process
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


@pytest.mark.single_process
def test_microbatch_depends_on_batch_size_only():
    assert microbatch_rows(1024) == 16 and microbatch_rows(10) == 8 and microbatch_rows(3) == 3
    assert microbatch_rows(1000, requested=50) == 50


@pytest.mark.single_process
def test_gpu_ranks_take_fewer_larger_microbatches_still_fixed_by_the_batch():
    """On a GPU every micro-batch costs a host round trip: at least 2,048 rows, at most 16 of them."""
    assert microbatch_rows(1024, device="gpu") == 1024  # one call
    assert microbatch_rows(16384, device="gpu") == 2048  # 8 micro-batches
    assert microbatch_rows(262144, device="gpu") == 16384  # 16: work for 16 GPUs
    assert microbatch_rows(3, device="gpu") == 3
    assert microbatch_rows(16384, requested=256, device="gpu") == 256  # parallel.microbatch wins
    assert microbatch_rows(16384, device="cpu") == microbatch_rows(16384) == 256


def test_the_evaluator_takes_the_default_of_the_ranks_device(ctx, monkeypatch):
    """ShardedEvaluator asks for the micro-batch of the device its ranks are bound to."""
    from hpcevo.parallel import ShardedEvaluator

    assert ShardedEvaluator(lambda x: x[:, 0], 16384, ctx).mb == 256
    monkeypatch.setattr(ctx, "device_kind", "gpu")
    ev = ShardedEvaluator(lambda x: x[:, 0], 16384, ctx)
    assert (ev.mb, ev.k) == (2048, 8)
    assert ShardedEvaluator(lambda x: x[:, 0], 16384, ctx, microbatch=512).mb == 512


def run(ctx, algo, problem, out, generations=12, every=5, seed=7, microbatch=None):
    """The run as hpcevo.run drives it (the loop users run), with the algorithm and problem
    objects held here: [digest, best fitness, non-finite count]."""
    cfg = {"run": {"name": "p", "seed": seed, "generations": generations, "out": str(out), "dtype": algo.dtype},
           "log": {"every": every}, "parallel": {"microbatch": microbatch or 0}, "checkpoint": {"final": False}}
    s = hpcevo.run(cfg, problem=problem, algorithm=algo, ctx=ctx, quiet=True).summary
    return [s["state_digest"], s["best_fitness"], s["nonfinite_evaluations"]]


def here_and_alone(ctx, references, request, shared_tmp, algo, problem, **kw):
    """The run on this job's ranks, and the same run on one rank (rank 0, COMM_SELF; in a suite
    run, the one the 1-rank pass made: conftest.References)."""
    here = run(ctx, algo, problem, shared_tmp / "here", **kw)
    alone = references.get(request, "run", lambda: here if ctx.size == 1 else
                           run(context_for(MPI.COMM_SELF), algo, problem, shared_tmp / "alone", **kw))
    return here, alone


slow = pytest.mark.slow
CASES = [
    # (algorithm, pop, problem, dim): uneven splits, more ranks than individuals, odd CSO swarm
    ("cso", 10, "sphere", 5),
    pytest.param("cso", 7, "rastrigin", 8, marks=slow),
    ("pso", 3, "ackley", 7),
    pytest.param("pso", 2, "rosenbrock", 4, marks=slow),
    pytest.param("cso", 256, "ackley", 100, marks=slow),
    pytest.param("pso", 100, "griewank", 30, marks=slow),
]


@pytest.mark.parametrize("name,pop,prob,dim", CASES)
def test_bitwise_equal_to_one_rank(ctx, references, request, shared_tmp, name, pop, prob, dim):
    """The run on all ranks of this job equals, bit for bit, the same run on one rank."""
    problem = make_problem(prob, dim)
    cls = CSO if name == "cso" else PSO
    algo = cls(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub)
    here, alone = here_and_alone(ctx, references, request, shared_tmp, algo, problem)
    assert here == alone
    # and every rank holds the same result
    assert ctx.comm_ctl.allgather(here[0]) == [here[0]] * ctx.size


class Undeclared:
    """A problem's function with nothing declared about blocks: evaluated the old way, one
    micro-batch at a time, in a loop."""

    def __init__(self, problem):
        self.dim, self.lb, self.ub, self.evaluate = problem.dim, problem.lb, problem.ub, problem.evaluate


@pytest.mark.parametrize("name,pop", [("cso", 37), ("pso", 1024), ("de", 100), ("cmaes", 24), ("openes", 50)])
def test_one_call_per_rank_gives_the_bits_of_the_loop_of_microbatches(ctx, shared_tmp, name, pop):
    """A block-invariant problem (hpcevo's own functions) is evaluated in one call at one rank,
    the others one micro-batch at a time: the same bits. (At several ranks both take the loop:
    the one-call share was a slice XLA fused with the ask; tests/test_api.py's save/load test at
    2 ranks caught it. The 1-vs-N tests above compare this run with the one-rank one.)"""
    from hpcevo.algorithms import ALGORITHMS

    problem = make_problem("rastrigin", 9)
    assert problem.block_invariant
    algo = ALGORITHMS[name](pop_size=pop, dim=9, lb=problem.lb, ub=problem.ub)
    whole = run(ctx, algo, problem, shared_tmp / "whole", generations=9, every=3)
    loop = run(ctx, algo, Undeclared(problem), shared_tmp / "loop", generations=9, every=3)
    assert whole == loop


def test_the_one_call_path_is_taken_where_it_keeps_the_bits(ctx):
    from hpcevo.parallel import ShardedEvaluator

    fn = make_problem("sphere", 4).evaluate
    ev = ShardedEvaluator(fn, 37, ctx, block_invariant=True)
    assert ev.whole == (ctx.size == 1) and ev.k == 5 and ev.slots == -(-5 // ctx.size)  # one rank only
    # every rank's call has the same shape, and none reads past the padded batch
    assert ev.rows >= max(s + ev.slots for s, _ in (shard_of(37, 8, ctx.size, r) for r in range(ctx.size))) * 8
    assert not ShardedEvaluator(fn, 37, ctx).whole  # undeclared: the loop
    assert not ShardedEvaluator(fn, 37, ctx, batch_size=4, block_invariant=True).whole  # memory bound: the loop
    x = jax_uniform((37, 4))
    a = ev(x, np.asarray(ev.shard))
    b = ShardedEvaluator(fn, 37, ctx)(x, np.asarray(ev.shard))
    assert np.array_equal(np.asarray(a), np.asarray(b)) and np.array_equal(np.asarray(a), np.asarray(fn(x)))


def jax_uniform(shape):
    import jax

    return jax.random.uniform(jax.random.PRNGKey(0), shape, minval=-5.0, maxval=5.0)


@pytest.mark.slow
def test_float64_bitwise_equal_to_one_rank(ctx, references, request, shared_tmp):
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        problem = make_problem("ellipsoid", 9)
        algo = CSO(pop_size=33, dim=9, lb=problem.lb, ub=problem.ub, dtype="float64")
        here, alone = here_and_alone(ctx, references, request, shared_tmp, algo, problem)
        assert here == alone
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.slow
def test_nan_fitness_counted_as_worst_and_never_poisons(ctx, references, request, shared_tmp):
    import jax.numpy as jnp

    sphere = make_problem("sphere", 4)

    class Flaky:
        dim, lb, ub = sphere.dim, sphere.lb, sphere.ub

        @staticmethod
        def evaluate(x):
            f = jnp.sum(x * x, -1)
            return jnp.where(x[:, 0] > 0, jnp.nan, f)  # about half the candidates fail

    algo = PSO(pop_size=20, dim=4, lb=sphere.lb, ub=sphere.ub)
    here, alone = here_and_alone(ctx, references, request, shared_tmp, algo, Flaky, generations=10)
    digest, best, nonfinite = here
    assert np.isfinite(best)
    assert 0 < nonfinite < 200
    assert here == alone


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


@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_rank_with_an_error_gives_up_on_ranks_that_never_arrive(ctx):
    """The other ranks are held elsewhere (as inside HDF5's own collective) past the deadline: the
    rank with the error returns it marked stranded instead of waiting for them forever."""
    if ctx.size == 1:  # nobody to wait for: the error comes straight back, at once, not stranded
        t0 = time.monotonic()
        got = agree_on_error(ctx, OSError(28, "No space left on device"), stranded_after=0.5)
        assert isinstance(got, OSError) and not getattr(got, "stranded", False)
        assert time.monotonic() - t0 < 0.5
        return
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


def test_collective_stage_raises_the_first_failing_ranks_error_everywhere(ctx):
    """The "capture, agree, re-raise" idiom: a failure on the last rank only is every rank's."""
    with pytest.raises(ConfigError, match="boom") as e:
        with collective_stage(ctx):
            if ctx.rank == ctx.size - 1:
                raise ConfigError("boom", "run.seed")
    assert e.value.key == "run.seed"  # the key travels with the error to the other ranks
    with collective_stage(ctx):  # nobody failed: nobody raises
        pass
    with pytest.raises(ValueError, match="converted"):
        with collective_stage(ctx, convert=lambda err: ValueError(f"converted: {err}")):
            if ctx.rank == 0:
                raise OSError(28, "No space left on device")
