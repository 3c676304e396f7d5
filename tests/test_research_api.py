"""The daily research loop from Python, under MPI: ask/evaluate/tell (and its pure form inside the
user's own jit), hyper-parameters as data, a collective end of ``hpcevo.run``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import ALGORITHMS, CSO, DE, GA, NSGA2, PSO, CMAES, OpenES
from hpcevo.algorithms.base import params_of
from hpcevo.parallel import context_for
from hpcevo.problems import make_problem

from configs import small_config

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

RASTRIGIN = make_problem("rastrigin", 6)


def build(cls, problem=RASTRIGIN, **kw):
    extra = {"num_objectives": problem.num_objectives} if cls.multi_objective else {}
    return cls(pop_size=kw.pop("pop_size", 24), dim=problem.dim, lb=problem.lb, ub=problem.ub, **extra, **kw)


def ask_tell(loop, n):
    for _ in range(n):
        x = loop.ask()
        loop.tell(x, loop.evaluate(x))
    return loop


CASES = {"de": (DE, RASTRIGIN, {}), "cso": (CSO, RASTRIGIN, {}), "pso": (PSO, RASTRIGIN, {}),
         "cmaes": (CMAES, RASTRIGIN, {}), "openes": (OpenES, RASTRIGIN, {}), "ga": (GA, RASTRIGIN, {}),
         "nsga2": (NSGA2, make_problem("zdt1", 6), {})}


# -- ask / evaluate / tell --------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
def test_ask_evaluate_tell_is_bitwise_advance_at_any_rank_count(ctx, references, request, name):
    cls, problem, kw = CASES[name]
    algorithm = build(cls, problem, **kw)

    def digests(c):
        a = hpcevo.Loop(algorithm, problem, c).init(3).advance(5)
        b = ask_tell(hpcevo.Loop(algorithm, problem, c).init(3), 5)
        assert b.generation == a.generation == 6 and b.evaluations == a.evaluations
        for k, v in a.history.items():
            np.testing.assert_array_equal(b.history[k], v, err_msg=k)
        return [a.digest(), b.digest()]

    here = digests(ctx)
    assert here[0] == here[1]
    assert here == references.get(request, "digests", lambda: here if ctx.size == 1 else digests(
        context_for(MPI.COMM_SELF)))


def test_own_logic_between_ask_and_tell(ctx):
    """What evosax users write: change the candidates' fitness in Python (a penalty), tell it."""
    algorithm = build(DE)
    loop = hpcevo.Loop(algorithm, RASTRIGIN, ctx).init(0)
    for _ in range(4):
        x = loop.ask()
        f = loop.evaluate(x) + 10.0 * jnp.sum(jnp.maximum(x - 4.0, 0.0), axis=1)
        loop.tell(x, f)
    assert loop.generation == 5 and np.isfinite(loop.best_fitness)
    loop.check_replicas()


def test_host_problem_ask_tell_equals_advance(ctx):
    def f(x):  # NumPy, one candidate
        return float(np.sum(x * x))

    algorithm = build(CSO)
    a = hpcevo.Loop(algorithm, f, ctx, host=True).init(1).advance(4)
    b = ask_tell(hpcevo.Loop(algorithm, f, ctx, host=True).init(1), 4)
    assert a.digest() == b.digest()
    a.close(), b.close()


def test_ask_tell_misuse_raises_on_every_rank(ctx):
    loop = hpcevo.Loop(build(PSO), RASTRIGIN, ctx).init(0)
    with pytest.raises(hpcevo.UsageError, match="call ask"):
        loop.tell(np.zeros((24, 6)), np.zeros(24))
    x = loop.ask()
    with pytest.raises(hpcevo.UsageError, match="asked but not told"):
        loop.advance(1)
    with pytest.raises(hpcevo.UsageError, match="asked but not told"):
        loop.ask()
    with pytest.raises(hpcevo.UsageError, match="shape"):
        loop.tell(x, np.zeros(23))
    with pytest.raises(hpcevo.UsageError, match="shape"):
        loop.evaluate(np.zeros((4, 5)))
    if ctx.size > 1:  # a fitness computed differently on one rank would fork the replicas
        with pytest.raises(hpcevo.UsageError, match="differs between ranks"):
            loop.tell(x, np.full(24, float(ctx.rank == 1)))
    # not real numbers: one message naming the argument, not JAX's from deep inside (a complex
    # fitness lost its imaginary part without a word)
    for bad, said in ((np.zeros(24) + 1j, "complex numbers"), (["a"] * 24, "strings"), (None, "objects"),
                      ([object()] * 24, "objects"), ([[1.0], [1.0, 2.0]], "got list .*inhomogeneous")):
        with pytest.raises(hpcevo.UsageError, match=f"Loop.tell: 'fitness' must be an array of real numbers.*{said}"):
            loop.tell(x, bad)
    with pytest.raises(hpcevo.UsageError, match="Loop.tell: 'x' must be an array of real numbers; got complex"):
        loop.tell(np.asarray(x) + 1j, np.zeros(24))
    with pytest.raises(hpcevo.UsageError, match="Loop.evaluate: 'x' must be an array of real numbers; got strings"):
        loop.evaluate([["a"] * 6])
    loop.tell(x, loop.evaluate(x))  # the generation is still open, and ends normally
    assert loop.generation == 2
    with pytest.raises(hpcevo.UsageError, match="distributed"):
        hpcevo.Loop(build(OpenES, distributed=True, block=8), RASTRIGIN, ctx).init(0).ask()


