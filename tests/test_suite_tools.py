"""The suite's own tools: the shards CTest splits the one-process tiers into (conftest.py's
--shard) must partition the tests, or a test would silently run twice or never; the runner of
shards side by side (tests/run_shards.py) must fail when any shard fails; the profile table
(scripts/suite-profile.py) must add up what the per-test records say, per file and tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "single_process",
           "tests/test_plotting.py", "tests/test_model.py", *args]
    # (no profile: a pass of this name would replace the records of the suite's own passes)
    env = {k: v for k, v in os.environ.items() if k != "HPCEVO_TEST_PROFILE"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def ids(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [ln for ln in r.stdout.splitlines() if ln.startswith("tests/")]


@pytest.mark.single_process
@pytest.mark.slow
def test_shards_partition_the_selected_tests_and_balance_them():
    whole = ids(collected())
    assert len(whole) >= 7
    shards = [ids(collected("--shard", f"{i}/3")) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(whole)  # every test once: none twice, none lost
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # round robin over the collection order: one file's tests spread over the shards
    assert shards[0] == whole[0::3] and shards[2] == whole[2::3]
    bad = collected("--shard", "3/3")
    assert bad.returncode != 0 and "0 <= I < N" in bad.stderr


@pytest.mark.single_process
@pytest.mark.slow  # four pytest processes start
def test_shards_side_by_side_run_every_test_once_and_fail_when_one_shard_fails(tmp_path):
    # a plugin that fails one chosen test: the shard that holds it must fail the whole run
    (tmp_path / "fail_one.py").write_text(
        "import os\n"
        "def pytest_runtest_call(item):\n"
        "    if item.name == os.environ.get('FAIL_TEST'):\n"
        "        raise AssertionError('failed on purpose')\n")
    env = {**{k: v for k, v in os.environ.items() if k != "HPCEVO_TEST_PROFILE"}, "PYTHONPATH": str(tmp_path)}

    def shards(fail: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "tests/run_shards.py", "2", "-q", "-p", "no:cacheprovider", "-p",
                               "fail_one", "-m", "single_process", "tests/test_model.py"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env={**env, "FAIL_TEST": fail})

    ok = shards("")
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "shard 0/2: exit 0" in ok.stdout and "shard 1/2: exit 0" in ok.stdout
    assert "3 passed" in ok.stdout and "2 passed" in ok.stdout  # 5 tests, each once
    bad = shards("test_collective_formulas")  # in shard 1: the second shard's failure counts too
    assert bad.returncode == 1 and "failed on purpose" in bad.stdout, bad.stdout[-3000:]
    assert "shard 0/2: exit 0" in bad.stdout and "shard 1/2: exit 1" in bad.stdout


@pytest.mark.single_process
@pytest.mark.slow  # four pytest processes start
def test_groups_apart_run_side_by_side_each_its_own_selection_and_profile_and_any_failure_fails(tmp_path):
    """`run_shards.py apart`: the nodes and slurm tiers in one CTest test. Each +NAME group runs
    the common arguments and its own, writes its profile as pass NAME, and a failure in any
    group (the second one included) is the exit status."""
    (tmp_path / "fail_one.py").write_text(
        "import os\n"
        "def pytest_runtest_call(item):\n"
        "    if item.name == os.environ.get('FAIL_TEST'):\n"
        "        raise AssertionError('failed on purpose')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HPCEVO_TEST_PASS",)}
    env.update(PYTHONPATH=str(tmp_path), HPCEVO_TEST_PROFILE=str(tmp_path / "profile"))

    def apart(fail: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "tests/run_shards.py", "apart", "-q", "-p", "no:cacheprovider",
                               "-p", "fail_one", "-m", "single_process", "+one", "tests/test_model.py",
                               "+two", "tests/test_plotting.py"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**env, "FAIL_TEST": fail})

    ok = apart("")
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "----- one: exit 0" in ok.stdout and "----- two: exit 0" in ok.stdout
    model, plotting = (ids(collected(f)) for f in ("--deselect=tests/test_plotting.py",
                                                     "--deselect=tests/test_model.py"))
    for name, want in (("one", model), ("two", plotting)):
        recs = [json.loads(x) for x in (tmp_path / "profile" / f"np1-{name}.jsonl").read_text().splitlines()]
        assert sorted(r["test"] for r in recs) == sorted(want)  # its own selection, every test once
    bad = apart("test_collective_formulas")  # a test of test_model.py: the first group fails
    assert bad.returncode == 1 and "----- one: exit 1" in bad.stdout and "----- two: exit 0" in bad.stdout
    plot_test = plotting[0].split("::")[-1].split("[")[0]
    bad = apart(plot_test)  # the second group's failure counts as well
    assert bad.returncode == 1 and "----- two: exit 1" in bad.stdout, bad.stdout[-3000:]
    usage = subprocess.run([sys.executable, "tests/run_shards.py", "apart", "-q", "+only", "tests/test_model.py"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.mark.single_process
def test_the_profile_table_adds_up_the_records_per_file_and_tier(tmp_path):
    prof = tmp_path / "profile"
    prof.mkdir()

    def rec(test, ranks, wall, compile_=0.0, sleep=0.0):
        return json.dumps({"test": test, "file": test.split("::")[0], "ranks": ranks, "outcome": "passed",
                           "wall": wall, "cpu": wall / 2, "compile": compile_, "cache_load": 0.0, "sleep": sleep,
                           "idle": 0.0, "busy": 0.5})

    # two shards of the pure tier, a 3-rank pass and the launcher tier, as the plugin names them
    (prof / "np1-single-process-and-not-slow-and-not-launcher-shard-0-2.jsonl").write_text(
        rec("tests/test_a.py::t1", 1, 2.0, 1.0) + "\n" + rec("tests/test_b.py::t1", 1, 4.0) + "\n")
    (prof / "np1-single-process-and-not-slow-and-not-launcher-shard-1-2.jsonl").write_text(
        rec("tests/test_a.py::t2", 1, 3.0, 0.5) + "\n")
    (prof / "np3-not-single-process-and-not-launcher.jsonl").write_text(rec("tests/test_a.py::t3", 3, 10.0, 4.0, 2.0) + "\n")
    (prof / "np1-launcher.jsonl").write_text(rec("tests/test_c.py::t1", 1, 7.0, sleep=6.0) + "\n")
    # the watchdog's part of the launcher tier: its own file (HPCEVO_TEST_PASS), the same column
    (prof / "np1-launcher-watchdog.jsonl").write_text(rec("tests/test_c.py::t2", 1, 1.0) + "\n")
    out = tmp_path / "table.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite-profile.py"), str(prof), "--json", str(out),
                        "--tests", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    table = json.loads(out.read_text())
    assert table["tests/test_a.py"]["pure"]["wall"] == 5.0 and table["tests/test_a.py"]["pure"]["tests"] == 2
    assert table["tests/test_a.py"]["pure"]["compile"] == 1.5
    assert table["tests/test_a.py"]["np3"]["wall"] == 10.0 and table["tests/test_a.py"]["np3"]["sleep"] == 2.0
    assert set(table["tests/test_c.py"]) == {"launcher"}
    assert table["tests/test_c.py"]["launcher"]["sleep"] == 6.0
    assert table["tests/test_c.py"]["launcher"]["wall"] == 8.0 and table["tests/test_c.py"]["launcher"]["tests"] == 2
    # the slowest tests listed, slowest first
    listed = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert [ln.split()[-1] for ln in listed] == ["tests/test_a.py::t3", "tests/test_c.py::t1"]


NAP_SCRIPT = r"""
import json, resource, sys, time
import numpy as np
import jax, jax.numpy as jnp
import mpi4jax
from mpi4py import MPI

