"""Evaluation budgets and target stops that act at the generation they are met, IPOP- and
BIPOP-CMA-ES that count only the evaluations they use, CMA-ES's documented defaults and an
initial mean, and a run whose every evaluation fails (issue 28's friction points)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import CMAES, PGPE, SNES, XNES, OpenES, SepCMAES
from hpcevo.errors import ConfigError, UsageError
from hpcevo.parallel import context_for
from hpcevo.problems import make_problem

SPHERE = make_problem("sphere", 5)
RASTRIGIN = make_problem("rastrigin", 4)


def cmaes(problem=SPHERE, **kw):
    kw.setdefault("pop_size", 9)
    return CMAES(dim=problem.dim, lb=problem.lb, ub=problem.ub, **kw)


def config(out, generations=None, **run):
    cfg = {"run": {"name": "budget", "seed": 5, "out": str(out), **run},
           "algorithm": {"name": "cmaes", "restart": "bipop", "lambda0": 4, "pop_size": 64},
           "problem": {"name": "rastrigin", "dim": 3}, "log": {"every": 7}, "checkpoint": {"every": 0}}
    if generations is not None:
        cfg["run"]["generations"] = generations
    return cfg


# -- Loop.limit: evaluations and target, checked after every generation ------------------------
@pytest.mark.single_process
def test_budget_ends_the_loop_at_the_generation_that_reaches_it():
    loop = hpcevo.Loop(cmaes(), SPHERE).init(1).limit(evaluations=100)
    loop.advance(1000)  # one dispatch of up to 1,024 generations: the stop is inside it
    # 9 rows a generation: 100 is reached in generation 12 (108 evaluations), not at a boundary
    assert loop.met == "evaluations" and loop.generation == 12 and loop.evaluations == 108
    assert list(loop.history["evaluations"]) == [9] * 12
    free = hpcevo.Loop(cmaes(), SPHERE).init(1).advance(11)
    assert free.digest() == loop.digest() and free.met is None
    loop.advance(5)  # the budget is spent: nothing more runs
    assert loop.generation == 12
    loop.limit(evaluations=200).advance(1000)
    assert loop.generation == 23 and loop.evaluations == 207


@pytest.mark.single_process
def test_target_ends_the_loop_at_the_first_generation_whose_best_meets_it():
    free = hpcevo.Loop(cmaes(), SPHERE).init(2).advance(150)
    best = free.history["best"]
    target = float(best[97])  # met first at generation 98 (or where the best first got there)
    first = int(np.argmax(best <= np.float32(target))) + 1
    loop = hpcevo.Loop(cmaes(), SPHERE).init(2).limit(target=target).advance(1000)
    assert loop.met == "target" and loop.generation == first and loop.best_fitness <= target
    assert loop.digest() == hpcevo.Loop(cmaes(), SPHERE).init(2).advance(first - 1).digest()


def _first_stall(best, k, tol, dtype=np.float32):
    """hooks.Stagnation's rule over a history: the first generation g whose best improved by no
    more than tol over the k generations before it."""
    for g in range(k + 1, len(best) + 1):
        if dtype(best[g - 1 - k]) - dtype(best[g - 1]) <= dtype(tol):
            return g
    return None


@pytest.mark.single_process
def test_stagnation_ends_the_loop_where_the_hooks_rule_says_on_device_and_host():
    pso = hpcevo.algorithms.PSO(pop_size=16, dim=4, lb=RASTRIGIN.lb, ub=RASTRIGIN.ub)
    k, tol = 30, 1e-3
    stop = _first_stall(hpcevo.Loop(pso, RASTRIGIN).init(1).advance(599).history["best"], k, tol)
    assert stop is not None and stop > k + 1
    whole = hpcevo.Loop(pso, RASTRIGIN).init(1).limit(stagnation=k, tolerance=tol).advance(600)
    stepped = hpcevo.Loop(pso, RASTRIGIN).init(1).limit(stagnation=k, tolerance=tol)
    for _ in range(100):
        stepped.advance(7)  # the window crosses dispatches
    assert whole.generation == stepped.generation == stop and whole.met == stepped.met == "stagnation"
    assert whole.digest() == stepped.digest()

    def f(x):
        return np.sum(x * x - 10 * np.cos(2 * np.pi * x), axis=1) + 10 * x.shape[1]

    host_stop = _first_stall(hpcevo.Loop(pso, f, host=True).init(1).advance(599).history["best"], k, tol)
    host = hpcevo.Loop(pso, f, host=True).init(1).limit(stagnation=k, tolerance=tol).advance(600)
    assert host.generation == host_stop and host.met == "stagnation"


@pytest.mark.single_process
def test_limit_refuses_bad_values():
    loop = hpcevo.Loop(cmaes(), SPHERE)
    for kw, text in [({"evaluations": 0}, ">= 1"), ({"evaluations": 2.5}, "evaluations"),
                     ({"target": "low"}, "target"), ({"target": math.nan}, "nan"), ({"stagnation": 0}, ">= 1"),
                     ({"stagnation": 5, "tolerance": -1.0}, "tolerance")]:
        with pytest.raises(UsageError, match=text):
            loop.limit(**kw)
    mo = make_problem("zdt1", 4)
    with pytest.raises(UsageError, match="single-objective"):
        hpcevo.Loop(hpcevo.algorithms.NSGA2(pop_size=8, dim=4, lb=mo.lb, ub=mo.ub), mo).limit(target=0.1)


# -- IPOP and BIPOP: only the rows they use count -------------------------------------------------
@pytest.mark.single_process
@pytest.mark.parametrize("restart", ["ipop", "bipop"])
def test_restarts_count_only_the_rows_they_use(restart):
    algorithm = cmaes(RASTRIGIN, pop_size=128, restart=restart, lambda0=4)
    loop = hpcevo.Loop(algorithm, RASTRIGIN).init(0).advance(600)
    # When the restarts come, and which sizes BIPOP's draws give the small-population ones, depend
    # on float rounding (the second came later on an Intel host under jax 0.11; on another AMD host
    # two restarts used only 4 and 8 rows): go on until three populations were used, within a bound.
    while (int(loop.state.algo.restarts) < 2 or len(set(loop.history["evaluations"].tolist())) < 3) \
            and loop.generation < 3000:
        loop.advance(300)
    per_generation = loop.history["evaluations"]
    assert int(loop.state.algo.restarts) >= 2  # (several populations were used)
    assert loop.evaluations == int(per_generation.sum()) == int(loop.state.algo.evals)
    assert len(set(per_generation.tolist())) >= 3 and per_generation.max() <= 128
    assert loop.evaluations < loop.generation * 128  # not pop_size rows a generation


@pytest.mark.single_process
def test_a_host_problem_evaluates_only_the_rows_used():
    rows = []

    def f(x):
        rows.append(len(x))
        return np.sum(x * x, axis=1)

    algorithm = cmaes(RASTRIGIN, pop_size=64, restart="ipop", lambda0=4)
    loop = hpcevo.Loop(algorithm, f, host=True).init(0).advance(300)
    assert sum(rows) == loop.evaluations == int(loop.state.algo.evals)
    assert max(rows) < 64 <= loop.generation


@pytest.mark.single_process
def test_bipop_regimes_follow_pycmas_rules():
    """Every restart of a long BIPOP run, checked against the rules of pycma's fmin(bipop=True)."""
    a = cmaes(RASTRIGIN, pop_size=512, restart="bipop", lambda0=8, dtype="float32")
    lam0, sigma = 8, a._scales()[0]
    step = jax.jit(lambda s: a.tell(*(lambda x, s: (s, RASTRIGIN.evaluate(x)))(*a.ask(s))))
    s, seen = a.init(jax.random.PRNGKey(3)), 0
    small_runs = large_runs = 0
    for _ in range(4000):
        before, s = s, step(s)
        if int(s.restarts) == int(before.restarts):
            continue
        seen += 1
        ended = int(before.evals) + int(before.lam) - int(before.run_start)  # the ended run's rows
        spent = np.asarray(before.spent).copy()
        spent[int(before.regime)] += ended
        assert np.array_equal(np.asarray(s.spent), spent)
        L = int(before.large_runs)
        if spent[0] < max(1, spent[1]):  # small: random lambda and sigma, half the large budget
            small_runs += 1
            assert int(s.regime) == 0 and int(s.large_runs) == L
            assert lam0 <= int(s.lam) <= lam0 * 2**L
            assert 0.01 * sigma <= float(s.sigma0) <= sigma * (1 + 1e-6)
            assert int(s.max_gen) == min(a.max_gen_default, math.floor(0.5 * spent[1] / int(s.lam)))
        else:  # large: IPOP's doubling, the default sigma
            large_runs += 1
            assert int(s.regime) == 1 and int(s.large_runs) == L + 1
            assert int(s.lam) == min(lam0 * 2 ** (L + 1), 512) and float(s.sigma0) == pytest.approx(sigma)
            assert int(s.max_gen) == a.max_gen_default
        assert int(s.gen) == 0 and float(s.sigma) == float(s.sigma0)
    assert small_runs >= 3 and large_runs >= 3, (small_runs, large_runs)


