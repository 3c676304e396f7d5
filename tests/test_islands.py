"""Islands: several populations on groups of ranks (or several per rank), deterministic
migration, and the promise that the layout of islands on ranks never changes a bit.

The MPI tests run at every rank count of the suite, so 8 islands meet 1, 2, 3 and 4 ranks
(several islands per rank, and groups of uneven size); tests/test_islands_jobs.py adds 8 and 16
ranks and a run stopped by SIGTERM.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hpcevo
from hpcevo import checkpoint
from hpcevo.algorithms import ALGORITHMS, CSO, DE, PSO
from hpcevo.algorithms import migration as mig
from hpcevo.errors import ConfigError, DivergenceError
from hpcevo.parallel.islands import IslandLayout
from hpcevo.problems import make_problem

ROOT = Path(__file__).resolve().parents[1]


def example(name: str, out: Path, *sets: str):
    return hpcevo.load_config(ROOT / "examples" / name, overrides=[f"run.out={str(out)!r}", *sets])


def outcome(summary: dict) -> dict:
    return {"digest": summary["state_digest"], "best": summary["best_fitness"],
            "islands": [r["best_fitness"] for r in summary["islands"]]}


# -- the layout --------------------------------------------------------------------------------
@pytest.mark.single_process
def test_every_layout_places_each_island_and_each_rank_once_and_evenly():
    for count in range(1, 13):
        for size in range(1, 19):
            views = [IslandLayout(count, size, r) for r in range(size)]
            hosted = [v.local for v in views]
            assert all(hosted), (count, size)  # every rank has an island
            if size >= count:
                groups = [v.ranks_of(i) for i, v in zip(range(count), views)]
                assert sorted(r for g in groups for r in g) == list(range(size))  # each rank in one group
                assert all(list(g) == list(range(g[0], g[-1] + 1)) for g in groups)  # contiguous
                assert max(map(len, groups)) - min(map(len, groups)) <= 1
            else:
                assert sorted(i for h in hosted for i in h) == list(range(count))  # each island once
                assert max(map(len, hosted)) - min(map(len, hosted)) <= 1
            ranks, slots = views[0].table_index()
            for i in range(count):  # the exchange reads island i from its group's leader
                assert hosted[ranks[i]][slots[i]] == i and ranks[i] == views[0].ranks_of(i)[0]


# -- migration, pure ---------------------------------------------------------------------------
@pytest.mark.single_process
def test_emigrants_and_replacement_pick_what_they_say():
    f = jnp.asarray([3.0, jnp.nan, 1.0, 5.0, 1.0, jnp.inf])
    x = jnp.arange(6.0)[:, None] * jnp.ones((1, 2))
    ex, ef = mig.emigrants(x, f, 3, "best", jax.random.PRNGKey(0))
    assert ef.tolist() == [1.0, 1.0, 3.0] and ex[:, 0].tolist() == [2.0, 4.0, 0.0]  # ties by index
    rx, rf = mig.emigrants(x, f, 4, "random", jax.random.PRNGKey(1))
    assert len(set(rx[:, 0].tolist())) == 4  # distinct rows
    new_x, new_f = jnp.full((2, 2), -1.0), jnp.asarray([-7.0, -8.0])
    x2, f2 = mig.replace(x, f, new_x, new_f, "worst", jax.random.PRNGKey(0))
    assert np.isnan(f).sum() == 1 and f2.tolist()[:1] == [3.0]
    assert f2[1] == -7.0 and f2[5] == -8.0  # NaN is the worst, then +inf
    assert (x2[jnp.asarray([1, 5])] == -1.0).all() and (x2[jnp.asarray([0, 2, 3, 4])] == x[jnp.asarray([0, 2, 3, 4])]).all()
    x3, f3 = mig.replace(x, f, new_x, new_f, "random", jax.random.PRNGKey(3))
    assert sorted(np.asarray(f3)[np.asarray(f3) < 0].tolist()) == [-8.0, -7.0]


@pytest.mark.single_process
def test_topologies_send_once_take_once_and_never_from_themselves():
    for k in (2, 3, 8):
        assert mig.sources("ring", k, jax.random.PRNGKey(0)).tolist() == [(i - 1) % k for i in range(k)]
        seen = set()
        for g in range(20):
            src = mig.sources("random", k, mig.migration_key(jax.random.PRNGKey(5), jnp.asarray(g))).tolist()
            assert sorted(src) == list(range(k)) and all(s != i for i, s in enumerate(src))
            # one cycle through every island: follow the sources from island 0
            i, visited = 0, []
            for _ in range(k):
                visited.append(i)
                i = src[i]
            assert sorted(visited) == list(range(k))
            seen.add(tuple(src))
        assert len(seen) > 1 or k == 2  # fresh each migration
    table_x = jnp.arange(3 * 2 * 1.0).reshape(3, 2, 1)
    table_f = jnp.asarray([[0.0, 9.0], [5.0, 1.0], [2.0, 7.0]])
    ix, iff = mig.immigrants(table_x, table_f, 0, None, 2)  # "all": the best of the others
    assert iff.tolist() == [1.0, 2.0] and ix[:, 0].tolist() == [3.0, 4.0]


@pytest.mark.single_process
@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.migrates))
def test_with_population_replaces_what_population_reads(name):
    p = make_problem("sphere", 4)
    a = ALGORITHMS[name](pop_size=10, dim=4, lb=p.lb, ub=p.ub)
    state = a.init(jax.random.PRNGKey(0))
    x, state = a.init_ask(state)
    state = a.init_tell(state, jnp.sum(x**2, axis=1))
    px, pf = a.population(state)
    nx, nf = px + 0.25, pf - 100.0
    qx, qf = a.population(a.with_population(state, nx, nf))
    assert (qx == nx).all() and (qf == nf).all()


@pytest.mark.single_process
def test_a_better_immigrant_becomes_the_swarm_best_of_pso():
    p = make_problem("sphere", 3)
    a = PSO(pop_size=6, dim=3, lb=p.lb, ub=p.ub)
    s = a.init(jax.random.PRNGKey(0))
    x, s = a.init_ask(s)
    s = a.tell(s, jnp.sum(x**2, axis=1))
    px, pf = a.population(s)
    s2 = a.with_population(s, px.at[2].set(0.0), pf.at[2].set(-1.0))
    assert float(s2.gbest_fitness) == -1.0 and (s2.gbest_position == 0).all()


# -- the config --------------------------------------------------------------------------------
BASE = {"algorithm": {"name": "cso", "pop_size": 16}, "problem": {"name": "sphere", "dim": 4},
        "islands": {"count": 4, "migrants": 2}}


def with_islands(**islands) -> dict:
    return {**BASE, "islands": {**BASE["islands"], **islands}}


@pytest.mark.single_process
@pytest.mark.parametrize("islands, key, words", [
    ({"island": [{"at": [4], "algorithm": {"name": "de"}}]}, "islands.island[0].at", "island 4 does not exist"),
    ({"island": [{"at": 1, "algorithm": {"name": "de"}}, {"at": [1], "algorithm": {"name": "ga"}}]},
     "islands.island[1].at", "changed by two"),
    ({"migrants": 17}, "islands.migrants", "population of 16"),
    ({"island": [{"at": 2, "algorithm": {"name": "cmaes"}}]}, "islands", "search distribution"),
    ({"island": [{"at": 2, "algorithm": {"name": "de", "F": "high"}}]}, "islands.island", "island 2"),
    ({"topology": "star"}, "islands.topology", "'ring', 'all' or 'random'"),
    ({"count": 0}, "islands.count", "greater than or equal to 1"),
])
def test_bad_islands_are_one_clear_config_error(islands, key, words):
    with pytest.raises(ConfigError) as e:
        hpcevo.load_config(with_islands(**islands))
    assert e.value.key == key and words in str(e.value), str(e.value)


@pytest.mark.single_process
def test_island_entries_change_the_islands_they_name():
    from hpcevo.driver import build

    cfg = hpcevo.load_config(with_islands(island=[
        {"at": [1, 3], "algorithm": {"name": "de", "strategy": "current-to-best/1/bin"}},
        {"at": 2, "algorithm": {"phi": 0.05}},
    ]))
    problem = build.build_problem(cfg)
    algorithms, names = build.build_islands(cfg, problem, build.build_algorithm(cfg, problem))
    assert names == ["cso", "de", "cso", "de"]
    assert isinstance(algorithms[1], DE) and algorithms[1].strategy == "current-to-best/1/bin"
    assert algorithms[1].pop_size == 16  # the run's pop_size, the new algorithm's defaults
    assert isinstance(algorithms[2], CSO) and algorithms[2].phi == 0.05 and algorithms[0].phi != 0.05
    # an entry without `at` is for the island at its position
    cfg = hpcevo.load_config(with_islands(island=[{}, {"algorithm": {"name": "ga", "pop_size": 8}}]))
    algorithms, names = build.build_islands(cfg, problem, build.build_algorithm(cfg, problem))
    assert names == ["cso", "ga", "cso", "cso"] and algorithms[1].pop_size == 8


# -- whole runs at every rank count --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["islands.toml", "islands_portfolio.toml"])
def test_examples_give_one_digest_at_every_rank_count(ctx, alone, shared_tmp, references, request, name):
    sets = ["run.generations=60", "log.every=20", "islands.migrate_every=10"]
    here = hpcevo.run(example(name, shared_tmp / "here", *sets), quiet=True, ctx=ctx).summary

    def one_rank():
        return outcome(hpcevo.run(example(name, shared_tmp / "alone", *sets), quiet=True, ctx=alone).summary)

    want = references.get(request, "summary", lambda: outcome(here) if ctx.size == 1 else one_rank())
    assert outcome(here) == want
    count = hpcevo.load_config(ROOT / "examples" / name).islands.count
    assert here["ranks"] == ctx.size and len(here["islands"]) == count
    if ctx.is_root:
        recs = [json.loads(x) for x in (shared_tmp / "here" / "metrics.jsonl").read_text().splitlines()]
        assert [r["generation"] for r in recs] == [20, 40, 60]
        assert [len(r["islands"]) for r in recs] == [count] * 3
        assert recs[-1]["best"] == min(r["best"] for r in recs[-1]["islands"]) == here["best_fitness"]
        run = hpcevo.open_run(shared_tmp / "here")
        assert run.metrics[f"island{count - 1}.best"].shape == (3,)
        newest = checkpoint.list_checkpoints(shared_tmp / "here" / "checkpoints")[0]
        hist = checkpoint.read_history(newest)
        assert len(hist["best"]) == 60 and all(f"island{i}.best" in hist for i in range(count))
    ctx.comm_ctl.Barrier()


@pytest.mark.slow
def test_a_checkpoint_holds_every_island_and_resumes_at_another_rank_count(ctx, alone, shared_tmp):
    # The programs of the test above (same islands, same migration): only the lengths differ.
    sets = ["log.every=10", "islands.migrate_every=10"]
    whole = hpcevo.run(example("islands_portfolio.toml", shared_tmp / "whole", "run.generations=40", *sets),
                       quiet=True, ctx=ctx).summary
    first = hpcevo.run(example("islands_portfolio.toml", shared_tmp / "split", "run.generations=25", *sets),
                       quiet=True, ctx=ctx).summary
    assert first["generations"] == 25
    if ctx.is_root:  # the rest on one rank alone: another rank count whenever size > 1
        path = checkpoint.list_checkpoints(shared_tmp / "split" / "checkpoints")[0]
        assert checkpoint.verify_file(path).problem is None
        rest = hpcevo.run(example("islands_portfolio.toml", shared_tmp / "split", "run.generations=40", *sets),
                          resume=True, quiet=True, ctx=ctx if ctx.size == 1 else alone).summary
        assert rest["resumed_from"] == 25 and rest["state_digest"] == whole["state_digest"]
        assert [r["best_fitness"] for r in rest["islands"]] == [r["best_fitness"] for r in whole["islands"]]
    ctx.comm_ctl.Barrier()


@pytest.mark.slow
@pytest.mark.parametrize("topology, emigrants, replace", [
    ("ring", "best", "worst"), ("all", "random", "random"), ("random", "best", "random")])
def test_every_migration_choice_is_the_same_run_at_every_layout(ctx, alone, references, request, topology, emigrants,
                                                               replace):
    p = make_problem("rastrigin", 6)
    algorithms = [(CSO, DE, PSO)[i](pop_size=12 + i, dim=6, lb=p.lb, ub=p.ub) for i in range(3)]
    how = mig.Migration(every=3, migrants=2, topology=topology, emigrants=emigrants, replace=replace)

    def run(c):
        a = hpcevo.Archipelago(algorithms, p, c, how).init(4).advance(11)
        return {"digest": a.digest(), "best": a.best_fitness, "history": a.history["best"].tolist()}

    here = run(ctx)
    assert here == references.get(request, "run", lambda: here if ctx.size == 1 else run(alone))
    # migration moved candidates: without it the same islands end elsewhere
    if ctx.is_root and topology == "ring":
        still = hpcevo.Archipelago(algorithms, p, alone, how._replace(migrants=0)).init(4).advance(11)
        assert still.digest() != here["digest"]
    ctx.comm_ctl.Barrier()


def test_the_replica_check_covers_each_islands_group(ctx):
    p = make_problem("sphere", 3)
    a = hpcevo.Archipelago([CSO(pop_size=8, dim=3, lb=p.lb, ub=p.ub)] * 2, p, ctx,
                           mig.Migration(every=2, migrants=1)).init(0).advance(3)
    a.check_replicas()  # sound replicas pass
    group = a.engine.layout.ranks_of(a.local[0])
    if len(group) > 1 and ctx.rank == group[-1]:  # one rank of a group of two or more drifts
        s = a.state[0]
        a.state = (s._replace(best_f=s.best_f + 1),)
    drifted = any(len(a.engine.layout.ranks_of(i)) > 1 for i in range(2))
    if drifted:
        with pytest.raises(DivergenceError, match="island .'s replicated state diverged"):
            a.check_replicas()
    else:  # one rank per island or fewer: nothing is replicated, nothing to compare
        a.check_replicas()


# -- limits and COCO data: the archipelago as one optimiser ---------------------------------------
def bbob_islands(out: Path, *sets: str):
    """Three CSO islands on BBOB f1 (5-D): a target within reach in about 50 generations."""
    return example("islands.toml", out, "problem.name='bbob'", "problem.function=1", "problem.instance=1",
                   "problem.dim=5", "islands.count=3", "log.every=10", "islands.migrate_every=10", *sets)


def coco_files(folder: Path) -> dict[str, bytes]:
    """What cocopp reads (the logger's own resume states name their folder: left out)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".hpcevo" not in p.parts}


@pytest.mark.slow
@pytest.mark.ranks(1, 2, 3)  # (3 islands: all on a rank, two on one, one each; groups of ranks: above)
def test_islands_end_where_a_target_or_budget_is_met_with_the_bits_of_that_many_generations(ctx, alone, shared_tmp):
    """run.target_precision, run.evaluations and log.coco with [islands]: the run ends at the first
    generation where the best of all islands meets the target (or the evaluations of all islands
    reach the budget), with the digest of a run of exactly that many generations, and its COCO
    data (every evaluation, generation by generation, island by island) the same at any layout."""
    hit = hpcevo.run(bbob_islands(shared_tmp / "hit", "run.target_precision=1e-3", "log.coco=true"),
                     quiet=True, ctx=ctx).summary
    g = hit["generations"]
    assert 1 < g < 300 and hit["stopped_by"].startswith("run.target_precision")
    assert hit["best_precision"] <= 1e-3
    if ctx.is_root:
        hist = checkpoint.read_history(checkpoint.list_checkpoints(shared_tmp / "hit" / "checkpoints")[0])
        assert hist["best"][-2] - 79.48 > 1e-3  # (f_opt of f1, instance 1): not met a generation earlier
        plain = hpcevo.run(bbob_islands(shared_tmp / "plain", f"run.generations={g}"), quiet=True, ctx=alone).summary
        assert plain["state_digest"] == hit["state_digest"] and plain["evaluations"] == hit["evaluations"]
        one = hpcevo.run(bbob_islands(shared_tmp / "one", "run.target_precision=1e-3", "log.coco=true"),
                         quiet=True, ctx=ctx if ctx.size == 1 else alone).summary
        assert one["state_digest"] == hit["state_digest"]
        coco = coco_files(shared_tmp / "hit" / "coco")
        assert coco == coco_files(shared_tmp / "one" / "coco")
        dat = [line.split() for line in coco["data_f1/bbobexp_f1_DIM5.dat"].decode().splitlines() if line[0] != "%"]
        assert int(dat[-1][0]) == hit["evaluations"]  # every evaluation logged, none twice
        assert float(dat[-1][2]) == pytest.approx(hit["best_precision"], rel=1e-9)
    # a budget: the generation whose evaluations (every island's) reach it is the last
    spent = hpcevo.run(bbob_islands(shared_tmp / "budget", "run.evaluations=3000"), quiet=True, ctx=ctx).summary
    per = 3 * 32  # (three CSO islands of 64: 32 new candidates each a generation, 64 in the first)
    assert spent["evaluations"] == 3 * 64 + (spent["generations"] - 1) * per
    assert spent["evaluations"] - per < 3000 <= spent["evaluations"]
    assert spent["stopped_by"].startswith("run.evaluations")
    ctx.comm_ctl.Barrier()


@pytest.mark.slow
@pytest.mark.ranks(1, 3)
def test_islands_with_coco_data_resume_to_the_files_and_digest_of_a_run_never_stopped(ctx, alone, shared_tmp):
    sets = ["run.target_precision=1e-3", "log.coco=true", "checkpoint.every=10"]
    whole = hpcevo.run(bbob_islands(shared_tmp / "whole", *sets), quiet=True, ctx=ctx).summary
    first = hpcevo.run(bbob_islands(shared_tmp / "split", *sets, "run.generations=20"), quiet=True, ctx=ctx).summary
    assert first["generations"] == 20
    if ctx.is_root:  # the rest on one rank: another rank count whenever size > 1
        rest = hpcevo.run(bbob_islands(shared_tmp / "split", *sets), resume=True, quiet=True,
                          ctx=ctx if ctx.size == 1 else alone).summary
        assert rest["resumed_from"] == 20 and rest["generations"] == whole["generations"]
        assert rest["state_digest"] == whole["state_digest"]
        assert coco_files(shared_tmp / "split" / "coco") == coco_files(shared_tmp / "whole" / "coco")
    ctx.comm_ctl.Barrier()


@pytest.mark.slow
@pytest.mark.ranks(1, 3)
def test_an_archipelagos_limits_and_observer_cover_every_island(ctx):
    """The API: ``Archipelago.limit`` as ``Loop.limit`` over all islands (a target met inside a
    dispatch ends it there, with the bits of that many generations), and ``observe`` hears every
    evaluation, generation by generation, island by island."""
    p = make_problem("sphere", 4)
    algorithms = [(CSO, DE, PSO)[i](pop_size=10 + 2 * i, dim=4, lb=p.lb, ub=p.ub) for i in range(3)]
    how = mig.Migration(every=4, migrants=2)
    seen: list[np.ndarray] = []
    a = hpcevo.Archipelago(algorithms, p, ctx, how, observe=seen.append).init(5).advance(39)
    assert sum(len(f) for f in seen) == a.evaluations
    f = np.concatenate(seen)
    at = 0
    for g in range(40):  # each generation's values, island after island: each island's best of it
        for i, alg in enumerate(a.algorithms):
            n = alg.num_init if g == 0 else alg.num_ask
            assert f[at:at + n].min() == a.island_history(i)["gen_best"][g], (g, i)
            at += n
    target = float(a.history["best"][29])  # first met at generation 30 or before
    first = int(np.argmax(a.history["best"] <= target)) + 1
    b = hpcevo.Archipelago(algorithms, p, ctx, how).limit(target=target).init(5).advance(100)
    assert b.generation == first and b.met == "target"
    assert b.digest() == hpcevo.Archipelago(algorithms, p, ctx, how).init(5).advance(first - 1).digest()
    b.advance(10)  # met: nothing more
    assert b.generation == first
    c = hpcevo.Archipelago(algorithms, p, ctx, how).limit(evaluations=a.evaluations - 1).init(5).advance(100)
    assert c.generation == 40 and c.met == "evaluations"
    d = hpcevo.Archipelago(algorithms, p, ctx, how).limit(stagnation=3, tolerance=1e30).init(5).advance(100)
    assert d.generation == 4 and d.met == "stagnation"
    with pytest.raises(hpcevo.UsageError, match="'evaluations' must be >= 1"):
        hpcevo.Archipelago(algorithms, p, ctx, how).limit(evaluations=0)
