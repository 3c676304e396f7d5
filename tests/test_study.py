"""Studies: many runs in one job, on groups of ranks, resumable as a whole (MPI tests at 1-4
ranks; the study file's expansion and the queue's and report's pieces as pure tests)."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import hpcevo
from configs import problem_file
from hpcevo.errors import EXIT_RUNS_FAILED, EXIT_STOPPED, ConfigError, UsageError
from hpcevo.parallel import WorkQueue, context_for, split
from hpcevo.studies.journal import read_events, states
from hpcevo.studies.spec import load_study


def study_dict(out, *, rpr: int = 1, seeds=3, generations: int = 6, **extra) -> dict:
    """CSO on a float32 sphere and DE on a float64 Rastrigin (one zipped axis: two programs, and a
    group computes in both JAX modes) x seeds."""
    return {
        "study": {"out": str(out), "seeds": seeds, "ranks_per_run": rpr, **extra},
        "base": {"run": {"generations": generations}, "algorithm": {"pop_size": 8}, "problem": {"dim": 3},
                 "log": {"every": 3}},
        "axis": [{"zip": {"algorithm.name": ["cso", "de"], "problem.name": ["sphere", "rastrigin"],
                          "run.dtype": ["float32", "float64"]}, "labels": ["cso-sphere32", "de-rastrigin64"]}],
    }


def alone_digests(study, tmp: Path, one) -> dict[str, str]:
    """Each run of ``study`` run by itself on one rank (``one``: rank 0 on COMM_SELF), out of the study."""
    out = {}
    for r in study.runs:
        data = json.loads(json.dumps(r.data))
        data["run"]["out"] = str(tmp / "alone" / r.name)
        out[r.name] = hpcevo.run(data, ctx=one, quiet=True).digest
    return out


# -- the study on this job's ranks --------------------------------------------------------------
class StopAtRun:
    """A stop source that asks for a stop once this process has started ``k`` runs (every run
    enters its stop source once): the run then stops at its first boundary with a checkpoint."""

    def __init__(self, k: int):
        self.k, self.entered, self.signum = k, 0, 0

    def __enter__(self):
        self.entered += 1
        if self.entered > self.k:  # (the study's own entry is the first)
            self.signum = int(signal.SIGUSR1)
        return self

    def __exit__(self, *exc):
        pass


_ALONE: dict[str, dict[str, str]] = {}


def alone_once(study, tmp: Path, one) -> dict[str, str]:
    """``alone_digests``, once per process for the same runs (the parameters of a test share it)."""
    key = json.dumps([(r.name, r.data["run"]["generations"]) for r in study.runs])
    if key not in _ALONE:
        _ALONE[key] = alone_digests(study, tmp, one)
    return _ALONE[key]


@pytest.mark.parametrize("rpr", [1, 2])
def test_every_run_of_a_stopped_and_resumed_study_is_the_run_alone(ctx, references, request, shared_tmp, alone,
                                                                   rpr):
    """Mixed algorithms, problems, dtypes and seeds on groups of 1 or 2 ranks, stopped (a stop
    request once two runs have begun on a rank) and resumed: each run's digest is the one its
    config gives alone on one rank, and its directory is an ordinary run's."""
    spec = study_dict(shared_tmp / "s", rpr=rpr)
    study = load_study(spec)
    want = references.get(request, "digests", lambda: alone_once(study, shared_tmp, alone))
    if rpr > ctx.size:
        with pytest.raises(UsageError, match="ranks_per_run = 2, but the job has 1 rank"):
            hpcevo.study(spec, ctx=ctx, quiet=True)
        return
    stopped = hpcevo.study(spec, ctx=ctx, quiet=True, stop=StopAtRun(2))
    assert stopped.status == "stopped" and stopped.exit_code == EXIT_STOPPED
    assert any(r["status"] == "stopped" for r in stopped.ran) and stopped.counts["done"] < 6
    with pytest.raises(UsageError, match="already holds this study"):
        hpcevo.study(spec, ctx=ctx, quiet=True)
    resumed = hpcevo.study(spec, ctx=ctx, quiet=True, resume=True)
    assert resumed.status == "complete" and resumed.exit_code == 0 and resumed.counts["done"] == 6
    done_before = {r["run"] for r in stopped.ran if r["status"] == "complete"}
    assert done_before and done_before.isdisjoint(r["run"] for r in resumed.ran)  # done runs are not run again
    assert {**{r["run"]: r["state_digest"] for r in stopped.ran if r["status"] == "complete"},
            **resumed.digests()} == want
    # ordinary run directories, readable on every rank as soon as study() returns
    for r in study.runs:
        rec = hpcevo.open_run(r.out)
        assert rec.summary["state_digest"] == want[r.name] and rec.summary["ranks"] == rpr
    events = read_events(study.out)
    starts = [e for e in events if e["event"] == "start"]
    assert {e["run"] for e in starts} == {r.name for r in study.runs}
    assert all(len(e["ranks"]) == rpr and e["group"] < ctx.size // rpr for e in starts)
    assert events[-1]["event"] == "finished" and events[-1]["counts"]["done"] == 6


def test_a_run_whose_problem_raises_is_recorded_failed_and_the_others_finish(ctx, shared_tmp):
    problem = problem_file(ctx, shared_tmp / "picky.py", "import jax.numpy as jnp\n\n\ndef f(x):\n"
                           "    if x.shape[-1] == 4:\n        raise ValueError('no 4-D candidates here')\n"
                           "    return jnp.sum(x * x, axis=-1)\n")
    spec = {"study": {"out": str(shared_tmp / "s"), "seeds": 2},
            "base": {"run": {"generations": 4}, "algorithm": {"name": "cso", "pop_size": 8},
                     "problem": {"name": f"{problem}:f", "lb": -1.0, "ub": 1.0}},
            "axis": [{"key": "problem.dim", "values": [3, 4]}]}
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    result = hpcevo.study(spec, ctx=ctx, quiet=True)
    # the script's signal handlers are its own again (they were left to the study's stop flag:
    # Ctrl-C and SIGTERM after the study only set a flag nobody read)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert result.status == "failed" and result.exit_code == EXIT_RUNS_FAILED
    assert result.counts == {"done": 2, "failed": 2, "stopped": 0, "running": 0, "pending": 0}
    failed = {r["run"]: r["error"] for r in result.ran if r["status"] == "failed"}
    assert set(failed) == {"cso__dim4__s0", "cso__dim4__s1"}
    assert all("no 4-D candidates here" in e and "picky.py" in e for e in failed.values())
    found = {s.run.name: s for s in states(load_study(spec))}
    assert found["cso__dim4__s0"].state == "failed" and "no 4-D" in found["cso__dim4__s0"].detail
    # resumed: failed runs are skipped unless asked for, and fail the same way again
    again = hpcevo.study(spec, ctx=ctx, quiet=True, resume=True)
    assert again.ran == [] and again.exit_code == EXIT_RUNS_FAILED
    retried = hpcevo.study(spec, ctx=ctx, quiet=True, resume=True, retry_failed=True)
    assert sorted(r["run"] for r in retried.ran) == ["cso__dim4__s0", "cso__dim4__s1"]


# -- groups and the queue ------------------------------------------------------------------------
@pytest.mark.parametrize("per", [1, 2])
def test_groups_split_the_job_and_their_leaders_talk(ctx, per):
    if per > ctx.size:
        with pytest.raises(UsageError, match="more than the 1 rank"):
            split(ctx, per)
        return
    groups = split(ctx, per)
    assert groups.count == ctx.size // per and groups.idle == ctx.size % per
    if groups.ctx is None:
        assert ctx.rank >= groups.count * per
        return
    assert groups.index == ctx.rank // per and groups.ctx.size == per and groups.ctx.rank == ctx.rank % per
    # a Loop on a group is the loop alone on that many ranks
    from hpcevo.algorithms import CSO
    from hpcevo.problems import make_problem

    p = make_problem("sphere", 3)
    loop = hpcevo.Loop(CSO(pop_size=7, dim=3, lb=p.lb, ub=p.ub), p, groups.ctx).init(groups.index).advance(3)
    loop.check_replicas()
    # leaders pass a token around the ring of groups
    if groups.count > 1 and groups.is_leader:
        right, left = (groups.index + 1) % groups.count, (groups.index - 1) % groups.count
        if groups.index == 0:
            groups.send({"from": 0, "digest": loop.digest()}, to=right)
            token = groups.recv(source=left)
        else:
            token = groups.recv(source=left)
            groups.send(token, to=right)
        assert token["from"] == 0
    with pytest.raises(UsageError):
        groups.send("x", to=groups.count) if groups.is_leader else groups.send("x", to=0)


def test_the_queue_gives_every_task_once_and_halts_on_request(ctx):
    groups = split(ctx, 1)
    seen: list[dict] = []
    queue = WorkQueue(groups, list(range(9)), seen.append if ctx.is_root else None)
    mine, outcome = [], None
    while (task := queue.next(outcome)) is not None:
        mine.append(task)
        outcome = {"task": task, "by": ctx.rank}
    assert queue.close() == []
    everyone = sorted(t for part in ctx.comm_ctl.allgather(mine) for t in part)
    assert everyone == list(range(9))
    if ctx.is_root:
        ends = [e for e in seen if e["event"] == "end"]
        assert sorted(e["task"] for e in ends) == list(range(9))
        assert all(e["group"] == e["by"] for e in ends)
    # a halt: nobody gets a task after it is asked for
    queue = WorkQueue(groups, list(range(20)), None)
    first = queue.next(None)
    assert first is not None
    ctx.comm_ctl.Barrier()  # (every group has its first task before any asks for a halt)
    assert queue.next({"task": first}, halt="enough") is None
    left = queue.close()
    assert len(left) == 20 - ctx.size and sorted(left) == list(range(ctx.size, 20))


def test_an_error_in_the_queues_events_is_every_ranks(ctx):
    groups = split(ctx, 1)

    def broken(event):
        raise OSError("disk full while writing the journal")

    queue = WorkQueue(groups, list(range(3)), broken if ctx.is_root else None)
    while queue.next(None) is not None:
        pass
    with pytest.raises(Exception, match="disk full while writing the journal"):
        queue.close()


# -- the study file ------------------------------------------------------------------------------
@pytest.mark.single_process
def test_a_study_file_expands_into_named_runs(tmp_path):
    (tmp_path / "base.toml").write_text('[run]\ngenerations = 5\n[algorithm]\nname = "cso"\npop_size = 8\n'
                                        '[problem]\nname = "sphere"\ndim = 3\n')
    (tmp_path / "s.toml").write_text(
        'base = "base.toml"\n\n[study]\nseeds = "3-4"\n\n'
        '[[axis]]\nkey = "algorithm.name"\nvalues = ["cso", "de"]\n[axis.set.de]\n"algorithm.F" = 0.7\n'
        'algorithm.CR = 0.5\n\n'
        '[[axis]]\nzip = { "problem.name" = ["sphere", "ackley"], "problem.dim" = [3, 5] }\n')
    s = load_study(tmp_path / "s.toml")
    assert s.name == "s" and s.out == Path("studies/s") and s.seeds == (3, 4)
    assert [r.name for r in s.runs][:3] == ["cso__sphere-dim3__s3", "cso__sphere-dim3__s4", "cso__ackley-dim5__s3"]
    assert len(s.runs) == 8 and s.configurations == ["cso", "de"] and s.problems == ["sphere-dim3", "ackley-dim5"]
    de = s.by_name("de__ackley-dim5__s4")
    cfg = de.config()
    assert (cfg.algorithm.name, cfg.algorithm_params, cfg.problem.name, cfg.problem.dim, cfg.run.seed) == (
        "de", {"F": 0.7, "CR": 0.5}, "ackley", 5, 4)
    assert cfg.run.name == de.name and cfg.run.out == str(Path("studies/s/runs") / de.name)
    assert s.by_name("cso__sphere-dim3__s3").config().algorithm_params == {}
    quick = load_study(tmp_path / "s.toml", ["study.seeds=1", "base.run.generations=7"])  # the CLI's --set
    assert len(quick.runs) == 4 and quick.runs[0].config().run.generations == 7 and quick.seeds == (0,)
    assert quick.overrides == ("study.seeds=1", "base.run.generations=7")


@pytest.mark.single_process
def test_axes_and_zip_tables_are_shorthands_for_axes():
    import tomllib

    s = load_study(tomllib.loads('[study]\nseeds = "0..1"\n[base]\nproblem.dim = 3\n'
                                 '[axes]\n"algorithm.name" = ["cso", "de"]\nproblem.name = ["sphere", "ackley"]\n'
                                 '[zip]\n"algorithm.pop_size" = [8, 16]\n"run.generations" = [5, 10]\n'))
    assert len(s.runs) == 2 * 2 * 2 * 2 and s.seeds == (0, 1)
    assert s.configurations == ["cso-pop_size8-generations5", "cso-pop_size16-generations10",
                                "de-pop_size8-generations5", "de-pop_size16-generations10"]
    cfg = s.by_name("de-pop_size16-generations10__ackley__s1").config()
    assert (cfg.algorithm.pop_size, cfg.run.generations, cfg.problem.name) == (16, 10, "ackley")
    with pytest.raises(ConfigError, match="'axes.algorithm.name': a list of values"):
        load_study({"base": {"problem": {"name": "sphere", "dim": 3}}, "axes": {"algorithm.name": "cso"}})


@pytest.mark.single_process
@pytest.mark.parametrize("change, message, key", [
    ({"axis": [{"key": "algorithm.pop_size", "values": [8, -3]}]}, "run 'pop_size-3__sphere__s0'",
     "algorithm.pop_size"),
    ({"axis": [{"key": "run.seed", "values": [1, 2]}]}, "set by the study for every run", "axis[0]"),
    ({"axis": [{"zip": {"problem.dim": [2, 3], "algorithm.pop_size": [8]}}]}, "one length", "axis[0]"),
    ({"axis": [{"key": "algorithm.name", "values": ["cso", "cso"]}]}, "distinct, non-empty labels", "axis[0].labels"),
    ({"axis": [{"key": "algorithm.name", "values": ["cso"], "set": {"de": {"algorithm.F": 1}}}]},
     "no value of this axis is labelled 'de'", "axis[0].set"),
    ({"study": {"seeds": "5-2"}}, "study.seeds", "study.seeds"),
    ({"study": {"baseline": "csp"}}, "did you mean 'cso'", "study.baseline"),
    ({"study": {"ranks_per_run": 0}}, "ranks_per_run", "study.ranks_per_run"),
    ({"axis": [{"key": "algorithm.nmae", "values": [1]}]}, "unknown key 'algorithm.nmae'", "algorithm.nmae"),
    ({"axis": [{"key": "algorithm.name", "values": ["cso", "dee"]}]}, "did you mean 'de'", "algorithm.name"),
    ({"studdy": {}}, "unknown key 'studdy'", "studdy"),
    ({"base": "no/such/base.toml"}, "base config 'no/such/base.toml' not found", "base"),
    # nothing comes from Python in a study: no problem or algorithm is every run failing, one by one
    ({"base": {"algorithm": {"name": "cso"}, "problem": {"dim": 3}}}, "run 'cso__problem__s0': missing required "
     "key 'problem.name'", "problem.name"),
    ({"base": {"problem": {"name": "sphere"}}, "axis": [{"key": "problem.dim", "values": [3, 4]}]},
     "run 'config__dim3__s0': missing required key 'algorithm'", "algorithm"),
])
def test_a_bad_study_is_one_message_naming_the_run_and_the_key(change, message, key):
    data = {"study": {"seeds": 1}, "base": {"algorithm": {"name": "cso"}, "problem": {"name": "sphere", "dim": 3}},
            "axis": [{"key": "algorithm.name", "values": ["cso"]}]}
    for k, v in change.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) and k == "study" else v
    with pytest.raises(ConfigError) as e:
        load_study(data)
    assert message in str(e.value) and key in e.value.key, (str(e.value), e.value.key)
    assert "Traceback" not in str(e.value) and "\n" not in str(e.value).strip()


