"""Bad input of every class found by trying hpcevo as a newcomer: each ends in one message that
names the key or file and what is allowed, exit 2, never a traceback (issue "a newcomer's first
hour"). The command line is run as a user runs it, in a subprocess; the API's exceptions in
process. The property-based sweep over many inputs is tests/test_fuzz.py.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcevo
from hpcevo.driver.report import Reporter
from hpcevo.driver.resources import check_memory

from test_launcher import MPIEXEC, clean_env

pytestmark = pytest.mark.single_process

MINIMAL = '[algorithm]\nname = "cso"\npop_size = 8\n\n[problem]\nname = "ackley"\ndim = 4\n'


def cli(*args: str, cwd: Path | None = None, n: int | None = None, env: dict | None = None):
    cmd = [sys.executable, "-m", "hpcevo", *args]
    if n is not None:
        cmd = [MPIEXEC, "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env or clean_env())


def one_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """The run failed as bad input: exit 2, exactly one message, no traceback; returns it."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.stderr.count("hpcevo: error:") == 1, r.stderr
    assert "hpcevo: error: hpcevo" not in r.stderr, r.stderr  # the prefix once, not twice
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    return r.stderr


def write(tmp: Path, data: bytes | str, name: str = "c.toml") -> Path:
    path = tmp / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


# -- configs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    bytes(range(256)) * 2,  # random bytes
    MINIMAL.encode("utf-16"),  # another encoding
    b"# caf\xe9: one Latin-1 byte in a comment\n" + MINIMAL.encode(),
], ids=["random-bytes", "utf-16", "latin-1-comment"])
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_a_config_that_is_not_utf8(tmp_path, content):
    path = write(tmp_path, content)
    one_error(cli("run", str(path)), "c.toml", "not UTF-8")
    with pytest.raises(hpcevo.ConfigError, match="not UTF-8"):
        hpcevo.load_config(path)


@pytest.mark.parametrize("override, key", [
    ("algorithm.pop_size=1000000000000", "algorithm.pop_size"),
    ("run.generations=18446744073709551617", "run.generations"),  # above the 64-bit range
    ("run.generations=4294967296", "run.generations"),
    ("problem.dim=99999999999", "problem.dim"),
], ids=["pop", "generations-2**64", "generations-2**32", "dim"])
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_integers_too_large_to_use(tmp_path, override, key):
    path = write(tmp_path, MINIMAL)
    one_error(cli("run", str(path), "--set", override), key, "less than or equal to 2147483647")
    with pytest.raises(hpcevo.ConfigError) as e:
        hpcevo.load_config(path, [override])
    assert e.value.key == key


def test_a_population_that_cannot_fit_in_memory_is_refused_with_its_size(tmp_path):
    path = write(tmp_path, MINIMAL)
    msg = one_error(cli("run", str(path), "--set", "problem.dim=200000000", "--set", "algorithm.pop_size=100000"),
                    "algorithm.pop_size = 100000 x problem.dim = 200000000", "needs at least", "GiB")
    assert "149 TiB" in msg or "1.49e+05 GiB" in msg  # 2 x 1e5 x 2e8 x 4 bytes
    with pytest.raises(hpcevo.ConfigError) as e:  # the API: the same check, the key
        check_memory("c.toml", 1000, 1000, "float64", available=2**20, ranks=1)
    assert e.value.key == "algorithm.pop_size" and "15.3 MiB" in str(e.value)
    check_memory("c.toml", 1000, 1000, "float32", available=2**30, ranks=4)  # 8 MB of 256 MiB fits
    with pytest.raises(hpcevo.ConfigError, match="4 ranks on this node share"):
        check_memory("c.toml", 1000, 1000, "float32", available=2**24, ranks=4)


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_threads_per_rank_must_be_positive(tmp_path, threads):
    path = write(tmp_path, MINIMAL)
    one_error(cli("run", str(path), "--set", f"parallel.threads_per_rank={threads}"), "parallel.threads_per_rank")


@pytest.mark.parametrize("bounds, needle", [
    ("problem.lb=-1e39", "outside what float32 holds"),
    ("problem.ub=inf", "outside what float32 holds"),
    ("problem.ub=[1.0, 1.0, 1e300, 1.0]", "outside what float32 holds"),
], ids=["lb-1e39", "ub-inf", "ub-list"])
def test_bounds_beyond_the_float32_range(tmp_path, bounds, needle):
    path = write(tmp_path, MINIMAL)
    one_error(cli("run", str(path), "--set", bounds), needle, "problem.")
    # A float64 run holds 1e39, but never inf.
    cfg = hpcevo.load_config(path, ["run.dtype='float64'", "problem.lb=-1e39", "problem.ub=1e39"])
    assert cfg.problem.lb == -1e39
    with pytest.raises(hpcevo.ConfigError, match="outside what float64 holds"):
        hpcevo.load_config(path, ["run.dtype='float64'", "problem.ub=inf"])