# -- CMA-ES's defaults and x0 ---------------------------------------------------------------------
@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_cmaes_population_defaults_to_the_documented_lambda(tmp_path):
    for dim, restart, pop in [(2, "none", 6), (10, "none", 10), (40, "none", 15), (10, "ipop", 10 * 512),
                              (10, "bipop", 10 * 512)]:
        cfg = {"run": {"name": "d", "generations": 2, "out": str(tmp_path / f"{dim}{restart}")},
               "algorithm": {"name": "cmaes", "restart": restart}, "problem": {"name": "sphere", "dim": dim}}
        summary = hpcevo.run(cfg, quiet=True).summary
        assert summary["pop_size"] == pop and pop == (4 + int(3 * math.log(dim))) * (1 if restart == "none" else 512)
        assert f"pop_size = {pop}\n" in (tmp_path / f"{dim}{restart}" / "config.toml").read_text()
    cfg["algorithm"]["pop_size"] = 30  # (given: kept)
    cfg["run"]["out"] = str(tmp_path / "given")
    assert hpcevo.run(cfg, quiet=True).summary["pop_size"] == 30


@pytest.mark.single_process
@pytest.mark.parametrize("cls", [CMAES, SepCMAES, OpenES, SNES, XNES, PGPE])
def test_x0_is_the_first_mean(cls):
    x0 = (0.5, -1.0, 2.0, 0.0)
    kw = {"pop_size": 8, "dim": 4, "lb": -5.0, "ub": 5.0}
    state = cls(**kw, x0=x0).init(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(state.mean), np.float32(x0))
    other = cls(**kw).init(jax.random.PRNGKey(0))
    assert not np.array_equal(np.asarray(other.mean), np.float32(x0))
    # the key stream is the same with or without x0: only the mean differs
    assert np.array_equal(np.asarray(state.key), np.asarray(other.key))
    with pytest.raises(ConfigError, match="x0"):
        cls(**kw, x0=(1.0, 2.0))
    assert np.array_equal(np.asarray(cls(**kw, x0=1.5).init(jax.random.PRNGKey(0)).mean), np.full(4, 1.5, np.float32))


