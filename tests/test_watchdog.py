"""The watchdog (hpcevo/parallel/watchdog.py, [fault]): a rank that stops answering ends the job
within seconds with exit code 76 and a message naming it; a run that is slow but healthy (its
generations slowing down gradually, a long compilation, a slow checkpoint write) is never ended.

The limits (driver/policy.py's PhaseLimits) are tested pure; the rest end to end under mpiexec
(marked `launcher`), with the problems of tests/watchdog_problems.py. Each case that must not be
ended has a twin that must: the same slowness past a limit, so that a watchdog that never fires
cannot pass.
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_launcher import MPIEXEC, clean_env

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "tests" / "watchdog_problems.py"


# -- the limits, pure -----------------------------------------------------------------------
def fault(**kw):
    base = dict(watchdog=True, slowdown=10.0, min_seconds=30.0, startup_seconds=600.0, compile_seconds=1800.0,
                checkpoint_seconds=600.0, heartbeat_seconds=2.0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.single_process
def test_a_dispatch_may_take_slowdown_times_the_slowest_recent_one_and_never_less_than_the_floor():
    from hpcevo.driver.policy import RECENT, PhaseLimits

    limits = PhaseLimits(fault(min_seconds=1.0))
    assert limits.dispatch(10)[0] == 1800.0 and "compile" in limits.dispatch(10)[1]  # nothing measured yet
    limits.note_dispatch(10, 0.01)
    seconds, why = limits.dispatch(10)
    assert seconds == 1.0 and "fault.min_seconds" in why
    limits.note_dispatch(10, 0.5)
    assert limits.dispatch(10)[0] == pytest.approx(5.0)  # 10 x the slowest recent
    assert limits.dispatch(40)[0] == pytest.approx(20.0)  # scaled up to the generations asked for
    assert limits.dispatch(1)[0] == pytest.approx(5.0)  # never scaled down: fixed costs stay
    for _ in range(RECENT):
        limits.note_dispatch(10, 0.2)
    assert limits.dispatch(10)[0] == pytest.approx(2.0)  # the slow one has left the window
    assert "fault.slowdown = 10 x" in limits.dispatch(10)[1]


@pytest.mark.single_process
def test_generations_slowing_down_10x_gradually_stay_inside_the_limit_and_a_sudden_jump_does_not():
    from hpcevo.driver.policy import PhaseLimits

    limits = PhaseLimits(fault(min_seconds=0.5))
    t = 0.1
    limits.note_dispatch(1, t)
    for _ in range(200):  # 0.1 s -> 1 s a generation, 1.2% a step, then 10x more
        t *= 1.012
        assert t < limits.dispatch(1)[0], t
        limits.note_dispatch(1, t)
    assert t > 10 * 0.1
    assert 11 * t > limits.dispatch(1)[0]  # a sudden 11x slowdown is past it


@pytest.mark.single_process
def test_checkpoints_start_up_and_compilation_have_their_own_allowances():
    from hpcevo.driver.policy import PhaseLimits

    limits = PhaseLimits(fault(min_seconds=1.0, checkpoint_seconds=50.0, startup_seconds=70.0, compile_seconds=90.0))
    limits.note_dispatch(10, 0.01)
    assert limits.checkpoint() == (50.0, "fault.checkpoint_seconds")
    limits.note_checkpoint(8.0)  # a slow filesystem: 10 x its slowest write
    assert limits.checkpoint()[0] == pytest.approx(80.0)
    assert limits.startup()[0] == 70.0 and limits.compile()[0] == 90.0
    assert limits.boundary()[0] == 90.0  # before the first boundary was measured
    limits.note_boundary(0.002)
    assert limits.boundary()[0] == 1.0


@pytest.mark.single_process
def test_the_message_names_the_silent_ranks_and_the_hosts_all_of_whose_ranks_are_silent():
    from hpcevo.parallel.watchdog import Phase, Watchdog, _ranges

    now = [100.0]
    ctx = SimpleNamespace(rank=0, size=6, host="a", rank_hosts=("a", "a", "b", "b", "c", "c"))
    dog = Watchdog(ctx, heartbeat_seconds=1.0, clock=lambda: now[0])
    dog.heard = {1: 99.5, 2: 70.0, 3: 71.0, 4: 99.0, 5: 80.0}  # b is gone, c half
    text, lost = dog.report(Phase("generations 101-110", 30.0, "fault.min_seconds", 60.0), 40.0)
    assert lost == ["b"]
    assert "generations 101-110 has taken 40.0 s, past its limit of 30 s (fault.min_seconds)" in text
    assert "ranks 2-3 on b; rank 5 on c; host lost: b" in text and "no heartbeat for up to 30 s" in text
    assert "exit code 76" in text
    dog.heard = {r: 99.9 for r in range(1, 6)}
    assert "Every rank still answers" in dog.report(Phase("x", 1, "y", 0), 2)[0]
    dog.heard = {1: 99.9}  # no channel from the others: names no one
    text, lost = dog.report(Phase("x", 1, "y", 0), 2)
    assert lost == [] and "cannot be told" in text
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    # the deputy speaks only where rank 0 is silent
    deputy = Watchdog(SimpleNamespace(rank=2, size=6, host="b", rank_hosts=ctx.rank_hosts), heartbeat_seconds=1.0,
                      clock=lambda: now[0])
    deputy.deputy = 2
    deputy.heard = {0: 99.0}
    assert not deputy.speaks()
    deputy.heard = {0: 50.0}
    assert deputy.speaks()


@pytest.mark.single_process
def test_a_rank_whose_speaker_does_not_end_the_job_speaks_itself_and_keeps_what_a_speaker_wrote(
        tmp_path, monkeypatch, capsys):
    """Each rank times its phase by its own dispatches: rank 0, whose recent ones were slower,
    may allow more than rank 1 and never end the job. Rank 1 then ended itself quietly after the
    grace, and the job ended with 76 and no message (CI, under load). Now it speaks and aborts;
    an exit file a speaker already wrote (its lost hosts) is left as it is."""
    from hpcevo.parallel import watchdog as wd

    ended = []

    class Ended(Exception):
        pass

    def stop(code):
        ended.append(code)
        raise Ended

    monkeypatch.setattr(wd, "SPEAK_GRACE", 0.0)
    monkeypatch.setattr(wd, "real_exit", stop)
    monkeypatch.setattr(wd.threading, "Timer", lambda *a: SimpleNamespace(start=lambda: None))
    exit_file = tmp_path / "exit"
    monkeypatch.setenv("HPCEVO_EXIT_FILE", str(exit_file))
    aborted = []
    ctx = SimpleNamespace(rank=1, size=2, host="a", rank_hosts=("a", "a"), abort=lambda code: aborted.append(code))
    dog = wd.Watchdog(ctx, heartbeat_seconds=1.0)
    dog.deputy = 1
    dog.heard = {0: dog.clock()}  # rank 0 answers: it is the speaker, and it has not spoken
    assert not dog.speaks()
    with pytest.raises(Ended):
        dog._end_job(wd.Phase("generation 21", 1.2, "fault.slowdown = 10 x the slowest recent dispatch", 0.0), 1.3)
    err = capsys.readouterr().err
    assert err.startswith("hpcevo: error: watchdog on rank 1 (a): generation 21 has taken")
    assert "fault.slowdown = 10 x" in err and "Every rank still answers" in err
    assert aborted == [76] and ended == [76] and exit_file.read_text() == "76\n"
    # a speaker wrote first: its lost hosts stay
    exit_file.write_text("76\n")
    (tmp_path / "exit.lost").write_text("b\n")
    with pytest.raises(Ended):
        dog._end_job(wd.Phase("generation 21", 1.2, "fault.min_seconds", 0.0), 1.3)
    assert (tmp_path / "exit.lost").read_text() == "b\n" and "watchdog on rank 1" in capsys.readouterr().err


# -- end to end -----------------------------------------------------------------------------
CONFIG = """
[run]
name = "wd"
generations = {generations}
[algorithm]
name = "cso"
pop_size = 48
[problem]
name = "{problem}"
dim = 4
lb = -5.0
ub = 5.0
{host}
[parallel]
microbatch = {microbatch}
[log]
every = 1
progress = "lines"
[checkpoint]
every = {checkpoint_every}
every_seconds = 0
[fault]
min_seconds = {min_seconds}
heartbeat_seconds = 0.5
{fault}
"""


def launch(tmp: Path, n: int, *, generations: int, problem: str = "slowing", env: dict | None = None,
           min_seconds: float = 2.0, fault_lines: str = "", checkpoint_every: int = 0, timeout: float = 240):
    host = "host = true" if problem == "slowing" else ""
    cfg = tmp / "wd.toml"
    cfg.write_text(CONFIG.format(generations=generations, problem=f"{PROBLEMS}:{problem}", host=host,
                                 microbatch=24 // n, checkpoint_every=checkpoint_every, min_seconds=min_seconds,
                                 fault=fault_lines))
    exit_file = tmp / "exit"
    run_env = {**clean_env(), **(env or {}), "HPCEVO_EXIT_FILE": str(exit_file), "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    r = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "hpcevo", "run", str(cfg), "--set",
                        f"run.out={tmp / 'run'}"], capture_output=True, text=True, env=run_env, timeout=timeout)
    r.seconds = time.monotonic() - t0
    r.exit_file = exit_file
    return r


def launch_twins(tmp: Path, twins: dict[str, dict], **common) -> dict:
    """``launch`` of each twin (name: its own keywords) at the same time, each in ``tmp / name``:
    a twin spends its time sleeping or waiting for a stalled rank, so two side by side take the
    time of one and neither slows the other past what its test allows."""
    for name in twins:
        (tmp / name).mkdir()
    with ThreadPoolExecutor(len(twins)) as pool:
        futures = {name: pool.submit(launch, tmp / name, **{**common, **kw}) for name, kw in twins.items()}
        return {name: f.result() for name, f in futures.items()}


def stall_time(out: str) -> float:
    return float(next(ln for ln in out.splitlines() if ln.startswith("WD-STALL")).split()[-1])


@pytest.mark.launcher
@pytest.mark.parametrize("n, how", [(2, "stop"), (3, "stop"), (3, "sleep")])
def test_a_rank_that_stops_answering_ends_the_job_in_seconds_with_exit_76_naming_it(tmp_path, n, how):
    """Rank 1 stops mid-run: SIGSTOP (as a dead node looks: no heartbeat) or stuck in the
    problem's code (heartbeats still come). The others wait in the generation's Allgather; the
    watchdog ends the job at its limit (2 s here), rank 0 names rank 1 where it stopped answering,
    and the job script's exit file holds 76."""
    r = launch(tmp_path, n, generations=100_000, env={"WD_STALL": f"1:20:{how}"})
    ended = time.time()
    assert r.returncode == 76, (r.returncode, r.stderr[-3000:])
    took = ended - stall_time(r.stdout)
    assert took < 20, took
    (line,) = [ln for ln in r.stderr.splitlines() if "watchdog on rank 0" in ln]
    assert line.startswith("hpcevo: error: watchdog on rank 0 (")
    assert re.search(r"generation \d+ has taken \d+\.\d s, past its limit of 2 s \(fault.min_seconds", line), line
    if how == "stop":
        assert "Stopped answering (no heartbeat for up to" in line and ": rank 1 on " in line
    else:
        assert "Every rank still answers" in line
    assert "Traceback" not in r.stderr
    assert r.exit_file.read_text() == "76\n"
    assert (tmp_path / "exit.lost").read_text() == ""  # one host: none of it lost
    print(f"\n{n} ranks, rank 1 {'stopped' if how == 'stop' else 'stuck'}: the job ended {took:.1f} s later (limit 2 s)")


