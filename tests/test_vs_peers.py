"""The peer comparison harness (benchmarks/vs_peers.py) runs end to end and records what it says.

Its smoke run uses the one peer the test environment has (pycma, a test dependency); evosax and
EvoX are the optional benchmark extra. The timing itself is never asserted: only that every side
was timed, the ratios are the ratios of the medians, and the JSON holds what the table shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def peers(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", "peers", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.single_process
@pytest.mark.slow  # a benchmark's smoke run (11 s): not the inner loop's
def test_quick_run_times_every_side_and_writes_what_it_prints(tmp_path):
    out = tmp_path / "peers.json"
    r = peers("--quick", "--only", "pycma:cmaes", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["cpu"] and rep["sides"]["hpcevo"]["jax"] and "cma" in rep["sides"]["pycma"]
    assert "--xla_cpu_max_isa=AVX2" in rep["sides"]["hpcevo"]["xla_flags"]  # bound as `hpcevo run` binds
    assert rep["sides"]["pycma"]["nproc"] == "1"
    (row,) = rep["rows"]
    assert (row["peer"], row["algorithm"], row["pop"], row["dim"]) == ("pycma", "cmaes", 64, 10)
    med = {k: v["median"] for k, v in row["ms"].items()}
    assert set(med) == {"pycma", "hpcevo Loop.advance", "hpcevo bare step"}
    assert all(v > 0 and row["ms"][k]["n"] == 2 for k, v in med.items())
    assert row["peer_over_hpcevo"] == pytest.approx(med["pycma"] / med["hpcevo Loop.advance"])
    assert row["overhead"] == pytest.approx(med["hpcevo Loop.advance"] / med["hpcevo bare step"])
    (cli,) = rep["cli"]  # `hpcevo run`, timed from the run's own records
    assert cli["algorithm"] == "cmaes" and cli["ms"]["hpcevo run"]["median"] > 0
    assert f"{row['peer_over_hpcevo']:.2f}" in r.stdout and "| pycma | cmaes | 64 | 10 |" in r.stdout


@pytest.mark.single_process
def test_unknown_pair_is_one_message():
    r = peers("--only", "evosax:nsga2", timeout=60)
    assert r.returncode == 2 and "unknown pair(s) evosax:nsga2" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.single_process
@pytest.mark.slow  # a benchmark's smoke run: not the inner loop's
def test_user_objective_gives_hpcevo_the_plain_function_and_its_one_call_lever(tmp_path):
    out = tmp_path / "peers.json"
    r = peers("--quick", "--objective", "user", "--only", "pycma:cmaes", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    (row,) = rep["rows"]
    assert rep["objective"] == row["objective"] == "user"
    # the plain function as a user's: micro-batched by default, and the one-call column beside it
    assert set(row["ms"]) == {"pycma", "hpcevo Loop.advance", "hpcevo bare step", "hpcevo, one micro-batch"}
    assert any(n.endswith("micro-batches") and not n.startswith("1 ") for n in row["notes"])
    (cli,) = rep["cli"]  # `hpcevo run` naming the same function by import path
    assert cli["objective"] == "user" and cli["ms"]["hpcevo run"]["median"] > 0
    assert "objective: a plain JAX Ackley as a user writes it" in r.stdout
