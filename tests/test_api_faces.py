"""hpcevo.run as a research script uses it (issue 26): from a thread; its errors in its own
words (``resume=True``), the command line's in flags (``--resume``); and the name a problem held
in Python is recorded and resumed under (``problem_name``, a script's ``__main__`` functions)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax.numpy as jnp
import pytest

import hpcevo
from hpcevo.driver.resume import resume_conflicts
from hpcevo.problems import make_problem
from hpcevo.problems.user import held_names_match

from configs import small_config
from test_launcher import clean_env

# The rank matrix: what these MPI tests check (an error or an input on some ranks reaching
# every rank) needs a last rank and a middle one: 2 and 3 ranks have them, 4 repeats them.
pytestmark = pytest.mark.ranks(1, 2, 3)


def sphere(x):
    return jnp.sum((x - 0.5) ** 2)


def shifted(x):
    return jnp.sum((x - 0.5) ** 2)


def in_a_thread(fn):
    """``fn()`` in a new thread; its result, or its exception raised here."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=240)
    assert not thread.is_alive(), "the run in the thread did not return"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- run() from a thread ------------------------------------------------------------------------
def test_run_from_a_thread_completes_with_the_main_threads_digest(ctx, shared_tmp):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    main = hpcevo.run(small_config(shared_tmp / "main"), ctx=ctx, quiet=True)
    threaded = in_a_thread(lambda: hpcevo.run(small_config(shared_tmp / "thread"), ctx=ctx, quiet=True))
    assert threaded.status == "complete" and threaded.generations == 4
    assert threaded.digest == main.digest
    assert ctx.comm_ctl.allgather(threaded.digest) == [main.digest] * ctx.size
    # the main thread's handlers are as they were: the thread installed none
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


