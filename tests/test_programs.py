"""Programs kept on disk (hpcevo/driver/programs.py): a launch that runs programs an earlier
launch compiled loads them without tracing or lowering, and its run is bitwise the run compiled
from scratch; what the key is made of; what is never kept; a damaged file is a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcevo
from hpcevo.driver import programs

from test_launcher import clean_env

ROOT = Path(__file__).resolve().parents[1]
# BIPOP-CMA-ES on BBOB: LAPACK's eigendecomposition inside (a program loaded without lowering
# must find LAPACK set up), population buckets (one program per bucket), instance data as data.
CMAES = ["--set", "run.generations=150", "--set", "algorithm.pop_size=200", "--set", "problem.dim=4"]


def launch(cache: Path, out: Path, *extra: str, store: bool = True) -> dict:
    # Without the store, over the suite's own JAX cache where it has one (compiled there before:
    # the runs compared with are the same either way, and the suite pays no XLA compile for them).
    jax_cache = cache if store else Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache)
    env = {**clean_env(), "JAX_COMPILATION_CACHE_DIR": str(jax_cache), "HPCEVO_PROGRAM_CACHE": "1" if store else "0"}
    r = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(ROOT / "examples" / "bbob_f8.toml"), "--quiet",
                        "--set", f"run.out={out}", *CMAES, *extra], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def kept(cache: Path) -> list[Path]:
    return sorted(cache.glob("hpcevo-*.program"))


def store_over_suite_cache(cache: Path) -> Path:
    """An empty program store (``cache``) over the XLA executables of the suite's own JAX cache:
    links to its entries, never its ``hpcevo-*.program`` files. What is tested is the store (what
    it keeps, what it loads, the bits of what it loads). The programs it keeps are still compiled
    by XLA (what it keeps must be); the small ones it never keeps (seeds, fingerprints) now load
    as everywhere else in the suite instead of compiling from nothing: 106 -> 42 s for the test
    of every algorithm. Without a suite cache: empty."""
    cache.mkdir(mode=0o700)
    suite = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if suite and Path(suite).is_dir() and Path(suite).resolve() != cache.resolve():
        for entry in Path(suite).iterdir():
            if entry.name.endswith("-cache") and entry.is_file():
                try:
                    os.link(entry, cache / entry.name)
                except OSError:  # (another file system)
                    os.symlink(entry, cache / entry.name)
    return cache


@pytest.mark.single_process
def test_a_second_launch_loads_its_programs_and_runs_bitwise_the_run_compiled_from_scratch(tmp_path):
    cache = store_over_suite_cache(tmp_path / "cache")
    scratch = launch(cache, tmp_path / "off", store=False)
    assert scratch["programs_loaded"] == scratch["programs_kept"] == 0 and not kept(cache)

    first = launch(cache, tmp_path / "first")
    files = kept(cache)
    assert first["programs_kept"] >= 2 and len(files) == first["programs_kept"] and first["programs_loaded"] == 0
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)  # (executed when loaded: this user's only)
    again = launch(cache, tmp_path / "again")
    assert again["programs_loaded"] == first["programs_kept"] and again["programs_kept"] == 0
    assert scratch["state_digest"] == first["state_digest"] == again["state_digest"]
    assert again["generations"] == scratch["generations"] and again["evaluations"] == scratch["evaluations"]

    # another instance (data to the programs) and another seed load the same programs; a
    # resumed run too
    other = launch(cache, tmp_path / "i2", "--set", "problem.instance=2", "--set", "run.seed=7")
    assert other["programs_loaded"] >= 2 and other["programs_kept"] == 0
    assert other["state_digest"] == launch(cache, tmp_path / "i2-off", "--set", "problem.instance=2", "--set",
                                           "run.seed=7", store=False)["state_digest"]
    # another population is another program: compiled and kept beside the others
    bigger = launch(cache, tmp_path / "pop", "--set", "algorithm.pop_size=400")
    assert bigger["programs_kept"] >= 1 and len(kept(cache)) == len(files) + bigger["programs_kept"]

    # a damaged file is a miss: compiled again, written anew, the same run
    for f in kept(cache):
        f.write_bytes(f.read_bytes()[:100])
    mended = launch(cache, tmp_path / "mended")
    assert mended["programs_loaded"] == 0 and mended["programs_kept"] >= 2
    assert mended["state_digest"] == scratch["state_digest"]
    assert launch(cache, tmp_path / "after")["programs_loaded"] >= 2


EVERY = r"""
import json, sys
import hpcevo
from hpcevo.algorithms import ALGORITHMS
from hpcevo.driver import programs
from hpcevo.problems import make_problem
out = {}
for name, cls in sorted(ALGORITHMS.items()):
    problem = make_problem("zdt1", 5) if cls.multi_objective else make_problem("rastrigin", 5)
    kw = {"neighbours": 4} if name == "moead" else {}
    algorithm = cls(pop_size=14, dim=5, lb=problem.lb, ub=problem.ub, **kw)
    loop = hpcevo.Loop(algorithm, problem).init(3).advance(6)
    out[name] = loop.digest()
