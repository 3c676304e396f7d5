"""BBOB runs as COCO's users need them: COCO data written by rank 0 from the gathered fitness (the
same files at any rank count, equal to what cocoex's Observer writes for the same evaluations,
read by cocopp with the run's own numbers), resumed runs continuing their COCO files, one
compiled program for every instance of a function, float64 by default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.parallel import context_for
from hpcevo.problems.bbob import make_bbob

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

FUNCTION, INSTANCE, DIM = 21, 3, 5  # Gallagher's 101 peaks: rotations, peaks; x is logged below 7-D


def config(out, generations=40, **extra):
    run = {"name": "bbob", "seed": 2, "out": str(out), "generations": generations, **extra.pop("run", {})}
    cfg = {"run": run, "algorithm": {"name": "cmaes", "restart": "ipop", "pop_size": 40},
           "problem": {"name": "bbob", "function": FUNCTION, "instance": INSTANCE, "dim": DIM},
           "log": {"every": 10, "coco": True}, "checkpoint": {"every": 0}}
    cfg.update(extra)
    return cfg


def coco_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".hpcevo" not in p.parts}


def evaluations_of(cfg) -> tuple[np.ndarray, np.ndarray]:
    """The run's own evaluations (values and points, in order), from a Loop of the same config."""
    seen = []
    problem = make_bbob(FUNCTION, INSTANCE, DIM)
    import jax

    with jax.enable_x64(True):
        algorithm = hpcevo.algorithms.CMAES(pop_size=40, dim=DIM, lb=problem.lb, ub=problem.ub, dtype="float64",
                                            restart="ipop")
        loop = hpcevo.Loop(algorithm, problem, context_for(MPI.COMM_SELF),
                           observe=lambda f, x: seen.append((f, x)), observe_x=True)
        loop.init(cfg["run"]["seed"]).advance(cfg["run"]["generations"] - 1)
    return np.concatenate([f for f, _ in seen]), np.concatenate([x for _, x in seen])


def test_coco_data_is_the_same_at_any_rank_count_and_what_coco_writes(ctx, references, request, shared_tmp):
    here = hpcevo.run(config(shared_tmp / "here"), quiet=True, ctx=ctx).summary
    files = coco_files(shared_tmp / "here" / "coco") if ctx.is_root else {}

    def one_rank():
        if ctx.size == 1:
            return {k: v.decode() for k, v in files.items()}
        alone = shared_tmp / "alone"
        hpcevo.run(config(alone), quiet=True, ctx=context_for(MPI.COMM_SELF))
        return {k: v.decode() for k, v in coco_files(alone / "coco").items()}

    want = references.get(request, "coco", one_rank)  # (collective: rank 0 computes, every rank gets it)
    if not ctx.is_root:
        return
    assert {k: v.decode() for k, v in files.items()} == want
    assert set(files) == {"bbobexp_f21.info", *(f"data_f21/bbobexp_f21_DIM5.{e}" for e in ("dat", "tdat", "rdat",
                                                                                              "mdat"))}
    # The run's own evaluations replayed through COCO's own problem and Observer: the same lines.
    import cocoex

    f, x = evaluations_of(config(shared_tmp / "here"))
    assert len(f) == here["evaluations"]
    observer = cocoex.Observer("bbob", f"outer_folder: {shared_tmp} result_folder: cocoex algorithm_name: cmaes")
    suite = cocoex.Suite("bbob", "", f"function_indices:{FUNCTION} dimensions:{DIM} instance_indices:{INSTANCE}")
    problem = suite.get_problem_by_function_dimension_instance(FUNCTION, DIM, INSTANCE)
    problem.observe_with(observer)
    theirs = np.array([problem(row) for row in x])
    np.testing.assert_allclose(theirs, f, rtol=1e-13)
    problem.free()  # (its logger writes the last lines)
    out = Path(observer.result_folder)
    for ext in ("dat", "tdat"):
        mine = [ln for ln in files[f"data_f21/bbobexp_f21_DIM5.{ext}"].decode().splitlines() if not ln.startswith("%")]
        coco = [ln for ln in (out / f"data_f21/bbobexp_f21_DIM5.{ext}").read_text().splitlines()
                if not ln.startswith("%")]
        assert [ln.split()[0] for ln in mine] == [ln.split()[0] for ln in coco]  # the same evaluations
        np.testing.assert_allclose([[float(v) for v in ln.split()] for ln in mine],
                                   [[float(v) for v in ln.split()] for ln in coco], rtol=1e-9, atol=1e-12)