c = MPI.COMM_WORLD
r = c.rank


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def waited(exchange):
    # rank 0 computes for 1.5 s while the others wait in the exchange: what does waiting cost them?
    c.Barrier()
    before = cpu()
    if r == 0:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
    out = exchange()
    return out, cpu() - before


gather = jax.jit(lambda x: mpi4jax.allgather(x, comm=c))
gather(jnp.zeros(2)).block_until_ready()  # compiled before anything is timed
host, host_cpu = waited(lambda: c.allgather(r * 10))
jitted, jit_cpu = waited(lambda: np.asarray(gather(jnp.full(2, float(r)))).tolist())
counts = [i + 1 for i in range(c.size)]
gv = np.zeros(sum(counts), np.int64)
c.Allgatherv(np.full(r + 1, r, np.int64), [gv, counts])
c.Ibarrier().Wait()
open(f"{sys.argv[1]}/rank{r}.json", "w").write(json.dumps({"rank": r, "host": host, "jitted": jitted, "max": c.allreduce(r, op=MPI.MAX),
                  "bcast": c.bcast(r * 7, root=c.size - 1), "gatherv": gv.tolist(),
                  "host_cpu": host_cpu, "jit_cpu": jit_cpu}))
"""


@pytest.mark.launcher
def test_the_suites_preloaded_ranks_nap_while_they_wait_and_exchange_the_same_data(tmp_path):
    """tests/mpi_nap.c (preloaded into the suite's multi-rank jobs): a rank waiting in a blocking
    collective (mpi4py's, and mpi4jax's inside a jitted program) uses next to no CPU while the rank
    it waits for computes, and every collective still delivers what MPI's own does. A process that
    calls no MPI carries it unaffected."""
    from test_launcher import MPIEXEC, clean_env

    lib = tmp_path / "libmpi_nap.so"
    subprocess.run(["mpicc", "-O2", "-shared", "-fPIC", "-Wl,--as-needed", "-o", str(lib),
                    str(Path(__file__).with_name("mpi_nap.c")), "-ldl"], check=True)
    script = tmp_path / "nap.py"
    script.write_text(NAP_SCRIPT)
    env = clean_env()
    env["LD_PRELOAD"] = str(lib)
    env["JAX_PLATFORMS"] = "cpu"
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script), str(tmp_path)], capture_output=True,
                       text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(3)]
    assert [d["rank"] for d in ranks] == [0, 1, 2]
    for d in ranks:
        assert d["host"] == [0, 10, 20]
        assert d["jitted"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert d["max"] == 2 and d["bcast"] == 14
        assert d["gatherv"] == [0, 1, 1, 2, 2, 2]
    # Spinning, a waiting rank takes about as much CPU as the busy rank gets (1.5 s alone on the
    # machine, less beside other work: 1.0-1.2 s here); napping, a few hundredths of a second.
    busy = ranks[0]["host_cpu"]
    assert busy > 0.3, ranks[0]
    for d in ranks[1:]:
        assert d["host_cpu"] < 0.25 * busy and d["jit_cpu"] < 0.25 * busy, (d, busy)
    plain = subprocess.run(["bash", "-c", "echo fine"], capture_output=True, text=True, env=env)
    assert plain.returncode == 0 and plain.stdout == "fine\n"