def scanned(functions, length: int):
    """``(state, params) -> (state, history rows)``: ``length`` generations of ``Loop.functions()``
    in a ``lax.scan``, as a user writes it."""
    ask, evaluate, tell, row = functions

    def generations(state, params):
        def body(s, _):
            x, algo = ask(s, params)
            s2 = tell(s, x, algo, evaluate(x), params)
            return s2, row(s, s2)
        return jax.lax.scan(body, state, None, length=length)
    return generations


def test_functions_in_the_users_own_jitted_scan_equal_advance(ctx):
    algorithm = build(PSO)
    a = hpcevo.Loop(algorithm, RASTRIGIN, ctx).init(2).advance(7)
    loop = hpcevo.Loop(algorithm, RASTRIGIN, ctx).init(2)
    state, history = jax.jit(scanned(loop.functions(), 7))(loop.state, loop.params_data())
    loop.adopt(state, history)
    assert loop.generation == 8 and loop.digest() == a.digest()
    for k, v in a.history.items():
        np.testing.assert_array_equal(loop.history[k], v, err_msg=k)
    loop.advance(2)  # and the loop goes on from there
    assert loop.digest() == a.advance(2).digest()


def plain_user_function(x):
    """As a user writes it: its rows' values may depend on the block (not declared invariant)."""
    return jnp.mean(x * x - 3.0 * jnp.cos(2.0 * jnp.pi * x), axis=-1)


def test_the_functions_evaluate_jitted_alone_is_one_program_at_every_rank_count(ctx, references, request):
    """Found 2026-11-27: ``functions().evaluate`` traced this rank's share into the user's jit as a
    constant; XLA specialised the loop of micro-batches on its trip count (2 at one rank, 1 at two
    for 14 rows in micro-batches of 8), and some rows of a plain function came out with another
    last bit at 2 ranks than at 1. The share is data now, as in the engine's own programs."""
    algorithm = PSO(pop_size=14, dim=6, lb=-5.12, ub=5.12)
    x = jax.random.uniform(jax.random.PRNGKey(1), (3, 14, 6), minval=-5.0, maxval=5.0)

    def values(c):
        evaluate = jax.jit(hpcevo.Loop(algorithm, plain_user_function, c).init(0).functions().evaluate)
        return [np.asarray(evaluate(x[i])).tolist() for i in range(3)]

    assert values(ctx) == references.get(request, "values", lambda: values(context_for(MPI.COMM_SELF)))


@pytest.mark.slow  # (two vmapped scans compiled per pass)
@pytest.mark.ranks(1, 3)  # the collective's batching is the subject: 3 is an uneven split (2 adds nothing)
@pytest.mark.parametrize("name, problem", [("pso", plain_user_function), ("cmaes", RASTRIGIN)])
def test_jax_vmap_over_the_functions_runs_many_seeds_and_hyper_parameters_alike_at_any_rank_count(
        ctx, references, request, name, problem):
    """Issue 41: ``jax.vmap`` over a generation made of ``loop.functions()`` (the field's way of
    running many small runs as one program) failed at 2 ranks and more with mpi4jax's raw "Batching
    rule for 'allgather_mpi' not implemented". Now 3 seeds, each with its own dynamic
    hyper-parameters, advance as one vmapped, jitted scan to the same bits at every rank count."""
    cls = {"pso": PSO, "cmaes": CMAES}[name]
    algorithm = cls(pop_size=13, dim=6, lb=-5.12, ub=5.12)
    seeds = (0, 1, 5)
    vary = {"pso": ("w", [0.5, 0.7298, 0.9]), "cmaes": ("c_sigma", None)}[name]

    def lanes(c):
        loops = [hpcevo.Loop(algorithm, problem, c).init(s) for s in seeds]
        params = [loop.params_data() for loop in loops]
        if vary[1] is not None:
            params = [{**p, vary[0]: jnp.asarray(v, p[vary[0]].dtype)} for p, v in zip(params, vary[1])]
        stack = lambda *xs: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *xs)  # noqa: E731

        generations = jax.jit(jax.vmap(scanned(loops[0].functions(), 6)))
        states, history = generations(stack(*[loop.state for loop in loops]), stack(*params))
        leaves = jax.tree_util.tree_leaves((states, history))
        assert all(a.shape[0] == len(seeds) for a in leaves)
        lane_digests = []
        for i, loop in enumerate(loops):  # each lane is a state of its loop: adopted, it goes on
            loop.adopt(jax.tree_util.tree_map(lambda a: a[i], states),
                       jax.tree_util.tree_map(lambda a: a[i], history))
            assert loop.generation == 7
            lane_digests.append(loop.digest())
        assert len(set(lane_digests)) == len(seeds)  # three runs, not one run three times
        return {"lanes": lane_digests, "best": [float(loop.best_fitness) for loop in loops]}

    got = lanes(ctx)
    assert got == references.get(request, "lanes", lambda: lanes(context_for(MPI.COMM_SELF)))


