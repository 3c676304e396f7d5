"""`hpcevo.minimize(f, x0, sigma0)`: the one-call entry for the pycma habit (`cma.fmin2`), at any
rank count: it finds the minimum, stops as pycma does, keeps its run directory, and gives the
same bits at every rank count."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import hpcevo
from hpcevo.errors import UsageError


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def sphere_block(x):  # a block function: (rows, n) -> (rows,)
    return jnp.sum((x - 0.25) ** 2, axis=-1)


def test_minimize_finds_rosenbrocks_minimum_and_stops_as_pycma_does(ctx, references, request, shared_tmp, alone):
    result = hpcevo.minimize(rosenbrock, [0.5] * 5, 0.3, out=shared_tmp / "rosen", ctx=ctx)
    # pycma needs about 2,000 evaluations here: so should CMA-ES, and stop by TolFun, not maxiter
    assert result.best_fitness < 1e-8 and np.allclose(result.best_solution, 1.0, atol=1e-3)
    assert result.summary["stopped_by"].startswith("run.stagnation_generations")
    assert 500 < result.evaluations < 6000 and result.evaluations == 8 * result.generations  # lambda = 4 + int(3 ln 5)
    assert result.run_dir == shared_tmp / "rosen" and (result.run_dir / "summary.json").is_file()
    run = hpcevo.open_run(result.run_dir)
    assert run.config["algorithm"]["name"] == "cmaes" and run.config["algorithm"]["x0"] == [0.5] * 5
    assert run.summary["state_digest"] == result.digest and result.summary["ranks"] == ctx.size

    def one_rank():
        if ctx.size == 1:
            return result.digest
        return hpcevo.minimize(rosenbrock, [0.5] * 5, 0.3, out=shared_tmp / "rosen-alone", ctx=alone).digest

    assert result.digest == references.get(request, "digest", one_rank)  # the same bits at any rank count


@pytest.mark.slow  # (two runs of thousands of generations: not the inner loop's)
@pytest.mark.ranks(1, 3)  # (the rules are the run's own, tested at every rank count elsewhere)
def test_minimize_in_bounds_to_a_target_and_with_bipop_restarts(ctx, shared_tmp):
    boxed = hpcevo.minimize(sphere_block, np.full(4, 0.9), 0.5, bounds=(0.0, [1.0, 1.0, 2.0, 2.0]), target=1e-9,
                            out=shared_tmp / "box", ctx=ctx)
    assert boxed.best_fitness <= 1e-9 and boxed.summary["stopped_by"].startswith("run.target")
    assert np.all(boxed.best_solution >= 0.0) and np.all(boxed.best_solution <= [1.0, 1.0, 2.0, 2.0])
    assert hpcevo.open_run(boxed.run_dir).config["algorithm"]["clip"] is True
    bipop = hpcevo.minimize(rosenbrock, [0.0] * 3, 0.5, restarts="bipop", evaluations=2500, out=shared_tmp / "bipop",
                            ctx=ctx)
    assert bipop.summary["stopped_by"].startswith("run.evaluations")
    assert 2500 <= bipop.evaluations < 2500 + 8 * 2**9 and bipop.best_fitness < 1e-6


@pytest.mark.slow  # (five runs: the folder rule, not the inner loop's)
@pytest.mark.ranks(1, 2)
def test_minimize_replaces_its_default_folder_but_not_one_you_name(ctx, shared_tmp):
    here = os.getcwd()
    try:
        os.chdir(shared_tmp)  # (every rank sees it)
        first = hpcevo.minimize(sphere_block, [0.0, 0.0], 0.2, evaluations=60, ctx=ctx)
        again = hpcevo.minimize(sphere_block, [0.5, 0.5], 0.2, evaluations=60, ctx=ctx, seed=1)  # as pycma's outcmaes
        assert first.run_dir.resolve() == again.run_dir.resolve() == (shared_tmp / "runs" / "minimize").resolve()
        summary = json.loads((shared_tmp / "runs" / "minimize" / "summary.json").read_text())
        assert summary["seed"] == 1
        named = shared_tmp / "mine"
        hpcevo.minimize(sphere_block, [0.0, 0.0], 0.2, evaluations=60, out=named, ctx=ctx)
        with pytest.raises(UsageError, match="overwrite"):
            hpcevo.minimize(sphere_block, [0.0, 0.0], 0.2, evaluations=60, out=named, ctx=ctx)
        assert hpcevo.minimize(sphere_block, [0.0, 0.0], 0.2, evaluations=60, out=named, overwrite=True,
                               ctx=ctx).run_dir == named
    finally:
        os.chdir(here)


@pytest.mark.single_process
@pytest.mark.parametrize("kw, message", [
    ({"x0": []}, "'x0' must be a non-empty vector"),
    ({"x0": [[1.0, 2.0]]}, "'x0' must be a non-empty vector"),
    ({"x0": [1.0, float("nan")]}, "'x0' must be a non-empty vector"),
    ({"x0": "abc"}, "'x0' must be a vector of numbers"),
    ({"sigma0": 0.0}, "'sigma0' must be a positive number"),
    ({"sigma0": True}, "'sigma0' must be a positive number"),
    ({"restarts": "lots"}, "'restarts' must be 'none', 'ipop' or 'bipop'"),
    ({"evaluations": 0}, "'evaluations' must be a whole number >= 1"),
    ({"popsize": 1}, "'popsize' must be a whole number >= 2"),
    ({"bounds": (1.0, 0.0)}, "'bounds' must have lower < upper"),
    ({"bounds": (0.5, 2.0)}, "with x0 inside"),
    ({"bounds": ([0.0, 0.0, 0.0], 1.0)}, "'bounds' must be \\(lower, upper\\)"),
])
def test_bad_arguments_get_one_clear_error(kw, message, tmp_path):
    args = {"x0": [0.1, 0.2], "sigma0": 0.3, **kw}
    with pytest.raises(UsageError, match=message):
        hpcevo.minimize(sphere_block, args.pop("x0"), args.pop("sigma0"), out=tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()  # nothing was started
