"""IPOP- and BIPOP-CMA-ES [AH05, H09]: a generation costs what its current population costs.

The population (lambda) changes size at restarts. A loop runs each generation in the program of
its size's bucket (lambda0 * 2^k, capped at pop_size: within 2x of lambda) and moves between
programs at the restarts, where before every generation computed pop_size rows (lambda0 * 2^9
by default: 56x the work at lambda 8 in 5-D). Every promise is kept across the moves: the same
bits at any rank count, a resumed run equal to the run never stopped, ask/evaluate/tell equal to
advance, a batch's runs equal to the runs alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcevo
from hpcevo.algorithms import CMAES
from hpcevo.problems import make_problem

# On the 2-D sphere the restarts come every 100-200 generations (TolFun, TolX); BIPOP's small
# runs draw populations between the buckets' sizes.
PROBLEM = make_problem("sphere", 2)


def bipop(**kw):
    return CMAES(pop_size=40, dim=2, lb=PROBLEM.lb, ub=PROBLEM.ub, restart="bipop", lambda0=5, **kw)


def walk(loop, steps: int = 60, k: int = 10) -> list[list[int]]:
    """(generation, lambda, rows of the program that ran it) after each of ``steps`` advances."""
    seen = []
    for _ in range(steps):
        loop.advance(k)
        seen.append([loop.generation, int(loop.state.algo.lam), loop.engine.algorithm.num_ask])
    return seen


@pytest.mark.single_process
def test_the_buckets_are_lambda0_doubled_up_to_pop_size():
    a = bipop()
    assert a.row_buckets() == (5, 10, 20, 40) and a.num_ask == 40
    assert [a.bucket_rows(lam) for lam in (5, 6, 10, 11, 35, 40)] == [5, 10, 10, 20, 40, 40]
    assert CMAES(pop_size=13, dim=2, lb=-1.0, ub=1.0, restart="ipop", lambda0=3).row_buckets() == (3, 6, 12, 13)
    assert CMAES(pop_size=8, dim=2, lb=-1.0, ub=1.0).row_buckets() is None  # no restarts: one size
    b = a.with_rows(10)
    assert (b.num_ask, b.rows, a.rows) == (10, 10, 0) and b != a and hash(b) != hash(a)
    assert "rows" not in CMAES.hyper_parameters()  # not a setting of a config


@pytest.mark.ranks(1, 2, 3)
def test_each_population_runs_in_the_program_of_its_bucket_with_the_bits_of_one_rank(ctx, references, request,
                                                                                    alone):
    loop = hpcevo.Loop(bipop(), PROBLEM, ctx).init(5)
    seen = walk(loop)
    for generation, lam, rows in seen:
        assert rows in (5, 10, 20, 40) and lam <= rows and (rows == 5 or rows < 2 * lam), (generation, lam, rows)
    assert len({rows for _, _, rows in seen}) == 4  # every bucket visited,
    assert any(lam < rows for _, lam, rows in seen)  # and BIPOP's small runs between sizes
    got = {"digest": loop.digest(), "seen": seen, "best": loop.history["best"].tolist()}

    def one_rank():
        lp = hpcevo.Loop(bipop(), PROBLEM, alone).init(5)
        return {"seen": walk(lp), "digest": lp.digest(), "best": lp.history["best"].tolist()}

    assert got == references.get(request, "bipop", one_rank)


# (the moves are the same at any rank count: the test above; these at 1 and 2 ranks)
@pytest.mark.ranks(1, 2)
def test_a_run_saved_in_a_larger_program_resumes_to_the_run_never_stopped(ctx, shared_tmp):
    whole = hpcevo.Loop(bipop(), PROBLEM, ctx).init(5)
    compiled = []
    whole.on_compile = compiled.append  # (a run's driver arms its watchdog there)
    whole.advance(300)
    assert compiled == [10, 20] and whole.engine.algorithm.num_ask == 20  # (past two restarts)
    path = whole.save(shared_tmp / "ck")
    whole.advance(300)
    again = hpcevo.Loop(bipop(), PROBLEM, ctx).load(path)
    again.advance(300)
    assert again.digest() == whole.digest() and again.generation == whole.generation == 601
    np.testing.assert_array_equal(again.history["best"], whole.history["best"][-len(again.history["best"]):])


@pytest.mark.ranks(1, 2)
def test_ask_evaluate_tell_across_a_restart_is_advance(ctx):
    stepped = hpcevo.Loop(bipop(), PROBLEM, ctx).init(5).advance(100)
    advanced = hpcevo.Loop(bipop(), PROBLEM, ctx).init(5).advance(100)
    sizes = []
    for _ in range(40):
        x = stepped.ask()
        sizes.append(x.shape[0])
        stepped.tell(x, stepped.evaluate(x))
    advanced.advance(40)
    assert sizes[0] == 5 and sizes[-1] == 10  # the first restart moved it
    assert stepped.digest() == advanced.digest()
    np.testing.assert_array_equal(stepped.history["best"], advanced.history["best"])
    # the pure functions for the user's own jit are one fixed shape: the largest population
    assert stepped.functions().ask(stepped.state, stepped.params_data())[0].shape == (40, 2)


@pytest.mark.ranks(1, 2)
def test_a_batch_of_restarting_runs_moves_each_between_programs_and_equals_the_runs_alone(ctx):
    def loops():
        made = [hpcevo.Loop(bipop(), PROBLEM, ctx) for _ in range(3)]
        made[1].limit(evaluations=1500)
        return made

    batch = hpcevo.Batch(loops()).init([5, 6, 7])
    batch.advance(250)
    rows = {loop.engine.algorithm.num_ask for loop in batch}
    batch.advance(250)
    for seed, loop, alone in zip([5, 6, 7], batch, loops()):
        alone.init(seed).advance(250).advance(250)
        assert (loop.generation, loop.evaluations, loop.met) == (alone.generation, alone.evaluations, alone.met)
        assert loop.digest() == alone.digest()
    assert batch[1].met == "evaluations" and batch[0].generation == 501
    assert all(int(loop.state.algo.restarts) >= 1 for loop in batch) and rows
