"""The ranks of one node compile a program once (hpcevo/parallel/compiling.py): the node's first
rank compiles, the others load its programs from the compilation cache, and no rank waits for a
turn that never comes. At every rank count: the turns are between the ranks of a node, and 3
ranks have a first rank and two others.
"""

from __future__ import annotations

import time

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import pytest

import hpcevo
from hpcevo.algorithms import CSO
from hpcevo.parallel.compiling import ENV, compile_on_node, shared_compilation

pytestmark = pytest.mark.ranks(1, 2, 3, 4)

_EVENTS: dict[str, int] = {}


def _count(name: str, **_: object) -> None:
    if name.startswith("/jax/compilation_cache/cache_"):
        _EVENTS[name] = _EVENTS.get(name, 0) + 1


jax.monitoring.register_event_listener(_count)


def cache_events(action) -> dict[str, int]:
    """The persistent cache's hits and misses while ``action()`` runs."""
    before = dict(_EVENTS)
    action()
    return {k.rsplit("_", 1)[-1]: v - before.get(k, 0) for k, v in _EVENTS.items() if v - before.get(k, 0)}


def unique_loop(ctx):
    """A Loop whose programs no cache holds yet: the objective has a constant drawn for this
    test (the same on every rank), so its programs are new."""
    c = ctx.comm_ctl.bcast(float(np.random.default_rng().uniform(0.5, 1.5)) if ctx.rank == 0 else None)

    def objective(x):
        return jnp.sum((x - c) ** 2, axis=-1)

    return hpcevo.Loop(CSO(pop_size=24, dim=3, lb=(-2.0,) * 3, ub=(2.0,) * 3), objective, ctx)


def node_rank(ctx) -> int:
    return ctx.node_comm.rank


def test_the_ranks_of_a_node_compile_a_program_once(ctx, monkeypatch):
    assert jax.config.jax_compilation_cache_dir, "the suite runs with a compilation cache"
    monkeypatch.delenv(ENV, raising=False)
    loop = unique_loop(ctx)
    events = cache_events(lambda: loop.compile(0))
    # (gathered, so that every rank asserts alike: one rank failing alone would desynchronise the pass)
    everyone = ctx.comm_ctl.allgather((node_rank(ctx), shared_compilation(ctx), events))
    for rank, shared, got in everyone:
        if rank == 0:
            assert got.get("misses", 0) >= 2, everyone  # (generation 1's program and the chunk's at least)
        else:
            assert shared, everyone
            assert got.get("misses", 0) == 0 and got.get("hits", 0) >= 2, everyone
    # What a rank loaded is what the first rank compiled: the run is the same on every rank.
    loop.init(3).advance(6)
    digests = ctx.comm_ctl.allgather(loop.digest())
    assert digests == [digests[0]] * ctx.size


def test_each_rank_compiles_for_itself_when_asked(ctx, monkeypatch):
    """HPCEVO_NODE_COMPILE=every: what the ranks did before (and the check that the test above
    can tell the two apart)."""
    monkeypatch.setenv(ENV, "every")
    loop = unique_loop(ctx)
    ctx.comm_ctl.Barrier()  # (all start their compilation together: none finds another's)
    events = cache_events(lambda: loop.compile(0))
    everyone = ctx.comm_ctl.allgather((shared_compilation(ctx), events))
    assert all(not shared and got.get("misses", 0) >= 2 for shared, got in everyone), everyone


def spans(ctx, work) -> list[tuple[float, float, object]]:
    """Every rank's (start, end, outcome) of ``compile_on_node(ctx, work)``, in rank order (one
    node: the monotonic clock is the machine's)."""
    span = {}

    def timed():
        span["start"] = time.monotonic()
        try:
            return work()
        finally:
            span["end"] = time.monotonic()
    class Program:
        def compile(self):
            span["outcome"] = timed()
    try:
        compile_on_node(ctx, lambda: [Program()])
        outcome = span["outcome"]
    except RuntimeError as e:
        outcome = f"raised: {e}"
    return ctx.comm_ctl.allgather((span["start"], span["end"], outcome))


def test_the_others_wait_for_the_first_rank_then_compile(ctx, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    got = spans(ctx, lambda: time.sleep(0.3) or "done")
    first = got[0]
    assert [g[2] for g in got] == ["done"] * ctx.size
    for start, _, _ in got[1:]:
        assert start >= first[1], got  # after the first rank's turn ended


def test_a_failure_on_the_first_rank_leaves_no_rank_waiting(ctx, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)

    def work():
        if node_rank(ctx) == 0:
            raise RuntimeError("XLA failed here")
        return "done"

    got = spans(ctx, work)
    assert got[0][2] == "raised: XLA failed here"
    assert [g[2] for g in got[1:]] == ["done"] * (ctx.size - 1)


def test_a_rank_whose_lowering_fails_leaves_no_rank_waiting(ctx, monkeypatch):
    """Tracing the user's code can fail on one rank only (tests/test_agreement.py at the Loop):
    that rank raises, the others compile side by side instead of waiting for turns."""
    monkeypatch.delenv(ENV, raising=False)
    last = ctx.rank == ctx.size - 1

    class Program:
        def compile(self):
            time.sleep(0.3)

    def lower():
        if last:
            raise ValueError("cannot trace on this rank")
        return [Program()]
    try:
        compile_on_node(ctx, lower)
        outcome = "done"
    except ValueError as e:
        outcome = str(e)
    got = ctx.comm_ctl.allgather((outcome,))
    assert [g[0] for g in got] == ["done"] * (ctx.size - 1) + ["cannot trace on this rank"], got


def test_ranks_that_disagree_compile_each_for_itself(ctx, monkeypatch):
    """One rank's environment says "every": no rank waits for a turn, all compile at once."""
    if ctx.rank == ctx.size - 1:
        monkeypatch.setenv(ENV, "every")
    else:
        monkeypatch.delenv(ENV, raising=False)
    ctx.comm_ctl.Barrier()
    got = spans(ctx, lambda: time.sleep(0.5) or "done")
    assert [g[2] for g in got] == ["done"] * ctx.size
    assert max(g[0] for g in got) < min(g[1] for g in got), got  # side by side, not in turns


def test_groups_and_islands_compile_each_for_itself(ctx, monkeypatch):
    """A context over another communicator than COMM_WORLD (a study's group, an island): its
    programs hold a handle each rank allocated for itself, so there is nothing to share."""
    monkeypatch.delenv(ENV, raising=False)
    sub = ctx.split(0)
    everyone = ctx.comm_ctl.allgather((shared_compilation(sub), shared_compilation(ctx)))
    assert everyone == [(False, ctx.size > 1)] * ctx.size, everyone


def test_programs_of_differing_handles_are_not_shared(ctx):
    """Where the ranks' programs would hold different communicator handles (Open MPI's are
    addresses), the others would find nothing to load: no turns."""
    from mpi4py import MPI

    from hpcevo.parallel.compiling import _agree

    if ctx.node_comm.size == 1:
        return
    odd = MPI.COMM_SELF if ctx.node_comm.rank == ctx.node_comm.size - 1 else MPI.COMM_WORLD
    everyone = ctx.comm_ctl.allgather((_agree(ctx.node_comm, True, MPI.COMM_WORLD),
                                       _agree(ctx.node_comm, True, odd), _agree(ctx.node_comm, False, MPI.COMM_WORLD)))
    assert everyone == [(True, False, False)] * ctx.size, everyone
