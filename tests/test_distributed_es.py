"""The distributed ES mode (``algorithm.distributed = true``: OpenES, SNES, PGPE) against the
replicated mode on this job's ranks. Rank-count invariance of the distributed mode itself is in
tests/test_algorithms_digest.py (its distributed cases: N ranks == 1 rank, from a config)."""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import PGPE, SNES, OpenES
from hpcevo.driver.engine import state_digest
from hpcevo.errors import ConfigError
from hpcevo.parallel import context_for
from hpcevo.problems import make_problem

# Splits of rows over 1, 2 and 3 ranks (3: uneven); a 4th rank splits them evenly again and
# adds nothing but collectives (tests/test_parallel.py and the digest matrix run at 4).
pytestmark = pytest.mark.ranks(1, 2, 3)

single = pytest.mark.single_process

# Odd unit counts and small blocks: the last block is padded, and the blocks split unevenly over
# 2, 3 and 4 ranks (some ranks get none at 4 ranks for SNES).
CASES = [
    (OpenES, {"pop_size": 10, "block": 2, "sigma_decay": 0.99}, "sphere", 4),
    (SNES, {"pop_size": 7, "block": 3}, "rastrigin", 3),
    (PGPE, {"pop_size": 8, "block": 1, "optimizer": "clipup"}, "ackley", 4),
]


def _without_noise(state):
    # The replicated mode keeps the asked noise (pop, dim) in its state for tell; the
    # distributed mode keeps none (shape (0, dim)): everything else must be equal.
    return state._replace(algo=state.algo._replace(z=None))


@pytest.mark.parametrize("cls,kw,name,dim", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.slow
def test_distributed_mode_equals_the_replicated_mode_bitwise(ctx, references, request, cls, kw, name, dim):
    """The distributed mode on this job's ranks against the replicated mode (on one rank: its
    rank-count invariance is tested on its own, so any rank count's run would do)."""
    prob = make_problem(name, dim)
    replicated = cls(dim=dim, lb=prob.lb, ub=prob.ub, **kw)
    distributed = dataclasses.replace(replicated, distributed=True)

    def outcome(loop):
        state = jax.device_get(loop.state)
        return {"noise": list(state.algo.z.shape), "state": state_digest(_without_noise(state)),
                "history": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in loop.history.items()}}

    def run(algo, c):
        return hpcevo.Loop(algo, prob, c).compile(3).init(3).advance(7)

    want = references.get(request, "replicated", lambda: outcome(run(replicated, ctx if ctx.size == 1 else
                                                                     context_for(MPI.COMM_SELF))))
    loop = run(distributed, ctx)
    got = outcome(loop)
    assert want["noise"] == [replicated.units, dim] and got["noise"] == [0, dim]
    assert loop.generation == 8 and len(loop.history["best"]) == 8
    assert got["state"] == want["state"] and got["history"] == want["history"]
    # and it optimises: the best seen improved on the initial population's
    assert loop.best_fitness < float(loop.history["best"][0])


@single
def test_distributed_mode_refuses_micro_batch_settings(tmp_path):
    data = {
        "run": {"name": "d", "seed": 1, "generations": 2, "out": str(tmp_path)},
        "algorithm": {"name": "openes", "pop_size": 8, "distributed": True},
        "problem": {"name": "sphere", "dim": 3},
    }
    for section, key in (("parallel", "microbatch"), ("evaluation", "batch_size")):
        with pytest.raises(ConfigError, match=f"'{section}.{key}' does not apply .* set algorithm.block"):
            hpcevo.load_config({**data, section: {key: 2}})
    with pytest.raises(ValueError, match="block must be >= 0"):
        OpenES(pop_size=8, dim=2, lb=(0.0, 0.0), ub=(1.0, 1.0), distributed=True, block=-1)
