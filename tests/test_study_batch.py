"""Batched runs in a study (``study.batch``): a group advances the runs of one program together,
each run bitwise the same config run alone, a finished run's slot taken by the next pending run,
a run that fails recorded alone while its batch-mates go on (MPI tests at 1-4 ranks; the study
file's key as a pure test). Stopped by SIGTERM and resumed at another rank count:
tests/test_study_jobs.py (its study batches by default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpcevo
from configs import problem_file
from hpcevo.driver import execute
from hpcevo.errors import EXIT_RUNS_FAILED, ConfigError, UsageError
from hpcevo.studies.journal import read_events
from hpcevo.studies.spec import load_study


def spec(out: Path, batch, **study) -> dict:
    """DE with two values of a dynamic hyper-parameter (F) on two BBOB functions and instances with
    budgets of their own, two seeds: eight runs of one program, ending at different generations."""
    return {
        "study": {"out": str(out), "seeds": 2, "batch": batch, **study},
        "base": {"run": {"generations": 60, "target_precision": 1e-8}, "algorithm": {"name": "de", "pop_size": 8},
                 "problem": {"name": "bbob", "dim": 3}, "log": {"every": 4, "coco": True},
                 "checkpoint": {"every": 10}},
        "axis": [{"key": "algorithm.F", "values": [0.5, 0.9], "labels": ["F5", "F9"]},
                 {"zip": {"problem.function": [1, 15], "problem.instance": [1, 2], "run.evaluations": [200, 360]},
                  "labels": ["f1i1", "f15i2"], "role": "problem"}],
    }


_ALONE: dict[str, str] = {}


def alone_digests(study, tmp: Path, one, ctx) -> dict[str, str]:
    """Each run's config run by itself on one rank: by rank 0 (once per process), told to all."""
    if ctx.is_root:
        for r in study.runs:
            if r.name not in _ALONE:
                data = json.loads(json.dumps(r.data))
                data["run"]["out"] = str(tmp / "alone" / r.name)
                _ALONE[r.name] = hpcevo.run(data, ctx=one, quiet=True).digest
    return ctx.comm_ctl.bcast({r.name: _ALONE[r.name] for r in study.runs} if ctx.is_root else None, root=0)


def in_flight(out: Path) -> dict[int, int]:
    """The most runs each group had begun and not ended at once (the journal's start and end)."""
    most: dict[int, int] = {}
    now: dict[int, int] = {}
    group_of: dict[str, int] = {}
    for e in read_events(out):
        if e["event"] == "start":
            group_of[e["run"]] = g = e["group"]
            now[g] = now.get(g, 0) + 1
            most[g] = max(most.get(g, 0), now[g])
        elif e["event"] == "end":
            now[group_of[e["run"]]] -= 1
    return most


def test_runs_batched_in_a_study_are_bitwise_the_runs_alone(ctx, shared_tmp, alone):
    """Eight runs of one program (mixed seeds, F, BBOB functions, instances and budgets) through
    batches of three slots: every digest is the run alone's, runs overlap in each group (never more
    than three), and each run directory is an ordinary run's, with its COCO data."""
    study = load_study(spec(shared_tmp / "s", 3))
    assert len({r.program for r in study.runs}) == 1 and len(study.runs) == 8
    want = alone_digests(study, shared_tmp, alone, ctx)
    result = hpcevo.study(study, ctx=ctx, quiet=True)
    assert result.status == "complete" and result.counts["done"] == 8
    assert result.digests() == want
    generations = {r["generations"] for r in result.ran}
    assert len(generations) > 1  # (runs ended at generations of their own, their slots reused)
    most = in_flight(study.out)
    assert max(most.values()) >= 2 and max(most.values()) <= 3
    for r in study.runs:
        rec = hpcevo.open_run(r.out)
        assert rec.summary["state_digest"] == want[r.name]
        assert any((r.out / "coco").rglob("*.tdat")), r.name


@pytest.mark.ranks(1, 2)  # (the same logic at any count: the test above holds the rank matrix)
def test_study_batch_1_runs_one_at_a_time_to_the_same_digests(ctx, shared_tmp, alone):
    study = load_study(spec(shared_tmp / "one", 1))
    want = alone_digests(study, shared_tmp, alone, ctx)
    one = hpcevo.study(study, ctx=ctx, quiet=True)
    assert one.digests() == want and max(in_flight(study.out).values()) == 1


def test_a_run_that_fails_in_a_batch_is_recorded_alone_and_its_batch_mates_go_on(ctx, shared_tmp, alone,
                                                                                 monkeypatch):
    """One run cannot start (its directory is a file), one fails at a boundary mid-run (a
    UsageError raised there on every rank): both are recorded failed with their messages; the
    other six, batched with them, finish with the digests they have alone."""
    data = spec(shared_tmp / "s", 8)
    study = load_study(data)
    want = alone_digests(study, shared_tmp, alone, ctx)
    blocked, broken = study.runs[1], study.runs[2]
    if ctx.is_root:
        blocked.out.parent.mkdir(parents=True)
        blocked.out.write_text("not a run\n")
    ctx.comm_ctl.Barrier()
    log = execute.Run.log

    def failing_log(self, gen, metrics):
        if self.cfg.run.name == broken.name and gen == 8:
            raise UsageError(f"injected failure at generation {gen}")
        return log(self, gen, metrics)

    monkeypatch.setattr(execute.Run, "log", failing_log)
    result = hpcevo.study(data, ctx=ctx, quiet=True)
    assert result.status == "failed" and result.exit_code == EXIT_RUNS_FAILED
    assert result.counts == {"done": 6, "failed": 2, "stopped": 0, "running": 0, "pending": 0}
    failed = {r["run"]: r["error"] for r in result.ran if r["status"] == "failed"}
    assert set(failed) == {blocked.name, broken.name}
    assert "is a file, not a folder" in failed[blocked.name]
    assert "injected failure at generation 8" in failed[broken.name]
    assert result.digests() == {k: v for k, v in want.items() if k not in failed}
    assert blocked.out.read_text() == "not a run\n"  # (nothing of the run written over the user's file)


