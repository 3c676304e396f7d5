"""The distributed ES mode (``algorithm.distributed = true``: OpenES, SNES, PGPE) against the
replicated mode on this job's ranks. Rank-count invariance of the distributed mode itself is in
tests/test_algorithms_digest.py (its distributed cases: N ranks == 1 rank, from a config)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from hpcevo.algorithms import PGPE, SNES, OpenES
from hpcevo.config import config_from_dict
from hpcevo.errors import ConfigError
from hpcevo.problems import make_problem
from hpcevo.workflow import Workflow

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
def test_distributed_mode_equals_the_replicated_mode_bitwise(ctx, cls, kw, name, dim):
    prob = make_problem(name, dim)
    replicated = cls(dim=dim, lb=prob.lb, ub=prob.ub, **kw)
    distributed = dataclasses.replace(replicated, distributed=True)
    runs = {}
    for algo in (replicated, distributed):
        wf = Workflow(algo, prob.evaluate, ctx)
        state, first = wf.start(3)
        state, rest = wf.advance(state, 7)
        runs[algo.distributed] = jax.device_get(state), first, rest
    (rs, r1, r2), (ds, d1, d2) = runs[False], runs[True]
    assert rs.algo.z.shape == (replicated.units, dim) and ds.algo.z.shape == (0, dim)
    assert int(ds.generation) == 8
    for a, b in zip(jax.tree_util.tree_leaves(_without_noise(rs)), jax.tree_util.tree_leaves(_without_noise(ds))):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for h, g in ((r1, d1), (r2, d2)):
        for k in h:
            assert h[k].tobytes() == g[k].tobytes(), k
    # and it optimises: the best seen improved on the initial population's
    assert float(ds.best_f) < float(d1["best"][0])


@single
def test_distributed_mode_refuses_micro_batch_settings(tmp_path):
    data = {
        "run": {"name": "d", "seed": 1, "generations": 2, "out": str(tmp_path)},
        "algorithm": {"name": "openes", "pop_size": 8, "distributed": True},
        "problem": {"name": "sphere", "dim": 3},
    }
    for section, key in (("parallel", "microbatch"), ("evaluation", "batch_size")):
        with pytest.raises(ConfigError, match=f"'{section}.{key}' does not apply .* set algorithm.block"):
            config_from_dict({**data, section: {key: 2}})
    with pytest.raises(ValueError, match="block must be >= 0"):
        OpenES(pop_size=8, dim=2, lb=(0.0, 0.0), ub=(1.0, 1.0), distributed=True, block=-1)
