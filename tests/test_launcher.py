"""Real jobs started with mpiexec (or no launcher at all): what a user types, end to end.

Marked `launcher`: run these from a plain `python -m pytest -m launcher`, not under mpiexec.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cso.toml"
MPIEXEC = os.environ.get("MPIEXEC", shutil.which("mpiexec") or "mpiexec")


def clean_env() -> dict[str, str]:
    # A nested launch must not inherit an outer job's PMI wiring.
    drop = ("PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_", "OMPI_", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def hpcevo(n: int | None, *args: str, timeout: float = 300, cwd: Path | None = None):
    cmd = [sys.executable, "-m", "hpcevo", *args]
    if n is not None:
        cmd = [MPIEXEC, "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=cwd)


def test_same_digest_at_1_2_3_4_ranks(tmp_path):
    summaries = {}
    for n in (None, 2, 3, 4):  # None: one rank, no launcher at all
        out = tmp_path / f"n{n}"
        r = hpcevo(n, "run", str(EXAMPLE), "--set", "run.generations=50", "--set", "log.every=20",
                   "--set", f"run.out={out}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("done: best fitness") == 1  # rank 0 alone speaks
        summaries[n] = json.loads((out / "summary.json").read_text())
        lines = (out / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["generation"] for x in lines] == [20, 40, 50]
        assert (out / "config.toml").exists()
    ref = summaries[None]
    assert ref["ranks"] == 1 and summaries[3]["ranks"] == 3
    assert ref["evaluations"] == 1024 + 49 * 512
    for n, s in summaries.items():
        assert s["state_digest"] == ref["state_digest"], f"{n} ranks"
        assert s["best_fitness"] == ref["best_fitness"] and s["best_solution"] == ref["best_solution"]
    assert set(ref["versions"]) >= {"hpcevo", "jax", "mpi4jax", "mpi4py", "h5py", "mpi"}


def test_typo_in_key_exits_2_on_every_rank_with_one_message(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text(EXAMPLE.read_text().replace("pop_size", "pop_sise"))
    r = hpcevo(3, "run", str(bad), timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("hpcevo: error:") == 1
    assert "algorithm.pop_sise" in r.stderr and "did you mean 'pop_size'" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    args = ("run", str(EXAMPLE), "--set", "run.generations=3", "--set", f"run.out={out}", "-q")
    assert hpcevo(2, *args).returncode == 0
    before = (out / "summary.json").read_bytes()
    r = hpcevo(2, *args)
    assert r.returncode == 2 and "already holds a run" in r.stderr and "--overwrite" in r.stderr
    assert (out / "summary.json").read_bytes() == before
    assert hpcevo(2, *args, "--overwrite").returncode == 0


def test_exception_on_one_rank_ends_the_job_quickly(tmp_path):
    """Rank 1 raises mid-run while rank 0 waits in a collective: MPI_Abort, not a hang."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "import hpcevo.driver.engine as engine\n"
        "orig = engine.DeviceEngine.advance\n"
        "def advance(self, state, n, *rest):\n"
        "    if MPI.COMM_WORLD.rank == 1 and int(state.generation) >= 5:\n"
        "        raise RuntimeError('injected failure on rank 1')\n"
        "    return orig(self, state, n, *rest)\n"
        "engine.DeviceEngine.advance = advance\n"
        "from hpcevo.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    t0 = time.monotonic()
    r = subprocess.run(
        [MPIEXEC, "-n", "3", sys.executable, str(script), "run", str(EXAMPLE), "--set", "run.generations=100000",
         "--set", "log.every=5", "--set", f"run.out={tmp_path / 'out'}", "-q"],
        capture_output=True, text=True, timeout=120, env=clean_env(),
    )
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert "[rank 1] Traceback" in r.stderr and "[rank 1] RuntimeError: injected failure on rank 1" in r.stderr
    assert elapsed < 100  # the run was asked for 100000 generations: it did not go on, nor hang


