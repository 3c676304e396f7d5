"""Surviving what batch jobs meet, end to end with real launchers and real signals: a rank killed
with SIGKILL, the scheduler's warning signal, a truncated checkpoint, a checkpoint directory that
stops being writable, a resume that would change the experiment.

Marked `launcher`: run from a plain `python -m pytest -m launcher`, not under mpiexec.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcevo import checkpoint

from test_launcher import MPIEXEC, clean_env

pytestmark = pytest.mark.launcher

CONFIG = """
[run]
name = "survive"
seed = 11
generations = {generations}

[algorithm]
name = "cso"
pop_size = 64

[problem]
name = "rastrigin"
dim = 12

[log]
every = 50
progress = "lines"

[checkpoint]
every = {every}
every_seconds = 0
keep = 3
"""


def write_config(tmp: Path, generations: int = 1_000_000, every: int = 100) -> Path:
    path = tmp / "run.toml"
    path.write_text(CONFIG.format(generations=generations, every=every))
    return path


def cmd(n: int | None, *args: str) -> list[str]:
    base = [sys.executable, "-m", "hpcevo", *args]
    return [MPIEXEC, "-n", str(n), *base] if n else base


def run(n: int | None, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(n, *args), capture_output=True, text=True, timeout=timeout, env=clean_env())


def start(n: int, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd(n, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**clean_env(), **(env or {})}, start_new_session=True)


def wait_for_checkpoints(ckdir: Path, count: int, proc: subprocess.Popen, timeout: float = 240) -> list[Path]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = checkpoint.list_checkpoints(ckdir)
        if len(found) >= count:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"run ended early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"no {count} checkpoints in {ckdir} after {timeout} s")


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the hpcevo processes started under a launcher (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    ranks, todo = {}, [launcher_pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"hpcevo" in cmdline:
                for kv in env:
                    if kv.startswith(b"PMI_RANK="):
                        ranks[int(kv.split(b"=", 1)[1])] = child
    return ranks


def digest(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["state_digest"]


def uninterrupted(tmp: Path, generations: int) -> str:
    out = tmp / f"whole-{generations}"
    r = run(None, "run", str(write_config(tmp, generations)), "--set", f"run.out={out}", "-q")
    assert r.returncode == 0, r.stderr
    return digest(out)


def test_sigkill_of_one_rank_ends_the_job_and_a_2_rank_resume_matches_1_rank(tmp_path):
    cfg, out = write_config(tmp_path), tmp_path / "run"
    proc = start(3, "run", str(cfg), "--set", f"run.out={out}", "-q")
    try:
        wait_for_checkpoints(out / "checkpoints", 2, proc)
        pids = {}
        for _ in range(100):
            pids = rank_pids(proc.pid)
            if len(pids) == 3:
                break
            time.sleep(0.05)
        assert sorted(pids) == [0, 1, 2], pids
        t_kill = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        proc.wait(timeout=60)
        ended_after = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert ended_after < 30, f"the job took {ended_after:.1f} s to end after a rank died"
    assert not (out / "summary.json").exists()
    newest = checkpoint.list_checkpoints(out / "checkpoints")[0]
    report = checkpoint.verify_file(newest)
    assert report.problem is None, report.problem
    # Resume at 2 ranks to a target past the newest checkpoint; compare with 1 rank uninterrupted.
    target = report.header.generation + 150
    r = run(2, "run", str(cfg), "--set", f"run.out={out}", "--set", f"run.generations={target}", "--resume")
    assert r.returncode == 0, r.stderr
    assert f"resuming from '{newest}'" in r.stdout and f"generation {report.header.generation}" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["resumed_from"] == report.header.generation
    assert summary["state_digest"] == uninterrupted(tmp_path, target)


def test_sigusr1_to_the_launcher_checkpoints_exits_75_and_resumes_exactly(tmp_path):
    cfg, out = write_config(tmp_path), tmp_path / "run"
    proc = start(3, "run", str(cfg), "--set", f"run.out={out}", env={"HPCEVO_EXIT_FILE": str(tmp_path / "exit")})
    try:
        wait_for_checkpoints(out / "checkpoints", 2, proc)
        proc.send_signal(signal.SIGUSR1)  # to mpiexec, which forwards it to every rank
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # (the ranks' code, as job scripts read it: MPICH's mpiexec may report 0 after forwarding a
    # signal, about one launch in five here)
    assert (tmp_path / "exit").read_text().strip() == "75" and proc.returncode in (0, 75), stderr
    assert stdout.count("stopped by SIGUSR1 at generation") == 1
    stopped_at = int(stdout.split("stopped by SIGUSR1 at generation")[1].split()[0])
    newest = checkpoint.list_checkpoints(out / "checkpoints")[0]
    assert newest.name == checkpoint.file_name(stopped_at)
    assert checkpoint.verify_file(newest).problem is None
    target = stopped_at + 150
    r = run(3, "resume", str(out), "--set", f"run.generations={target}")
    assert r.returncode == 0, r.stderr
    assert digest(out) == uninterrupted(tmp_path, target)


def test_a_signal_while_compiling_ends_the_job_at_once_and_a_resume_is_the_run_never_stopped(tmp_path):
    """A SIGTERM while rank 1 compiles (it takes 30 s to trace the problem, rank 0 waiting for it
    in generation 1) met the default handler and killed the ranks; with a handler alone, it
    would wait for the compilation to end. Now the job ends within seconds, exit 75 (nothing
    computed since generation 0: nothing to save), with one message, and a resume runs to the
    digest of the run never stopped."""
    cfg = tmp_path / "slow.toml"
    cfg.write_text(CONFIG.format(generations=60, every=0).replace('name = "rastrigin"',
                                                                  'name = "watchdog_problems:slow_to_trace"\n'
                                                                  'lb = -5.0\nub = 5.0'))
    out, mark = tmp_path / "run", tmp_path / "tracing"
    env = {**clean_env(), "WD_TRACE": "30", "WD_TRACE_MARK": str(mark), "HPCEVO_EXIT_FILE": str(tmp_path / "exit"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), clean_env().get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd(2, "run", str(cfg), "--set", f"run.out={out}"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # to mpiexec, which forwards it to every rank
        stdout, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - t_signal
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # (the ranks' code, as job scripts read it: MPICH's mpiexec may report 0 after forwarding a signal)
    assert (tmp_path / "exit").read_text().strip() == "75", (proc.returncode, stdout, stderr[-3000:])
    assert took < 15, f"the job took {took:.1f} s to end after the signal (the compilation: 30 s)"
    assert stdout.count("stopped by SIGTERM while compiling, before generation 1 (nothing to save)") == 1, stdout
    assert checkpoint.list_checkpoints(out / "checkpoints") == []
    env.pop("WD_TRACE")
    r = subprocess.run(cmd(2, "run", str(cfg), "--set", f"run.out={out}", "--resume", "-q"), capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    whole = subprocess.run(cmd(None, "run", str(cfg), "--set", f"run.out={tmp_path / 'whole'}", "-q"),
                           capture_output=True, text=True, env=env, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert digest(out) == digest(tmp_path / "whole")


def test_truncated_newest_checkpoint_is_reported_and_the_previous_used(tmp_path):
    cfg, out = write_config(tmp_path, generations=300), tmp_path / "run"
    assert run(2, "run", str(cfg), "--set", f"run.out={out}", "-q").returncode == 0
    newest, previous = checkpoint.list_checkpoints(out / "checkpoints")[:2]
    assert (newest.name, previous.name) == ("gen-000000300.h5", "gen-000000200.h5")
    os.truncate(newest, newest.stat().st_size // 2)
    r = run(2, "run", str(cfg), "--set", f"run.out={out}", "--set", "run.generations=400", "--resume")
    assert r.returncode == 0, r.stderr
    assert f"checkpoint '{newest}' is damaged" in r.stderr and "trying the one before it" in r.stderr
    assert r.stderr.count("is damaged") == 1  # reported once, by rank 0
    assert f"resuming from '{previous}' (generation 200" in r.stdout
    assert digest(out) == uninterrupted(tmp_path, 400)
    # inspect shows both states
    r = run(None, "inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout and "gen-000000400.h5" in r.stdout


def _can_mount() -> str:
    if os.geteuid() != 0:
        return ""
    probe = Path(f"/tmp/hpcevo-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], capture_output=True)
        return "mount" if ok else ""
    finally:
        probe.rmdir()


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_checkpoint_directory_failing_mid_run_is_one_clear_error(tmp_path, how):
    """The directory becomes read-only (or fills up) between two checkpoints: exit 4 with one
    message naming the file and the reason, and the checkpoints already published stay valid."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    mounted = False
    if _can_mount():
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ckdir)], check=True)
        mounted = True
    elif how == "full" or os.geteuid() == 0:
        pytest.skip("needs root with mount (tmpfs) to make a directory full or read-only for root")
    cfg, out = write_config(tmp_path, every=50), tmp_path / "run"
    # stuck_seconds: a write that fails inside HDF5's flush can hold every rank there (see below)
    proc = start(2, "run", str(cfg), "--set", f"run.out={out}", "--set", f"checkpoint.dir={ckdir}",
                 "--set", "checkpoint.stuck_seconds=10", "-q")
    try:
        wait_for_checkpoints(ckdir, 2, proc)
        if how == "read-only":
            if mounted:
                while subprocess.run(["mount", "-o", "remount,ro", str(ckdir)], capture_output=True).returncode:
                    time.sleep(0.01)  # busy while a checkpoint is being written: try again
            else:
                ckdir.chmod(0o555)
        else:
            with open(tmp_path / "dd.log", "w") as log:
                subprocess.run(["dd", "if=/dev/zero", f"of={ckdir}/filler", "bs=64k"], stderr=log)
        stdout, stderr = proc.communicate(timeout=120)
        good = [p for p in checkpoint.list_checkpoints(ckdir)]
        reports = [checkpoint.verify_file(p) for p in good]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if mounted:
            subprocess.run(["umount", "-l", str(ckdir)], capture_output=True)
        else:
            ckdir.chmod(0o755)
    assert proc.returncode == 4, stderr
    reason = "Read-only file system" if mounted and how == "read-only" else (
        "No space left on device" if how == "full" else "Permission denied")
    assert stderr.count("hpcevo: error: cannot write checkpoint") == 1, stderr
    assert reason in stderr and str(ckdir) in stderr
    assert "Traceback" not in stderr
    assert good and all(r.problem is None for r in reports), [r.problem for r in reports]


