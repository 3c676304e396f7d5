"""Host problems (NumPy functions, external commands): evaluation outside JIT over ranks and
threads, static and dynamic schedules, failures penalised, counted and logged, bitwise equal
runs at any rank count, resume, and start-up errors."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from hpcevo.errors import ConfigError
from hpcevo.parallel import TaskRunner, allgather_rows, context_for
from hpcevo.problems import create
from test_user_problems import run_fails_where_missing

# Splits of rows over 1, 2 and 3 ranks (3: uneven); a 4th rank splits them evenly again and
# adds nothing but collectives (tests/test_parallel.py and the digest matrix run at 4).
pytestmark = pytest.mark.ranks(1, 2, 3)

NUMPY_PROBLEMS = textwrap.dedent(
    """
    import numpy as np

    def weighted(x, shift=0.0):
        # a block (n, dim) -> (n,); a BLAS product, whose bits may depend on the block's shape
        w = np.linspace(0.5, 1.5, x.shape[1])
        return ((x - shift) ** 2) @ w

    def picky(x):
        # one candidate; fails in two ways for parts of the box
        if x[0] > 0.6:
            raise ValueError("diverged")
        if x[1] < -0.7:
            return "no number"
        return float(np.sum(x * x))
    picky.batched = False

    def wrong_shape(x):
        return np.zeros(len(x) + 1)
    """
)

# A stand-in simulator: sh + awk (fast to start), a random sleep of a few ms, and failures chosen
# by (generation, index) so that a run is deterministic: a crash, unparsable output, a timeout,
# no output file, and death by a signal.
SIM = textwrap.dedent(
    """\
    #!/bin/sh
    # sim.sh INPUT OUTPUT INDEX GENERATION
    case "$4-$3" in
      1-3) echo "simulated crash" >&2; exit 3 ;;
      2-1) echo "garbage" > "$2"; exit 0 ;;
      2-2) sleep 30 ;;
      3-0) exit 0 ;;
      3-3) kill -KILL $$ ;;
    esac
    sleep 0.00$(( $$ % 10 ))
    awk '{ s += $1 * $1 } END { printf "%.17g\\n", s }' "$1" > "$2"
    """
)
SIM_FAILURES = {(1, 3): "exit status 3", (2, 1): "not a number: 'garbage'", (2, 2): "timed out after 1.5 s",
                (3, 0): "wrote no output file", (3, 3): "killed by signal SIGKILL"}


@pytest.fixture
def files(ctx, shared_tmp):
    """The NumPy problems and the simulator, in a directory every rank sees."""
    if ctx.rank == 0:
        (shared_tmp / "hostprob.py").write_text(NUMPY_PROBLEMS)
        (shared_tmp / "sim.sh").write_text(SIM)
        (shared_tmp / "sim.sh").chmod(0o755)
    ctx.comm_ctl.Barrier()
    return shared_tmp


def config(out: Path, problem: dict, generations: int = 4, **evaluation):
    return hpcevo.load_config({
        "run": {"name": "host", "seed": 5, "generations": generations, "out": str(out)},
        "algorithm": {"name": "cso", "pop_size": 8},
        "problem": {"dim": 3, "lb": -1.0, "ub": 1.0, **problem},
        "evaluation": evaluation,
        "log": {"every": 2, "progress": "lines"},
        "checkpoint": {"every": 2, "every_seconds": 0},
    })


def failures(out: Path) -> list[dict]:
    path = out / "failures.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# -- parallel pieces: gather by index, tasks over ranks and threads ------------------------------
def test_allgather_rows_takes_any_number_of_rows_per_rank(ctx):
    n = 11
    owner = [(i * i + 3) % (ctx.size + 1) % ctx.size for i in range(n)]  # uneven; some ranks may hold none
    mine = np.array([i for i in range(n) if owner[i] == ctx.rank], np.int64)
    rows = np.stack([mine * 1.5, -mine.astype(float)], axis=1) if mine.size else np.zeros((0, 2))
    full = allgather_rows(ctx, n, mine, rows)
    assert full.tobytes() == np.stack([np.arange(n) * 1.5, -np.arange(n, dtype=float)], 1).tobytes()
    ints = allgather_rows(ctx, n, mine, mine.astype(np.int32) * 7)
    assert ints.dtype == np.int32 and ints.tolist() == [7 * i for i in range(n)]
    with pytest.raises(RuntimeError, match="expected 12"):  # every rank sees the same counts
        allgather_rows(ctx, n + 1, mine, rows)


@pytest.mark.parametrize("schedule,concurrency", [("static", 1), ("static", 3), ("dynamic", 1), ("dynamic", 2)])
def test_every_task_runs_once_somewhere(ctx, schedule, concurrency):
    runner = TaskRunner(ctx, concurrency, schedule)
    try:
        for num_tasks in (0, 1, 13):  # fewer tasks than ranks, too
            def task(t):
                time.sleep(0.001 * (t % 3))
                return t * t

            done = runner.map(num_tasks, task)
            assert all(v == t * t for t, v in done.items())
            everyone = ctx.comm_ctl.allgather(sorted(done))
            assert sorted(t for part in everyone for t in part) == list(range(num_tasks))
            if schedule == "static":  # contiguous blocks in rank order
                assert [t for part in everyone for t in part] == list(range(num_tasks))
    finally:
        runner.close()


def test_dynamic_schedule_gives_a_slow_rank_fewer_tasks(ctx):
    if ctx.size == 1:
        return  # nothing to balance
    runner = TaskRunner(ctx, 1, "dynamic")
    try:
        # Rank 0's tasks take 100 ms, the others' 1 ms: rank 0 ends up with a handful of the 40.
        done = runner.map(40, lambda t: time.sleep(0.1 if ctx.rank == 0 else 0.001))
    finally:
        runner.close()
    counts = ctx.comm_ctl.allgather(len(done))
    assert sum(counts) == 40 and counts[0] < 40 // ctx.size


# -- problems ----------------------------------------------------------------------------------
@pytest.mark.single_process
def test_numpy_problem_values_and_failures(tmp_path):
    (tmp_path / "hostprob.py").write_text(NUMPY_PROBLEMS)
    x = np.array([[0.1, 0.2, 0.3], [0.9, 0.0, 0.0], [0.0, -0.9, 0.0]])
    block = create(f"{tmp_path}/hostprob.py:weighted", 3, -1.0, 1.0, {"shift": 0.1}, host=True)
    assert block.rows_per_call is None and block.host
    values, failed = block.evaluate_rows(x, 0, 1)
    assert failed == [] and values.tolist() == (((x - 0.1) ** 2) @ np.linspace(0.5, 1.5, 3)).tolist()
    one = create(f"{tmp_path}/hostprob.py:picky", 3, -1.0, 1.0, host=True)
    assert one.rows_per_call == 1
    values, failed = one.evaluate_rows(x, 10, 1)
    assert values[0] == np.sum(x[0] ** 2) and np.isnan(values[1:]).all()
    assert failed[0][0] == 1 and failed[0][1].startswith("raised ValueError: diverged (")
    assert failed[1] == (2, "returned str, not numbers")
    bad = create(f"{tmp_path}/hostprob.py:wrong_shape", 3, -1.0, 1.0, host=True)
    _, failed = bad.evaluate_rows(x, 0, 1)
    assert failed == [(i, "returned shape (4,) for a block of 3 rows, expected (3,)") for i in range(3)]


@pytest.mark.single_process
def test_command_protocol_stdin_stdout_files_and_timeouts(tmp_path):
    def command(script: str, args: list[str], timeout=0.0):
        path = tmp_path / f"s{len(list(tmp_path.iterdir()))}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        return create("command", 2, -1.0, 1.0, {"command": [str(path), *args], "timeout": timeout})

    x = np.array([[0.25, -3.0]])
    # stdin -> stdout: the values, one per line, exactly as float64 repr
    echo = command("awk '{ s += $1 } END { print \"noise\"; print s }'", [])
    assert echo.evaluate_rows(x, 0, 1) == (np.array([-2.75]), [])
    # files, placeholders, literal braces; {dir} is private and removed afterwards
    seen = tmp_path / "seen.txt"
    files = command(f'echo "$3 $4 $5 $6" > {seen}; test -d "$7" || exit 9; awk \'{{ s += $1 }} END {{ print s }}\' "$1" > "$2"',
                    ["{input}", "{output}", "{index}", "{generation}", "{dim}", "{{x}}", "{dir}"])
    assert files.evaluate_rows(x, 6, 2) == (np.array([-2.75]), [])
    assert seen.read_text() == "6 2 2 {x}\n"
    assert not any(files._scratch.iterdir())
    # a timeout kills the whole process group: the background child too
    pidfile = tmp_path / "child.pid"
    slow = command(f"sleep 30 & echo $! > {pidfile}; wait", [], timeout=0.3)
    t0 = time.monotonic()
    assert slow.evaluate_rows(x, 0, 1)[1] == [(0, "timed out after 0.3 s")]
    assert time.monotonic() - t0 < 5
    time.sleep(0.1)
    status = Path(f"/proc/{int(pidfile.read_text())}/status")
    assert not status.exists() or "\nState:\tZ" in status.read_text()  # gone, or dead and unreaped
    assert "empty: no fitness" in command("true", []).evaluate_rows(x, 0, 1)[1][0][1]
    assert command("echo oops >&2; exit 2", []).evaluate_rows(x, 0, 1)[1][0][1].endswith(": oops")
    for p in (echo, files, slow):
        p.close()


@pytest.mark.single_process
@pytest.mark.parametrize("problem,expected", [
    ({"name": "command", "args": {"command": ["./no-such-sim", "{input}"]}}, "program './no-such-sim' not found"),
    ({"name": "command", "args": {"command": "no-such-sim-xyz {input}"}}, "not found on PATH"),
    ({"name": "command", "args": {"command": ["NOTEXEC"]}}, "is not an executable file (chmod +x?)"),
    ({"name": "command", "args": {"command": ["true", "{inptu}"]}}, "unknown placeholder {inptu}"),
    ({"name": "command", "args": {"command": ["true", "{input"]}}, "bad braces"),
    ({"name": "command", "args": {"command": []}}, "command must be a list of strings"),
    ({"name": "command", "args": {"command": ["true"], "timout": 3}}, "unknown [problem.args] key 'timout'"),
    ({"name": "command", "args": {"command": ["true"], "timeout": -1}}, "timeout must be a number of seconds"),
    ({"name": "command", "args": {"command": ["true"]}, "batched": False}, "problem.batched does not apply"),
    ({"name": "sphere", "host": True}, "problem.host = true is for a NumPy function named by import path"),
])
def test_bad_host_problems_are_refused_at_start_up(tmp_path, problem, expected):
    (tmp_path / "notexec").write_text("#!/bin/sh\n")
    args = problem.get("args", {})
    if args.get("command") == ["NOTEXEC"]:
        args["command"] = [str(tmp_path / "notexec")]
    with pytest.raises(ConfigError) as e:
        config(tmp_path, problem)
    assert expected in str(e.value), str(e.value)


@pytest.mark.single_process
def test_host_settings_are_refused_for_jax_problems(tmp_path):
    with pytest.raises(ConfigError, match="'evaluation.schedule' applies to host problems only"):
        config(tmp_path, {"name": "sphere"}, schedule="dynamic")
    # ... and kept out of a JAX run's resolved config, so its checkpoints resume as before
    from hpcevo.driver.build import resolved

    assert "concurrency" not in resolved(config(tmp_path, {"name": "sphere"}))["evaluation"]
    with pytest.raises(ConfigError, match="'evaluation.penalty': must be a number or inf, not nan"):
        config(tmp_path, {"name": "command", "args": {"command": ["true"]}}, penalty=float("nan"))


@pytest.mark.single_process
def test_numpy_code_traced_as_jax_suggests_host(tmp_path):
    (tmp_path / "np_only.py").write_text("import numpy as np\ndef f(x):\n    return np.cos(np.asarray(x)).sum()\n")
    with pytest.raises(ValueError, match="set problem.host = true"):
        create(f"{tmp_path}/np_only.py:f", 3, -1.0, 1.0)


# -- whole runs: the same at any rank count, schedule and concurrency; failures never stop -------
def test_numpy_problem_same_run_at_any_rank_count_and_schedule(ctx, files):
    problem = {"name": f"{files}/hostprob.py:picky", "host": True}
    static = hpcevo.run(config(files / "static", problem), quiet=True, ctx=ctx).summary
    dynamic = hpcevo.run(config(files / "dynamic", problem, schedule="dynamic", concurrency=2), quiet=True, ctx=ctx).summary
    assert static["status"] == dynamic["status"] == "complete"
    assert static["failed_evaluations"] > 0  # penalised with +inf: counted as non-finite too
    assert static["nonfinite_evaluations"] == static["failed_evaluations"]
    logged = failures(files / "static")
    if ctx.is_root:
        assert len(logged) == static["failed_evaluations"]
        assert all(r["reason"].startswith("raised ValueError") == (r["x"][0] > 0.6) for r in logged)
        one = hpcevo.run(config(files / "one", problem), quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        assert one["state_digest"] == static["state_digest"]
        assert failures(files / "one") == [dict(r, rank=0) for r in logged]
    assert dynamic["state_digest"] == static["state_digest"]
    assert dynamic["failed_evaluations"] == static["failed_evaluations"]
    assert ctx.comm_ctl.allgather(static["state_digest"]) == [static["state_digest"]] * ctx.size


def test_block_function_runs_on_fixed_slices_and_resumes(ctx, files):
    problem = {"name": f"{files}/hostprob.py:weighted", "host": True, "args": {"shift": 0.25}}
    whole = hpcevo.run(config(files / "whole", problem, generations=6, batch_size=3), quiet=True, ctx=ctx).summary
    hpcevo.run(config(files / "split", problem, generations=3, batch_size=3), quiet=True, ctx=ctx).summary
    if ctx.is_root:  # continued on one rank: another rank count whenever size > 1
        rest = hpcevo.run(config(files / "split", problem, generations=6,
                                                            batch_size=3, schedule="dynamic"),
                       resume=True, quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        assert rest["resumed_from"] == 3 and rest["state_digest"] == whole["state_digest"]
    ctx.comm_ctl.Barrier()


@pytest.mark.slow
def test_command_failures_are_penalised_counted_logged_and_never_stop_the_run(ctx, files):
    problem = {"name": "command", "args": {
        "command": [str(files / "sim.sh"), "{input}", "{output}", "{index}", "{generation}"], "timeout": 1.5}}
    # A finite penalty: an ordinary (bad) value, so the run is compared bit for bit below.
    here = hpcevo.run(config(files / "cmd", problem, schedule="dynamic", concurrency=2, penalty=1e30), quiet=True, ctx=ctx).summary
    assert here["status"] == "complete" and here["generations"] == 4
    assert here["failed_evaluations"] == len(SIM_FAILURES)
    assert here["nonfinite_evaluations"] == 0
    metrics = [json.loads(x) for x in (files / "cmd" / "metrics.jsonl").read_text().splitlines()] if ctx.is_root else []
    if ctx.is_root:
        assert [m["failed_evaluations"] for m in metrics] == [3, 5]
        logged = failures(files / "cmd")
        assert [(r["generation"], r["index"]) for r in logged] == sorted(SIM_FAILURES)
        for r in logged:
            assert SIM_FAILURES[(r["generation"], r["index"])] in r["reason"], r
            assert len(r["x"]) == 3 and 0 <= r["rank"] < ctx.size
        # one rank, static blocks, one at a time: the same run (the simulator is deterministic)
        one = hpcevo.run(config(files / "one", problem, penalty=1e30), quiet=True, ctx=context_for(MPI.COMM_SELF)).summary
        assert one["failed_evaluations"] == len(SIM_FAILURES)
        assert one["state_digest"] == here["state_digest"]
    assert ctx.comm_ctl.allgather(here["state_digest"]) == [here["state_digest"]] * ctx.size


def test_missing_program_on_some_ranks_fails_everywhere(ctx, files, capsys):
    """The simulator exists on rank 0's node only: every rank exits 2, one message, no hang."""
    problem = ('name = "command"\ndim = 3\nlb = -1.0\nub = 1.0\n[problem.args]\n'
               'command = ["./sim.sh", "{input}", "{output}", "{index}", "{generation}"]\n')
    run_fails_where_missing(ctx, capsys, files, "cso", problem, {"sim.sh": (files / "sim.sh").read_text()})