@pytest.mark.single_process
def test_validation_checks_each_distinct_program_once(monkeypatch):
    """2,000 runs of 4 programs (the seeds share theirs): the schema for each run, the builder's
    checks once per program."""
    from hpcevo.driver import build

    calls = []
    real = build.check
    monkeypatch.setattr(build, "check", lambda cfg: (calls.append(cfg.run.name), real(cfg))[1])
    study = load_study({"study": {"seeds": 500}, "base": {"problem": {"dim": 10}},
                        "axis": [{"key": "algorithm.name", "values": ["cso", "de"]},
                                 {"key": "problem.name", "values": ["sphere", "rastrigin"]}]})
    assert len(study.runs) == 2000 and len(calls) == 4


@pytest.mark.single_process
def test_runs_of_one_program_are_spread_so_that_groups_compile_different_programs(tmp_path):
    """Longest first, and among runs of one cost each program's first run, then each one's second:
    in the plain order a program's runs sat side by side, every group took one at the same moment
    and compiled the same program (a 2-group BBOB slice: each program twice, issue 41). BBOB's
    functions, instances, seeds, budgets and targets are data to a program; dimensions and static
    settings (CMA-ES's sigma_init) are not. The launch hands the runs out in that order (its journal)."""
    from hpcevo.studies.runner import spread_programs

    base = {"algorithm": {"name": "cmaes", "pop_size": 4}, "problem": {"name": "bbob", "function": 1, "instance": 1},
            "run": {"target_precision": 1e-8}, "log": {"every": 1000}, "checkpoint": {"every": 0}}
    dims = {"zip": {"problem.dim": [2, 3], "run.evaluations": [24, 36]}, "labels": ["d2", "d3"], "role": "problem"}
    functions = load_study({"study": {"out": str(tmp_path / "f")}, "base": base,
                            "axis": [{"key": "problem.function", "values": list(range(1, 25))}, dims]})
    assert len(functions.runs) == 48 and len({r.program for r in functions.runs}) == 2  # one per dimension
    study = load_study({
        "study": {"seeds": 2, "out": str(tmp_path / "s")}, "base": base,
        "axis": [{"key": "algorithm.sigma_init", "values": [0.3, 0.5], "labels": ["a", "b"]}, dims,
                 {"key": "problem.instance", "values": [1, 2], "labels": ["i1", "i2"]}]})
    runs = sorted(study.runs, key=lambda r: (-r.cost(), r.configuration, r.problem, r.index))
    assert [r.problem for r in runs[:8]] == (["d3-i1"] * 2 + ["d3-i2"] * 2) * 2
    assert [r.configuration for r in runs[:8]] == ["a"] * 4 + ["b"] * 4
    assert runs[0].cost() == 36 * 3 and runs[-1].cost() == 24 * 2  # (the budget, not 100 generations)
    assert len({r.program for r in runs}) == 4 and runs[0].program == runs[3].program != runs[4].program
    spread = spread_programs(runs)
    assert sorted(r.index for r in spread) == sorted(r.index for r in runs)
    assert [r.name for r in spread[:4]] == ["a__d3-i1__s0", "b__d3-i1__s0", "a__d3-i1__s1", "b__d3-i1__s1"]
    assert all(r.problem.startswith("d3-") for r in spread[:8])  # dim 3 (longer) first
    assert [r.configuration for r in spread[8:12]] == ["a", "b", "a", "b"]
    hpcevo.study(study, quiet=True)  # one group: it goes on with each program it has loaded
    started = [e["run"] for e in read_events(study.out) if e.get("event") == "start"]
    assert started == [f"{c}__{d}-{i}__s{seed}" for d in ("d3", "d2") for c in ("a", "b")
                       for i in ("i1", "i2") for seed in (0, 1)]
    # Each run's start-up is its own (issue 41; before, every run of a process reported the
    # process's first run's phases): a later run's setup, compile and first generation, counted
    # from its own start, so within the wall time the journal gives that run.
    walls = {e["run"]: e["wall_s"] for e in read_events(study.out) if e.get("event") == "end"}
    for name in started[1:]:
        s = json.loads((study.out / "runs" / name / "summary.json").read_text())
        assert set(s["startup_s"]) == {"setup", "compile", "first_generation", "total"}, (name, s["startup_s"])
        assert s["startup_s"]["total"] <= walls[name] and s["startup_s"]["compile"] <= s["compile_s"] + 0.05, (
            name, s["startup_s"], s["compile_s"], walls[name])