@pytest.mark.launcher
def test_generations_slowing_down_10x_gradually_are_not_ended_but_a_sudden_20x_jump_is(tmp_path):
    """Each rank's evaluation grows from 0.1 s to 1 s over 40 generations (one call a generation
    on each rank), with a floor of 0.5 s that a fixed limit would have crossed. Its twin jumps
    from 0.1 s to 2 s at generation 20 (a dispatch, with its overheads, takes a little more than
    its evaluation) and is ended there. (Halved, 0.05 to 0.5 s and a jump to 1 s, the jump was
    once ended at "has taken 3.0 s" without "Every rank still answers": the sizes stay.)"""
    r = launch_twins(tmp_path, {"slow": {"env": {"WD_SLOW": "grow:0.1:10:40"}},
                                "jump": {"env": {"WD_SLOW": "jump:0.1:2.0:20"}}}, n=2, generations=45, min_seconds=0.5)
    slow, jump = r["slow"], r["jump"]
    assert slow.returncode == 0, slow.stderr[-3000:]
    summary = json.loads((tmp_path / "slow" / "run" / "summary.json").read_text())
    assert summary["generations"] == 45 and summary["status"] == "complete"
    assert jump.returncode == 76, jump.stderr[-3000:]
    assert "fault.slowdown = 10 x the slowest recent dispatch" in jump.stderr
    assert "Every rank still answers" in jump.stderr