@pytest.mark.single_process
def test_x0_from_a_config(tmp_path):
    cfg = {"run": {"name": "x0", "generations": 1, "out": str(tmp_path / "r")},
           "algorithm": {"name": "cmaes", "x0": [1.0, 2.0, 3.0]}, "problem": {"name": "sphere", "dim": 3}}
    hpcevo.run(cfg, quiet=True)
    assert "x0 = [\n    1.0,\n    2.0,\n    3.0,\n]" in (tmp_path / "r" / "config.toml").read_text()
    cfg["algorithm"]["x0"] = [1.0]
    with pytest.raises(ConfigError, match="x0"):
        hpcevo.load_config(cfg)


# -- a run whose every evaluation fails is an error, and run() takes batched= --------------------
def _one_candidate(x):
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError("takes one candidate")
    return float(np.sum(x * x))


@pytest.mark.single_process
def test_every_evaluation_failing_is_an_error_with_the_cure(tmp_path):
    cfg = {"run": {"name": "oc", "generations": 4, "out": str(tmp_path / "oc")},
           "algorithm": {"name": "cmaes", "pop_size": 6}, "problem": {"dim": 3, "lb": -1.0, "ub": 1.0}}
    with pytest.raises(UsageError, match=r"all 6 evaluations of generation 1 failed .*takes one candidate.*"
                                         r"batched = false \(hpcevo.run\(\.\.\., batched=False\)\)"):
        hpcevo.run(cfg, problem=_one_candidate, host=True, quiet=True)
    result = hpcevo.run(cfg, problem=_one_candidate, host=True, batched=False, quiet=True, overwrite=True)
    assert result.summary["status"] == "complete" and result.summary["failed_evaluations"] == 0
    assert math.isfinite(result.summary["best_fitness"])
    with pytest.raises(UsageError, match="NaN or infinite"):
        hpcevo.run(cfg, problem=lambda x: jnp.full(x.shape[:1], jnp.nan), quiet=True, overwrite=True)
    with pytest.raises(ConfigError, match="batched"):
        hpcevo.run(cfg, problem=_one_candidate, host=True, batched="no", quiet=True, overwrite=True)


@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_every_evaluation_failing_exits_2_from_the_cli(tmp_path):
    (tmp_path / "f.py").write_text("import numpy as np\ndef f(x):\n    return float(np.sum(np.asarray(x) ** 2, axis=0).item())\n")
    (tmp_path / "c.toml").write_text(f'[run]\nname = "c"\ngenerations = 3\nout = "{tmp_path / "r"}"\n'
                                     '[algorithm]\nname = "cmaes"\npop_size = 5\n'
                                     f'[problem]\nname = "{tmp_path / "f.py"}:f"\nhost = true\ndim = 2\nlb = -1.0\nub = 1.0\n')
    out = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(tmp_path / "c.toml")], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 2, out.stderr
    assert "all 5 evaluations of generation 1 failed" in out.stderr and "Traceback" not in out.stderr


