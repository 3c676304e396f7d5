"""hpcevo's algorithms as gest-api generators (`hpcevo.gest.Generator`): driven by libEnsemble
(examples/libensemble_cmaes.py, local comms), and by hand, the run they make is hpcevo's own
loop on the same values, bit for bit."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gest_api", reason="gest-api is a test dependency (scripts/setup.sh installs it)")
from gest_api.vocs import VOCS  # noqa: E402

from hpcevo.algorithms import ALGORITHMS  # noqa: E402
from hpcevo.driver.loop import Loop  # noqa: E402
from hpcevo.gest import Generator  # noqa: E402
from hpcevo.parallel import alone  # noqa: E402
from hpcevo.problems.host import CallableProblem  # noqa: E402
from test_launcher import clean_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.single_process


def _reference(algorithm, fn, seed: int, generations: int, rows: int) -> Loop:
    """hpcevo's own loop evaluating ``fn`` (of one point) itself, one call a generation."""
    problem = CallableProblem("reference", algorithm.dim, algorithm.lb, algorithm.ub,
                              lambda x: np.array([fn(row) for row in x]), batched=True)
    loop = Loop(algorithm, problem, alone(), microbatch=rows).init(seed)
    if generations > 1:
        loop.advance(generations - 1)
    return loop


def rosenbrock(x: np.ndarray) -> float:  # as examples/libensemble_cmaes.py computes it
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


@pytest.mark.slow  # (libEnsemble's processes: not the inner loop's)
def test_libensemble_drives_hpcevos_cmaes_and_the_run_is_hpcevos_own_loop(tmp_path):
    # (in a folder of its own: libEnsemble writes ensemble.log and libE_stats.txt where it runs)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "libensemble_cmaes.py"), "--nworkers", "2",
                        "--comms", "local"], capture_output=True, text=True, env=clean_env(), timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["generations"] >= 140 and got["evaluated"] == 150 * 8  # 150 generations of lambda 8
    algorithm = ALGORITHMS["cmaes"](pop_size=8, dim=4, lb=(-2.0,) * 4, ub=(2.0,) * 4)
    ref = _reference(algorithm, rosenbrock, 7, got["generations"], 8)
    assert got["digest"] == ref.digest()  # bit for bit: the points, the state, the best
    assert got["best_fitness"] == float(ref.best_fitness) < 1e-3
    assert list(got["best_solution"].values()) == [float(v) for v in np.asarray(ref.best_solution)]


@pytest.mark.parametrize("name, hyper", [("de", {"pop_size": 12}), ("cmaes", {"restart": "ipop", "lambda0": 6,
                                                                                "pop_size": 48})])
def test_suggest_and_ingest_by_hand_in_any_order_and_pieces(name, hyper):
    """Values come back shuffled, in two pieces, half of them without _id (matched by value);
    a maximised objective is negated for hpcevo and reported as given; constants ride along."""
    vocs = VOCS(variables={"a": [-3.0, 3.0], "b": [-1.0, 2.0], "c": [0.0, 4.0]}, objectives={"gain": "MAXIMIZE"},
                constants={"label": 5.0})
    gain = lambda p: -((p[0] - 1.0) ** 2 + p[1] ** 2 + (p[2] - 2.0) ** 4)  # noqa: E731
    gen = Generator(vocs, name, seed=3, **hyper)
    rng = np.random.default_rng(0)
    for _ in range(25):
        points = gen.suggest()  # the generator decides: what is left of the generation
        assert {"a", "b", "c", "label", "_id"} <= set(points[0]) and points[0]["label"] == 5.0
        done = [{**p, "gain": gain([p["a"], p["b"], p["c"]])} for p in points]
        done = [done[i] for i in rng.permutation(len(done))]
        for d in done[::2]:
            del d["_id"]
        gen.ingest(done[: len(done) // 2])
        gen.ingest(done[len(done) // 2:])
    gen.finalize()
    assert gen.generation == 25
    algorithm = ALGORITHMS[name](dim=3, lb=(-3.0, -1.0, 0.0), ub=(3.0, 2.0, 4.0), **hyper)
    ref = _reference(algorithm, lambda x: -gain(x), 3, 25, max(algorithm.num_init, algorithm.num_ask))
    assert gen.loop.digest() == ref.digest()
    assert gen.best_fitness == -float(ref.best_fitness) and gen.best_fitness > -0.05


def test_what_a_generational_algorithm_cannot_do_is_a_clear_valueerror():
    vocs = VOCS(variables={"x": [0.0, 1.0], "y": [0.0, 1.0]}, objectives={"f": "MINIMIZE"})
    gen = Generator(vocs, "pso", pop_size=10, seed=1)
    first = gen.suggest(4)
    with pytest.raises(ValueError, match="7 points asked, 6 left in this generation of 10"):
        gen.suggest(7)
    rest = gen.suggest(6)
    with pytest.raises(ValueError, match="0 left"):
        gen.suggest(1)  # the next generation needs this one's values
    with pytest.raises(ValueError, match="_id 99 is not a point of the open generation"):
        gen.ingest([{"x": 0.5, "y": 0.5, "f": 1.0, "_id": 99}])
    with pytest.raises(ValueError, match="did not suggest"):
        gen.ingest([{"x": 0.123, "y": 0.5, "f": 1.0}])
    gen.ingest([{**p, "f": math.nan if i == 0 else p["x"] + p["y"]} for i, p in enumerate(first + rest)])
    assert len(gen.suggest(10)) == 10  # generation 2 (a NaN counts as the worst value)
    gen.finalize()
    assert gen.generation == 1
    with pytest.raises(ValueError, match="finalized"):
        gen.suggest(1)
    for bad, message in ((dict(variables={"x": [0.0, 1.0]}, objectives={"f": "MINIMIZE"},
                               constraints={"c": ["LESS_THAN", 0.0]}), "no constraints"),
                         (dict(variables={"x": {0, 1, 2}}, objectives={"f": "MINIMIZE"}), "finite domain"),
                         (dict(variables={"x": [0.0, 1.0]}, objectives={"f": "MINIMIZE", "g": "MINIMIZE"}),
                          "one objective"),
                         (dict(variables={"x": [0.0, 1.0]}, objectives={"f": "EXPLORE"}), "one objective")):
        with pytest.raises(ValueError, match=message):
            Generator(VOCS(**bad), "cmaes")
    with pytest.raises(ValueError, match="not one of hpcevo's"):
        Generator(vocs, "nope")
