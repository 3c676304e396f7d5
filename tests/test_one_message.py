"""Inputs that ended in a traceback or a raw exception now end in one hpcevo message naming them
(exit 2 from the CLI): a run or study directory that is a file, a seed range too large to hold,
a damaged COCO logger state on resume, ``parallel.split`` without a context."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcevo
from hpcevo.errors import ConfigError, UsageError

from test_overwrite import BBOB, config

pytestmark = pytest.mark.single_process
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcevo", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_a_run_or_study_directory_that_is_a_file_is_one_message(tmp_path):
    (tmp_path / "afile").write_text("mine")
    r = cli("run", str(ROOT / "examples" / "cso.toml"), "--set", "run.out=afile", "--set", "run.generations=3",
            cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "run directory 'afile' is a file, not a folder" in r.stderr, r.stderr
    (tmp_path / "s.toml").write_text('[study]\nseeds = 1\nout = "afile"\n[base]\nrun.generations = 3\n'
                                     'algorithm.name = "pso"\nproblem.name = "sphere"\nproblem.dim = 3\n')
    r = cli("study", "run", "s.toml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "study directory 'afile' is a file, not a folder" in r.stderr, r.stderr
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_study_whose_runs_have_no_problem_is_refused_before_any_run_starts(tmp_path):
    """Found 2026-11-27: a study file without problem.name (or without an algorithm) passed the
    study's checks (a run config may take them from Python) and every run started and failed,
    exit 5, a journal written. Nothing comes from Python in a study: exit 2, one line, nothing written."""
    (tmp_path / "s.toml").write_text('[study]\nseeds = 2\nout = "out"\n[base]\nrun.generations = 3\n'
                                     'problem.dim = 3\n[[axis]]\nkey = "algorithm.name"\nvalues = ["cso", "pso"]\n')
    r = cli("study", "run", "s.toml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "missing required key 'problem.name'" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seeds", ["0..100000000000", 10**12])
def test_a_seed_range_too_large_to_hold_is_one_message(seeds):
    spec = {"study": {"seeds": seeds}, "base": {"run": {"generations": 3}, "algorithm": {"name": "pso"},
                                                "problem": {"name": "sphere", "dim": 3}}}
    with pytest.raises(ConfigError, match=r"'study.seeds'.*a study holds at most 100000 runs"):
        hpcevo.load_study(spec)


@pytest.mark.parametrize("text, said", [
    ('{"format": 1, garbage', "JSONDecodeError"),
    ('{"format": "another"}', "not a BBOBLogger state"),
    ('{"format": "hpcevo.coco.BBOBLogger/1"}', "KeyError"),
    ("[1, 2]", "not a BBOBLogger state"),
])
def test_a_damaged_coco_logger_state_on_resume_is_one_message(tmp_path, text, said):
    cfg = config(tmp_path / "run", problem=BBOB, log={"coco": True})
    hpcevo.run(cfg, quiet=True)
    (tmp_path / "run" / "coco" / ".hpcevo" / "gen-000000006.json").write_text(text)
    cfg["run"]["generations"] = 10
    with pytest.raises(UsageError, match=f"COCO logger state for the checkpoint of generation 6 .* is damaged "
                                         f"\\(.*{said}.*Start the run again"):
        hpcevo.run(cfg, quiet=True, resume=True)


def test_split_without_a_context_is_one_message():
    from hpcevo.parallel import split

    for bad in (None, "world", 3):
        with pytest.raises(UsageError, match="split: 'ctx' must be a ParallelContext"):
            split(bad, 2)


def _array(rec, loop):
    return np.array([True, False])


def _raises(rec, loop):
    return 1 / 0


def _one_argument(rec):
    return True


@pytest.mark.parametrize("criterion, said", [
    (_array, r"stop criterion _array returned ndarray of shape \(2,\): a stop criterion answers True or False"),
    (_one_argument, r"'stop_when': _one_argument cannot be called as f\(record, loop\) \(its signature: \(rec\)\)"),
])
def test_a_stop_criterion_that_answers_an_array_or_takes_other_arguments_is_one_message(tmp_path, criterion, said):
    with pytest.raises(UsageError, match=said):
        hpcevo.run(config(tmp_path / "run", log={"every": 2}), quiet=True, stop_when=[criterion])


def test_a_stop_criterion_that_raises_keeps_its_error_and_says_which_and_when(tmp_path):
    """The user's own exception (their type, as a hook's), with a note naming the criterion."""
    with pytest.raises(ZeroDivisionError) as e:
        hpcevo.run(config(tmp_path / "run", log={"every": 2}), quiet=True, stop_when=[_raises])
    assert "(raised by the stop criterion _raises at generation 2)" in e.value.__notes__


def test_scalars_of_numpy_and_jax_are_answers(tmp_path):
    import jax.numpy as jnp

    for i, criterion in enumerate((lambda r, loop: np.bool_(r["generation"] >= 4),
                                   lambda r, loop: jnp.asarray(r["generation"] >= 4))):
        result = hpcevo.run(config(tmp_path / f"r{i}", log={"every": 2}), quiet=True, stop_when=[criterion])
        assert result.summary["generations"] == 4 and result.summary["stopped_by"] == "<lambda>"


def test_a_record_that_cannot_be_written_is_reported_once_not_again_at_close():
    """A full disk (/dev/full) fails the write of a record, which the run reports as one message;
    closing the writer must not raise a second, bare OSError in its place."""
    from hpcevo.driver.rundir import RecordWriter

    writer = RecordWriter(Path("/dev/full"), append=True)
    with pytest.raises(OSError, match="No space left"):
        writer.write({"generation": 1})
    writer.close()  # (the unflushed record is not written again)