@pytest.mark.single_process
def test_a_group_goes_on_with_the_programs_it_has_loaded_then_takes_one_nobody_has():
    """The queue's choice (rank 0's dispatcher): among the pending runs of the head's length, a
    group takes the next of a program it has run, else one of a program no group has taken,
    else the head; a longer run is never passed over for a shorter one."""
    from hpcevo.parallel.queue import _Dispatcher

    kinds = {0: ("A", "p"), 1: ("A", "q"), 2: ("A", "r"), 3: ("A", "p"), 4: ("A", "q"), 5: ("A", "r"),
             6: ("B", "p"), 7: ("B", "s")}
    queue = _Dispatcher(None, list(range(8)), 2, None, kinds)
    taken = [queue._take(g) for g in (0, 1, 0, 0, 1, 1, 1, 0)]
    assert taken == [0, 1, 3, 2, 4, 5, 7, 6]
    plain = _Dispatcher(None, list(range(8)), 2, None)
    assert [plain._take(g) for g in (0, 1, 0)] == [0, 1, 2]


# -- the report's statistics ----------------------------------------------------------------------
@pytest.mark.single_process
def test_holm_and_ert_by_hand():
    from hpcevo.studies.report import RunData, ert, holm

    # Holm (1979): p sorted 0.01, 0.02, 0.03, 0.04 of m = 4 -> 0.04, 0.06, 0.06, 0.06 (made monotone)
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, float("nan"), 0.01]) == pytest.approx([0.5, float("nan"), 0.02], nan_ok=True)
    runs = [RunData("a", "c", "p", 0.1, np.array([10.0, 20, 30]), np.array([5.0, 1.0, 0.1])),  # reaches 1.0 at 20
            RunData("b", "c", "p", 2.0, np.array([10.0, 20, 30, 40]), np.array([5.0, 4, 3, 2]))]  # never: 40
    assert ert(runs, 1.0) == (60.0, 1)
    assert ert(runs, 0.01) == (math.inf, 0)


