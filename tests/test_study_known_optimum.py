"""A study's report judges problems with a known optimum in f - f_opt, not only BBOB.

Before, only BBOB runs were precisions: a CEC 2022 function's values carry its bias (f1: 300,
f12: 2700), so the report's medians, success counts, ERT and figures judged raw f, a study target
of 1e-8 could never be met, and the runs' summaries, progress lines and journal had no f - f_opt.
Now every run whose problem knows its optimum records it (``summary.json``: ``f_opt``,
``best_precision``), and the report judges its precision, with the runtime distribution's targets
counted down from the optimum rather than from the best run found.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hpcevo
from hpcevo.problems import cec2022
from hpcevo.studies.report import RunData, problem_targets, report

pytestmark = pytest.mark.single_process


def study_spec(out: Path) -> dict:
    return {
        "study": {"name": "cecmini", "seeds": 2, "out": str(out)},
        "base": {"run": {"generations": 15}, "algorithm": {"pop_size": 16}, "problem": {"dim": 10},
                 "checkpoint": {"every": 0}, "log": {"every": 1000}},
        "axis": [
            {"key": "algorithm.name", "values": ["pso", "de"]},
            {"key": "problem.name", "values": ["cec2022_f1", "sphere"], "labels": ["f1", "sphere"]},
        ],
    }


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    out = tmp_path_factory.mktemp("cec") / "s"
    study = hpcevo.load_study(study_spec(out))
    result = hpcevo.study(study, quiet=True)
    assert result.status == "complete"
    return study, result


def _summaries(study, problem: str, config: str) -> list[dict]:
    return [json.loads((r.out / "summary.json").read_text()) for r in study.runs
            if r.problem == problem and r.configuration == config]


def test_a_run_records_the_known_optimum_and_its_precision(done):
    study, result = done
    for r in study.runs:
        s = json.loads((r.out / "summary.json").read_text())
        f_opt = cec2022.BIAS[0] if r.problem == "f1" else 0.0
        assert s["f_opt"] == f_opt
        assert s["best_precision"] == pytest.approx(s["best_fitness"] - f_opt, rel=1e-12)
    ends = [e for e in result.ran if e.get("best_precision") is not None]
    assert len(ends) == len(study.runs) and {e["f_opt"] for e in ends} == {0.0, cec2022.BIAS[0]}


def test_the_report_judges_f_minus_f_opt(done, tmp_path):
    study, _ = done
    summaries = {c: _summaries(study, "f1", c) for c in ("pso", "de")}
    precisions = sorted(s["best_precision"] for ss in summaries.values() for s in ss)
    target = precisions[len(precisions) // 2]  # some runs reach it, some do not
    rep = report(study, tmp_path / "rep", target=target)
    for row in (r for r in rep.rows if r["problem"] == "f1"):
        mine = [s["best_precision"] for s in summaries[row["configuration"]]]
        assert row["median"] == pytest.approx(float(np.median(mine)), rel=1e-12)
        assert row["best"] == pytest.approx(min(mine), rel=1e-12)
        assert row["successes"] == sum(p <= target for p in mine)
    # judged on raw f (every value 300 above its precision), fewer runs would have reached it
    hits = sum(r["successes"] for r in rep.rows if r["problem"] == "f1")
    assert hits >= 1 and sum(s["best_fitness"] <= target for ss in summaries.values() for s in ss) < hits
    assert "final precision f - f_opt" in rep.markdown and "(target f - f_opt <= " in rep.markdown
    assert all(f.stat().st_size > 10_000 for f in rep.files if f.suffix == ".png")


def test_sphere_values_are_unchanged_its_optimum_being_zero(done, tmp_path):
    study, _ = done
    rep = report(study, tmp_path / "rep")
    for row in (r for r in rep.rows if r["problem"] == "sphere"):
        mine = [s["best_fitness"] for s in _summaries(study, "sphere", row["configuration"])]
        assert row["median"] == pytest.approx(float(np.median(mine)), rel=1e-12)


def test_runtime_targets_count_down_from_the_optimum_where_it_is_known():
    runs = [RunData("a", "c", "p", 3.0, np.array([10.0, 20.0]), np.array([100.0, 3.0]), known=True),
            RunData("b", "c", "p", 5.0, np.array([10.0, 20.0]), np.array([80.0, 5.0]), known=True)]
    t = problem_targets(runs)
    assert t[0] == pytest.approx(90.0) and t[-1] == pytest.approx(90.0 * 1e-8)
    assert t[-1] < 3.0  # not from the best run found
    unknown = [RunData(r.name, r.configuration, r.problem, r.final, r.evals, r.best) for r in runs]
    assert problem_targets(unknown)[-1] >= 3.0  # (there the best found stands in for the optimum)


def test_progress_lines_say_f_minus_f_opt_where_the_optimum_is_not_zero(tmp_path, capsys):
    base = {"run": {"generations": 3, "out": str(tmp_path / "cec")}, "algorithm": {"name": "pso", "pop_size": 8},
            "problem": {"name": "cec2022_f1", "dim": 10}, "checkpoint": {"every": 0}, "log": {"every": 1}}
    hpcevo.run(base)
    out = capsys.readouterr().out
    assert "f-f_opt" in out and "f - f_opt" in out
    base["problem"] = {"name": "sphere", "dim": 10}
    base["run"]["out"] = str(tmp_path / "sphere")
    hpcevo.run(base)
    assert "f_opt" not in capsys.readouterr().out  # (the same number twice says nothing)