@pytest.mark.launcher
def test_a_long_first_compilation_is_not_ended_unless_past_compile_seconds(tmp_path):
    """Rank 1 takes 5 s to trace the problem while the others wait for it in generation 1: far past
    fault.min_seconds (2 s), inside fault.compile_seconds. Its twin sets compile_seconds = 3."""
    runs = launch_twins(tmp_path, {"ok": {}, "short": {"fault_lines": "compile_seconds = 3"}}, n=2, generations=30,
                        problem="slow_to_trace", env={"WD_TRACE": "5"})
    for name, code in (("ok", 0), ("short", 76)):
        assert runs[name].returncode == code, (name, runs[name].stderr[-3000:])
    r = runs["short"]
    assert "compiling and the first generation has taken" in r.stderr and "(fault.compile_seconds)" in r.stderr


@pytest.mark.launcher
def test_a_slow_checkpoint_write_is_not_ended_unless_past_checkpoint_seconds(tmp_path):
    """Rank 1 takes 4 s longer for each checkpoint (every 10 generations) while rank 0 waits for it
    inside the collective write: far past fault.min_seconds (2 s). Its twin sets
    checkpoint_seconds = 3."""
    runs = launch_twins(tmp_path, {"ok": {}, "short": {"fault_lines": "checkpoint_seconds = 3"}}, n=2, generations=20,
                        env={"WD_CHECKPOINT": "4"}, checkpoint_every=10)
    for name, code in (("ok", 0), ("short", 76)):
        assert runs[name].returncode == code, (name, runs[name].stderr[-3000:])
    r = runs["short"]
    assert "the checkpoint at generation 10 has taken" in r.stderr and "(fault.checkpoint_seconds)" in r.stderr


