"""One launch writes a run or a study directory at a time (``rundir.DirLock``).

Two launches of one run (a job submitted twice, a resume started while the run still runs) tore
each other's metrics.jsonl, and one of them ended with a misleading "free space" message. Now
the second stops at once, with one message naming the holder, before it touches anything; the
first goes on undisturbed. The lock is the kernel's (flock): a launch that dies, however it dies,
leaves nothing to clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpcevo
from hpcevo.driver.rundir import LOCK, DirLock
from hpcevo.errors import UsageError

from test_overwrite import config, snapshot

ROOT = Path(__file__).resolve().parents[1]
HELD = r"is being written by another launch \(process \d+ on [^,]+, since [\d: -]+\)"


@pytest.mark.single_process
def test_a_second_launch_on_a_run_being_written_stops_with_one_message_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    assert hpcevo.run(config(out), quiet=True).status == "complete"
    before = snapshot(out)
    held = DirLock.take(out, "the test's")  # another launch's: another open file, as another process has
    try:
        for kw in ({"resume": True}, {"overwrite": True}, {}):
            with pytest.raises(UsageError, match=f"run directory '{out}' {HELD}"):
                hpcevo.run(config(out, run={"generations": 8}), quiet=True, **kw)
            assert snapshot(out) == before
    finally:
        held.release()
    # the holder gone (or dead: the kernel drops its lock), the run goes on
    assert hpcevo.run(config(out, run={"generations": 8}), quiet=True, resume=True).summary["generations"] == 8


@pytest.mark.single_process
def test_two_launches_of_one_run_the_second_refused_the_first_whole(tmp_path):
    """Real processes: a run (its problem waits for a file the test makes, so it is surely still
    writing), and the same run started again with --resume (a job submitted twice). The second
    exits 2 at once; the first then completes with every record."""
    out, go = tmp_path / "r", tmp_path / "go"
    (tmp_path / "f.py").write_text(
        "import os, time\nimport numpy as np\n"
        "def f(x):\n"
        f"    while not os.path.exists({str(go)!r}):\n        time.sleep(0.05)\n"
        "    return np.sum(np.asarray(x) ** 2, axis=-1)\n")
    cmd = [sys.executable, "-m", "hpcevo", "run", str(ROOT / "examples" / "cso.toml"), "--set", f"run.out={out}",
           "--set", f"problem.name={tmp_path / 'f.py'}:f", "--set", "problem.host=true", "--set", "problem.dim=4",
           "--set", "problem.lb=-1.0", "--set", "problem.ub=1.0", "--set", "algorithm.pop_size=16",
           "--set", "log.every=1", "--set", "run.generations=200", "-q"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (out / "config.toml").exists():  # (written once the directory is the first's)
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.1)
        second = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=120)
        assert first.poll() is None
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=600)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
    assert "is being written by another launch (process" in second.stderr
    assert first.returncode == 0, stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in records] == list(range(1, 201))
    assert json.loads((out / "summary.json").read_text())["generations"] == 200


def _study(tmp_path: Path) -> dict:
    return {"study": {"seeds": 2, "out": str(tmp_path / "s")},
            "base": {"run": {"generations": 5}, "algorithm": {"name": "pso", "pop_size": 8},
                     "problem": {"name": "sphere", "dim": 3}}}


@pytest.mark.single_process
def test_a_study_directory_has_one_launch_per_share(tmp_path):
    spec = _study(tmp_path)
    hpcevo.study(spec, quiet=True, part=(0, 2))
    journal = (tmp_path / "s" / "journal-0of2.jsonl").read_bytes()
    held = DirLock.take(tmp_path / "s", "the test's", f"{LOCK}-0of2")
    try:
        with pytest.raises(UsageError, match=rf"study directory '{tmp_path / 's'}' \(share 0/2\) {HELD}"):
            hpcevo.study(spec, quiet=True, part=(0, 2), resume=True)
        assert (tmp_path / "s" / "journal-0of2.jsonl").read_bytes() == journal
        # another share runs beside it, as `--part 1/2` in another job does
        assert hpcevo.study(spec, quiet=True, part=(1, 2)).status == "complete"
    finally:
        held.release()
    held = DirLock.take(tmp_path / "s", "the test's")
    try:
        with pytest.raises(UsageError, match=rf"study directory '{tmp_path / 's'}' {HELD}"):
            hpcevo.study(spec, quiet=True, resume=True)
    finally:
        held.release()
    assert hpcevo.study(spec, quiet=True, resume=True).status == "complete"


@pytest.mark.ranks(1, 3)
def test_every_rank_hears_of_the_other_launch(ctx, shared_tmp):
    """Rank 0 takes the lock; the refusal is every rank's, at once (no rank waits for the others)."""
    out = shared_tmp / "run"
    assert hpcevo.run(config(out), ctx=ctx, quiet=True).status == "complete"
    held = DirLock.take(out, "the test's") if ctx.is_root else None
    try:
        with pytest.raises(UsageError, match=HELD):
            hpcevo.run(config(out, run={"generations": 8}), ctx=ctx, quiet=True, resume=True)
    finally:
        ctx.comm_ctl.Barrier()
        if held is not None:
            held.release()
    assert hpcevo.run(config(out, run={"generations": 8}), ctx=ctx, quiet=True, resume=True).summary["generations"] == 8


@pytest.mark.single_process
def test_a_file_system_without_locks_runs_unlocked(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(37, os.strerror(37))  # ENOLCK

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert DirLock.take(tmp_path, "x").fd is None
    assert hpcevo.run(config(tmp_path / "run"), quiet=True).status == "complete"
