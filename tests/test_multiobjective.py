"""Multi-objective: problems and fronts against pymoo, indicators against moocore, dominance
sorting and crowding against pymoo, NSGA-II and MOEA/D behaviour, config checks, and a
multi-objective run resumed at another rank count."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import moocore
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo import checkpoint
from hpcevo.algorithms import MOEAD, NSGA2
from hpcevo.algorithms.mo import crowded_order, crowding_distance, non_dominated, non_dominated_rank
from hpcevo.errors import ConfigError
from hpcevo.indicators import hypervolume, igd
from hpcevo.parallel import context_for
from hpcevo.problems import MO_PROBLEMS, make_problem

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

single = pytest.mark.single_process


# -- problems ------------------------------------------------------------------------------------
def _pymoo_problem(name, dim, m):
    from pymoo.problems import get_problem

    return get_problem(name, n_var=dim) if name.startswith("zdt") else get_problem(name, n_var=dim, n_obj=m)


@single
@pytest.mark.parametrize("name", list(MO_PROBLEMS))
def test_problem_values_match_pymoo(name):
    m = 2 if name.startswith("zdt") else 3
    dim = 10 if name.startswith("zdt") else 8
    ours = make_problem(name, dim)
    theirs = _pymoo_problem(name, dim, m)
    assert ours.num_objectives == m
    assert np.allclose(ours.lb, theirs.xl) and np.allclose(ours.ub, theirs.xu)
    rng = np.random.default_rng(1)
    x = rng.uniform(theirs.xl, theirs.xu, (64, dim))
    x[:4] = np.clip(x[:4], 0.2, 0.8)  # away from the box edges, where DTLZ4's x^100 underflows
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(ours.evaluate)(jnp.asarray(x)))
    np.testing.assert_allclose(got, theirs.evaluate(x), rtol=1e-10, atol=1e-12)


@single
@pytest.mark.parametrize("name,m", [("zdt1", 2), ("zdt2", 2), ("zdt3", 2), ("zdt4", 2), ("zdt6", 2),
                                    ("dtlz1", 3), ("dtlz2", 3), ("dtlz2", 2), ("dtlz4", 3)])
def test_pareto_fronts_match_pymoo(name, m):
    """Our reference points and pymoo's lie on the same front: each set is close to the other,
    and no point of ours dominates another."""
    ours = make_problem(name, 12, objectives=None if name.startswith("zdt") else m)
    front = ours.pareto_front()
    assert front.shape[1] == m and len(front) >= 100
    kw = {} if name.startswith("zdt") else {"ref_dirs": _ref_dirs(m)}
    theirs = _pymoo_problem(name, 12, m).pareto_front(**kw)
    assert moocore.igd(front, ref=theirs) < 0.02  # each of their points is near one of ours
    assert moocore.igd(theirs, ref=front) < 0.02  # and each of ours near one of theirs
    assert len(moocore.filter_dominated(front)) == len(front)


@single
@pytest.mark.parametrize("name,m", [("dtlz5", 3), ("dtlz6", 3), ("dtlz7", 3), ("dtlz7", 2)])
def test_pareto_fronts_match_the_problems_optimal_sets(name, m):
    """Fronts pymoo does not compute offline: the non-dominated images of many random
    Pareto-optimal decision vectors (g minimal: x_M = 0.5 for DTLZ5, 0 for DTLZ6/7) lie on ours."""
    ours = make_problem(name, 10, objectives=m)
    x = np.random.default_rng(0).random((20000, 10))
    x[:, m - 1:] = 0.5 if name == "dtlz5" else 0.0
    with jax.enable_x64(True):
        image = moocore.filter_dominated(np.asarray(jax.jit(ours.evaluate)(jnp.asarray(x))))
    front = ours.pareto_front()
    assert moocore.igd(image, ref=front) < 0.02 and moocore.igd(front, ref=image) < 0.02


def _ref_dirs(m):
    from pymoo.util.ref_dirs import get_reference_directions

    return get_reference_directions("das-dennis", m, n_partitions=40)


@single
def test_problem_arguments_are_checked():
    with pytest.raises(ValueError, match="zdt1 has 2 objectives, got objectives = 3"):
        make_problem("zdt1", 30, objectives=3)
    with pytest.raises(ValueError, match=r"dtlz2: dim must be >= 4 \(the number of objectives\)"):
        make_problem("dtlz2", 3, objectives=4)
    with pytest.raises(ValueError, match="sphere is single-objective"):
        make_problem("sphere", 3, objectives=2)
    with pytest.raises(ValueError, match="did you mean 'zdt1'.*multi-objective: zdt1"):
        make_problem("zdt11", 3)
    p = make_problem("dtlz3", 12, objectives=5)
    assert p.num_objectives == 5 and p.evaluate(jnp.zeros((4, 12))).shape == (4, 5)


# -- indicators ----------------------------------------------------------------------------------
def _fixed_fronts():
    rng = np.random.default_rng(7)
    out = []
    for m, n in ((2, 1), (2, 400), (3, 1), (3, 300)):
        f = rng.random((n, m))
        if m == 3:
            f = f / np.linalg.norm(f, axis=1, keepdims=True)  # many mutually non-dominated points
        f[: n // 5] += 0.5  # some points outside the reference box, some dominated
        out.append((f, rng.random(n) < 0.85))
    f = make_problem("zdt3", 30).pareto_front()  # a real front, disconnected
    out.append((f, np.ones(len(f), bool)))
    return out


@single
@pytest.mark.slow
def test_hypervolume_and_igd_match_moocore_to_1e9():
    with jax.enable_x64(True):
        for f, mask in _fixed_fronts():
            m = f.shape[1]
            ref = np.full(m, 1.1)
            reference = np.random.default_rng(m).random((50, m))
            hv = float(jax.jit(hypervolume)(jnp.asarray(f), jnp.asarray(ref), jnp.asarray(mask)))
            inside = f[mask][np.all(f[mask] < ref, axis=1)]
            expect = float(moocore.hypervolume(inside, ref=ref)) if len(inside) else 0.0
            assert abs(hv - expect) <= 1e-9 * max(1.0, expect), (m, len(f), hv, expect)
            d = float(jax.jit(igd)(jnp.asarray(f), jnp.asarray(reference), jnp.asarray(mask)))
            assert abs(d - float(moocore.igd(f[mask], ref=reference))) <= 1e-9


@single
@pytest.mark.slow
def test_hypervolume_corner_cases():
    with jax.enable_x64(True):
        ref = jnp.asarray([1.0, 1.0, 1.0])
        one = jnp.asarray([[0.5, 0.5, 0.5]])
        assert float(hypervolume(one, ref)) == 0.125
        dup = jnp.asarray([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9], [1.0, 0.1, 0.1]])
        assert float(hypervolume(dup, ref)) == 0.125  # duplicates, dominated, on the boundary
        assert float(hypervolume(dup, ref, jnp.zeros(4, bool))) == 0.0


# -- sorting and crowding ------------------------------------------------------------------------
@single
@pytest.mark.slow
def test_non_dominated_sort_and_crowding_match_pymoo():
    from pymoo.operators.survival.rank_and_crowding.metrics import calc_crowding_distance
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

    rng = np.random.default_rng(3)
    for m in (2, 3):
        f = rng.random((120, m))
        ranks = np.asarray(non_dominated_rank(jnp.asarray(f, jnp.float32)))
        fronts = NonDominatedSorting().do(f.astype(np.float32))
        assert [sorted(np.flatnonzero(ranks == i)) for i in range(len(fronts))] == [sorted(fr) for fr in fronts]
        assert np.array_equal(np.asarray(non_dominated(jnp.asarray(f))), ranks == 0)
        with jax.enable_x64(True):
            cd = np.asarray(crowding_distance(jnp.asarray(f), jnp.asarray(ranks)))
        for fr in fronts:
            if len(fr) <= 2:  # all boundary points [Deb et al. 2002]
                assert np.all(np.isinf(cd[fr]))
                continue
            expect = calc_crowding_distance(f[fr]) * m  # pymoo averages over the objectives
            np.testing.assert_allclose(cd[fr], expect, rtol=1e-12)


@single
@pytest.mark.slow
def test_selection_among_exact_ties_is_by_index():
    f = jnp.asarray([[1.0, 2.0], [2.0, 1.0], [1.0, 2.0], [2.0, 1.0], [3.0, 3.0]])
    rank = non_dominated_rank(f)
    assert list(np.asarray(rank)) == [0, 0, 0, 0, 1]
    order = np.asarray(crowded_order(rank, crowding_distance(f, rank)))
    assert list(order) == [0, 1, 2, 3, 4]  # all boundary points (inf), so index order


# -- the algorithms ------------------------------------------------------------------------------
def _run(algo, prob, generations, seed=0):
    @jax.jit
    def go(key):
        s = algo.init(key)
        x, s = algo.init_ask(s)
        s = algo.init_tell(s, prob.evaluate(x))

        def body(s, _):
            x, s = algo.ask(s)
            return algo.tell(s, prob.evaluate(x)), None

        return jax.lax.scan(body, s, None, generations - 1)[0]

    return go(jax.random.PRNGKey(seed))


@single
@pytest.mark.parametrize("cls,name,pop,gens,kw,max_igd", [
    (NSGA2, "zdt1", 60, 150, {}, 0.05),
    (MOEAD, "zdt2", 60, 150, {}, 0.05),
    # Tchebycheff decomposition maps the simplex's edge weights onto the sphere's corners: pymoo's
    # MOEA/D with Tchebycheff (same T, 100 generations) ends at IGD 0.075, HV 0.70 here too.
    (MOEAD, "dtlz2", 91, 100, {"neighbours": 15}, 0.1),
    (NSGA2, "dtlz2", 92, 100, {}, 0.1),
])
@pytest.mark.slow
def test_converges_close_to_the_true_front(cls, name, pop, gens, kw, max_igd):
    prob = make_problem(name, 12)
    algo = cls(pop_size=pop, dim=12, lb=prob.lb, ub=prob.ub, num_objectives=prob.num_objectives, **kw)
    s = _run(algo, prob, gens)
    x, f = algo.population(s)
    assert np.all(np.asarray(x) >= np.asarray(prob.lb)) and np.all(np.asarray(x) <= np.asarray(prob.ub))
    front = np.asarray(f, np.float64)[np.asarray(non_dominated(f))]
    ref = prob.default_ref_point()
    best = moocore.hypervolume(prob.pareto_front(), ref=ref)
    assert moocore.hypervolume(front, ref=ref) > 0.85 * best  # a finite set: the continuum's HV is above reach
    assert moocore.igd(front, ref=prob.pareto_front()) < max_igd


@single
@pytest.mark.slow
def test_nsga2_survival_keeps_the_best_fronts_and_never_loses_the_front():
    prob = make_problem("zdt3", 8)
    algo = NSGA2(pop_size=20, dim=8, lb=prob.lb, ub=prob.ub, num_objectives=2)
    s = _run(algo, prob, 2)
    for _ in range(5):
        before = np.asarray(s.fitness)
        x, s = algo.ask(s)
        children = np.asarray(prob.evaluate(x))
        s = algo.tell(s, children)
        merged = np.concatenate([before, children])
        ranks = np.asarray(non_dominated_rank(jnp.asarray(merged)))
        kept = np.asarray(s.rank)
        # survivors are the best fronts: nobody left out has a better front than a survivor
        assert kept.max() <= np.sort(ranks)[algo.pop_size - 1]
        # the merged set's first front survives whole when it fits
        if (ranks == 0).sum() <= algo.pop_size:
            assert (kept == 0).sum() == (ranks == 0).sum()


@single
def test_moead_pop_size_and_neighbours_are_checked():
    kw = dict(dim=4, lb=(0.0,) * 4, ub=(1.0,) * 4, num_objectives=3)
    with pytest.raises(ValueError, match="100 is not: the nearest are 91 and 105"):
        MOEAD(pop_size=100, **kw)
    with pytest.raises(ValueError, match="neighbours must be in"):
        MOEAD(pop_size=15, neighbours=20, **kw)
    assert MOEAD(pop_size=7, dim=4, lb=kw["lb"], ub=kw["ub"], neighbours=3).pop_size == 7  # 2 objectives: any size


# -- configs and runs ----------------------------------------------------------------------------
def _mo_config(out, **over):
    data = {
        "run": {"name": "mo", "seed": 5, "generations": 20, "out": str(out)},
        "algorithm": {"name": "nsga2", "pop_size": 13},
        "problem": {"name": "zdt2", "dim": 6},
        "log": {"every": 5},
        "checkpoint": {"every": 10, "every_seconds": 0},
    }
    for key, value in over.items():
        section, name = key.split("__")
        data[section][name] = value
    return hpcevo.load_config(data)


@single
def test_config_refuses_mismatched_algorithm_and_problem(tmp_path):
    with pytest.raises(ConfigError, match="problem 'zdt2' has 2 objectives, but algorithm 'cso' optimises "
                                          "one; multi-objective algorithms: moead, nsga2"):
        _mo_config(tmp_path, algorithm__name="cso")
    with pytest.raises(ConfigError, match="algorithm 'nsga2' is multi-objective, but problem 'sphere' has 1 "
                                          "objective; single-objective algorithms: cmaes"):
        _mo_config(tmp_path, problem__name="sphere")
    with pytest.raises(ConfigError, match="'problem.ref_point': need 2 finite numbers"):
        _mo_config(tmp_path, problem__ref_point=[1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="exact hypervolume is computed for 2 and 3 objectives"):
        _mo_config(tmp_path, problem__name="dtlz2", problem__objectives=4, problem__ref_point=[1.0] * 4)
    with pytest.raises(ConfigError, match="unknown key 'algorithm.num_objectives'"):
        _mo_config(tmp_path, algorithm__num_objectives=2)


@pytest.mark.slow
def test_mo_run_logs_metrics_and_resumes_at_another_rank_count(ctx, shared_tmp):
    whole = hpcevo.run(_mo_config(shared_tmp / "whole"), quiet=True, ctx=ctx).summary
    first = hpcevo.run(_mo_config(shared_tmp / "split", run__generations=10), quiet=True, ctx=ctx).summary
    assert first["generations"] == 10
    if ctx.is_root:
        rest = hpcevo.run(_mo_config(shared_tmp / "split"), resume=True, quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        assert rest["resumed_from"] == 10 and rest["state_digest"] == whole["state_digest"]
        assert rest["front_f"] == whole["front_f"] and rest["hypervolume"] == whole["hypervolume"]
        # the summary's front is the population's non-dominated set, and its HV is the front's
        front = np.asarray(whole["front_f"])
        assert len(front) == whole["front_size"] > 0 and len(moocore.filter_dominated(front)) == len(front)
        assert np.isclose(moocore.hypervolume(front, ref=whole["ref_point"]), whole["hypervolume"], rtol=1e-5)
        assert whole["ref_point"] == pytest.approx([1.1, 1.1])
        recs = [json.loads(x) for x in (shared_tmp / "whole" / "metrics.jsonl").read_text().splitlines()]
        assert [r["generation"] for r in recs] == [5, 10, 15, 20]
        assert recs[-1]["hv"] == whole["hypervolume"] and recs[-1]["igd"] == whole["igd"]
        assert recs[0]["hv"] <= recs[-1]["hv"]
        # the checkpoints hold the front and per-generation indicators, equal after the resume
        ck = checkpoint.list_checkpoints(shared_tmp / "split" / "checkpoints")[0]
        a = checkpoint.read_history(shared_tmp / "whole" / "checkpoints" / ck.name)
        b = checkpoint.read_history(ck)
        assert sorted(a) == ["evaluations", "front_size", "hv", "igd", "nonfinite"] and len(a["hv"]) == 20
        assert list(a["evaluations"]) == [13] * 20  # rows used per generation (pop_size 13)
        for k in a:
            assert a[k].tobytes() == b[k].tobytes(), k
        import h5py

        with h5py.File(ck) as f:
            n = int(f["state/front_size"][()])
            assert np.array_equal(f["state/front_f"][:n], np.asarray(whole["front_f"], np.float32))
    ctx.comm_ctl.Barrier()