@pytest.mark.single_process
def test_the_reports_statistics_are_scipys(monkeypatch):
    from scipy import stats

    from hpcevo.studies import report as rep

    rng = np.random.default_rng(5)
    configs, problems = ["base", "better", "same"], ["p1", "p2", "p3", "p4"]
    runs = []
    for pi, p in enumerate(problems):
        for c, shift in zip(configs, (1.0, 0.2, 1.0)):
            for s in range(12):
                final = float(shift * (pi + 1) * rng.lognormal(0, 0.3))
                runs.append(rep.RunData(f"{c}{p}{s}", c, p, final, np.array([8.0, 16.0]), np.array([5.0, final])))
    rows = rep._rows(runs, configs, problems, "base", {p: 1.5 for p in problems})
    overall = rep._overall(rows, configs, problems, "base")
    raw = []
    for p in problems:
        ref = [r.final for r in runs if r.problem == p and r.configuration == "base"]
        for c in configs:
            x = [r.final for r in runs if r.problem == p and r.configuration == c]
            row = next(r for r in rows if r["problem"] == p and r["configuration"] == c)
            assert row["median"] == pytest.approx(np.median(x)) and row["n"] == 12
            assert row["q1"] == pytest.approx(np.percentile(x, 25)) and row["q3"] == pytest.approx(np.percentile(x, 75))
            assert row["success_rate"] == pytest.approx(np.mean(np.asarray(x) <= 1.5))
            if c != "base":
                raw.append(stats.mannwhitneyu(x, ref, alternative="two-sided").pvalue)
                assert row["p"] == pytest.approx(raw[-1])
    adjusted = [r["p_holm"] for r in rows if "p_holm" in r]
    assert adjusted == pytest.approx(rep.holm(raw))
    assert all(r["verdict"] == "better" for r in rows if r["configuration"] == "better")
    assert all(r["verdict"] == "=" for r in rows if r["configuration"] == "same")
    med = np.array([[np.median([r.final for r in runs if r.problem == p and r.configuration == c]) for c in configs]
                    for p in problems])
    assert overall["friedman_p"] == pytest.approx(stats.friedmanchisquare(*med.T).pvalue)
    assert overall["wilcoxon_p"]["better"] == pytest.approx(stats.wilcoxon(med[:, 1], med[:, 0]).pvalue)
    ranks = np.mean([stats.rankdata(row) for row in med], axis=0)
    assert [overall["mean_rank"][c] for c in configs] == pytest.approx(ranks)


