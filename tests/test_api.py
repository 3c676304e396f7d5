"""The public Python API (``hpcevo.__all__``): load_config, run, open_run, Loop, parallel.init,
the protocols, errors as exceptions; and the examples/api_*.py scripts as written, on this job's
ranks (launcher-level checks of the same scripts: tests/test_launcher.py)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.algorithms import ALGORITHMS, CSO, DE, PSO
from hpcevo.parallel import context_for
from hpcevo.problems import CEC2022_NAMES, MO_PROBLEMS, PROBLEMS, create, make_problem

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("api_*.py"))


def sphere(x):
    """One candidate (dim,) -> (): vectorised by hpcevo."""
    return jnp.sum((x - 0.5) ** 2)


def config(out: Path, **sections) -> dict:
    data = {"run": {"name": "api", "seed": 5, "generations": 12, "out": str(out)},
            "log": {"every": 4}, "checkpoint": {"every": 4, "every_seconds": 0}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


# -- the names ----------------------------------------------------------------------------------
@pytest.mark.single_process
def test_every_name_in_all_resolves_and_the_contract_is_there():
    for name in hpcevo.__all__:
        assert getattr(hpcevo, name) is not None, name
    assert {"load_config", "run", "open_run", "Result", "Loop", "Algorithm", "Problem", "HostProblem",
            "ConfigError", "parallel"} <= set(hpcevo.__all__)
    with pytest.raises(AttributeError):
        hpcevo.no_such_name  # noqa: B018


@pytest.mark.single_process
def test_hpcevos_own_classes_follow_the_protocols():
    for name, cls in ALGORITHMS.items():
        problem = make_problem("zdt1", 4) if cls.multi_objective else make_problem("sphere", 4)
        algo = cls(pop_size=24, dim=4, lb=problem.lb, ub=problem.ub,
                   **({"num_objectives": 2} if cls.multi_objective else {}))
        assert isinstance(algo, hpcevo.Algorithm), name
    for name in (*PROBLEMS, *MO_PROBLEMS, CEC2022_NAMES[0]):
        p = create(name, 10)
        assert isinstance(p, hpcevo.Problem) and not p.host, name
        assert p.wants_generation is False  # declared defaults, no probing needed
    assert isinstance(create("command", 2, -1.0, 1.0, {"command": ["true"]}), hpcevo.HostProblem)
    assert make_problem("zdt1", 4).pareto_front().shape[1] == 2 and make_problem("sphere", 3).pareto_front() is None


# -- load_config --------------------------------------------------------------------------------
@pytest.mark.single_process
def test_load_config_takes_a_path_or_a_dict_and_raises_configerror_with_the_key(tmp_path):
    cfg = hpcevo.load_config(ROOT / "examples" / "cso.toml", overrides=["run.generations=50"])
    assert cfg.run.generations == 50 and cfg.algorithm.name == "cso"
    data = config(tmp_path, algorithm={"name": "cso", "pop_size": 16}, problem={"name": "sphere", "dim": 3})
    assert hpcevo.load_config(data).problem.dim == 3
    assert data["run"]["generations"] == 12  # the caller's dict is not changed by overrides
    hpcevo.load_config(data, overrides=["run.generations=3"])
    assert data["run"]["generations"] == 12
    cases = [
        ({**data, "run": {**data["run"], "seed": -1}}, "run.seed"),
        ({**data, "algorithm": {"name": "cso", "pop_size": 16, "phii": 0.1}}, "algorithm.phii"),
        ({**data, "algorithm": {"name": "cso", "pop_size": 16, "phi": 3.0}}, "algorithm"),
        ({**data, "algorithm": {"name": "csoo", "pop_size": 16}}, "algorithm.name"),
        ({**data, "problem": {"name": "sphere", "dim": 3, "ref_point": [1.0, 1.0]}}, "problem.ref_point"),
    ]
    for bad, key in cases:
        with pytest.raises(hpcevo.ConfigError) as e:
            hpcevo.load_config(bad)
        assert e.value.key == key, (key, str(e.value))
        assert isinstance(e.value, hpcevo.UsageError)  # what the CLI turns into exit 2


# -- run ----------------------------------------------------------------------------------------
def test_run_with_a_function_held_in_python(ctx, shared_tmp):
    cfg = hpcevo.load_config(config(shared_tmp / "f", algorithm={"name": "pso", "pop_size": 21},
                                    problem={"dim": 4, "lb": -1.0, "ub": 1.0}))
    result = hpcevo.run(cfg, problem=sphere, ctx=ctx, quiet=True)
    assert result.status == "complete" and result.generations == 12
    assert result.run_dir == shared_tmp / "f"
    assert result.best_fitness == float(np.min(result.history["best"])) and result.best_fitness < 1.0
    assert result.best_solution.shape == (4,) and len(result.history["gen_mean"]) == 12
    assert ctx.comm_ctl.allgather(result.digest) == [result.digest] * ctx.size
    # what the function was is recorded: its name, which only Python can run again
    run = hpcevo.open_run(result.run_dir)
    assert run.config["problem"]["name"] == "<python: test_api.sphere>" == result.summary["problem"]
    assert run.summary["state_digest"] == result.digest
    assert run.metrics["generation"].tolist() == [4, 8, 12]
    assert [c.generation for c in run.checkpoints] == [12, 8, 4] and run.kind == "single-objective"
    history, header = run.history()
    assert header.generation == 12 and history["best"].tobytes() == result.history["best"].tobytes()
    # ... and a resume from Python with the same function continues it
    more = hpcevo.run(cfg.model_copy(update={"run": cfg.run.model_copy(update={"generations": 20})}),
                      problem=sphere, resume=True, ctx=ctx, quiet=True)
    assert more.summary["resumed_from"] == 12 and more.generations == 20
    whole = hpcevo.run(hpcevo.load_config(config(shared_tmp / "w", run={"generations": 20},
                                                 algorithm={"name": "pso", "pop_size": 21},
                                                 problem={"dim": 4, "lb": -1.0, "ub": 1.0})),
                       problem=sphere, ctx=ctx, quiet=True)
    assert more.digest == whole.digest


@pytest.mark.ranks(1, 2)
def test_a_held_algorithm_object_equals_the_configured_algorithm(ctx, shared_tmp):
    problem = make_problem("rastrigin", 5)
    by_config = hpcevo.run(hpcevo.load_config(config(shared_tmp / "c", algorithm={"name": "de", "pop_size": 11, "F": 0.7},
                                                     problem={"name": "rastrigin", "dim": 5})), ctx=ctx, quiet=True)
    algo = DE(pop_size=11, dim=5, lb=problem.lb, ub=problem.ub, F=0.7)
    held = hpcevo.run(config(shared_tmp / "o"), algorithm=algo, problem=problem, ctx=ctx, quiet=True)
    assert held.digest == by_config.digest
    resolved = hpcevo.open_run(held.run_dir).config
    assert resolved["algorithm"] == hpcevo.open_run(by_config.run_dir).config["algorithm"]  # the CLI could run it


def test_held_objects_that_do_not_fit_are_configerrors(ctx, shared_tmp):
    problem = make_problem("sphere", 3)
    with pytest.raises(hpcevo.ConfigError, match="dim: the algorithm has 4, the problem 3"):
        hpcevo.run(config(shared_tmp / "a"), problem=problem, ctx=ctx, quiet=True,
                   algorithm=CSO(pop_size=8, dim=4, lb=(-1.0,) * 4, ub=(1.0,) * 4))
    with pytest.raises(hpcevo.ConfigError, match="not an hpcevo algorithm: it lacks"):
        hpcevo.run(config(shared_tmp / "b"), problem=problem, algorithm=object(), ctx=ctx, quiet=True)
    with pytest.raises(hpcevo.ConfigError, match="missing required key 'algorithm'") as e:
        hpcevo.run(config(shared_tmp / "c"), problem=problem, ctx=ctx, quiet=True)
    assert e.value.key == "algorithm"
    with pytest.raises(hpcevo.ConfigError, match="for one candidate it returned shape"):
        hpcevo.run(config(shared_tmp / "d", algorithm={"name": "cso", "pop_size": 8},
                          problem={"dim": 3, "lb": 0.0, "ub": 1.0}), problem=lambda x: x * 2, ctx=ctx, quiet=True)


def test_a_numpy_function_held_in_python_runs_on_the_host(ctx, shared_tmp):
    def numpy_sphere(x):  # a block (n, dim) -> (n,), NumPy: JAX could not trace it
        return np.sum(np.asarray(x) ** 2, axis=1)

    cfg = config(shared_tmp / "h", algorithm={"name": "cso", "pop_size": 8}, problem={"dim": 3, "lb": -1.0, "ub": 1.0},
                 run={"generations": 4})
    result = hpcevo.run(cfg, problem=numpy_sphere, host=True, ctx=ctx, quiet=True)
    assert result.summary["failed_evaluations"] == 0 and result.best_fitness < 1.0
    assert hpcevo.open_run(result.run_dir).config["problem"]["host"] is True


def test_the_cli_refuses_to_resume_a_run_of_a_held_function(ctx, shared_tmp, capsys):
    cfg = config(shared_tmp / "r", algorithm={"name": "pso", "pop_size": 8},
                 problem={"dim": 2, "lb": -1.0, "ub": 1.0}, run={"generations": 2})
    hpcevo.run(cfg, problem=sphere, ctx=ctx, quiet=True)
    from hpcevo import cli

    assert cli.main(["resume", str(shared_tmp / "r"), "-q"]) == 2
    err = capsys.readouterr().err
    if ctx.is_root:
        assert "was a Python object handed to hpcevo.run(problem=...)" in err


# -- Loop: the step-level API -------------------------------------------------------------------
def test_loop_save_and_load_at_another_rank_count_continues_bitwise(ctx, shared_tmp):
    problem = make_problem("ackley", 6)
    algo = CSO(pop_size=30, dim=6, lb=problem.lb, ub=problem.ub)
    loop = hpcevo.Loop(algo, problem, ctx).compile(2).init(seed=2).advance(9)
    assert loop.generation == 10 and loop.evaluations == 30 + 9 * 15
    path = loop.save(shared_tmp / "ck")
    loop.advance(5)
    if ctx.is_root:  # one rank alone: a different rank count whenever size > 1
        alone = hpcevo.Loop(algo, problem, context_for(MPI.COMM_SELF)).load(path).advance(5)
        assert alone.digest() == loop.digest() and alone.generation == 15
        assert alone.history["best"].tobytes() == loop.history["best"].tobytes()
    x, f = loop.population()
    assert x.shape == (30, 6) and f.shape == (30,) and float(f.min()) >= loop.best_fitness
    loop.check_replicas()
    ctx.comm_ctl.Barrier()


def test_loop_takes_a_plain_function_and_the_algorithms_box(ctx):
    algo = PSO(pop_size=12, dim=3, lb=(-2.0,) * 3, ub=(2.0,) * 3)
    loop = hpcevo.Loop(algo, sphere, ctx).compile(1).init(seed=1).advance(3)
    assert loop.problem.dim == 3 and loop.problem.lb == (-2.0,) * 3
    assert np.all(np.abs(loop.best_solution) <= 2.0) and len(loop.history["best"]) == 4
    with pytest.raises(hpcevo.UsageError, match="no state yet"):
        _ = hpcevo.Loop(algo, sphere, ctx).best_fitness


# -- the parallel context -----------------------------------------------------------------------
def test_parallel_init_describes_this_rank_and_prints_once(ctx, capsys):
    got = hpcevo.parallel.init()
    assert got is ctx  # one context per process, bound once
    assert (got.rank, got.size) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
    assert 0 <= got.local_rank < got.local_size and got.device.startswith("cpu")
    assert got.hosts == [MPI.Get_processor_name()] and len(got.rank_hosts) == got.size
    got.print("hello from", got.rank)
    out = capsys.readouterr().out
    assert out == ("hello from 0\n" if got.is_root else "")


# -- the examples as written, on this job's ranks ------------------------------------------------
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
@pytest.mark.slow
@pytest.mark.ranks(1, 2)
def test_api_examples_run_as_written_on_this_jobs_ranks(ctx, shared_tmp, script, capsys, monkeypatch):
    assert len(EXAMPLES) >= 3
    monkeypatch.setattr(sys, "argv", [str(script), "--generations", "30", "--out", str(shared_tmp / script.stem)])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    if ctx.is_root:
        digest = out.strip().splitlines()[-1]
        assert digest.startswith("digest ") and len(digest) == len("digest ") + 64, out
    else:
        assert out == ""  # rank 0 alone prints
    summary = shared_tmp / script.stem / "summary.json"
    if ctx.is_root and summary.exists():
        assert json.loads(summary.read_text())["ranks"] == ctx.size


@pytest.mark.single_process
def test_a_float32_run_is_the_same_after_a_float64_run_and_under_a_scripts_x64(tmp_path, alone):
    """A run computes in its dtype's JAX mode and leaves the process's as it found it: a float32
    run after a float64 one (a study's group, a script's loop), or in a script that turned
    64-bit types on for itself, is the float32 run a fresh process makes."""
    def digest(dtype: str, name: str) -> str:
        cfg = {"run": {"seed": 1, "generations": 5, "out": str(tmp_path / name), "dtype": dtype},
               "algorithm": {"name": "de", "pop_size": 9}, "problem": {"name": "rastrigin", "dim": 3}}
        return hpcevo.run(cfg, ctx=alone, quiet=True).digest

    first = digest("float32", "a")
    digest("float64", "b")
    assert not jax.config.jax_enable_x64
    assert digest("float32", "c") == first
    jax.config.update("jax_enable_x64", True)
    try:
        assert digest("float32", "d") == first
        assert jax.config.jax_enable_x64  # (the script's own setting, as it left it)
    finally:
        jax.config.update("jax_enable_x64", False)