def test_the_run_name_message_shows_the_pattern_as_written(tmp_path):
    path = write(tmp_path, MINIMAL)
    msg = one_error(cli("run", str(path), "--set", "run.name='Bad Name!'"), "run.name")
    assert "^[A-Za-z0-9][A-Za-z0-9._-]*$" in msg


def test_a_minimal_config_needs_only_algorithm_and_problem(tmp_path):
    path = write(tmp_path, MINIMAL, "minimal.toml")
    cfg = hpcevo.load_config(path)
    assert (cfg.run.name, cfg.run.generations, cfg.run.seed) == ("minimal", 100, 0)
    cfg = hpcevo.load_config({"algorithm": {"name": "de"}, "problem": {"name": "sphere", "dim": 3}})
    assert cfg.run.name == "de-sphere" and cfg.algorithm.pop_size == 100


# -- the command line -----------------------------------------------------------------------------
def test_info_set_without_a_config(tmp_path):
    one_error(cli("info", "--set", "parallel.threads_per_rank=2"), "--set needs a config")


def test_resume_of_a_config_file_says_what_to_type(tmp_path):
    path = write(tmp_path, MINIMAL)
    one_error(cli("resume", str(path)), "takes a run directory", f"hpcevo run {path} --resume")


@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_argument_errors_carry_the_prefix_once():
    one_error(cli("run"), "run: the following arguments are required: config")
    one_error(cli("bogus"), "invalid choice")


def test_jobs_render_into_a_missing_directory(tmp_path):
    path = write(tmp_path, MINIMAL)
    out = tmp_path / "no" / "such" / "job.sbatch"
    one_error(cli("jobs", "render", "slurm", str(path), "--time", "1h", "-o", str(out)), "does not exist", str(out))


def test_max_requeues_message():
    msg = one_error(cli("jobs", "render", "slurm", "examples/cso.toml", "--time", "1h", "--max-requeues", "-3"),
                    "--max-requeues -3: must be 0 (never requeue) or more")
    assert "+ 1" not in msg


@pytest.mark.parametrize("args, needle", [
    (["--pop", "0", "--eval-ms", "1"], "--pop 0"),
    (["--pop", "100", "--eval-ms", "0"], "cannot be projected"),
    (["--pop", "100", "--eval-ms", "nan"], "--eval-ms nan"),
    (["--pop", "100", "--eval-ms", "1", "--bandwidth-gbs", "0"], "--bandwidth-gbs"),
    (["--pop", "100", "--eval-ms", "1", "--ranks", "0"], "--ranks"),
], ids=["pop0", "all-zero", "nan", "bandwidth0", "ranks0"])
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_model_with_zero_or_nan_inputs(args, needle):
    one_error(cli("model", *args), needle)


@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_offline_tools_speak_once_per_job_under_a_launcher(tmp_path):
    """`jobs` and `model` need no MPI, but a user may start them with mpiexec: one message."""
    r = cli("model", "--pop", "0", "--eval-ms", "1", n=3)
    assert r.returncode != 0 and r.stderr.count("hpcevo: error:") == 1, r.stderr
    out = tmp_path / "job.sbatch"
    r = cli("jobs", "render", "slurm", "examples/cso.toml", "--time", "1h", "-o", str(out), n=3)
    assert r.returncode == 0 and out.is_file(), r.stderr