# -- hyper-parameters as data ---------------------------------------------------------------------
def test_set_params_takes_effect_without_recompiling(ctx):
    pso = build(PSO, w=0.5)
    loop = hpcevo.Loop(pso, RASTRIGIN, ctx).init(0).advance(3)
    compiled = loop.engine.programs_compiled()
    assert compiled >= 2
    loop.set_params(w=0.7, c1=1.2).advance(3)
    assert loop.engine.programs_compiled() == compiled  # data, not a new program
    assert loop.params["w"] == 0.7 and loop.algorithm.w == 0.7 and loop.algorithm.c1 == 1.2
    unchanged = hpcevo.Loop(pso, RASTRIGIN, ctx).init(0).advance(6)
    assert loop.digest() != unchanged.digest()
    # from the same state on, the values as data equal the same values built into the algorithm
    again = hpcevo.Loop(pso, RASTRIGIN, ctx).init(0)
    built = hpcevo.Loop(build(PSO, w=0.7, c1=1.2), RASTRIGIN, ctx).init(0)
    built.state = jax.tree_util.tree_map(jnp.copy, again.state)
    assert again.set_params(w=0.7, c1=1.2).advance(5).digest() == built.advance(5).digest()


@pytest.mark.ranks(1, 2)
@pytest.mark.parametrize("cls, name", [(OpenES, "lr"), (OpenES, "sigma_init"), (CMAES, "sigma_init")])
def test_an_initial_value_is_refused_for_what_it_is_not_as_shaping_the_program(ctx, cls, name, shared_tmp):
    """OpenES's lr and the ES's sigma_init are floats that set generation 1's state (which then
    adapts or decays them on its own): refused mid-run, as they must be, but the message said they
    "shape the compiled program". Loop.set_params and a resume's --set say the same."""
    loop = hpcevo.Loop(build(cls), RASTRIGIN, ctx).init(0).advance(2)
    carried = name.removesuffix("_init")
    with pytest.raises(hpcevo.UsageError, match=rf"'{name}' of {cls.__name__} is static \(it sets the state of "
                                                rf"generation 1 only; the run's state has carried its own {carried}"):
        loop.set_params(**{name: 0.5})
    with pytest.raises(hpcevo.UsageError, match="shapes the compiled program"):
        loop.set_params(pop_size=12)
    if cls is CMAES:  # with restarts, each restart starts from sigma_init: not generation 1's alone
        bipop = hpcevo.Loop(build(cls, restart="bipop", pop_size=48), RASTRIGIN, ctx).init(0)
        with pytest.raises(hpcevo.UsageError, match="'sigma_init' of CMAES is static \\(a constant of the compiled"):
            bipop.set_params(sigma_init=0.5)
    cfg = small_config(shared_tmp / "r", algorithm={"name": cls.__name__.lower(), "pop_size": 8})
    hpcevo.run(cfg, quiet=True, ctx=ctx)
    cfg["algorithm"][name] = 0.5
    cfg["run"]["generations"] = 6
    with pytest.raises(hpcevo.UsageError, match=rf"algorithm.{name}: static, it sets the state of generation 1 only"):
        hpcevo.run(cfg, quiet=True, ctx=ctx, resume=True)


