"""Batched runs (``hpcevo.Batch``): many runs of one program advanced together in one dispatch,
each run bitwise the same run advanced alone, whatever its batch-mates, slot or batch size, at
any rank count."""

from __future__ import annotations

import numpy as np
import pytest

import hpcevo
from hpcevo.algorithms import ALGORITHMS
from hpcevo.algorithms.base import params_of
from hpcevo.problems import make_problem
from hpcevo.problems.bbob import make_bbob

# Each batch here is compared with its runs alone at the same rank count; the runs alone are
# what tests/test_algorithms_digest.py and test_parallel.py hold equal at 1 to 4 ranks.

DIM = 4
RASTRIGIN = make_problem("rastrigin", DIM)
SINGLE = [name for name, cls in ALGORITHMS.items() if not cls.multi_objective]


def build(name, pop=7, problem=RASTRIGIN, **kw):
    return ALGORITHMS[name](pop_size=pop, dim=problem.dim, lb=problem.lb, ub=problem.ub, **kw)


def setup(loop, j, params):
    """Run j's own settings: a budget, a target or other dynamic hyper-parameters."""
    if j == 1:
        loop.limit(evaluations=40)
    if j == 2:
        loop.limit(target=float(np.float32(30.0)))
    if j == 0 and params:  # another value of every dynamic hyper-parameter
        loop.set_params(**{k: v * 0.9 if v else 0.1 for k, v in params.items()})
    return loop


def check_every_run_is_the_run_alone(ctx, algorithm, **options):
    """Mixed seeds, budgets, targets and hyper-parameters in a batch of 3, two calls; each run
    against the same loop advanced alone."""
    params = params_of(algorithm)
    seeds = [11, 12, 13]
    batch = hpcevo.Batch([setup(hpcevo.Loop(algorithm, RASTRIGIN, ctx, **options), j, params) for j in range(3)])
    batch.init(seeds).advance(9).advance(6)
    for j, (seed, loop) in enumerate(zip(seeds, batch)):
        alone = setup(hpcevo.Loop(algorithm, RASTRIGIN, ctx, **options), j, params).init(seed).advance(9).advance(6)
        assert (loop.generation, loop.evaluations, loop.met) == (alone.generation, alone.evaluations, alone.met), j
        for k, v in alone.history.items():
            np.testing.assert_array_equal(loop.history[k], v, err_msg=f"run {j}: {k}")
        assert loop.digest() == alone.digest(), f"run {j} of the batch differs from the run alone"
        loop.check_replicas()
    assert batch[1].met == "evaluations" and batch[1].generation < batch[0].generation == 16


# Every algorithm at one rank; the evaluation split over the ranks, below.
@pytest.mark.ranks(1)
@pytest.mark.parametrize("name", SINGLE)
def test_every_run_of_a_batch_is_bitwise_the_run_alone(ctx, name):
    check_every_run_is_the_run_alone(ctx, build(name, pop=6))


# Split over the ranks: 2-row micro-batches (uneven at 2 and 3 ranks: 4 of them at pop 8), a
# generation that evaluates fewer rows than its population (CSO) and the distributed ES mode
# (no rank holds the population: its own exchange).
SPLIT = {"cso": ({}, {"microbatch": 2}), "cmaes": ({}, {"microbatch": 2}),
         "openes": ({"distributed": True, "block": 2}, {})}


@pytest.mark.ranks(2, 3)
@pytest.mark.parametrize("name", SPLIT)
def test_batched_runs_split_over_the_ranks_as_the_run_alone(ctx, name):
    kw, options = SPLIT[name]
    check_every_run_is_the_run_alone(ctx, build(name, pop=8, **kw), **options)