# -- run directories and their files -------------------------------------------------------------
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_plot_of_a_damaged_metrics_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[run]\nname = "x"\n')
    good = {"generation": 10, "evaluations": 80, "best": 1.0, "gen_best": 1.0, "gen_mean": 2.0, "gen_std": 0.1,
            "nonfinite": 0, "wall_s": 0.1, "evals_per_s": 800.0}
    for damage in ({"best": "garbage"}, {"best": None, "gen_best": [1, 2]}):
        (run / "metrics.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, **damage}) + "\n")
        one_error(cli("plot", str(run)), "metrics.jsonl", "line 2", "damaged")
    (run / "metrics.jsonl").write_text(json.dumps({"generation": 1, "evaluations": 8, "colour": 3}) + "\n")
    one_error(cli("plot", str(run)), "metrics.jsonl", "damaged")


@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_a_second_run_of_the_same_config_names_resume_and_overwrite(tmp_path):
    path = write(tmp_path, MINIMAL + '\n[run]\ngenerations = 2\n')
    assert cli("run", str(path), "-q", cwd=tmp_path).returncode == 0
    summary = (tmp_path / "runs" / "c" / "summary.json").read_text()
    one_error(cli("run", str(path), cwd=tmp_path), "already holds a run", "--resume", "--overwrite")
    assert (tmp_path / "runs" / "c" / "summary.json").read_text() == summary  # nothing lost


# -- the log --------------------------------------------------------------------------------------
def test_the_log_when_every_evaluation_fails_and_running_totals():
    import io

    stream = io.StringIO()
    rep = Reporter(True, True, "lines", 10, stream)
    rep.boundary({"generation": 5, "evals_per_s": 1.0, "nonfinite": 16, "failed_evaluations": 16},
                 "best inf  mean - (no finite fitness in this generation)")
    text = stream.getvalue()
    assert "non-finite so far 16" in text and "failed so far 16" in text
    from hpcevo.driver.recording import SingleObjective

    line = SingleObjective.progress({"best": math.inf, "gen_best": math.inf, "gen_mean": 0.0})
    assert "mean -" in line and "0.000000e+00" not in line


def test_notes_on_a_collapsed_population_and_a_long_stall():
    import io

    stream = io.StringIO()
    rep = Reporter(True, True, "lines", 1000, stream)
    rec = {"evals_per_s": 1.0, "nonfinite": 0, "gen_best": 3.0, "gen_mean": 3.0}
    rep.boundary({**rec, "generation": 100, "best": 3.0, "gen_std": 0.5}, "p")
    rep.boundary({**rec, "generation": 200, "best": 3.0, "gen_std": 0.0}, "p")
    rep.boundary({**rec, "generation": 300, "best": 3.0, "gen_std": 0.0}, "p")
    text = stream.getvalue()
    assert text.count("the population has collapsed at generation 200") == 1
    assert text.count("has not improved for 200 generations (since generation 100)") == 1


def test_an_error_in_a_problem_by_import_path_names_its_file_and_line(tmp_path):
    (tmp_path / "mine.py").write_text("import jax.numpy as jnp\n\n\ndef f(x):\n    return jnp.sum(x) + undefined\n")
    path = write(tmp_path, '[algorithm]\nname = "cso"\npop_size = 8\n[problem]\nname = "mine.py:f"\n'
                           'dim = 4\nlb = -1.0\nub = 1.0\n')
    msg = one_error(cli("run", str(path), cwd=tmp_path), "c.toml", "NameError", "line 5")
    assert "mine.py" in msg.split("NameError", 1)[1]  # the user's file, not a frame inside JAX


# -- damaged files, messages, validation of what Python hands over (issue "No hang, no silent fork")
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    path = write(tmp, MINIMAL + '\n[run]\ngenerations = 2\n')
    assert cli("run", str(path), "-q", cwd=tmp).returncode == 0
    return tmp / "runs" / "c"


@pytest.mark.parametrize("summary", ["{}", "[]", "not json", '{"generations": "x", "best_fitness": [1]}',
                                     b"\xff\xfe\x00"], ids=["empty", "list", "text", "types", "bytes"])
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_inspect_of_a_damaged_summary(tmp_path, finished_run, summary):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").write_bytes(summary if isinstance(summary, bytes) else summary.encode())
    r = cli("inspect", str(run))
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    if r.returncode == 2:  # unreadable as a whole: one message naming the file
        assert r.stderr.count("hpcevo: error:") == 1 and "summary.json" in r.stderr
    else:  # readable JSON of the wrong shape: said so, the checkpoints still listed
        assert r.returncode == 0 and "damaged" in r.stdout and "gen-000000002.h5" in r.stdout, r.stdout


@pytest.mark.parametrize("config", [b"\x00\x01garbage", b"run = 5\nalgorithm = [1, 2]\n", b"[run]\nname = 7\n"],
                         ids=["bytes", "types", "name-type"])
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_inspect_and_open_run_of_a_damaged_config(tmp_path, finished_run, config):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "config.toml").write_bytes(config)
    r = cli("inspect", str(run))
    assert "Traceback" not in r.stderr + r.stdout and r.returncode in (0, 2), r.stderr
    assert (r.returncode == 2 and r.stderr.count("hpcevo: error:") == 1) or "damaged" in r.stdout, r.stdout + r.stderr
    try:
        hpcevo.open_run(run).config
    except hpcevo.UsageError as e:
        assert "config.toml" in str(e)


@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_unknown_islands_key_lists_the_valid_ones(tmp_path):
    path = write(tmp_path, MINIMAL + "\n[islands]\ncuont = 4\n")
    msg = one_error(cli("run", str(path)), "unknown key 'islands.cuont'; did you mean 'count'?")
    assert "(valid: count, migrate_every, migrants, topology, emigrants, replace, island)" in msg
    path = write(tmp_path, MINIMAL + "\n[[islands.island]]\natt = 1\n")
    one_error(cli("run", str(path)), "unknown key 'islands.island[0].att'; did you mean 'at'? (valid: at, algorithm)")