# -- under MPI: the same at any rank count, resumable mid-restart ---------------------------------
def _here_and_alone(ctx, references, request, make):
    here = make(ctx, "here")

    def one_rank():
        return here if ctx.size == 1 else make(context_for(MPI.COMM_SELF), "alone")

    return here, references.get(request, "summary", one_rank)


OUTCOME = ("state_digest", "generations", "evaluations", "stopped_by", "best_fitness")


# (at 1, 2 and 3 ranks: the stop is agreed on by every rank, and 3 splits the population unevenly;
# a 4th rank adds about 500 collectives and nothing that 3 does not try)
@pytest.mark.ranks(1, 2, 3)
def test_budget_and_target_stop_at_the_same_generation_at_any_rank_count(ctx, references, request, shared_tmp):
    def make(c, where):
        out = {}
        # (target 1.0: about 500 generations; each costs a collective, slow at 3-4 ranks on 2 cores)
        for key, run in [("budget", {"evaluations": 700}), ("target", {"target": 1.0, "evaluations": 20000}),
                         ("stagnation", {"stagnation_generations": 15, "stagnation_tolerance": 1e-2,
                                         "evaluations": 20000})]:
            s = hpcevo.run(config(shared_tmp / where / key, **run), quiet=True, ctx=c).summary
            out[key] = {k: s[k] for k in OUTCOME}
        return out

    here, alone = _here_and_alone(ctx, references, request, make)
    assert here == alone
    assert here["budget"]["evaluations"] >= 700 and here["budget"]["stopped_by"].startswith("run.evaluations")
    assert here["target"]["best_fitness"] <= 1.0 and here["target"]["stopped_by"].startswith("run.target")
    assert here["stagnation"]["stopped_by"].startswith("run.stagnation_generations")
    if ctx.is_root:
        lines = [json.loads(x) for x in (shared_tmp / "here" / "budget" / "metrics.jsonl").read_text().splitlines()]
        assert lines[-1]["generation"] == here["budget"]["generations"]  # logged where it ended
        assert lines[-1]["evaluations"] == here["budget"]["evaluations"]


@pytest.mark.slow
@pytest.mark.ranks(1, 2)
def test_bipop_resumes_mid_restart_equal_to_a_run_never_stopped(ctx, shared_tmp):
    whole = hpcevo.run(config(shared_tmp / "whole", generations=160), quiet=True, ctx=ctx).summary
    cfg = config(shared_tmp / "part", generations=70)
    cfg["checkpoint"] = {"every": 0, "final": True}
    first = hpcevo.run(cfg, quiet=True, ctx=ctx).summary
    cfg["run"]["generations"] = 160
    rest = hpcevo.run(cfg, quiet=True, ctx=ctx, resume=True).summary
    assert first["generations"] == 70 and rest["resumed_from"] == 70
    assert rest["state_digest"] == whole["state_digest"] and rest["evaluations"] == whole["evaluations"]
    # the budget is free to grow on resume, and counts on from the checkpoint
    cfg["run"]["evaluations"] = rest["evaluations"] + 50
    cfg["run"]["generations"] = 100000
    more = hpcevo.run(cfg, quiet=True, ctx=ctx, resume=True).summary
    assert rest["evaluations"] + 50 <= more["evaluations"] < rest["evaluations"] + 50 + 64


@pytest.mark.single_process
def test_target_precision_is_relative_to_the_problems_optimum(tmp_path):
    cfg = {"run": {"name": "tp", "out": str(tmp_path / "tp"), "evaluations": 100000, "target_precision": 1e-3},
           "algorithm": {"name": "cmaes"}, "problem": {"name": "rastrigin", "dim": 2, "lb": -1.0, "ub": 1.0}}
    s = hpcevo.run(cfg, quiet=True).summary
    assert s["best_fitness"] <= 1e-3 and s["stopped_by"].startswith("run.target_precision")
    assert s["evaluations"] == s["generations"] * 6  # (4 + floor(3 ln 2) rows a generation)
    with pytest.raises(ConfigError, match="both set a target"):
        hpcevo.run({**cfg, "run": {**cfg["run"], "target": 1.0}}, quiet=True, overwrite=True)
    with pytest.raises(ConfigError, match="does not know its optimal value"):
        hpcevo.run({**cfg, "problem": {"dim": 2, "lb": -1.0, "ub": 1.0}}, problem=lambda x: jnp.sum(x * x),
                   quiet=True, overwrite=True)