print(json.dumps({"digests": out, "loaded": programs.loaded, "kept": programs.stored}))
"""


@pytest.mark.single_process
@pytest.mark.slow  # (three interpreters, each compiling or loading 28 programs)
def test_every_algorithm_loaded_from_disk_runs_bitwise_as_compiled(tmp_path):
    cache = store_over_suite_cache(tmp_path / "cache")

    def script(store: bool) -> dict:
        # (without the store, over the suite's own cache where it has one: compiled there before)
        where = cache if store else os.environ.get("JAX_COMPILATION_CACHE_DIR", cache)
        env = {**clean_env(), "JAX_COMPILATION_CACHE_DIR": str(where), "HPCEVO_PROGRAM_CACHE": "1" if store else "0"}
        r = subprocess.run([sys.executable, "-c", EVERY], capture_output=True, text=True, env=env, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    from hpcevo.algorithms import ALGORITHMS

    off, first, again = script(False), script(True), script(True)
    assert set(off["digests"]) == set(ALGORITHMS) and off["loaded"] == off["kept"] == 0
    assert first["kept"] == 2 * len(ALGORITHMS) and first["loaded"] == 0
    assert again["loaded"] == 2 * len(ALGORITHMS) and again["kept"] == 0
    assert off["digests"] == first["digests"] == again["digests"]


@pytest.mark.single_process
def test_what_a_program_is_made_of_is_written_out_for_hpcevos_pieces_only():
    """The id of an engine's programs (the key that shares engines in a process, written out):
    equal where the programs are (another BBOB function, instance or hyper-parameter value: data to them),
    other where they differ; none for code of the user's."""
    from types import SimpleNamespace

    from hpcevo.algorithms import CMAES, CSO
    from hpcevo.driver.loop import as_loop_problem, disk_id, engine_key
    from hpcevo.driver.recording import recorder_for
    from hpcevo.problems import make_problem
    from hpcevo.problems.bbob import make_bbob

    one = SimpleNamespace(size=1, device_kind="cpu")

    def made_of(algorithm, problem, microbatch=None, trace=""):
        problem = as_loop_problem(problem, algorithm, False)
        return disk_id(problem, engine_key(algorithm, problem, one, microbatch, None, recorder_for(problem), trace), one)

    f8 = [make_bbob(8, i, 5) for i in (1, 2)]
    cma = CMAES(pop_size=12, dim=5, lb=f8[0].lb, ub=f8[0].ub)
    same = made_of(cma, f8[0])
    assert same is not None and made_of(cma, f8[1]) == same == made_of(cma, f8[0])  # (the instance is data)
    assert made_of(cma, make_bbob(9, 1, 5)) == same  # (so is the function: problems/bbob.py)
    others = [made_of(CMAES(pop_size=14, dim=5, lb=f8[0].lb, ub=f8[0].ub), f8[0]), made_of(cma, make_bbob(8, 1, 5, lb=-4.0)),
              made_of(cma, f8[0], microbatch=4), made_of(cma, f8[0], trace="f")]
    assert None not in others and len({same, *others}) == 5
    assert disk_id(f8[0], engine_key(cma, f8[0], SimpleNamespace(size=1, device_kind="gpu"), None, None,
                                     recorder_for(f8[0])), SimpleNamespace(size=1, device_kind="gpu")) != same
    rastrigin = make_problem("rastrigin", 5)
    cso = CSO(pop_size=8, dim=5, lb=rastrigin.lb, ub=rastrigin.ub)
    assert made_of(cso, rastrigin) not in (None, same)
    assert made_of(CSO(pop_size=8, dim=5, lb=rastrigin.lb, ub=rastrigin.ub, phi=0.3), rastrigin) == made_of(
        cso, rastrigin)  # (a dynamic hyper-parameter is data)
    assert made_of(CMAES(pop_size=12, dim=5, lb=f8[0].lb, ub=f8[0].ub, sigma_init=0.7), f8[0]) != same  # (static)
    # code of the user's: a function, a subclass
    assert made_of(cso, lambda x: (x * x).sum(-1)) is None

    class Mine(CSO):
        pass

    assert made_of(Mine(pop_size=8, dim=5, lb=rastrigin.lb, ub=rastrigin.ub), rastrigin) is None
    assert programs.describe(lambda x: x) is None and programs.describe(object()) is None
    assert programs.describe({"a": (1, 2.5, "x")}) == programs.describe({"a": (1, 2.5, "x")})
    assert programs.describe(np.arange(3.0)) != programs.describe(np.array([0.0, 1.0, 2.0 + 1e-9]))