@pytest.mark.single_process
def test_the_readmes_study_file_and_the_example_study_are_studies():
    import re
    import tomllib

    root = Path(__file__).resolve().parents[1]
    section = (root / "README.md").read_text().split("## Studies", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    study = load_study(tomllib.loads(snippet))
    assert len(study.runs) == 3 * 2 * 10 and study.baseline == "cso"
    assert study.by_name("de__rastrigin30__s9").config().algorithm_params == {"F": 0.6}
    example = load_study(root / "examples" / "study.toml")
    assert len(example.runs) == 120 and example.name == "classic" and set(example.targets) == set(example.problems)


def test_a_context_splits_by_color_like_mpi_comm_split(ctx):
    part = ctx.split(color=ctx.rank % 2)
    assert part.size == (ctx.size + 1 - ctx.rank % 2) // 2 and part.rank == ctx.rank // 2
    # what Loop takes (its constructor agrees over the part's ranks; a Loop on a group runs in
    # test_groups_split_the_job_and_their_leaders_talk)
    from hpcevo.algorithms import CSO
    from hpcevo.problems import make_problem

    p = make_problem("sphere", 3)
    assert hpcevo.Loop(CSO(pop_size=7, dim=3, lb=p.lb, ub=p.ub), p, part).ctx is part
    solo = ctx.split(color=0 if ctx.rank == 0 else None)  # None: this rank takes part in no part
    assert (solo is None) == (ctx.rank != 0) and (solo is None or solo.size == 1)
    with pytest.raises(UsageError, match="rank 0 passed something else"):
        ctx.split(color=-1 if ctx.rank == 0 else 0)


@pytest.mark.ranks(2, 3)
def test_an_object_that_cannot_be_pickled_fails_both_ends_not_a_hang(ctx):
    """Groups.send of a lambda raised on the sender alone, and its receiver waited forever; now
    the receiver's recv raises too, naming the sender, and the pair goes on talking."""
    groups = split(ctx, 1)
    if groups.index == 0:
        with pytest.raises(UsageError, match=r"Groups.send: the object for group 1 cannot be sent: it cannot be "
                                             r"pickled .*group 1's recv raises too"):
            groups.send(lambda: 1, to=1)
        groups.send({"then": "fine"}, to=1)
    elif groups.index == 1:
        with pytest.raises(UsageError, match=r"Groups.recv: group 0 could not send its object: it cannot be pickled"):
            groups.recv(source=0)
        assert groups.recv(source=0) == {"then": "fine"}
    ctx.comm_ctl.Barrier()