# -- as a user runs them (launcher pass) ----------------------------------------------------------
@pytest.mark.launcher
def test_examples_run_the_same_at_1_and_3_ranks(tmp_path):
    from test_launcher import ROOT, hpcevo

    runs = {}
    for n in (None, 3):
        out = tmp_path / f"cmd{n}"
        r = hpcevo(n, "run", "examples/host_command.toml", "--set", "run.generations=2", "--set",
                   "log.every=1", "--set", f"run.out={out}", cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert "failed so far 1" in r.stdout  # the boundary line reports the running total
        runs[n] = json.loads((out / "summary.json").read_text()), failures(out)
    (one, log1), (three, log3) = runs[None], runs[3]
    assert one["state_digest"] == three["state_digest"] and one["failed_evaluations"] == 1
    assert [(r["generation"], r["index"], r["x"]) for r in log1] == [(r["generation"], r["index"], r["x"]) for r in log3]
    assert "solver diverged" in log1[0]["reason"]
    r = hpcevo(2, "run", "examples/host_numpy.toml", "--set", "run.generations=20", "--set",
               f"run.out={tmp_path / 'np'}", "-q", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "np" / "summary.json").read_text())["failed_evaluations"] == 0


@pytest.mark.launcher
def test_missing_program_exits_2_with_one_message(tmp_path):
    from test_launcher import ROOT, hpcevo

    r = hpcevo(3, "run", "examples/host_command.toml", "--set", 'problem.args.command=["./sim-missing", "{input}"]',
               "--set", f"run.out={tmp_path}", cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("hpcevo: error:") == 1 and "program './sim-missing' not found" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
