"""No collective entry point leaves ranks waiting when their input differs or their user code
fails on some ranks only: every rank raises the same hpcevo error, quickly (issue: "No hang, no
silent fork..."). Each test runs at every rank count; the input of the last rank is the odd one
(at one rank, that is the only rank: the call then fails or succeeds as it does alone).

A test here that hangs is a failure: the CTest timeout ends it (and `-m mpi4py` aborts the
job when a rank leaves with an error).
"""

from __future__ import annotations

import os
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import hpcevo
from configs import small_config
from hpcevo import cli
from hpcevo.algorithms import CSO, DE
from hpcevo.errors import ConfigError, UsageError, UserCodeExit
from hpcevo.problems import make_problem

# The rank matrix: what these MPI tests check (an error or an input on some ranks reaching
# every rank) needs a last rank and a middle one: 2 and 3 ranks have them, 4 repeats them.
pytestmark = pytest.mark.ranks(1, 2, 3)


def odd(ctx) -> bool:
    """This rank gets the odd input (the last rank; at one rank, rank 0)."""
    return ctx.rank == ctx.size - 1


config = small_config


def same_everywhere(ctx, error: BaseException) -> str:
    """The error's type and first line, checked to be the same on every rank (the rank that
    reported it keeps its own text; the others add "(reported by rank N)")."""
    mine = (type(error).__name__, str(error).split(" (reported by rank")[0])
    everyone = ctx.comm_ctl.allgather(mine)
    assert everyone == [everyone[0]] * ctx.size, everyone
    return str(error)


# -- hpcevo.run ----------------------------------------------------------------------------------
def test_run_with_a_config_file_that_one_rank_lacks(ctx, shared_tmp):
    """A config on a node-local disk that one node lacks: same path, one rank cannot read it."""
    node = shared_tmp / f"node{ctx.rank}"
    node.mkdir()
    if not odd(ctx):
        (node / "c.toml").write_text('[algorithm]\nname = "cso"\npop_size = 8\n[problem]\nname = "sphere"\ndim = 3\n')
    here = os.getcwd()
    os.chdir(node)
    try:
        with pytest.raises(ConfigError) as e:
            hpcevo.run("c.toml", ctx=ctx, quiet=True)
    finally:
        os.chdir(here)
    text = same_everywhere(ctx, e.value)
    assert "'c.toml' not found" in text
    if ctx.size > 1 and not odd(ctx):
        assert f"reported by rank {ctx.size - 1}" in text


def test_run_with_a_dict_that_is_bad_on_one_rank(ctx, shared_tmp):
    data = config(shared_tmp / "r")
    if odd(ctx):
        data["algorithm"]["pop_size"] = np.int64(-1)  # (a NumPy scalar: accepted as the number it holds)
    with pytest.raises(ConfigError) as e:
        hpcevo.run(data, ctx=ctx, quiet=True)
    assert e.value.key == "algorithm.pop_size"
    same_everywhere(ctx, e.value)
    assert not (shared_tmp / "r").exists()  # refused before anything was written


def test_run_with_configs_that_differ_between_ranks_is_refused(ctx, shared_tmp):
    data = config(shared_tmp / "r", run={"seed": 5 if odd(ctx) and ctx.size > 1 else 2})
    if ctx.size == 1:
        assert hpcevo.run(data, ctx=ctx, quiet=True).status == "complete"
        return
    with pytest.raises(UsageError) as e:
        hpcevo.run(data, ctx=ctx, quiet=True)
    text = same_everywhere(ctx, e.value)
    assert "differs between ranks" in text and "'config.run.seed' is 2 on rank 0 and 5 there" in text
    assert not (shared_tmp / "r").exists()


def test_run_with_an_option_that_differs_between_ranks_is_refused(ctx, shared_tmp):
    data = config(shared_tmp / "r")
    hpcevo.run(data, ctx=ctx, quiet=True)
    with pytest.raises(UsageError) as e:  # one rank would replace the run the others continue
        hpcevo.run(data, ctx=ctx, quiet=True, resume=not odd(ctx), overwrite=odd(ctx) and ctx.size > 1)
    text = same_everywhere(ctx, e.value)
    assert ("differs between ranks" in text) if ctx.size > 1 else ("already holds a run" in text)


def test_run_with_arguments_of_the_wrong_type_names_them(ctx, shared_tmp):
    data = config(shared_tmp / "r")
    cases = [({"config": None}, "'config' must be"), ({"quiet": "yes"}, "'quiet'"), ({"deadline": 5j}, "'deadline'"),
             ({"deadline": "soon"}, "deadline"), ({"overwrite": True, "resume": True}, "exclude each other"),
             ({"stop": 3}, "'stop'"), ({"host": "no"}, "'host'"), ({"algorithm": "cso"}, "not an hpcevo algorithm")]
    for kw, needle in cases:
        args = {"config": data, "ctx": ctx, "quiet": True, **kw}
        with pytest.raises(UsageError) as e:
            hpcevo.run(args.pop("config"), **args)
        assert needle in same_everywhere(ctx, e.value), (kw, str(e.value))
    with pytest.raises(UsageError, match="'ctx' must be a ParallelContext"):
        hpcevo.run(data, ctx="world")