def _cocopp_datasets(folder: Path):
    os.environ.setdefault("XDG_CACHE_HOME", str(folder.parent / "xdg"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cocopp

        return cocopp.pproc.DataSetList(str(folder))


@pytest.mark.ranks(1, 2)
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_cocopp_reads_a_run_with_the_runs_own_numbers(ctx, shared_tmp):
    cfg = config(shared_tmp / "run", generations=60, run={"target_precision": 1e-6})
    summary = hpcevo.run(cfg, quiet=True, ctx=ctx).summary
    if not ctx.is_root:
        return
    (ds,) = _cocopp_datasets(shared_tmp / "run" / "coco")
    assert (ds.funcId, ds.dim, list(ds.instancenumbers)) == (FUNCTION, DIM, [INSTANCE])
    fopt = make_bbob(FUNCTION, INSTANCE, DIM).fopt
    f, _ = evaluations_of(cfg)
    f = f[: summary["evaluations"]]
    running = np.minimum.accumulate(f) - fopt
    assert int(ds.maxevals[0]) == summary["evaluations"] == len(f)
    assert ds.finalfunvals[0] == pytest.approx(summary["best_fitness"] - fopt, rel=1e-9)
    for target in (10.0, 1.0, 1e-2, 1e-4, 1e-6):
        (got,) = ds.detEvals([target])
        hit = np.flatnonzero(running <= target)
        assert (got[0] if np.isfinite(got[0]) else None) == (hit[0] + 1 if len(hit) else None), target
    # and the command-line post-processor runs on it (offline)
    out = subprocess.run([sys.executable, "-m", "cocopp", "--tab-only", "-o", str(shared_tmp / "ppdata"),
                          str(shared_tmp / "run" / "coco")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XDG_CACHE_HOME": str(shared_tmp / "xdg")})
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.ranks(1, 2)
def test_a_resumed_run_continues_its_coco_files(ctx, shared_tmp):
    whole = hpcevo.run(config(shared_tmp / "whole", generations=50), quiet=True, ctx=ctx).summary
    cfg = config(shared_tmp / "part", generations=23)
    cfg["checkpoint"] = {"every": 0, "final": True}
    hpcevo.run(cfg, quiet=True, ctx=ctx)  # complete at 23: its COCO entry is closed
    cfg["run"]["generations"] = 50
    rest = hpcevo.run(cfg, quiet=True, ctx=ctx, resume=True).summary
    assert rest["state_digest"] == whole["state_digest"] and rest["resumed_from"] == 23
    if ctx.is_root:
        assert coco_files(shared_tmp / "part" / "coco") == coco_files(shared_tmp / "whole" / "coco")


# -- one process ---------------------------------------------------------------------------------
@pytest.mark.single_process
@pytest.mark.parametrize("planted", ["coco", "coco/data_f21", "coco/bbobexp_f21.info", "coco/file"])
def test_no_coco_data_is_written_through_a_link_planted_in_the_run(tmp_path, planted):
    """A link in the run directory's coco/ (the folder, its data folder, its .info file), planted
    before a resume, stops the run with one message; nothing lands where it points. coco/ as a
    file is one message too."""
    cfg = config(tmp_path / "run", generations=14)
    cfg["checkpoint"] = {"every": 0, "final": True}
    hpcevo.run(cfg, quiet=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "run" / planted.replace("/file", "")
    if planted.endswith("/file"):
        shutil.rmtree(target)
        target.write_text("not a folder")
    else:
        os.rename(target, outside / target.name)
        os.symlink(outside / target.name, target)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    cfg["run"]["generations"] = 30
    with pytest.raises(hpcevo.UsageError, match="symbolic link|not a folder") as e:
        hpcevo.run(cfg, quiet=True, resume=True)
    assert "never" in str(e.value) and "link" in str(e.value)
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


@pytest.mark.single_process
def test_a_copied_or_moved_run_continues_its_own_coco_files(tmp_path):
    """The logger's state names the folder it wrote; a copy resumes into its own coco/ (the
    original's files untouched), and a moved run resumes at all (its old folder is gone)."""
    whole = hpcevo.run(config(tmp_path / "whole", generations=30), quiet=True).summary
    cfg = config(tmp_path / "part", generations=14)
    cfg["checkpoint"] = {"every": 0, "final": True}
    hpcevo.run(cfg, quiet=True)
    original = coco_files(tmp_path / "part" / "coco")
    again = config(tmp_path / "copy", generations=30)
    again["checkpoint"] = cfg["checkpoint"]
    shutil.copytree(tmp_path / "part", tmp_path / "copy")
    rest = hpcevo.run(again, quiet=True, resume=True).summary
    assert rest["state_digest"] == whole["state_digest"] and rest["resumed_from"] == 14
    assert coco_files(tmp_path / "copy" / "coco") == coco_files(tmp_path / "whole" / "coco")
    assert coco_files(tmp_path / "part" / "coco") == original  # (the original's files untouched)
    os.rename(tmp_path / "part", tmp_path / "moved")
    again["run"]["out"] = str(tmp_path / "moved")
    rest = hpcevo.run(again, quiet=True, resume=True).summary
    assert rest["state_digest"] == whole["state_digest"]
    assert coco_files(tmp_path / "moved" / "coco") == coco_files(tmp_path / "whole" / "coco")


@pytest.mark.single_process
def test_functions_and_instances_share_one_compiled_program():
    """Every BBOB function and instance of a dimension is one program (the function is data, a
    branch of one switch: problems/bbob.py): a campaign of 24 functions compiles and loads one
    set of programs, not 24. A run on the shared engine equals the run on a fresh one."""
    from hpcevo.driver import loop as loop_module

    algorithm = hpcevo.algorithms.CMAES(pop_size=8, dim=3, lb=-5.0, ub=5.0)
    made = [(15, 1), (15, 2), (15, 3), (1, 1), (21, 2), (22, 2), (24, 5)]
    loops = [hpcevo.Loop(algorithm, make_bbob(f, i, 3)).init(0).advance(20) for f, i in made]
    assert all(lp.engine is loops[0].engine for lp in loops)
    assert len({lp.digest() for lp in loops}) == len(made)  # other problems, other runs
    for k in (1, 4, 5, 6):  # a fresh engine for each gives the same run
        loop_module._ENGINES.clear()
        again = hpcevo.Loop(algorithm, make_bbob(*made[k], 3)).init(0).advance(20)
        assert again.engine is not loops[k].engine and again.digest() == loops[k].digest(), made[k]
        assert again.best_fitness == loops[k].best_fitness
    # each run solved its own function: its best is near that function's fopt, not another's
    for (f, i), lp in zip(made, loops):
        assert lp.best_fitness >= make_bbob(f, i, 3).fopt


@pytest.mark.single_process
def test_a_loop_on_an_engine_that_compiled_its_programs_traces_and_lowers_nothing_again():
    """A study's runs of one program (other instances, seeds) share an engine; each run's
    ``compile`` traced, lowered and looked the programs up in the cache again: a quarter of a
    second a run, most of a short BBOB run (issue 41). Now nothing is traced for the next run."""
    import jax.monitoring

    algorithm = hpcevo.algorithms.CMAES(pop_size=6, dim=4, lb=-5.0, ub=5.0)
    first = hpcevo.Loop(algorithm, make_bbob(7, 1, 4)).compile(0).init(0).advance(5)
    events = []

    def heard(event, seconds, **kw):
        if event in ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration"):
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(heard)
    try:
        nxt = hpcevo.Loop(algorithm, make_bbob(7, 2, 4))
        assert nxt.engine is first.engine
        nxt.compile(3).init(3).advance(5)
    finally:
        jax.monitoring.unregister_event_duration_listener(heard)
    assert events == []
    from hpcevo.driver import loop as loop_module
    loop_module._ENGINES.clear()
    alone = hpcevo.Loop(algorithm, make_bbob(7, 2, 4)).compile(3).init(3).advance(5)
    assert alone.engine is not nxt.engine and alone.digest() == nxt.digest()


@pytest.mark.single_process
def test_bbob_runs_in_float64_unless_told_and_says_why_float32_is_risky(tmp_path, capsys):
    cfg = {"run": {"name": "b", "generations": 3, "out": str(tmp_path / "a")}, "algorithm": {"name": "cmaes"},
           "problem": {"name": "bbob", "function": 1, "instance": 1, "dim": 2}}
    assert hpcevo.load_config(cfg).run.dtype == "float64"
    assert hpcevo.run(cfg, quiet=True).summary["dtype"] == "float64"
    cfg["run"].update(dtype="float32", out=str(tmp_path / "b"))
    hpcevo.run(cfg, quiet=True)
    err = capsys.readouterr().err
    assert "float32" in err and "f_opt" in err and "1e-8" in err, err


@pytest.mark.single_process
def test_bad_bbob_and_coco_configs_are_one_message(tmp_path):
    base = {"run": {"name": "b", "generations": 3, "out": str(tmp_path / "x")}, "algorithm": {"name": "cmaes"}}
    for problem, text in [({"name": "bbob", "function": 1, "dim": 2}, "problem.instance is required"),
                          ({"name": "bbob", "function": 25, "instance": 1, "dim": 2}, "problem.function"),
                          ({"name": "sphere", "dim": 2, "function": 3}, "applies to name = \"bbob\""),
                          ({"name": "bbob", "function": 1, "instance": 1, "dim": 1}, "dim")]:
        with pytest.raises(hpcevo.ConfigError, match=text):
            hpcevo.run({**base, "problem": problem}, quiet=True)
    with pytest.raises(hpcevo.ConfigError, match="log.coco.*needs a BBOB problem"):
        hpcevo.run({**base, "problem": {"name": "sphere", "dim": 2}, "log": {"coco": True}}, quiet=True)


@pytest.mark.single_process
def test_a_dispatchs_traced_rows_come_home_without_a_program_for_each_length():
    """A run logging COCO's data brings each dispatch's fitness values and candidates home, cut
    to the generations it ran. Cut on the device, that was a slice compiled for every length:
    each run's last dispatch has its own, 30% of a warm 48-run BBOB study. Now a handful of
    slices serve every length, and the rows are the same."""
    import jax.monitoring

    from hpcevo.driver.engine import _first_rows

    values = jnp.arange(200 * 3 * 2, dtype=jnp.float32).reshape(200, 3, 2)
    compiled = []

    def heard(event, seconds, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(heard)
    try:
        for n in range(0, 201):
            rows = _first_rows(values, n)
            assert isinstance(rows, np.ndarray) and rows.shape == (n, 3, 2)
            assert np.array_equal(rows, np.asarray(values)[:n])
    finally:
        jax.monitoring.unregister_event_duration_listener(heard)
    assert len(compiled) <= 8, len(compiled)  # powers of two below 200: 1, 2, 4, ..., 128