@pytest.mark.single_process
@pytest.mark.parametrize("value, ok", [("auto", True), (1, True), (64, True), (0, False), ("8", False),
                                       (True, False), (2.5, False)])
def test_study_batch_is_auto_or_a_positive_count(tmp_path, value, ok):
    data = spec(tmp_path / "s", value)
    if ok:
        assert load_study(data, check=False).batch == value
        return
    with pytest.raises(ConfigError, match="study.batch") as e:
        load_study(data, check=False)
    # (one line: the union's two members merged, what was given at its end)
    assert str(e.value).count("'study.batch'") == 1 and "input should be 'auto', or " in str(e.value)
    assert str(e.value).endswith(f"got {value!r}")


@pytest.mark.single_process
def test_dynamic_hyper_parameters_are_data_to_a_programs_runs(tmp_path):
    """Runs differing in a built-in algorithm's dynamic hyper-parameters (DE's F) share one program
    (one batch, one compilation); a static one (pop_size) makes another."""
    study = load_study(spec(tmp_path / "s", "auto"), check=False)
    assert len({r.program for r in study.runs}) == 1
    data = spec(tmp_path / "t", "auto")
    data["axis"][0] = {"key": "algorithm.pop_size", "values": [8, 12]}
    assert len({r.program for r in load_study(data, check=False).runs}) == 2


def test_a_host_problems_runs_go_one_at_a_time_with_their_failures_recorded_once(ctx, shared_tmp, alone):
    """A NumPy function (evaluated on the host: nothing to batch) that fails for some candidates:
    each run's failures.jsonl lists each failed evaluation once, as the run alone's does."""
    problem = problem_file(ctx, shared_tmp / "half.py", "def f(x):\n    if x[0] > 0.5:\n"
                           "        raise ValueError('x0 > 0.5')\n    return float((x * x).sum())\n")
    data = {"study": {"out": str(shared_tmp / "s"), "seeds": 3},
            "base": {"run": {"generations": 6}, "algorithm": {"name": "de", "pop_size": 8},
                     "problem": {"name": f"{problem}:f", "host": True, "batched": False, "dim": 3, "lb": -1.0,
                                 "ub": 1.0},
                     "log": {"every": 2}}}
    study = load_study(data)
    result = hpcevo.study(study, ctx=ctx, quiet=True)
    assert result.status == "complete"
    assert max(in_flight(study.out).values()) == 1
    if ctx.is_root:
        for r in study.runs:
            got = (r.out / "failures.jsonl").read_text().splitlines()
            run = json.loads(json.dumps(r.data))
            run["run"]["out"] = str(shared_tmp / "alone" / r.name)
            alone_run = hpcevo.run(run, ctx=alone, quiet=True)
            want = (shared_tmp / "alone" / r.name / "failures.jsonl").read_text().splitlines()
            assert len(got) == len(want) > 0 and alone_run.digest == result.digests()[r.name]


@pytest.mark.single_process
def test_the_plan_says_how_runs_are_batched_and_survives_a_closed_pipe(tmp_path):
    """``study plan`` names the programs and the batching; piped into ``head`` (the reader leaving
    early) it ends quietly, exit 0, with no traceback."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    study = root / "examples" / "study.toml"
    line = (f"{sys.executable} -m hpcevo study plan {study} --set study.batch={{b}} | head -1")
    for batch, said in (("auto", 'up to 8 runs of a program advanced together (study.batch = "auto")'),
                        ("1", "one run at a time")):
        r = subprocess.run(["bash", "-o", "pipefail", "-c", line.format(b=batch)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr and r.stderr == "", r.stderr
        assert "12 program(s)" in r.stdout and said in r.stdout, r.stdout


def test_a_batch_holds_what_the_least_free_memory_of_its_ranks_allows(ctx, shared_tmp, monkeypatch):
    """The batch's size comes from the free memory: each run's state may take a quarter of it. One
    rank of a group seeing less than the others bounds the whole group's batch (every rank must
    ask the queue alike, or the group's leader and its other ranks would part ways)."""
    from hpcevo.driver import run_batch

    # (in every group of two, its second rank, not its leader, sees less; alone, the one rank does)
    low = ctx.rank % 2 == 1 if ctx.size > 1 else True
    monkeypatch.setattr(run_batch, "_nbytes", lambda state: 1000)
    monkeypatch.setattr(run_batch, "_free_memory", lambda c: 8000 if low else 10 ** 12)
    study = load_study(spec(shared_tmp / "s", "auto", ranks_per_run=min(2, ctx.size)))
    result = hpcevo.study(study, ctx=ctx, quiet=True)
    assert result.status == "complete" and result.counts["done"] == 8
    assert max(in_flight(study.out).values()) == 2  # (0.25 x 8,000 / 1,000 bytes; "auto" would be 8)


@pytest.mark.ranks(2, 3)
def test_a_study_batched_differently_on_one_rank_is_refused_on_every_rank(ctx, shared_tmp):
    """Every rank of a group must ask the queue alike: a study.batch that differs between ranks is
    one message on every rank before anything runs, not a group whose ranks part ways."""
    data = spec(shared_tmp / "s", 4 if ctx.rank == ctx.size - 1 else "auto")
    with pytest.raises(UsageError, match="differs between ranks") as e:
        hpcevo.study(data, ctx=ctx, quiet=True)
    assert "batch" in str(e.value)
    assert not (shared_tmp / "s").exists()