def test_run_returns_on_every_rank_after_the_summary_is_written(ctx, shared_tmp):
    result = hpcevo.run(config(shared_tmp / "r"), ctx=ctx, quiet=True)
    summary = hpcevo.open_run(result.run_dir).summary  # on every rank, right away
    assert summary is not None and summary["state_digest"] == result.digest


# -- user code that ends its process ------------------------------------------------------------
HOST_EXIT = '''
import os, sys
import numpy as np

def f(x):
    if int(os.environ.get("HPCEVO_TEST_EXIT_RANK", "-1")) == {rank}:
        sys.exit(3)
    return np.sum(x ** 2, axis=1)
'''


def test_a_host_problem_that_calls_sys_exit_on_one_rank(ctx, shared_tmp, capsys):
    """Through the API: every rank raises UserCodeExit naming the rank and the user's line;
    through the CLI: every rank exits 2, rank 0 alone prints one message."""
    if ctx.rank == 0:
        (shared_tmp / "exits.py").write_text(HOST_EXIT.format(rank=ctx.size - 1))
    ctx.comm_ctl.Barrier()
    os.environ["HPCEVO_TEST_EXIT_RANK"] = str(ctx.rank)
    try:
        data = config(shared_tmp / "r", problem={"name": f"{shared_tmp / 'exits.py'}:f", "host": True, "lb": -1.0,
                                                 "ub": 1.0}, parallel={"microbatch": 1})
        with pytest.raises(UserCodeExit) as e:
            hpcevo.run(data, ctx=ctx, quiet=True)
        text = same_everywhere(ctx, e.value)
        assert f"called sys.exit(3) on rank {ctx.size - 1} ({shared_tmp / 'exits.py'}, line 7)" in text
        capsys.readouterr()
        code = cli._main(ctx, ["run", str(_toml(ctx, shared_tmp, data)), "-q", "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("hpcevo: error:") == (1 if ctx.rank == 0 else 0) and "Traceback" not in err
    finally:
        del os.environ["HPCEVO_TEST_EXIT_RANK"]


def _toml(ctx, tmp, data):
    import tomli_w

    path = tmp / "c.toml"
    if ctx.rank == 0:
        path.write_text(tomli_w.dumps(data))
    ctx.comm_ctl.Barrier()
    return path


def test_a_problem_module_that_calls_sys_exit_while_loading_on_one_rank(ctx, shared_tmp):
    if ctx.rank == 0:
        (shared_tmp / "bye.py").write_text(textwrap.dedent(f'''
            import os, sys
            import jax.numpy as jnp
            if os.environ.get("HPCEVO_TEST_RANK") == "{ctx.size - 1}":
                sys.exit("no licence on this node")
            def f(x):
                return jnp.sum(x ** 2)
            '''))
    ctx.comm_ctl.Barrier()
    os.environ["HPCEVO_TEST_RANK"] = str(ctx.rank)
    try:
        data = config(shared_tmp / "r", problem={"name": f"{shared_tmp / 'bye.py'}:f", "lb": -1.0, "ub": 1.0})
        with pytest.raises(UserCodeExit) as e:
            hpcevo.run(data, ctx=ctx, quiet=True)
    finally:
        del os.environ["HPCEVO_TEST_RANK"]
    assert "called sys.exit('no licence on this node')" in same_everywhere(ctx, e.value)


# -- Loop and Archipelago ---------------------------------------------------------------------------
def test_loop_with_a_function_that_raises_on_one_rank(ctx):
    def f(x):
        if odd(ctx):
            raise RuntimeError("no data here")
        return jnp.sum(x ** 2)

    with pytest.raises(ConfigError) as e:
        hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), f, ctx)
    assert "RuntimeError: no data here" in same_everywhere(ctx, e.value)


class RaisesWhenCompiled:
    """A problem object (not traced when the Loop is made): it fails when the step is compiled."""

    name, dim, lb, ub, num_objectives, host = "odd", 3, (-1.0,) * 3, (1.0,) * 3, 1, False
    wants_generation = block_invariant = False

    def __init__(self, fails: bool):
        self.fails = fails

    def evaluate(self, x):
        if self.fails:
            raise ValueError("cannot trace on this rank")
        return jnp.sum(x ** 2, axis=-1)

    def pareto_front(self):
        return None

    def default_ref_point(self):
        return None


