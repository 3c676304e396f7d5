"""A study resumed after its file changed does not fork: default-deny, as a run's resume is.

Every run's config, as the study expanded it, is recorded in the journal when the run starts; a
resume compares each begun run's with what the study file gives now. A change that alters
results (any key but where and how a run logs, checkpoints and is bound to hardware) is refused,
naming the key, both values and the runs, before anything is touched; ``--rerun-changed``
(``rerun_changed=True``) starts those runs again from generation 1 instead, and the study then
equals one run from the start with the new file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hpcevo
from hpcevo.errors import ConfigError, UsageError

from test_overwrite import snapshot


def spec(out: Path, **base) -> dict:
    b = {"run": {"generations": 6}, "algorithm": {"name": "pso", "pop_size": 8},
         "problem": {"name": "sphere", "dim": 3}, "checkpoint": {"every": 3}}
    for table, keys in base.items():
        b[table] = {**b.get(table, {}), **keys}
    return {"study": {"seeds": 2, "out": str(out)}, "base": b}


def digests(out: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["state_digest"] for p in sorted((out / "runs").glob("*/summary.json"))}


# Each key the audit found accepted on resume, changed alone.
CHANGES = {
    "run.generations": {"run": {"generations": 9}},
    "algorithm.pop_size": {"algorithm": {"pop_size": 10}},
    "problem.dim": {"problem": {"dim": 4}},
    "run.dtype": {"run": {"dtype": "float64"}},
    "problem.lb": {"problem": {"lb": -2.0, "ub": 2.0}},
    "run.evaluations": {"run": {"evaluations": 30}},
    "run.target": {"run": {"target": 0.5}},
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "s"
    assert hpcevo.study(spec(out), quiet=True).status == "complete"
    return out


@pytest.mark.single_process
@pytest.mark.parametrize("key", list(CHANGES))
def test_a_resume_after_a_change_that_alters_results_is_refused_naming_it(ran, key):
    before = snapshot(ran)
    with pytest.raises(UsageError) as e:
        hpcevo.study(spec(ran, **CHANGES[key]), quiet=True, resume=True)
    text = str(e.value)
    assert f"{key}:" in text and "2 runs" in text and "s0" in text and "rerun_changed=True" in text, text
    assert snapshot(ran) == before


@pytest.mark.single_process
def test_what_a_resume_may_change_is_accepted_and_reruns_nothing(ran):
    before = digests(ran)
    r = hpcevo.study(spec(ran, checkpoint={"every": 2}, log={"every": 1}, fault={"min_seconds": 20.0}), quiet=True,
                     resume=True)
    assert r.status == "complete" and r.ran == [] and digests(ran) == before


@pytest.mark.single_process
def test_rerun_changed_starts_the_changed_runs_again_and_equals_a_study_run_anew(tmp_path, ran):
    out = tmp_path / "s"
    import shutil

    shutil.copytree(ran, out)
    # a third seed added as well: a pending run, started with the new settings like the rerun ones
    changed = spec(out, algorithm={"pop_size": 10})
    changed["study"]["seeds"] = 3
    r = hpcevo.study(changed, quiet=True, resume=True, rerun_changed=True)
    assert r.status == "complete" and len(r.ran) == 3
    fresh = tmp_path / "fresh"
    again = spec(fresh, algorithm={"pop_size": 10})
    again["study"]["seeds"] = 3
    assert hpcevo.study(again, quiet=True).status == "complete"
    assert digests(out) == digests(fresh) and len(digests(out)) == 3


@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_the_cli_names_the_key_and_takes_rerun_changed(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(f'[study]\nseeds = 1\nout = "{tmp_path / "s"}"\n[base]\nrun.generations = 4\n'
                 'algorithm.name = "pso"\nalgorithm.pop_size = 8\nproblem.name = "sphere"\nproblem.dim = 3\n')
    cli = [sys.executable, "-m", "hpcevo", "study", "run", str(f), "-q"]
    assert subprocess.run(cli, capture_output=True, text=True, timeout=300).returncode == 0
    r = subprocess.run(cli + ["--resume", "--set", "base.problem.dim=5"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "problem.dim: was 3, now 5" in r.stderr and "--rerun-changed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run(cli + ["--resume", "--set", "base.problem.dim=5", "--rerun-changed"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (config,) = (tmp_path / "s" / "runs").glob("*/config.toml")
    assert tomllib.loads(config.read_text())["problem"]["dim"] == 5


# -- one axis per key -------------------------------------------------------------------------------
def _with(**tables) -> dict:
    return {"study": {"seeds": 1}, "base": {"run": {"generations": 4}, "algorithm": {"name": "pso", "pop_size": 8},
                                            "problem": {"name": "sphere", "dim": 3}}, **tables}


NAME = {"key": "algorithm.name", "values": ["cso", "de"]}


@pytest.mark.single_process
@pytest.mark.parametrize("tables, overrides, said", [
    ({"axis": [NAME, {"key": "algorithm.name", "values": ["pso", "ga"]}]}, [], "'algorithm.name' is set by axes 1 and 2"),
    ({"axis": [NAME, {"zip": {"algorithm.name": ["pso", "ga"], "problem.dim": [3, 4]}}]}, [],
     "'algorithm.name' is set by axes 1 and 2"),
    ({"axes": {"algorithm.name": ["pso", "ga"]}, "axis": [NAME]}, [], "'algorithm.name' is set by axes 1 and 2"),
    ({"axis": [{"key": "problem.dim", "values": [3, 4], "set": {"dim3": {"algorithm.name": "ga"}}}, NAME]}, [],
     "'algorithm.name' is set by axes 1 and 2"),
    ({"axis": [NAME]}, ["base.algorithm.name=ga"], "--set 'algorithm.name' on the base, but axis 1 sets"),
    ({"axis": [{"key": "algorithm.F", "values": [0.5, 0.7]}]}, ["base.algorithm={name = 'de', pop_size = 8}"],
     "--set 'algorithm' on the base, but axis 1 sets 'algorithm.F'"),
], ids=["two grid axes", "grid and zip", "shorthand and axis", "a set table", "--set on an axis key",
        "--set on its table"])
def test_a_key_set_by_two_axes_or_by_an_axis_and_set_is_refused(tables, overrides, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        hpcevo.load_study(_with(**tables), overrides)


@pytest.mark.single_process
def test_one_axis_per_key_still_allows_what_studies_do():
    s = hpcevo.load_study(_with(axis=[NAME, {"key": "problem.dim", "values": [3, 4]}]),
                          ["base.run.generations=5", "study.seeds=2"])
    assert len(s.runs) == 8 and {r.config().algorithm.name for r in s.runs} == {"cso", "de"}


# -- no write through a link planted in a study's folders --------------------------------------------
@pytest.mark.single_process
def test_a_study_writes_nothing_through_a_link_planted_in_its_folders(tmp_path):
    from hpcevo.studies.report import report

    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "s"
    out.mkdir()
    (out / "runs").symlink_to(outside)
    with pytest.raises(UsageError, match="'runs' is a symbolic link.*never through a link"):
        hpcevo.study(spec(out), quiet=True)
    assert list(outside.iterdir()) == []
    (out / "runs").unlink()
    cfg = spec(out, problem={"name": "bbob", "function": 1, "instance": 1, "dim": 2}, log={"coco": True})
    study = hpcevo.load_study(cfg)
    assert hpcevo.study(study, quiet=True).status == "complete"
    for planted in ("report", "report/coco", "report/coco/pso"):
        link = out / planted
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside)
        with pytest.raises(UsageError, match="symbolic link.*never written through a link"):
            report(study)
        assert list(outside.iterdir()) == []
        link.unlink()
    assert (out / "report" / "coco" / "pso").is_dir() is False
    report(study)
    assert len(list((out / "report" / "coco" / "pso").iterdir())) == 2  # each run's data, copied
