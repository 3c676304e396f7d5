"""A BBOB study's report judges runs as COCO does, and agrees with cocopp on the same runs.

Before, the report judged raw f: runs that reached f - f_opt = 3e-9 on f1 were "success 0/1"
and on f21 (f_opt < 0) every configuration was a "success"; each instance was a problem of one
run. Now values are precisions, a problem is a function in a dimension with its instances as
the runs, and success counts and ERT equal cocopp's (``DataSet.detSuccesses``, ``detERT``) on
the COCO data the same runs wrote: 2 configurations x 2 functions x 2 dimensions x 3 instances.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import hpcevo
from hpcevo.problems.bbob import _fopt
from hpcevo.studies.report import report

pytestmark = [pytest.mark.single_process, pytest.mark.slow]

FUNCTIONS, DIMS, INSTANCES = (1, 21), (2, 3), (1, 2, 3)


def study_spec(out: Path) -> dict:
    return {
        "study": {"name": "bbobmini", "seeds": 1, "out": str(out)},
        "base": {"run": {"target_precision": 1e-8}, "algorithm": {"name": "cmaes"},
                 "problem": {"name": "bbob"}, "log": {"coco": True, "every": 1000}, "checkpoint": {"every": 0}},
        "axis": [
            {"key": "algorithm.sigma_init", "values": [0.2, 0.02], "labels": ["wide", "narrow"]},
            {"key": "problem.function", "values": list(FUNCTIONS), "labels": [f"f{f}" for f in FUNCTIONS]},
            {"zip": {"problem.dim": list(DIMS), "run.evaluations": [150 * d for d in DIMS]},
             "labels": [f"d{d}" for d in DIMS], "role": "problem"},
            {"key": "problem.instance", "values": list(INSTANCES), "labels": [f"i{i}" for i in INSTANCES]},
        ],
    }


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    out = tmp_path_factory.mktemp("bbob") / "s"
    study = hpcevo.load_study(study_spec(out))
    assert len(study.runs) == 24
    assert hpcevo.study(study, quiet=True).status == "complete"
    return study, report(study)


def _cocopp(folder: Path):
    os.environ.setdefault("XDG_CACHE_HOME", str(folder.parent / "xdg"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cocopp

        return cocopp.pproc.DataSetList(str(folder))


def test_problems_are_functions_in_a_dimension_with_their_instances_as_runs(done):
    study, rep = done
    assert {r["problem"] for r in rep.rows} == {f"f{f}-d{d}" for f in FUNCTIONS for d in DIMS}
    assert all(r["n"] == len(INSTANCES) for r in rep.rows)
    assert rep.overall["problems"] == len(FUNCTIONS) * len(DIMS)
    assert "final precision f - f_opt" in rep.markdown


def test_values_are_precisions_f_minus_f_opt(done):
    study, rep = done
    for row in rep.rows:
        f, d = (int(x[1:]) for x in row["problem"].split("-"))
        finals = []
        for run in study.runs:
            if run.configuration == row["configuration"] and run.data["problem"]["function"] == f and \
                    run.data["problem"]["dim"] == d:
                summary = json.loads((run.out / "summary.json").read_text())
                finals.append(summary["best_fitness"] - _fopt(f, run.data["problem"]["instance"]))
        assert row["best"] == pytest.approx(min(finals), rel=1e-12, abs=1e-300)
        assert row["median"] == pytest.approx(float(np.median(finals)), rel=1e-12, abs=1e-300)
        assert row["best"] >= 0  # (a precision: never below the optimum)


def test_success_counts_and_ert_equal_cocopps(done):
    study, rep = done
    reps = {t: report(study, study.out / f"report-{t:g}", target=t).rows for t in (1e1, 1e-1, 1e-3)}
    reps[1e-8] = rep.rows  # (the default target of BBOB problems: COCO's final one)
    checked = 0
    for config in ("wide", "narrow"):
        for ds in _cocopp(study.out / "report" / "coco" / config):
            problem = f"f{ds.funcId}-d{ds.dim}"
            assert sorted(ds.instancenumbers) == list(INSTANCES)
            for t, rows in reps.items():
                ours = next(r for r in rows if r["configuration"] == config and r["problem"] == problem)
                assert ours["target"] == t
                assert ours["successes"] == int(ds.detSuccesses([t])[0]), (config, problem, t)
                theirs = float(ds.detERT([t])[0])
                if not math.isfinite(theirs):
                    assert math.isinf(ours["ert"]) and ours["successes"] == 0
                else:
                    assert ours["ert"] == pytest.approx(theirs, rel=1e-12), (config, problem, t)
                checked += 1
    assert checked == 2 * len(FUNCTIONS) * len(DIMS) * 4
    # (both outcomes occur, and partial success, or the comparison proves little)
    rows = [r for rows in reps.values() for r in rows]
    assert {0, len(INSTANCES)} < {r["successes"] for r in rows}


def test_the_figures_are_written(done):
    study, rep = done
    names = {p.name for p in rep.files}
    assert {"convergence.png", "ecdf.png", "final.png"} <= names
    for p in rep.files:
        if p.suffix == ".png":
            assert p.stat().st_size > 10_000


def test_progress_lines_summary_and_journal_say_f_minus_f_opt(tmp_path, capsys):
    """What a user reads while a BBOB study runs is the precision too, beside the raw value."""
    spec = study_spec(tmp_path / "s")
    spec["axis"] = [{"key": "problem.instance", "values": [1, 2]}]
    spec["base"]["problem"].update(function=21, dim=2)
    spec["base"]["run"].update(evaluations=100)
    study = hpcevo.load_study(spec)
    result = hpcevo.study(study)
    out = capsys.readouterr().out
    for run in study.runs:
        summary = json.loads((run.out / "summary.json").read_text())
        precision = summary["best_fitness"] - _fopt(21, run.data["problem"]["instance"])
        assert summary["best_precision"] == pytest.approx(precision, rel=1e-12)
        (line,) = [ln for ln in out.splitlines() if run.name in ln and "f-f_opt" in ln]
        assert f"f-f_opt {precision:.2e}" in line
    events = [json.loads(ln) for ln in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    assert sorted(e["best_precision"] for e in events if e.get("event") == "end") == sorted(
        r["best_precision"] for r in result.ran)
    r = hpcevo.run(study.runs[0].config(), overwrite=True)
    assert "f-f_opt" in capsys.readouterr().out and r.summary["best_precision"] >= 0