def test_loop_whose_problem_fails_to_compile_on_one_rank(ctx):
    loop = hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), RaisesWhenCompiled(odd(ctx)), ctx)
    with pytest.raises(UsageError) as e:
        loop.init(0)
    text = same_everywhere(ctx, e.value)
    assert "the problem raised ValueError: cannot trace on this rank" in text and "test_agreement.py" in text


def test_loop_arguments_bad_or_different_on_one_rank(ctx, shared_tmp):
    loop = hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), make_problem("sphere", 3), ctx)
    with pytest.raises(UsageError, match="no state yet"):
        loop.save(shared_tmp / "ck")  # before init
    for bad in ("7", 2**40, -1, 1.5, True):
        with pytest.raises(ConfigError) as e:
            loop.init(bad if odd(ctx) else 7)
        assert e.value.key == "seed"
        same_everywhere(ctx, e.value)
    loop.init(7)
    for bad in ("3", 2.5, -2):
        with pytest.raises(ConfigError) as e:
            loop.advance(bad if odd(ctx) else 3)
        assert e.value.key == "generations"
    if ctx.size > 1:
        with pytest.raises(UsageError, match="differs between ranks") as e:
            loop.advance(4 if odd(ctx) else 3)
        same_everywhere(ctx, e.value)
    loop.advance(3)
    assert loop.generation == 4
    with pytest.raises(UsageError, match="not a file"):
        loop.load(shared_tmp / ("absent.h5" if odd(ctx) else "also-absent.h5"))
    path = loop.save(shared_tmp / "ck")
    with pytest.raises(UsageError) as e:  # a checkpoint that one rank does not see
        hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), make_problem("sphere", 3), ctx).load(
            path if not odd(ctx) else shared_tmp / "elsewhere.h5")
    same_everywhere(ctx, e.value)


def test_loop_options_checked_like_the_config(ctx):
    algo, problem = CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), make_problem("sphere", 3)
    for kw, key in (({"microbatch": -1}, "microbatch"), ({"schedule": "fifo"}, "schedule"),
                    ({"penalty": float("nan")}, "penalty"), ({"concurrency": 0}, "concurrency")):
        with pytest.raises(ConfigError) as e:
            hpcevo.Loop(algo, problem, ctx, **kw)
        assert e.value.key == key
    with pytest.raises(ConfigError, match="not an hpcevo algorithm"):
        hpcevo.Loop("cso", problem, ctx)
    with pytest.raises(UsageError, match="'ctx' must be a ParallelContext"):
        hpcevo.Loop(algo, problem, "world")
    if ctx.size > 1:  # another algorithm on one rank would compute another run
        with pytest.raises(UsageError, match="'algorithms\\[0\\].phi' is 0.1 on rank 0 and 0.3 there"):
            hpcevo.Loop(CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0, phi=0.3 if odd(ctx) else 0.1), problem, ctx)


def test_archipelago_takes_a_function_and_checks_its_arguments(ctx):
    algos = [CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0), DE(pop_size=8, dim=3, lb=-1.0, ub=1.0)]
    arch = hpcevo.Archipelago(algos, lambda x: jnp.sum(x ** 2), ctx, hpcevo.Migration(every=2, migrants=1)).init(0)
    arch.advance(3)
    assert arch.generation == 4 and np.isfinite(arch.best_fitness)
    for kw, needle in (({"migration": (2, 1)}, "'migration' must be an hpcevo.Migration"),
                       ({"names": ["a"]}, "'names' must be a list of 2 strings"),
                       ({"algorithms": []}, "non-empty list")):
        args = {"algorithms": algos, "problem": make_problem("sphere", 3), "ctx": ctx, **kw}
        with pytest.raises(UsageError, match=needle):
            hpcevo.Archipelago(**args)
    with pytest.raises(ConfigError) as e:
        hpcevo.Migration(every=0, migrants=1)
    assert e.value.key == "every"
    with pytest.raises(ConfigError, match="'ring', 'all' or 'random'"):
        hpcevo.Migration(every=2, migrants=1, topology="star")
    if ctx.size > 1:
        with pytest.raises(UsageError, match="differs between ranks"):
            hpcevo.Archipelago(algos, make_problem("sphere", 3), ctx,
                               hpcevo.Migration(every=2, migrants=2 if odd(ctx) else 1))