@pytest.mark.ranks(1, 2, 3)
def test_problem_instances_share_the_program_and_runs_end_one_by_one(ctx, shared_tmp):
    """BBOB instances of one function are one program (their data are arguments): a batch of
    instances, a target that ends one early, a run that joins later and one loaded from a
    checkpoint; each equals its run alone."""
    problems = [make_bbob(3, i, DIM) for i in (1, 2, 3)]
    algorithm = build("cmaes", pop=6, problem=problems[0])
    loops = [hpcevo.Loop(algorithm, p, ctx) for p in problems]
    loops[0].limit(target=problems[0].fopt + 60.0)
    batch = hpcevo.Batch(loops).init([5, 5, 6]).advance(25)
    assert loops[0].met == "target" and loops[0].generation < 26 and loops[2].generation == 26
    alone = [hpcevo.Loop(algorithm, p, ctx) for p in problems]
    alone[0].limit(target=problems[0].fopt + 60.0)
    for loop, a, seed in zip(loops, alone, [5, 5, 6]):
        assert loop.digest() == a.init(seed).advance(25).digest()
    assert loops[0].digest() != loops[1].digest()  # same seed, other instance
    # a run from a checkpoint and a new one join the two left; every run goes on as alone
    path = loops[1].save(shared_tmp / "ckpt", keep=1)
    back = hpcevo.Loop(algorithm, problems[1], ctx).load(path)
    late = hpcevo.Loop(algorithm, problems[0], ctx).init(9)
    hpcevo.Batch([back, loops[2], late]).advance(7)
    assert back.digest() == alone[1].advance(7).digest()
    assert loops[2].digest() == alone[2].advance(7).digest()
    assert late.digest() == hpcevo.Loop(algorithm, problems[0], ctx).init(9).advance(7).digest()


@pytest.mark.ranks(1, 2)
def test_a_batch_refuses_loops_of_other_programs_and_bad_input_on_every_rank(ctx):
    algorithm = build("de")
    loop = hpcevo.Loop(algorithm, RASTRIGIN, ctx)
    other = hpcevo.Loop(build("de", pop=9), RASTRIGIN, ctx)
    for bad, said in (([loop, other], "loops\\[1\\] is not the program of loops\\[0\\].*pop 7 dim 4 and pop 9"),
                      ([], "'loops' must be a non-empty list"),
                      (loop, "'loops' must be a non-empty list of hpcevo.Loop objects, got Loop"),
                      ([loop, "x"], "loops\\[1\\] is a str"), ([loop, loop], "a Loop appears twice")):
        with pytest.raises(hpcevo.UsageError, match=f"Batch: {said}"):
            hpcevo.Batch(bad)
    # A JAX function of the user's, given to each Loop, is one program; another function is not.
    def sphere(x):
        return (x * x).sum(axis=-1)

    def other_sphere(x):
        return (x * x).sum(axis=-1)

    same = [hpcevo.Loop(algorithm, sphere, ctx) for _ in range(2)]
    assert same[0].engine is same[1].engine
    hpcevo.Batch(same)
    with pytest.raises(hpcevo.UsageError, match=r"problems '.*\.sphere>' and '.*\.other_sphere>'"):
        hpcevo.Batch([same[0], hpcevo.Loop(algorithm, other_sphere, ctx)])
    host = hpcevo.Loop(algorithm, lambda x: float(np.sum(x * x)), ctx, host=True)
    with pytest.raises(hpcevo.UsageError, match="host problem"):
        hpcevo.Batch([host])
    host.close()
    batch = hpcevo.Batch([loop, hpcevo.Loop(algorithm, RASTRIGIN, ctx)])
    with pytest.raises(hpcevo.UsageError, match="Batch.init: 'seeds' must be a list of 2 seeds"):
        batch.init([1])
    with pytest.raises(hpcevo.UsageError, match="no state yet"):
        batch.advance(3)
    with pytest.raises(hpcevo.UsageError, match="seed"):
        batch.init([1, -1])
    batch.init([1, 2])
    x = batch[0].ask()
    with pytest.raises(hpcevo.UsageError, match="asked but not told"):
        batch.advance(1)
    batch[0].tell(x, batch[0].evaluate(x))
    assert batch.advance(2).digests() == [batch[0].digest(), batch[1].digest()]


@pytest.mark.ranks(1, 2)
def test_seeds_may_be_any_sequence_of_integers(ctx):
    algorithm = build("pso")
    batch = hpcevo.Batch([hpcevo.Loop(algorithm, RASTRIGIN, ctx) for _ in range(3)])
    assert batch.init(np.arange(4, 7)).digests() == hpcevo.Batch(
        [hpcevo.Loop(algorithm, RASTRIGIN, ctx) for _ in range(3)]).init(range(4, 7)).digests()
    assert [loop.seed for loop in batch] == [4, 5, 6]