def test_info_describes_every_rank():
    r = hpcevo(2, "info", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "MPICH" in r.stdout or "Open MPI" in r.stdout
    assert "ranks         2 on 1 host(s)" in r.stdout
    assert "h5py MPI      yes" in r.stdout
    # rank, host, local/of, local rank source, device, threads, cpus, affinity, jax devices
    rows = [ln.split() for ln in r.stdout.splitlines() if " MPI_LOCALRANKID " in ln]
    assert [(x[0], x[2], x[4], x[5], x[8]) for x in rows] == [("0", "0/2", "cpu", "1", "cpu:0"),
                                                            ("1", "1/2", "cpu", "1", "cpu:0")]
    # with a config, its [parallel] section decides; an impossible one exits 2, said once
    r = hpcevo(2, "info", str(EXAMPLE), "--set", "parallel.threads_per_rank=3", timeout=120)
    assert r.returncode == 0, r.stderr
    assert [ln.split()[5] for ln in r.stdout.splitlines() if " MPI_LOCALRANKID " in ln] == ["3", "3"]
    r = hpcevo(2, "info", str(EXAMPLE), "--set", "parallel.device='gpu'", timeout=120)
    assert r.returncode == 2 and r.stderr.count("hpcevo: error:") == 1
    assert "parallel.device = 'gpu' but no GPU is usable" in r.stderr


USER_PROBLEM = (
    "import jax.numpy as jnp\n"
    "def weighted_sphere(x, power=2.0):\n"
    "    return jnp.sum(jnp.arange(1.0, x.shape[0] + 1.0) * jnp.abs(x - 0.5) ** power)\n"
)


def test_user_problem_file_same_digest_at_1_and_3_ranks(tmp_path):
    (tmp_path / "myproblem.py").write_text(USER_PROBLEM)
    config = tmp_path / "user.toml"
    config.write_text(
        '[run]\nname = "user"\nseed = 5\ngenerations = 15\n'
        '[algorithm]\nname = "cso"\npop_size = 40\n'
        '[problem]\nname = "myproblem.py:weighted_sphere"\ndim = 7\nlb = -3.0\nub = 3.0\n'
        '[problem.args]\npower = 3.0\n'
    )
    digests = {}
    for n in (None, 3):
        r = hpcevo(n, "run", str(config), "--set", f"run.out={tmp_path / f'n{n}'}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        s = json.loads((tmp_path / f"n{n}" / "summary.json").read_text())
        assert s["problem"] == "myproblem.py:weighted_sphere" and s["dim"] == 7
        digests[n] = (s["state_digest"], s["best_fitness"])
    assert digests[3] == digests[None]
    # A mistake in it: exit 2 on every rank, one message naming the problem, no traceback.
    r = hpcevo(3, "run", str(config), "--set", "problem.args.powr=3.0", "--set",
               f"run.out={tmp_path / 'bad'}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("hpcevo: error:") == 1 and "Traceback" not in r.stderr
    assert "myproblem.py:weighted_sphere" in r.stderr and "unexpected keyword argument 'powr'" in r.stderr


def test_neuro_cartpole_example_reaches_500_on_2_ranks(tmp_path):
    r = hpcevo(2, "run", str(ROOT / "examples" / "neuro_cartpole.toml"), "--set", "run.generations=20",
               "--set", f"run.out={tmp_path}", timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["best_fitness"] == -500.0  # a policy's mean return over its episodes was 500
    assert s["dim"] == 4 * 16 + 16 + 16 * 2 + 2


def test_second_launch_loads_its_programs_from_the_compilation_cache(tmp_path):
    """parallel.compile_cache: the first run compiles and fills the cache; the second finds every
    program there and writes nothing new. Same digest either way; summary.json names the cache
    and the start-up phases (benchmarks/perf_suite.py part 4 measures how much sooner it starts)."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    cache = tmp_path / "cache"
    summaries = []
    for i in (1, 2):
        out = tmp_path / f"r{i}"
        r = subprocess.run(
            [MPIEXEC, "-n", "2", sys.executable, "-m", "hpcevo", "run", str(EXAMPLE), "--set", "run.generations=5",
             "--set", f"run.out={out}", "--set", f"parallel.compile_cache={cache}", "-q"],
            capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        summaries.append(json.loads((out / "summary.json").read_text()))
        if i == 1:
            entries = sorted(p.name for p in cache.glob("*-cache"))
            # the small programs too (each compiles in well under JAX's default 1 s threshold)
            for program in ("jit__run_chunk", "jit__first_with_history", "jit_fingerprint", "jit__threefry_seed"):
                assert any(n.startswith(program) for n in entries), (program, entries)
        else:
            assert sorted(p.name for p in cache.glob("*-cache")) == entries  # nothing new to write
    assert summaries[0]["compile_cache"] == summaries[1]["compile_cache"] == str(cache)
    assert summaries[0]["state_digest"] == summaries[1]["state_digest"]
    # A cache named by the environment (as CTest and site modules do) gets the same threshold.
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "env-cache")
    r = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(EXAMPLE), "--set", "run.generations=5",
                        "--set", f"run.out={tmp_path / 'r3'}", "-q"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert any(p.name.startswith("jit__threefry_seed") for p in (tmp_path / "env-cache").glob("*-cache"))
    assert set(summaries[1]["startup_s"]) >= {"python", "imports_mpi", "config", "setup", "compile",
                                              "first_generation", "total"}


def _script(n: int | None, script: Path, *args: str, timeout: float = 600):
    cmd = [sys.executable, str(script), *args]
    if n is not None:
        cmd = [MPIEXEC, "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT)


def test_api_examples_give_the_same_digest_alone_and_on_3_ranks_and_the_cli_agrees(tmp_path):
    """examples/api_*.py as a user starts them: one process, then mpiexec -n 3. api_run.py runs
    examples/cso.toml through hpcevo.run: the same digest as `hpcevo run` on it."""
    scripts = sorted((ROOT / "examples").glob("api_*.py"))
    assert {p.stem for p in scripts} >= {"api_run", "api_function", "api_loop"}
    digests = {}
    for script in scripts:
        for n in (None, 3):
            r = _script(n, script, "--generations", "30", "--out", str(tmp_path / f"{script.stem}-{n}"))
            assert r.returncode == 0, r.stderr
            last = r.stdout.strip().splitlines()[-1]
            assert last.startswith("digest ") and r.stdout.count("digest ") == 1, r.stdout  # rank 0 alone prints
            digests[script.stem, n] = last.split()[1]
        assert digests[script.stem, None] == digests[script.stem, 3], script.name
    r = hpcevo(None, "run", str(EXAMPLE), "--set", "run.generations=30", "--set", f"run.out={tmp_path / 'cli'}", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["state_digest"] == digests["api_run", None]