# -- ends the job from a process that ends itself ---------------------------------------------------
@pytest.mark.launcher
@pytest.mark.parametrize("n", [None, 3])
def test_os_exit_in_a_problem_ends_the_job_with_one_message_naming_the_rank(tmp_path, n):
    from test_launcher import hpcevo as launch

    (tmp_path / "quits.py").write_text(textwrap.dedent('''
        import os
        import numpy as np
        def f(x):
            if os.environ.get("PMI_RANK", "0") == os.environ["QUIT_RANK"]:
                os._exit(0)
            return np.sum(x ** 2, axis=1)
        '''))
    rank = "1" if n else "0"
    (tmp_path / "c.toml").write_text(textwrap.dedent(f'''
        [run]
        generations = 5
        out = "{tmp_path / 'out'}"
        [algorithm]
        name = "cso"
        pop_size = 8
        [problem]
        name = "{tmp_path / 'quits.py'}:f"
        host = true
        dim = 3
        lb = -1.0
        ub = 1.0
        [parallel]
        microbatch = 1
        '''))
    os.environ["QUIT_RANK"] = rank
    try:
        r = launch(n, "run", str(tmp_path / "c.toml"), "-q", timeout=120)
    finally:
        del os.environ["QUIT_RANK"]
    # os._exit(0) must not pass for success: hydra reports 0 when a rank leaves with 0 unfinished
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert r.stderr.count(f"called os._exit(0) on rank {rank}") == 1, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "summary.json").exists()


# -- a resume that would fork the run -----------------------------------------------------------------
def test_islands_settings_changed_on_resume_are_refused_on_every_rank(ctx, shared_tmp):
    """The fork the audit found: [islands] keys changed between a stop and its resume were
    accepted. (Every key of the resolved config: tests/test_resume_lock.py.)"""
    islands = {"count": 3, "migrate_every": 2, "migrants": 1}
    whole = hpcevo.run(config(shared_tmp / "whole", islands=islands, run={"generations": 6}), ctx=ctx, quiet=True)
    hpcevo.run(config(shared_tmp / "r", islands=islands, run={"generations": 3}), ctx=ctx, quiet=True)
    for key, value in (("migrants", 2), ("topology", "all"), ("migrate_every", 3), ("emigrants", "random")):
        with pytest.raises(UsageError) as e:
            hpcevo.run(config(shared_tmp / "r", islands={**islands, key: value}, run={"generations": 6}), ctx=ctx,
                       quiet=True, resume=True)
        assert f"islands.{key}: checkpoint has" in same_everywhere(ctx, e.value)
    resumed = hpcevo.run(config(shared_tmp / "r", islands=islands, run={"generations": 6}), ctx=ctx, quiet=True,
                         resume=True)
    assert resumed.summary["resumed_from"] == 3 and resumed.digest == whole.digest


@pytest.mark.launcher
def test_a_script_that_fails_on_one_rank_before_a_collective_ends_the_job(tmp_path):
    """``mpiexec -n 3 python study.py`` where one rank raises before hpcevo.run: the job ends
    (hpcevo.parallel makes an uncaught exception MPI_Abort, as ``python -m mpi4py`` does)."""
    import subprocess
    import time

    from test_launcher import MPIEXEC, clean_env

    script = tmp_path / "study.py"
    script.write_text(textwrap.dedent(f'''
        import hpcevo
        ctx = hpcevo.parallel.init()
        if ctx.rank == 1:
            raise ValueError("only rank 1 has no data")
        hpcevo.run({{"algorithm": {{"name": "cso", "pop_size": 8}}, "problem": {{"name": "sphere", "dim": 2}},
                    "run": {{"out": "{tmp_path / 'out'}"}}}}, ctx=ctx, quiet=True)
        '''))
    t = time.monotonic()
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=clean_env())
    assert r.returncode != 0 and time.monotonic() - t < 60
    assert "ValueError: only rank 1 has no data" in r.stderr
    assert "[rank 1] an uncaught ValueError ends the job" in r.stderr, r.stderr


@pytest.mark.launcher
def test_a_collective_call_on_rank_0_alone_ends_the_job_when_the_others_end(tmp_path):
    """``loop.ask()`` under ``if rank == 0:`` at 3 ranks, the others going on to the end of the
    script: rank 0 waited forever for them (they sat in MPI_Finalize). Now every rank's exit is
    one more collective call, so rank 0 learns at once that the others ended, and says so."""
    import subprocess
    import time

    from test_launcher import MPIEXEC, clean_env

    script = tmp_path / "ask.py"
    script.write_text(textwrap.dedent('''
        import hpcevo
        ctx = hpcevo.parallel.init()
        algo = hpcevo.algorithms.PSO(pop_size=8, dim=2, lb=-1.0, ub=1.0)
        loop = hpcevo.Loop(algo, hpcevo.problems.make_problem("sphere", 2), ctx).init(0)
        if ctx.rank == 0:
            loop.ask()
        '''))
    t = time.monotonic()
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=clean_env())
    assert r.returncode != 0 and time.monotonic() - t < 60
    assert ("the ranks are in different collective calls: rank 0 in Loop.ask, ranks 1, 2 in the end of the "
            "program") in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("in the end of the program") == 1  # (said where the call was made, once)
