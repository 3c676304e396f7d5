"""Problems by import path: loading, per-individual vs batch, bitwise N ranks == 1 rank, errors."""

from __future__ import annotations

import os
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo import cli
from hpcevo.algorithms import CSO, PSO
from hpcevo.config import config_from_dict
from hpcevo.driver.build import build_algorithm, build_problem
from hpcevo.errors import ConfigError
from hpcevo.parallel import context_for
from hpcevo.problems import create

# The rank matrix: these MPI tests compare two paths at one rank count, or a run with its
# one-rank twin; 2 ranks (an even split) and 3 (an uneven one) cover them, 4 repeats 2.
# The split itself is tested at 4 too (test_parallel, test_algorithms_digest, ...).
pytestmark = pytest.mark.ranks(1, 2, 3)

PROBLEM_FILE = textwrap.dedent(
    """
    import jax.numpy as jnp

    def shifted_sphere(x, shift=0.0, scale=1.0):
        # one candidate: (dim,) -> ()
        return scale * jnp.sum((x - shift) ** 2)

    def block_rastrigin(x):
        # a block: (n, dim) -> (n,); declared, so it is never vmapped
        return jnp.sum(x * x - 10.0 * jnp.cos(2.0 * jnp.pi * x) + 10.0, axis=1)
    block_rastrigin.batched = True

    class Weighted:
        lb, ub = -2.0, 3.0

        def __init__(self, dim, power=2):
            self.dim, self.power = dim, power
            self.w = jnp.arange(1.0, dim + 1.0)

        def evaluate(self, x):
            return jnp.sum(self.w * jnp.abs(x) ** self.power)

    def pair(x):
        return jnp.stack([jnp.sum(x), jnp.sum(x * x)])
    pair.num_objectives = 2

    def vector_out(x):
        return x * 2.0

    def bad_trace(x):
        return jnp.dot(x, jnp.ones(7))

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def problem_file(ctx, shared_tmp):
    """The problem module in a directory every rank sees, written once by rank 0."""
    path = shared_tmp / "userprob.py"
    if ctx.rank == 0:
        path.write_text(PROBLEM_FILE)
    ctx.comm_ctl.Barrier()
    return path


def run(ctx, algo, problem, generations=6, seed=3):
    loop = hpcevo.Loop(algo, problem, ctx).compile(seed).init(seed).advance(generations - 1)
    return [loop.digest(), loop.best_fitness]


@pytest.mark.parametrize("attr,args,batched", [
    ("shifted_sphere", {"shift": 1.5, "scale": 2.0}, False),
    ("block_rastrigin", {}, True),
])
@pytest.mark.slow
def test_file_problem_bitwise_equal_to_one_rank(ctx, references, request, problem_file, attr, args, batched):
    p = create(f"{problem_file}:{attr}", 6, -4.0, 4.0, args)
    assert p.batched is batched and p.dim == 6 and p.num_objectives == 1
    algo = CSO(pop_size=13, dim=6, lb=p.lb, ub=p.ub)
    here = run(ctx, algo, p)
    assert here == references.get(request, "run", lambda: here if ctx.size == 1 else run(context_for(MPI.COMM_SELF), algo, p))
    assert ctx.comm_ctl.allgather(here[0]) == [here[0]] * ctx.size


@pytest.mark.single_process
def test_values_args_and_bounds(problem_file):
    x = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, (5, 4)), jnp.float32)
    p = create(f"{problem_file}:shifted_sphere", 4, -1.0, [1.0, 2.0, 3.0, 4.0], {"shift": 0.5})
    np.testing.assert_allclose(np.asarray(p.evaluate(x)), np.sum((np.asarray(x) - 0.5) ** 2, 1), rtol=1e-6)
    assert p.lb == (-1.0,) * 4 and p.ub == (1.0, 2.0, 3.0, 4.0)
    w = create(f"{problem_file}:Weighted", 4, None, None, {})  # bounds from the class
    assert w.lb == (-2.0,) * 4 and w.ub == (3.0,) * 4
    np.testing.assert_allclose(np.asarray(w.evaluate(x)), np.sum(np.arange(1, 5) * np.asarray(x) ** 2, 1), rtol=1e-6)
    assert create(f"{problem_file}:Weighted", 4, -1.0, None, {}).lb == (-1.0,) * 4  # config wins


@pytest.mark.single_process
def test_how_batch_and_per_individual_are_told_apart(problem_file):
    # Undeclared: decided by shapes. A per-individual function is vmapped.
    assert create(f"{problem_file}:shifted_sphere", 3, -1.0, 1.0).batched is False
    # Declared on the function.
    assert create(f"{problem_file}:block_rastrigin", 3, -1.0, 1.0).batched is True
    # Declared in the config: a wrong declaration is an error, not a silent mis-evaluation.
    with pytest.raises(ValueError, match=r"declared batched: a block of shape \(2, 3\) must give \(2,\)"):
        create(f"{problem_file}:shifted_sphere", 3, -1.0, 1.0, batched=True)
    with pytest.raises(ValueError, match=r"declared per-individual: a candidate of shape \(3,\)"):
        create(f"{problem_file}:block_rastrigin", 3, -1.0, 1.0, batched=False)
    # dim 2: the probe block has 3 rows, so a (dim,)-shaped output is never mistaken for (n,).
    assert create(f"{problem_file}:shifted_sphere", 2, -1.0, 1.0).batched is False


@pytest.mark.single_process
def test_module_path_problem(problem_file, monkeypatch):
    # Not syspath_prepend: it calls into pkg_resources, which setuptools >= 81 no longer ships.
    monkeypatch.setattr(sys, "path", [str(problem_file.parent), *sys.path])
    sys.modules.pop("userprob", None)
    p = create("userprob:shifted_sphere", 3, -1.0, 1.0, {"shift": 1.0})
    assert float(p.evaluate(jnp.ones((1, 3)))[0]) == 0.0
    sys.modules.pop("userprob", None)


def cfg_dict(name: str, **problem) -> dict:
    return {
        "run": {"name": "t", "generations": 3},
        "algorithm": {"name": "pso", "pop_size": 8},
        "problem": {"name": name, "dim": 3, "lb": -1.0, "ub": 1.0, **problem},
    }


def build_error(data: dict) -> str:
    cfg = config_from_dict(data, "t.toml")  # validation alone does not import user code
    with pytest.raises(ConfigError) as e:
        build_algorithm(cfg, build_problem(cfg))
    assert str(e.value).startswith("t.toml: ")  # the message names where the config came from
    return str(e.value)


@pytest.mark.parametrize("suffix,problem,expected", [
    ("missing.py:f", {}, "file 'MISSING' not found (relative paths are taken from the working directory"),
    ("no_such_module_xyz:f", {}, "no module named 'no_such_module_xyz'"),
    (":shifted_spher", {}, "has no attribute 'shifted_spher'; did you mean 'shifted_sphere'?"),
    (":shifted_sphere", {"args": {"shfit": 1.0}}, "[problem.args] do not fit its signature (x, shift, scale)"),
    (":Weighted", {"args": {"powr": 1}}, "[problem.args] do not fit its signature (dim, power)"),
    (":vector_out", {}, "for one candidate it returned shape (3,)"),
    (":vector_out", {}, "declare num_objectives"),
    (":bad_trace", {}, "raised TypeError: dot_general requires contracting dimensions"),
    (":NOT_CALLABLE", {}, "'NOT_CALLABLE' is a int, not a function or a class"),
    (":pair", {}, "has 2 objectives, but algorithm 'pso' optimises one; multi-objective algorithms: moead, nsga2"),
    (":Weighted", {"dim": 4, "args": {"dim": 5}}, "problem.dim = 4 but the problem says its dim is 5"),
    (":shifted_sphere", {"lb": None}, "no lb: set problem.lb"),
])
@pytest.mark.single_process
def test_errors_name_the_problem_and_the_fix(problem_file, suffix, problem, expected):
    if suffix.startswith(":"):
        name = f"{problem_file}{suffix}"
    elif suffix.startswith("missing"):
        name = str(problem_file.parent / suffix)
        expected = expected.replace("MISSING", str(problem_file.parent / "missing.py"))
    else:
        name = suffix
    data = cfg_dict(name, **{k: v for k, v in problem.items() if v is not None})
    if problem.get("lb", 0) is None:
        del data["problem"]["lb"]
    msg = build_error(data)
    assert expected in msg, msg
    assert "[problem]" in msg or "objectives" in msg


@pytest.mark.single_process
def test_broken_module_reports_where(ctx, shared_tmp):
    path = shared_tmp / "broken.py"
    if ctx.rank == 0:
        path.write_text("import jax\n\nx = 1 / 0\n")
    ctx.comm_ctl.Barrier()
    with pytest.raises(ValueError) as e:
        create(f"{path}:f", 3, -1.0, 1.0)
    assert "loading" in str(e.value) and "ZeroDivisionError" in str(e.value) and "line 3" in str(e.value)


@pytest.mark.single_process
def test_bad_name_forms():
    for name in ("mod:", ":f", "a b:f", "mod:f-g"):
        with pytest.raises(ValueError):
            create(name, 3, -1.0, 1.0)
    with pytest.raises(ValueError, match="takes no \\[problem.args\\]"):
        create("sphere", 3, args={"a": 1})
    with pytest.raises(ValueError, match="problem.batched is for problems named by import path"):
        create("sphere", 3, batched=True)


def test_problem_file_on_some_ranks_only_fails_everywhere(ctx, shared_tmp, capsys):
    """The file exists on rank 0's node only: every rank exits 2 before any collective."""
    problem = 'name = "only_root.py:shifted_sphere"\ndim = 3\nlb = -1.0\nub = 1.0\n'
    if run_fails_where_missing(ctx, capsys, shared_tmp, "pso", problem, {"only_root.py": PROBLEM_FILE}):
        assert not (shared_tmp / "out" / "summary.json").exists()


def run_fails_where_missing(ctx, capsys, tmp, algorithm: str, problem: str, on_rank_0: dict[str, str]) -> bool:
    """``hpcevo run`` of a config whose [problem] (TOML lines) names, relative to the working
    directory, files (``on_rank_0``: name -> text) that only rank 0's node has: each rank runs
    in a directory of its own, as each node has its own disk, with the same config. At one
    rank the run succeeds (False); at more, every rank exits 2 and rank 0 alone prints one
    message, naming rank 1 (True)."""
    node = tmp / f"node{ctx.rank}"
    node.mkdir()
    if ctx.rank == 0:
        for name, text in on_rank_0.items():
            (node / name).write_text(text)
            (node / name).chmod(0o755)
    (node / "c.toml").write_text(
        f'[run]\nname = "t"\ngenerations = 1\nout = "{tmp / "out"}"\n'
        f'[algorithm]\nname = "{algorithm}"\npop_size = 8\n[problem]\n{problem}'
    )
    here = os.getcwd()
    os.chdir(node)
    try:
        code = cli.main(["run", "c.toml", "-q"])
    finally:
        os.chdir(here)
    _, err = capsys.readouterr()
    if ctx.size == 1:
        assert code == 0, err
        return False
    assert code == 2
    if ctx.rank == 0:
        assert err.count("error:") == 1 and "not found" in err and "reported by rank 1" in err, err
    else:
        assert err == ""
    return True