@pytest.mark.launcher
def test_fault_settings_are_checked_and_free_on_resume(tmp_path):
    from hpcevo import load_config
    from hpcevo.driver.resume import is_free
    from hpcevo.errors import ConfigError

    assert all(is_free(f"fault.{k}") for k in ("watchdog", "min_seconds", "slowdown"))
    with pytest.raises(ConfigError, match="fault.slowdown"):
        load_config({"run": {"name": "x"}, "algorithm": {"name": "cso"}, "problem": {"name": "sphere", "dim": 2},
                     "fault": {"slowdown": 1.5}})


@pytest.mark.launcher
def test_a_rank_that_stops_in_a_study_of_one_rank_groups_ends_the_job_not_a_hang(tmp_path):
    """ranks_per_run = 1: no rank runs beside the one that stops, so no run's watchdog sees it;
    the other groups finish their runs and wait for it. The job's watchdog names it once it has
    been silent for longer than a checkpoint may take (fault.checkpoint_seconds, 4 s here),
    and ends the job with 76. (It used to wait forever.)"""
    study = tmp_path / "s.toml"
    study.write_text(f"""[study]
seeds = 6
ranks_per_run = 1
out = "{tmp_path / 's'}"
[base]
run.generations = 30
algorithm.name = "cso"
algorithm.pop_size = 16
problem.name = "{PROBLEMS}:slowing"
problem.host = true
problem.dim = 4
problem.lb = -5.0
problem.ub = 5.0
fault.min_seconds = 2.0
fault.checkpoint_seconds = 4.0
fault.heartbeat_seconds = 0.5
""")
    env = {**clean_env(), "WD_STALL": "1:5:stop", "HPCEVO_EXIT_FILE": str(tmp_path / "exit"), "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-m", "hpcevo", "study", "run", str(study)],
                       capture_output=True, text=True, env=env, timeout=240)
    ended = time.time()
    assert r.returncode == 76, (r.returncode, r.stderr[-3000:])
    took = ended - stall_time(r.stdout)
    assert took < 60, took
    (line,) = [ln for ln in r.stderr.splitlines() if "watchdog on rank 0" in ln]
    assert "a rank sent no heartbeat for more than 4 s (fault.checkpoint_seconds" in line, line
    assert ": rank 1 on " in line and "Traceback" not in r.stderr
    assert (tmp_path / "exit").read_text() == "76\n"
    print(f"\nstudy of one-rank groups, rank 1 stopped: the job ended {took:.1f} s later")


@pytest.mark.launcher
def test_a_rank_stopped_before_the_watchdog_starts_ends_the_job_at_startup_seconds(tmp_path):
    """Rank 1 stops (SIGSTOP) right after MPI_Init, before the run's watchdog exists: the others
    waited for it forever in their first collective call, whatever fault.startup_seconds said.
    Now start-up is watched from MPI_Init on: the job ends with exit 76 and one message once the
    config's limit (here 6 s) has passed."""
    wrapper = tmp_path / "stop_rank_1.py"
    wrapper.write_text(textwrap.dedent('''
        import os, runpy, signal, sys
        from mpi4py import MPI  # MPI_Init
        if os.environ.get("PMI_RANK") == "1":
            os.kill(os.getpid(), signal.SIGSTOP)
        sys.argv = ["hpcevo", *sys.argv[1:]]
        runpy.run_module("hpcevo", run_name="__main__", alter_sys=True)
        '''))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\ngenerations = 5\n[algorithm]\nname = "cso"\npop_size = 8\n[problem]\nname = "sphere"\n'
                   'dim = 2\n[fault]\nstartup_seconds = 6\n')
    t0 = time.monotonic()
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, str(wrapper), "run", str(cfg), "--set",
                             f"run.out={tmp_path / 'run'}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(), start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < 45, (took, stderr[-3000:])
    assert stderr.count("start-up has taken") == 1, stderr[-3000:]
    assert "past its limit of 6 s (fault.startup_seconds)" in stderr and "exit code 76" in stderr
    assert not (tmp_path / "run").exists()  # nothing written