# HDF5 1.10's parallel flush on a full disk: a rank whose share of the metadata writes fails
# skips the flush's closing barrier, and ranks end up in different collectives. Injected here, so
# that the hang is certain rather than one run in five. "flush": rank 1's flush fails and leaves
# rank 0 held in a collective that rank 1 never enters. "close": every rank's flush fails (so the
# failure is agreed) and then the close of the failed file holds each rank in a different one.
# "inside": the flush holds each rank in a different collective, no error seen yet by anyone.
STUCK_IN_HDF5 = """
import sys
import h5py
from mpi4py import MPI
from hpcevo import cli

mode = sys.argv.pop(1)
held = [MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()]
rank = held[0].rank
flushes = []
real_flush, real_close = h5py.File.flush, h5py.File.close

def flush(self):
    flushes.append(1)
    if len(flushes) == 3:  # the second checkpoint's first flush
        if mode == "inside":
            held[rank % 2].Barrier()
        if rank == 1 or mode == "close":
            raise OSError(28, "No space left on device")
        held[0].Barrier()
    return real_flush(self)

def close(self):
    if mode == "close" and len(flushes) >= 3:
        held[rank % 2].Barrier()
    return real_close(self)

h5py.File.flush, h5py.File.close = flush, close
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("stuck_in", ["flush", "close", "inside"])
def test_checkpoint_failure_ends_the_job_when_ranks_are_stuck_inside_hdf5(tmp_path, stuck_in):
    """Ranks held inside HDF5 can neither hear of the error nor time out. "flush": the rank whose
    write failed gives up waiting for the others, reports, and ends the job. "close" and "inside":
    a watchdog ends it, rank 0 reporting. Each way: one message, the checkpoint error's exit code,
    and the first checkpoint stays valid."""
    cfg, out, ck = write_config(tmp_path, generations=10_000, every=50), tmp_path / "run", tmp_path / "ck"
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_IN_HDF5)
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script), stuck_in, "run", str(cfg),
                        "--set", f"run.out={out}", "--set", f"checkpoint.dir={ck}",
                        "--set", "checkpoint.stuck_seconds=4", "-q"],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 4, r.stderr
    assert r.stderr.count("hpcevo: error: cannot write checkpoint") == 1, r.stderr
    reason = "HDF5's collective call had not returned after 4 s" if stuck_in == "inside" else "No space left on device"
    assert f"cannot write checkpoint '{ck / 'gen-000000100.h5'}' (finishing the file): {reason}" in r.stderr
    ended = {"flush": "[rank 1 ended the job",
             "close": "the job was ended because HDF5's collective close of the failed file did not return within 2 s",
             "inside": "The job was ended; the checkpoints written before are intact"}[stuck_in]
    assert ended in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in checkpoint.list_checkpoints(ck)] == ["gen-000000050.h5"]
    assert checkpoint.verify_file(ck / "gen-000000050.h5").problem is None


def test_resume_with_a_changed_pop_size_exits_2_naming_both_values(tmp_path):
    cfg, out = write_config(tmp_path, generations=100), tmp_path / "run"
    assert run(2, "run", str(cfg), "--set", f"run.out={out}", "-q").returncode == 0
    before = sorted(p.read_bytes() for p in (out / "checkpoints").iterdir())
    r = run(2, "run", str(cfg), "--set", f"run.out={out}", "--set", "algorithm.pop_size=128", "--resume")
    assert r.returncode == 2
    assert r.stderr.count("hpcevo: error:") == 1 and "Traceback" not in r.stderr
    assert "algorithm.pop_size: checkpoint has 64, this run has 128" in r.stderr
    assert sorted(p.read_bytes() for p in (out / "checkpoints").iterdir()) == before  # nothing lost


def test_inspect_and_plot(tmp_path):
    cfg, out = write_config(tmp_path, generations=120, every=50), tmp_path / "run"
    assert run(None, "run", str(cfg), "--set", f"run.out={out}", "-q").returncode == 0
    r = run(None, "inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert "cso (pop 64) on rastrigin (dim 12), seed 11, 120 generations" in r.stdout
    assert "finished    generation 120" in r.stdout
    assert r.stdout.count("valid (state") == 3  # gen 50, 100 and the final 120
    single = run(None, "inspect", str(out / "checkpoints" / "gen-000000120.h5"))
    assert "generation  120" in single.stdout and "valid: every checksum matches" in single.stdout
    r = run(None, "plot", str(out))
    assert r.returncode == 0, r.stderr
    png = out / "convergence.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    bad = run(None, "inspect", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "not found" in bad.stderr
    # a damaged file, or a directory whose newest checkpoint is damaged: said, and exit 1
    newest = out / "checkpoints" / "gen-000000120.h5"
    os.truncate(newest, newest.stat().st_size // 2)
    single = run(None, "inspect", str(newest))
    assert single.returncode == 1 and "DAMAGED" in single.stdout
    r = run(None, "inspect", str(out))
    assert r.returncode == 1 and r.stdout.count("valid (state") == 2 and "DAMAGED" in r.stdout
    older = out / "checkpoints" / "gen-000000100.h5"
    assert run(None, "inspect", str(older)).returncode == 0