class Asked:
    """A stop source that asks for a stop from the start (as a signal would have)."""

    signum = int(signal.SIGUSR1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_a_stop_source_and_a_deadline_still_stop_a_run_in_a_thread(ctx, shared_tmp):
    stopped = in_a_thread(lambda: hpcevo.run(small_config(shared_tmp / "s", run={"generations": 40}), ctx=ctx,
                                             quiet=True, stop=Asked()))
    assert stopped.status == "stopped" and stopped.generations < 40
    assert [c.generation for c in hpcevo.open_run(shared_tmp / "s").checkpoints][0] == stopped.generations
    # a deadline one second away is within the margin (checkpoint.margin_seconds): stop at once
    late = in_a_thread(lambda: hpcevo.run(small_config(shared_tmp / "d", run={"generations": 40}), ctx=ctx,
                                          quiet=True, deadline=1))
    assert late.status == "stopped" and late.generations < 40


# -- errors in the caller's words ---------------------------------------------------------------
def test_api_errors_name_the_arguments_not_the_flags(ctx, shared_tmp):
    cfg = small_config(shared_tmp / "r")
    hpcevo.run(cfg, ctx=ctx, quiet=True)
    with pytest.raises(hpcevo.UsageError) as e:
        hpcevo.run(cfg, ctx=ctx, quiet=True)
    text = str(e.value)
    assert "already holds a run" in text and "resume=True" in text and "overwrite=True" in text
    assert "--" not in text
    with pytest.raises(hpcevo.UsageError) as e:
        hpcevo.run(cfg, ctx=ctx, quiet=True, overwrite=True, resume=True)
    assert "overwrite=True and resume=True exclude each other" in str(e.value)
    with pytest.raises(hpcevo.UsageError) as e:  # a resume the checkpoint's config refuses
        hpcevo.run(small_config(shared_tmp / "r", run={"seed": 3}), ctx=ctx, quiet=True, resume=True)
    assert "run.seed: checkpoint has 2, this run has 3" in str(e.value) and "overwrite=True" in str(e.value)
    assert "--" not in str(e.value)
    ctx.comm_ctl.Barrier()
    if ctx.is_root:  # every checkpoint damaged: nothing to resume from
        for path in (shared_tmp / "r" / "checkpoints").glob("gen-*.h5"):
            path.write_bytes(b"not a checkpoint")
    ctx.comm_ctl.Barrier()
    with pytest.raises(hpcevo.UsageError) as e:
        hpcevo.run(cfg, ctx=ctx, quiet=True, resume=True)
    assert "no usable checkpoint" in str(e.value) and "pass overwrite=True to start" in str(e.value)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcevo", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=clean_env())


def error_of(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("hpcevo: error:") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_cli_errors_name_the_flags_not_the_arguments(tmp_path):
    data = small_config(tmp_path / "r")
    path = tmp_path / "c.toml"
    path.write_text("".join(f"[{s}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
                            for s, keys in data.items()))
    assert cli("run", str(path), "-q", cwd=tmp_path).returncode == 0
    text = error_of(cli("run", str(path), "-q", cwd=tmp_path))
    assert "already holds a run" in text and "--resume" in text and "--overwrite" in text
    assert "--set run.out=DIR" in text and "=True" not in text
    text = error_of(cli("run", str(path), "-q", "--resume", "--overwrite", cwd=tmp_path))
    assert "--overwrite and --resume exclude each other" in text and "=True" not in text
    text = error_of(cli("run", str(path), "-q", "--resume", "--set", "run.seed=3", cwd=tmp_path))
    assert "run.seed: checkpoint has 2, this run has 3" in text and "--overwrite" in text and "=True" not in text
    for ck in (tmp_path / "r" / "checkpoints").glob("gen-*.h5"):
        ck.write_bytes(b"not a checkpoint")
    text = error_of(cli("run", str(path), "-q", "--resume", cwd=tmp_path))
    assert "pass --overwrite to start" in text and "=True" not in text


# -- the name of a problem held in Python -------------------------------------------------------
def held_config(out: Path, **sections) -> dict:
    """small_config without a problem name: the problem is held in Python."""
    cfg = small_config(out, **sections)
    cfg["problem"] = {"dim": 3, "lb": -1.0, "ub": 1.0}
    return cfg


@pytest.mark.ranks(1, 2)
def test_problem_name_is_what_the_run_records_and_a_resume_matches(ctx, shared_tmp):
    cfg = held_config(shared_tmp / "n")
    first = hpcevo.run(cfg, problem=sphere, problem_name="srr", ctx=ctx, quiet=True)
    assert first.summary["problem"] == "<python: srr>" == hpcevo.open_run(first.run_dir).config["problem"]["name"]
    # another function under the same name continues the run; one under its own name does not
    longer = {**cfg, "run": {**cfg["run"], "generations": 8}}
    more = hpcevo.run(longer, problem=shifted, problem_name="srr", resume=True, ctx=ctx, quiet=True)
    assert more.summary["resumed_from"] == 4 and more.generations == 8
    with pytest.raises(hpcevo.UsageError) as e:
        hpcevo.run({**cfg, "run": {**cfg["run"], "generations": 12}}, problem=shifted, resume=True, ctx=ctx,
                   quiet=True)
    assert "problem.name: checkpoint has '<python: srr>', this run has '<python: test_api_faces.shifted>'" in str(
        e.value)
    whole = hpcevo.run({**longer, "run": {**longer["run"], "out": str(shared_tmp / "w")}}, problem=sphere, ctx=ctx,
                       quiet=True)
    assert whole.summary["problem"] == "<python: test_api_faces.sphere>" and whole.digest == more.digest


@pytest.mark.parametrize("name, problem, needle", [
    ("", sphere, "non-empty line of text"),
    (" srr", sphere, "non-empty line of text"),
    ("a\nb", sphere, "non-empty line of text"),
    (7, sphere, "got 7"),
    ("srr", None, "pass it as problem= too"),
    ("srr", make_problem("sphere", 3), r"recorded by its own name \('sphere'\)"),
], ids=["empty", "spaces", "newline", "int", "no-problem", "problem-object"])
def test_problem_name_is_checked_like_every_argument(ctx, shared_tmp, name, problem, needle):
    cfg = held_config(shared_tmp / "x")
    with pytest.raises(hpcevo.ConfigError, match=needle) as e:
        hpcevo.run(cfg, problem=problem, problem_name=name, ctx=ctx, quiet=True)
    assert e.value.key == "problem_name"
    assert not (shared_tmp / "x").exists()  # refused before anything ran


def test_ranks_given_different_problem_names_are_refused(ctx, shared_tmp):
    cfg = held_config(shared_tmp / "y")
    name = f"srr{min(ctx.rank, 1)}"  # rank 0's differs from every other rank's
    if ctx.size == 1:  # (one rank agrees with itself)
        assert hpcevo.run(cfg, problem=sphere, problem_name=name, ctx=ctx, quiet=True).summary["problem"] == (
            "<python: srr0>")
        return
    with pytest.raises(hpcevo.UsageError) as e:
        hpcevo.run(cfg, problem=sphere, problem_name=name, ctx=ctx, quiet=True)
    assert "'problem' is '<python: srr0>' on rank 0 and '<python: srr1>' there" in str(e.value)
    assert not (shared_tmp / "y").exists()


@pytest.mark.single_process
def test_held_names_match_with_or_without_their_module():
    def cfg(name: str) -> dict:
        return {"problem": {"name": name, "dim": 3}, "run": {"seed": 1}}

    def stored(name: str) -> str:
        return f'[problem]\nname = "{name}"\ndim = 3\n\n[run]\nseed = 1\n'

    assert held_names_match("<python: srr>", "<python: study_problem.srr>")
    assert held_names_match("<python: pkg.study.srr>", "<python: srr>")  # and the other way round
    assert held_names_match("<python: Box.srr>", "<python: study.Box.srr>")
    assert held_names_match("sphere", "sphere") and not held_names_match("sphere", "<python: sphere>")
    for a, b in [("<python: srr>", "<python: study_problem.srr2>"), ("<python: srr>", "<python: xsrr>"),
                 ("<python: a.srr>", "<python: b.srr>"), ("<python: srr>", "srr")]:
        assert not held_names_match(a, b), (a, b)
        assert resume_conflicts(stored(a), cfg(b)) == [f"problem.name: checkpoint has {a!r}, this run has {b!r}"]
    assert resume_conflicts(stored("<python: srr>"), cfg("<python: study_problem.srr>")) == []
    assert resume_conflicts(stored("<python: study_problem.srr>"), cfg("<python: srr>")) == []


# -- a script's function, resumed by another script ---------------------------------------------
BODY = "return jnp.sum((x - 0.25) ** 2) + 0.1 * jnp.sum(jnp.abs(x))"

STUDY = f"""
import jax.numpy as jnp


def srr(x):
    {BODY}


def srr2(x):
    {BODY}
"""

SETUP = """
import json
import sys

import hpcevo

out, generations = sys.argv[1], int(sys.argv[2])
cfg = {"run": {"name": "study", "seed": 4, "generations": generations, "out": out},
       "algorithm": {"name": "cso", "pop_size": 8}, "problem": {"dim": 3, "lb": -1.0, "ub": 1.0},
       "log": {"every": 5}, "checkpoint": {"every": 5, "every_seconds": 0}}


def report(problem, **kwargs):
    try:
        result = hpcevo.run(cfg, problem=problem, quiet=True, **kwargs)
    except hpcevo.UsageError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    else:
        print(json.dumps({"digest": result.digest, "name": result.summary["problem"],
                          "resumed_from": result.summary["resumed_from"]}))
"""

# A: the function defined in the script itself (module __main__)
SCRIPT_A = SETUP + f"""
import jax.numpy as jnp


def srr(x):
    {BODY}


report(srr)
"""

# B: the same function imported from its module; argv[3] names it, argv[4] "resume" or "fresh",
# argv[5] (optional) a problem_name
SCRIPT_B = SETUP + """
import study_problem

extra = {"problem_name": sys.argv[5]} if len(sys.argv) > 5 else {}
report(getattr(study_problem, sys.argv[3]), resume=sys.argv[4] == "resume", **extra)
"""


@pytest.mark.single_process
@pytest.mark.slow  # five interpreters start (about 30 s)
def test_a_run_a_script_started_resumes_in_a_script_that_imports_its_function(tmp_path):
    for name, text in (("study_problem.py", STUDY), ("script_a.py", SCRIPT_A), ("script_b.py", SCRIPT_B)):
        (tmp_path / name).write_text(textwrap.dedent(text))

    def script(*args: str) -> dict:
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env=clean_env())
        assert r.returncode == 0 and r.stdout.strip(), (r.returncode, r.stdout, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    a = script("script_a.py", str(tmp_path / "a"), "10")
    assert a["name"] == "<python: srr>"  # no __main__: the code, not whichever script ran it
    # a function of another name is refused, naming both, and nothing of the run is touched
    before = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    other = script("script_b.py", str(tmp_path / "a"), "20", "srr2", "resume")
    assert other["error"] == "UsageError"
    assert "problem.name: checkpoint has '<python: srr>', this run has '<python: study_problem.srr2>'" in (
        other["message"])
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == before
    # ... unless it is given the name the run recorded
    named = script("script_b.py", str(tmp_path / "named"), "10", "srr2", "fresh", "srr")
    assert named["name"] == "<python: srr>" and named["digest"] == a["digest"]
    # the same function from its module continues the run, bitwise as if it had never stopped
    resumed = script("script_b.py", str(tmp_path / "a"), "20", "srr", "resume")
    assert resumed["resumed_from"] == 10 and resumed["name"] == "<python: study_problem.srr>"
    whole = script("script_b.py", str(tmp_path / "whole"), "20", "srr", "fresh")
    assert whole["resumed_from"] is None and whole["digest"] == resumed["digest"]
