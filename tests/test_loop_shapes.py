"""Loops of fixed trip counts (a GPU's default; ``HPCEVO_LOOPS=fixed:B`` anywhere): the same bits
at every rank count, in any split of the generations into dispatches, and stops met at the very
generation, as with loops of data trip counts (the CPU's default). Run here on CPUs, where the
fixed shape is chosen by the variable; docs/gpu.md has the same checks on a GPU."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import CMAES, CSO, PSO, OpenES
from hpcevo.driver.engine import GPU_BLOCK, loop_shape
from hpcevo.errors import UsageError
from hpcevo.parallel import context_for
from hpcevo.problems import make_problem

# 1-4 ranks: uneven splits (3) are where a rank runs a micro-batch past its own.
BLOCK = 3


def user_f(x):
    # A user's own function, not declared block invariant: evaluated one micro-batch at a time.
    return jnp.sum((x - 0.5) ** 2, axis=-1) + jnp.cos(x[:, 0])


def _case(name):
    rastrigin = make_problem("rastrigin", 4)
    if name == "pso":
        return PSO(pop_size=7, dim=4, lb=rastrigin.lb, ub=rastrigin.ub), rastrigin, {}
    if name == "cso":
        return CSO(pop_size=9, dim=4, lb=rastrigin.lb, ub=rastrigin.ub), rastrigin, {}
    if name == "ipop":  # population buckets and rows not worth evaluating (rows_used)
        sphere = make_problem("sphere", 2)
        return CMAES(pop_size=13, dim=2, lb=sphere.lb, ub=sphere.ub, restart="ipop", lambda0=3), sphere, {}
    if name == "openes-distributed":
        sphere = make_problem("sphere", 4)
        return OpenES(pop_size=10, dim=4, lb=sphere.lb, ub=sphere.ub, distributed=True, block=2), sphere, {}
    if name == "user-function":  # 30 rows in micro-batches of 4: 8 of them, 3 ranks own 3, 3, 2
        return PSO(pop_size=30, dim=3, lb=-2.0, ub=2.0), user_f, {"microbatch": 4}
    raise KeyError(name)


CASES = ["pso", "cso", "ipop", "openes-distributed", "user-function"]


def _run(c, name, pieces, **limits):
    algorithm, problem, kw = _case(name)
    loop = hpcevo.Loop(algorithm, problem, c, **kw).init(5)
    assert loop.engine.fixed and loop.engine.block == BLOCK
    if limits:
        loop.limit(**limits)
    for n in pieces:
        loop.advance(n)
    return loop


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_fixed_loops_give_the_same_bits_at_every_rank_count_and_in_any_dispatches(ctx, references, request,
                                                                                  monkeypatch, name):
    monkeypatch.setenv("HPCEVO_LOOPS", f"fixed:{BLOCK}")

    def digests(c):
        # 13 generations at once (4 blocks and one left) and as 1 + 5 + 7 (every block boundary
        # elsewhere): one and the same run
        whole = _run(c, name, [13])
        split = _run(c, name, [1, 5, 7])
        assert whole.generation == split.generation == 14
        for k, v in whole.history.items():
            np.testing.assert_array_equal(split.history[k], v, err_msg=k)
        return [whole.digest(), split.digest()]

    here = digests(ctx)
    assert here[0] == here[1]
    assert ctx.comm_ctl.allgather(here[0]) == [here[0]] * ctx.size
    assert here == references.get(request, "digests", lambda: here if ctx.size == 1 else digests(
        context_for(MPI.COMM_SELF)))


@pytest.mark.slow
@pytest.mark.ranks(1, 3)
@pytest.mark.parametrize("limit", ["target", "evaluations", "stagnation"])
def test_a_stop_inside_a_block_ends_the_run_at_that_very_generation(ctx, monkeypatch, limit):
    """The generations a block computes past a stop are dropped: the run ends at the generation
    that meets the limit (where the same limit ends it with loops of data trip counts), and its
    state is the state of a run advanced exactly that far."""
    name = "pso"
    algorithm, problem, _ = _case(name)
    monkeypatch.setenv("HPCEVO_LOOPS", f"fixed:{BLOCK}")
    free = _run(ctx, name, [60])
    best = free.history["best"]  # row j: generation j + 1
    if limit == "target":
        # a target the free run first meets in a generation that is not a block's last
        # (a dispatch from generation 1 runs blocks of generations 2-4, 5-7, ...)
        j = next(j for j in range(3, 59) if best[j] < best[j - 1] and (j + 1) % BLOCK != 1)
        limits, expected = {"target": float(best[j])}, j + 1
    elif limit == "evaluations":
        limits, expected = {"evaluations": 7 * 8 + 3}, 9  # 7 rows a generation: met in generation 9
    else:
        limits, expected = {"stagnation": 4, "tolerance": 1e30}, None  # no improvement ever counts
    fixed = _run(ctx, name, [60], **limits)
    assert fixed.generation < 61
    if expected is not None:
        assert fixed.generation == expected and expected % BLOCK != 1  # not a block's last
    monkeypatch.setenv("HPCEVO_LOOPS", "data")
    with_data = hpcevo.Loop(algorithm, problem, ctx).init(5).limit(**limits).advance(60)
    if limit != "target":  # (the data shape's bits, and so its best values, may differ)
        assert fixed.generation == with_data.generation
    assert fixed.met == with_data.met
    monkeypatch.setenv("HPCEVO_LOOPS", f"fixed:{BLOCK}")
    exact = _run(ctx, name, [fixed.generation - 1])
    assert fixed.digest() == exact.digest()
    for k, v in exact.history.items():
        np.testing.assert_array_equal(fixed.history[k], v, err_msg=k)


@pytest.mark.slow
@pytest.mark.ranks(1, 3)
def test_ask_evaluate_tell_is_bitwise_advance_with_fixed_loops(ctx, monkeypatch):
    monkeypatch.setenv("HPCEVO_LOOPS", f"fixed:{BLOCK}")
    algorithm, problem, _ = _case("cso")
    a = hpcevo.Loop(algorithm, problem, ctx).init(3).advance(7)
    b = hpcevo.Loop(algorithm, problem, ctx).init(3)
    for _ in range(7):
        x = b.ask()
        b.tell(x, b.evaluate(x))
    assert a.digest() == b.digest()


@pytest.mark.single_process
def test_the_loop_shape_follows_the_device_and_the_variable(monkeypatch):
    monkeypatch.delenv("HPCEVO_LOOPS", raising=False)
    assert loop_shape("cpu") == (False, 1) and loop_shape("gpu") == (True, GPU_BLOCK)
    for text, shape in (("data", (False, 1)), ("fixed", (True, GPU_BLOCK)), ("FIXED:16", (True, 16)),
                        (" fixed:1 ", (True, 1))):
        monkeypatch.setenv("HPCEVO_LOOPS", text)
        assert loop_shape("cpu") == shape and loop_shape("gpu") == shape
    for bad in ("fast", "fixed:0", "fixed:x", "fixed:5000", "data:3"):
        monkeypatch.setenv("HPCEVO_LOOPS", bad)
        with pytest.raises(UsageError, match="HPCEVO_LOOPS must be"):
            loop_shape("cpu")