def test_assigning_the_algorithm_is_set_params_or_refused(ctx):
    de = build(DE)
    loop = hpcevo.Loop(de, RASTRIGIN, ctx).init(0).advance(2)
    loop.algorithm = dataclasses.replace(de, F=0.9)  # the reported case: it used to be ignored
    loop.advance(3)
    ref = hpcevo.Loop(de, RASTRIGIN, ctx).init(0).advance(2).set_params(F=0.9).advance(3)
    assert loop.digest() == ref.digest() != hpcevo.Loop(de, RASTRIGIN, ctx).init(0).advance(5).digest()
    with pytest.raises(hpcevo.UsageError, match="'pop_size' of DE is static"):
        loop.algorithm = dataclasses.replace(de, pop_size=30)
    with pytest.raises(hpcevo.UsageError, match="'strategy' of DE is static"):
        loop.set_params(strategy="current-to-best/1/bin")
    with pytest.raises(hpcevo.UsageError, match="no hyper-parameter 'f'.*dynamic ones are F, CR"):
        loop.set_params(f=0.3)
    with pytest.raises(hpcevo.ConfigError, match="F must be in"):
        loop.set_params(F=7.0)
    with pytest.raises(hpcevo.UsageError, match="cannot become CSO"):
        loop.algorithm = build(CSO)
    if ctx.size > 1:
        with pytest.raises(hpcevo.UsageError, match="differs between ranks"):
            loop.set_params(F=0.3 + 0.1 * (ctx.rank == 1))
    assert loop.params == {"F": 0.9, "CR": 0.9}  # nothing above changed it


def test_checkpoint_keeps_the_params_and_resume_continues_bitwise(ctx, shared_tmp):
    de = build(DE, F=0.5)
    a = hpcevo.Loop(de, RASTRIGIN, ctx).init(4).advance(3).set_params(F=0.8, CR=0.3).advance(2)
    path = a.save(shared_tmp / "ck")
    assert hpcevo.checkpoint.read_header(ctx, path).params == {"F": 0.8, "CR": 0.3}
    a.advance(4)
    b = hpcevo.Loop(de, RASTRIGIN, ctx).load(path)  # built with F = 0.5: the checkpoint's values win
    assert b.params == {"F": 0.8, "CR": 0.3} and b.algorithm.F == 0.8
    assert b.advance(4).digest() == a.digest()


@pytest.mark.single_process
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_dynamic_hyper_parameter_is_data(name):
    """Each declared name is a field; values set as data equal the same values built in, from the
    same state on; and no new program is compiled."""
    cls = ALGORITHMS[name]
    problem = make_problem("zdt1", 4) if cls.multi_objective else make_problem("sphere", 4)
    kw = {"distributed": True, "block": 4} if name in ("openes", "snes", "pgpe") else {}
    if name == "moead":
        kw["neighbours"] = 5
    old = build(cls, problem, pop_size=16, **kw)
    fields = {f.name for f in dataclasses.fields(old)}
    assert set(cls.dynamic) <= fields
    new = {}
    for k, v in params_of(old).items():
        for value in (v * 0.8, v * 1.2, 0.5, 0.05):
            try:
                dataclasses.replace(old, **{**new, k: value})
            except hpcevo.ConfigError:
                continue
            new[k] = value
            break
    assert set(new) == set(cls.dynamic), "no valid new value found for some dynamic hyper-parameter"
    ctx = context_for(MPI.COMM_SELF)
    a = hpcevo.Loop(old, problem, ctx).init(0).advance(1)
    compiled = a.engine.programs_compiled()
    assert compiled >= 2
    b = hpcevo.Loop(dataclasses.replace(old, **new), problem, ctx).init(0)
    b.state = jax.tree_util.tree_map(jnp.copy, a.state)
    b.generation = a.generation
    a.set_params(**new).advance(3)
    assert a.engine.programs_compiled() == compiled
    assert a.digest() == b.advance(3).digest()


# -- a collective end -----------------------------------------------------------------------------
def test_run_returns_on_every_rank_with_its_files_readable(ctx, shared_tmp):
    result = hpcevo.run(small_config(shared_tmp / "r"), quiet=True)
    record = hpcevo.open_run(result.run_dir)
    assert record.summary is not None and record.summary["state_digest"] == result.digest
    assert len(record.metrics) >= 2 and record.checkpoints


# -- noisy problems: the best on fresh draws ------------------------------------------------------
def noisy_sphere(x, generation):
    """Sphere plus noise drawn from the generation number: every candidate of a generation meets
    the same draw (common random numbers), each generation a new one."""
    return jnp.sum(x * x) + 5.0 * jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(0), generation))


noisy_sphere.wants_generation = True