@pytest.mark.parametrize("value, needle", [
    ("0", "input should be greater than or equal to 1, or 'auto'; got 0"),
    ("'many'", "input should be a valid integer, or 'auto'; got 'many'"),
], ids=["zero", "word"])
def test_union_messages_say_what_is_allowed_without_schema_internals(tmp_path, value, needle):
    path = write(tmp_path, MINIMAL)
    msg = one_error(cli("run", str(path), "--set", f"parallel.threads_per_rank={value}"), needle)
    assert "constrained-int" not in msg and "literal[" not in msg


def test_numpy_scalars_in_a_dict_config_are_the_numbers_they_hold(tmp_path):
    data = {"run": {"generations": np.int64(3), "seed": np.uint32(5), "out": str(tmp_path / "np")},
            "algorithm": {"name": "cso", "pop_size": np.int32(8), "phi": np.float32(0.25)},
            "problem": {"name": "sphere", "dim": np.int16(3), "lb": np.float64(-2.0), "ub": [np.float32(2.0)] * 3},
            "parallel": {"share_gpus": np.bool_(False)}}
    cfg = hpcevo.load_config(data)
    assert (cfg.run.generations, cfg.algorithm.pop_size, cfg.problem.dim) == (3, 8, 3)
    assert type(cfg.run.seed) is int and cfg.algorithm_params == {"phi": 0.25}
    assert hpcevo.run(cfg, quiet=True).status == "complete"


def test_algorithm_objects_are_checked_as_the_config_checks_them():
    from hpcevo.algorithms import CSO, CMAES

    cso = CSO(pop_size=np.int64(8), dim=3, lb=-5.12, ub=np.array([1.0, 2.0, 3.0]))
    assert cso.lb == (-5.12,) * 3 and cso.ub == (1.0, 2.0, 3.0) and type(cso.pop_size) is int
    hash(cso)  # a static argument of jit
    for kw, key in (({"phi": "x"}, "phi"), ({"pop_size": "8"}, "pop_size"), ({"lb": [1, 2]}, "lb"),
                    ({"dtype": "float16"}, "dtype"), ({"lb": 1.0}, "lb")):
        with pytest.raises(hpcevo.ConfigError) as e:
            CSO(**{"pop_size": 8, "dim": 3, "lb": -1.0, "ub": 1.0, **kw})
        assert e.value.key == key and key in str(e.value)
    with pytest.raises(hpcevo.ConfigError, match="phi must be in"):
        CSO(pop_size=8, dim=3, lb=-1.0, ub=1.0, phi=3.0)
    with pytest.raises(hpcevo.ConfigError, match="'restart': input should be 'none', 'ipop' or 'bipop'"):
        CMAES(pop_size=8, dim=3, lb=-1.0, ub=1.0, restart="lpop")


def test_migration_is_checked_as_the_islands_section_is():
    same = "input should be greater than or equal to 0; got -1"
    with pytest.raises(hpcevo.ConfigError, match=same) as e:
        hpcevo.Migration(every=2, migrants=-1)
    assert e.value.key == "migrants"
    with pytest.raises(hpcevo.ConfigError, match=same) as e:
        hpcevo.load_config({**MINIMAL_DICT, "islands": {"count": 2, "migrants": -1}})
    assert e.value.key == "islands.migrants"
    assert hpcevo.Migration(every=np.int64(5), migrants=np.int32(2)).every == 5


MINIMAL_DICT = {"algorithm": {"name": "cso", "pop_size": 8}, "problem": {"name": "ackley", "dim": 4}}


@pytest.mark.slow
def test_island_runs_warn_of_idle_ranks_only_when_there_are_some(tmp_path):
    path = write(tmp_path, MINIMAL + '\n[run]\ngenerations = 2\n[islands]\ncount = 2\nmigrants = 1\n')
    r = cli("run", str(path), "-q", "--set", f"run.out={tmp_path / 'a'}", n=2)
    assert r.returncode == 0 and "nothing to evaluate" not in r.stderr, r.stderr  # one rank per island
    r = cli("run", str(path), "-q", "--set", f"run.out={tmp_path / 'b'}", "--set", "algorithm.pop_size=2",
            "--set", "islands.count=1", "--set", "islands.migrants=0", n=3)
    assert r.returncode == 0 and "2 of 3 ranks have nothing to evaluate" in r.stderr, r.stderr


def test_many_islands_on_a_rank_warn_of_their_compile_time(tmp_path, capsys, monkeypatch):
    from hpcevo.driver import execute

    monkeypatch.setattr(execute, "ISLANDS_COMPILE_WARNING", 3)
    data = {**MINIMAL_DICT, "run": {"generations": 1, "out": str(tmp_path / "i")}, "islands": {"count": 3}}
    hpcevo.run(data, quiet=True)
    err = capsys.readouterr().err
    assert err.count("warning: 3 islands on a rank: they compile into one program") == 1, err