@pytest.mark.single_process
def test_the_key_holds_the_process_that_compiles(monkeypatch, tmp_path):
    import jax

    store = programs.ProgramStore(tmp_path)
    key = store.key("id", "chunk", ("sig",))
    assert store.key("id", "chunk", ("sig",)) == key
    assert len({key, store.key("id2", "chunk", ("sig",)), store.key("id", "first", ("sig",)),
                store.key("id", "chunk", ("sig2",))}) == 4
    with jax.enable_x64(not jax.config.jax_enable_x64):
        assert store.key("id", "chunk", ("sig",)) != key
    monkeypatch.setattr(programs, "_fingerprint", "another hpcevo, JAX or CPU")
    assert store.key("id", "chunk", ("sig",)) != key
    monkeypatch.setenv(programs.SWITCH, "0")
    assert programs.store_for(tmp_path) is None


def test_programs_of_several_ranks_are_never_kept(ctx, shared_tmp, monkeypatch):
    """A program of several ranks holds its communicator: at 2-4 ranks a run keeps and loads
    nothing and its engine has no store; at one rank (with a compilation cache) it has one."""
    import jax

    from hpcevo.algorithms import CSO
    from hpcevo.problems import make_problem

    monkeypatch.setenv(programs.SWITCH, "1")  # (the suite runs without: conftest.py)
    out = shared_tmp / f"np{ctx.size}"
    cfg = {"algorithm": {"name": "cso", "pop_size": 17}, "problem": {"name": "rastrigin", "dim": 7},
           "run": {"generations": 12, "out": str(out)}}
    hpcevo.run(cfg, ctx=ctx, quiet=True)
    summary = json.loads((out / "summary.json").read_text())
    problem = make_problem("rastrigin", 7)
    engine = hpcevo.Loop(CSO(pop_size=17, dim=7, lb=problem.lb, ub=problem.ub), problem, ctx).engine
    if ctx.size > 1:
        assert summary["programs_kept"] == summary["programs_loaded"] == 0 and engine.disk is None
    elif jax.config.jax_compilation_cache_dir and programs.enabled():
        assert engine.disk is not None and engine.disk[0].directory == Path(jax.config.jax_compilation_cache_dir)


@pytest.mark.single_process
def test_a_program_calling_out_of_xla_is_not_kept_but_lapack_is(tmp_path):
    """A host callback (a Python function's address) or an MPI call (a communicator) belongs to
    the process that compiled it: such a program is used, never kept. LAPACK's calls are kept
    (their entry points are set up before a load)."""
    import jax
    import jax.numpy as jnp

    store = programs.ProgramStore(tmp_path)
    callback = jax.jit(lambda a: jax.pure_callback(lambda x: x * 2, jax.ShapeDtypeStruct((3,), jnp.float32), a,
                                                   vmap_method="sequential"))
    exe, _, hit = store.obtain(store.key("cb", "first", ()), lambda: callback.lower(jnp.ones(3, jnp.float32)))
    assert not hit and not list(tmp_path.iterdir())
    assert np.array_equal(exe(jnp.ones(3, jnp.float32)), np.full(3, 2.0))
    eigh = jax.jit(lambda a: jnp.linalg.eigh(a)[0])
    a = jnp.asarray([[2.0, 1.0], [1.0, 3.0]], jnp.float32)
    exe, _, hit = store.obtain(store.key("eigh", "first", ()), lambda: eigh.lower(a))
    assert not hit and len(list(tmp_path.glob("hpcevo-*.program"))) == 1
    again, _, hit = store.obtain(store.key("eigh", "first", ()), lambda: eigh.lower(a))
    assert hit and np.array_equal(again(a), exe(a)) and np.array_equal(again(a), eigh(a))