def test_reevaluate_reports_the_best_on_fresh_draws(ctx, shared_tmp, references, request):
    cfg = small_config(shared_tmp / "noisy", run={"generations": 12, "reevaluate": 6},
                       problem={"name": None, "dim": 3, "lb": -2.0, "ub": 2.0})
    result = hpcevo.run(cfg, problem=noisy_sphere, quiet=True)
    s = result.summary
    assert len(s["reevaluations"]) == 6 and len(set(s["reevaluations"])) == 6  # six different draws
    assert s["best_fitness"] == pytest.approx(np.mean(s["reevaluations"])) == result.best_fitness
    assert s["best_fitness_seen"] < s["best_fitness"]  # the luck of the best draw is gone
    assert hpcevo.open_run(result.run_dir).summary["reevaluations"] == s["reevaluations"]
    here = s["reevaluations"]
    assert here == references.get(request, "values", lambda: here)  # the same values at any rank count
    plain = hpcevo.run(small_config(shared_tmp / "det", run={"reevaluate": 3}), quiet=True).summary
    assert plain["reevaluations"] == [plain["best_fitness_seen"]] * 3  # deterministic: its one value
    with pytest.raises(hpcevo.ConfigError, match="run.reevaluate"):
        hpcevo.run(small_config(shared_tmp / "mo", run={"reevaluate": 3}, algorithm={"name": "nsga2"},
                                problem={"name": "zdt1", "dim": 4}), quiet=True)


@pytest.mark.ranks(2, 3)
def test_ranks_in_different_collective_calls_hear_it_at_once(ctx):
    """ask() on rank 0 while the other ranks evaluate: both are agreed calls, and the agreement
    names the two (it compared only the inputs, and blamed them)."""
    loop = hpcevo.Loop(build(PSO), RASTRIGIN, ctx).init(0)
    with pytest.raises(hpcevo.UsageError, match=r"the ranks are in different collective calls: rank 0 in Loop.ask.*"
                                                r"in Loop.evaluate's candidates.*same collective calls in the same order"):
        loop.ask() if ctx.rank == 0 else loop.evaluate(np.zeros((4, 6)))


LAUNCH = r"""
import json, os, sys
import jax.monitoring
hits = []
jax.monitoring.register_event_listener(
    lambda event, *a, **k: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
import hpcevo
from hpcevo.algorithms import CSO
problem = hpcevo.problems.make_problem("sphere", 3)

def loop(setting):
    return hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), problem, compile_cache=setting)

if sys.argv[1] == "refused":  # JAX has no cache yet ("off"): a bad directory or type is one UsageError
    said = []
    for setting in (sys.argv[2], 3):
        try:
            loop(setting)
        except hpcevo.UsageError as e:
            said.append(str(e))
    print(json.dumps({"cache": loop("off").compile_cache, "said": said}))
else:
    lp = loop(sys.argv[1]).init(0).advance(5)
    from hpcevo.driver import programs
    print(json.dumps({"cache": lp.compile_cache, "hits": len(hits), "loaded": programs.loaded, "digest": lp.digest()}))
"""


@pytest.mark.single_process
@pytest.mark.slow  # three interpreters start
def test_a_loop_script_keeps_its_programs_for_its_next_launch(tmp_path):
    """A script's Loop compiled its programs again at every launch (issue 41: 11-16 s each): by
    default it now keeps them in the per-user cache, as the command line does; "off" keeps none,
    and a directory others could write is refused."""
    import os
    import subprocess
    import sys

    # (as a user's script starts: no cache named, programs kept on disk as by default)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "HPCEVO_TEST_PROFILE",
                        "HPCEVO_PROGRAM_CACHE")}

    def launch(*args, home):
        r = subprocess.run([sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, timeout=300,
                           env={**env, "XDG_CACHE_HOME": str(home)})
        assert r.returncode == 0, r.stderr[-3000:]
        return __import__("json").loads(r.stdout.strip().splitlines()[-1])

    cache = tmp_path / "home" / "hpcevo" / "jax-cache"
    first, second = launch("auto", home=tmp_path / "home"), launch("auto", home=tmp_path / "home")
    assert first["cache"] == second["cache"] == str(cache) and first["hits"] == first["loaded"] == 0
    # its programs, loaded: from JAX's cache, or as they are (driver/programs.py: a generation's two)
    assert second["hits"] + second["loaded"] >= 2 and second["loaded"] == 2 and second["digest"] == first["digest"]
    assert (cache.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    off = launch("refused", str(shared), home=tmp_path / "home2")
    assert off["cache"] is None and not (tmp_path / "home2").exists()
    assert len(off["said"]) == 2 and "is writable by other users" in off["said"][0] and "compile_cache" in off["said"][0]
    assert "got int" in off["said"][1]
