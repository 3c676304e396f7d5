"""Programs kept on disk (hpcevo/driver/programs.py): a launch that runs programs an earlier
launch compiled loads them without tracing or lowering, and its run is bitwise the run compiled
from scratch; what the key is made of; what is never kept; a damaged file is a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcevo
from hpcevo.driver import build, programs

from test_launcher import clean_env

ROOT = Path(__file__).resolve().parents[1]
# BIPOP-CMA-ES on BBOB: LAPACK's eigendecomposition inside (a program loaded without lowering
# must find LAPACK set up), population buckets (one program per bucket), instance data as data.
CMAES = ["--set", "run.generations=150", "--set", "algorithm.pop_size=200", "--set", "problem.dim=4"]


def launch(cache: Path, out: Path, *extra: str, store: bool = True) -> dict:
    env = {**clean_env(), "JAX_COMPILATION_CACHE_DIR": str(cache), "HPCEVO_PROGRAM_CACHE": "1" if store else "0"}
    r = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(ROOT / "examples" / "bbob_f8.toml"), "--quiet",
                        "--set", f"run.out={out}", *CMAES, *extra], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def kept(cache: Path) -> list[Path]:
    return sorted(cache.glob("hpcevo-*-cache"))


@pytest.mark.single_process
def test_a_second_launch_loads_its_programs_and_runs_bitwise_the_run_compiled_from_scratch(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
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


@pytest.mark.single_process
def test_the_program_id_holds_what_makes_the_program_and_nothing_that_is_data():
    base = {"algorithm": {"name": "cmaes", "restart": "bipop"}, "run": {"generations": 10},
            "problem": {"name": "bbob", "function": 8, "dim": 5, "instance": 1}}

    def pid(**changes):
        cfg = json.loads(json.dumps(base))
        for key, value in changes.items():
            section, name = key.split("__")
            cfg.setdefault(section, {})[name] = value
        c = hpcevo.load_config(cfg)
        return build.disk_program_id(c, build.build_problem(c))

    same = pid()
    assert same is not None
    for data in ({"run__seed": 4}, {"run__generations": 99}, {"run__out": "elsewhere"}, {"problem__instance": 9},
                 {"run__evaluations": 500}, {"run__target_precision": 1e-8}, {"log__every": 3},
                 {"checkpoint__every": 7}, {"log__coco": True}):
        assert pid(**data) == same, data
    for program in ({"algorithm__pop_size": 12}, {"algorithm__sigma_init": 0.3}, {"problem__dim": 6},
                    {"problem__function": 9}, {"run__dtype": "float32"}, {"parallel__microbatch": 4},
                    {"algorithm__restart": "ipop"}):
        assert pid(**program) != same, program
    # code the config only names is not vouched for by its name
    user = hpcevo.load_config({"algorithm": {"name": "cso", "pop_size": 8}, "run": {"generations": 3},
                               "problem": {"name": f"{ROOT / 'examples' / 'user_problem.py'}:sphere_plus", "dim": 3}})
    assert build.disk_program_id(user, None) is None
    islands = hpcevo.load_config(ROOT / "examples" / "islands.toml")
    assert build.disk_program_id(islands, build.build_problem(islands)) is None


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


def test_programs_of_several_ranks_are_never_kept(ctx, shared_tmp):
    """A program of several ranks holds its communicator: at 2-4 ranks a run keeps and loads
    nothing; at one rank it keeps its programs or loads them."""
    out = shared_tmp / f"np{ctx.size}"
    cfg = {"algorithm": {"name": "cso", "pop_size": 13}, "problem": {"name": "rastrigin", "dim": 6},
           "run": {"generations": 12, "out": str(out)}}
    hpcevo.run(cfg, ctx=ctx, quiet=True)
    summary = json.loads((out / "summary.json").read_text())
    if ctx.size > 1:
        assert summary["programs_kept"] == summary["programs_loaded"] == 0
    elif summary["compile_cache"] and programs.enabled():
        assert summary["programs_kept"] + summary["programs_loaded"] >= 2
