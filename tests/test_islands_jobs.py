"""Islands as whole jobs: 8 and 4 islands on 8 ranks (groups of one and of two ranks) give the
1-rank run's digest, and a run stopped by SIGTERM resumes at another rank count bitwise equal to
an uninterrupted one. Marked ``launcher``: run by a plain ``python -m pytest -m launcher``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcevo import checkpoint
from test_launcher import MPIEXEC, clean_env
from test_survive import rank_pids, wait_for_checkpoints

pytestmark = pytest.mark.launcher
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "islands.toml"


def hpcevo(n: int | None, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hpcevo", *args]
    if n is not None:
        cmd = [MPIEXEC, "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("islands", [8, 4])
def test_islands_on_8_ranks_in_groups_of_one_and_of_two_equal_one_rank(tmp_path, islands):
    """8 islands on 8 ranks (a rank each), 4 on 8 (two ranks each: an island's evaluation split
    over its group), each against all of them on one rank. (Two ranks an island used to be 8
    islands on 16 ranks: the layouts are the same, at twice the processes on a 2-core machine.)"""
    sets = ["--set", "run.generations=30", "--set", "islands.migrate_every=10", "--set", "log.every=10",
            "--set", f"islands.count={islands}", "-q"]
    digests = {}
    for n in (None, 8):
        out = tmp_path / f"n{n}"
        r = hpcevo(n, "run", str(EXAMPLE), "--set", f"run.out={out}", *sets)
        assert r.returncode == 0, r.stderr[-3000:]
        s = summary(out)
        assert s["ranks"] == (n or 1) and len(s["islands"]) == islands
        digests[n] = (s["state_digest"], [i["best_fitness"] for i in s["islands"]])
    assert digests[8] == digests[None]


def test_sigterm_on_one_rank_stops_the_islands_and_a_resume_at_another_rank_count_is_exact(tmp_path):
    out = tmp_path / "run"
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-m", "hpcevo", "run", str(EXAMPLE), "--set", f"run.out={out}",
           "--set", "run.generations=1000000", "--set", "checkpoint.every=40", "--set", "checkpoint.every_seconds=0",
           "--set", "log.every=40", "--set", "log.progress='lines'"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    try:
        wait_for_checkpoints(out / "checkpoints", 2, proc)
        os.kill(rank_pids(proc.pid)[1], signal.SIGTERM)  # one rank of the job, as a node's daemon might
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, stderr[-3000:]
    assert took < 60
    stopped_at = int(stdout.split("stopped by SIGTERM at generation")[1].split()[0])
    newest = checkpoint.list_checkpoints(out / "checkpoints")[0]
    assert newest.name == checkpoint.file_name(stopped_at) and checkpoint.verify_file(newest).problem is None
    target = stopped_at + 50
    r = hpcevo(2, "resume", str(out), "--set", f"run.generations={target}", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    whole = tmp_path / "whole"
    r = hpcevo(None, "run", str(EXAMPLE), "--set", f"run.out={whole}", "--set", f"run.generations={target}", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(out)["state_digest"] == summary(whole)["state_digest"]
    assert summary(out)["resumed_from"] == stopped_at and summary(out)["ranks"] == 2
