"""--overwrite (overwrite=True) loses nothing when the new run does not start.

The run it replaces is set aside (``.hpcevo-replaced`` beside each of its entries) and dropped
only once the new run's first generation has been evaluated; any refusal, error or interrupt
before that puts it back byte for byte. Checked three ways: every refusal a config can meet on
the run path (the thirteen an audit found lost the old run, and the rest), an error or an
interrupt injected at every step of a start (the property: whatever ends a start early, the
old run comes back), and at 1 and 3 ranks, where rank 0 alone holds the files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import hpcevo
from hpcevo.driver import execute, rules
from hpcevo.driver.loop import Loop
from hpcevo.driver.rundir import ASIDE, LOCK, RunDir
from hpcevo.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def config(out: Path, **tables) -> dict:
    """The base run with ``tables``' keys set; [problem] is replaced whole (a held function's
    config has no problem name)."""
    cfg = {"run": {"generations": 6, "out": str(out)}, "algorithm": {"name": "pso", "pop_size": 8},
           "problem": {"name": "sphere", "dim": 3}, "checkpoint": {"every": 2}}
    for table, keys in tables.items():
        cfg[table] = keys if table == "problem" else {**cfg.get(table, {}), **keys}
    return cfg


HELD = {"dim": 3, "lb": -1.0, "ub": 1.0}  # [problem] of a function held in Python


BBOB = {"name": "bbob", "function": 1, "instance": 1, "dim": 2}
# The runs already there: plain (checkpoints inside), with COCO data, checkpoints outside the run.
SHAPES = {
    "plain": lambda out: config(out),
    "coco": lambda out: config(out, problem=BBOB, log={"coco": True}),
    "outside": lambda out: config(out, checkpoint={"dir": str(out.parent / "ck")}),
}


def snapshot(*roots: Path) -> dict[str, object]:
    """Every entry under ``roots`` (hidden ones too): bytes of files, targets of links. (But the
    lock file's text, which names the launch that holds it: tests/test_one_writer.py.)"""
    out: dict[str, object] = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                if name == LOCK:
                    out[str((Path(dirpath) / name).relative_to(root.parent))] = "lock"
                    continue
                p = Path(dirpath) / name
                key = str(p.relative_to(root.parent))
                if p.is_symlink():
                    out[key] = ("link", os.readlink(p))
                elif p.is_file():
                    out[key] = p.read_bytes()
                else:
                    out[key] = "dir"
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One finished run of each shape, copied for each case (making them costs a compile)."""
    base = tmp_path_factory.mktemp("made")
    for shape, cfg in SHAPES.items():
        (base / shape).mkdir()
        result = hpcevo.run(cfg(base / shape / "run"), quiet=True)
        assert result.status == "complete"
    return base


def existing(made: Path, tmp_path: Path, shape: str) -> tuple[Path, dict]:
    shutil.copytree(made / shape, tmp_path / shape, symlinks=True)
    out = tmp_path / shape / "run"
    owner = tmp_path / shape / "ck" / ".hpcevo-run"
    if owner.exists():  # (a checkpoint directory outside names its run: the copy's)
        owner.write_text(json.dumps({"run_dir": str(out.resolve())}) + "\n")
    return out, SHAPES[shape](out)


def roots(out: Path) -> tuple[Path, ...]:
    return (out, out.parent / "ck") if (out.parent / "ck").exists() else (out,)


def _nan(x):
    return jnp.full(x.shape[:1], jnp.nan)


def _raises(x):
    raise ValueError("cannot evaluate this")


def _plain(x):
    return float(np.sum(np.asarray(x) ** 2))


# (the config's change, a problem held in Python, what is raised). The first nine are the
# audit's: each deleted the old run before it was refused. (Four more of it, [islands] with
# run.evaluations, run.target, run.target_precision or run.stagnation_generations, are runs now:
# islands take limits; tests/test_islands.py.)
REFUSALS = {
    "multiobjective+target": (dict(algorithm={"name": "nsga2", "pop_size": 8}, problem={"name": "zdt1", "dim": 3},
                                   run={"target": 0.5}), None, ConfigError),
    "multiobjective+stagnation": (dict(algorithm={"name": "nsga2", "pop_size": 8},
                                       problem={"name": "zdt1", "dim": 3}, run={"stagnation_generations": 3}),
                                  None, ConfigError),
    "target+target_precision": (dict(run={"target": 1.0, "target_precision": 1e-8}), None, ConfigError),
    "nan target": (dict(run={"target": float("nan")}), None, ConfigError),
    "coco+islands, not bbob": (dict(log={"coco": True}, islands={"count": 2}), None, ConfigError),
    "coco, not bbob": (dict(log={"coco": True}), None, ConfigError),
    "target_precision, no optimum": (dict(run={"target_precision": 1e-8}, problem=HELD), _plain, ConfigError),
    "every evaluation failed": (dict(problem=HELD), _raises, UsageError),
    "every evaluation nan": (dict(problem=HELD), _nan, UsageError),
    # and the others of the run path
    "multiobjective+reevaluate": (dict(algorithm={"name": "nsga2", "pop_size": 8},
                                       problem={"name": "zdt1", "dim": 3}, run={"reevaluate": 2}), None, ConfigError),
    "coco, held function": (dict(log={"coco": True}, problem=HELD), _plain, ConfigError),
    "islands+target_precision, held function": (dict(run={"target_precision": 1e-8}, islands={"count": 2},
                                                     problem=HELD), _plain, ConfigError),
    "unknown key": (dict(run={"generatoins": 5}), None, ConfigError),
    "bad algorithm parameter": (dict(algorithm={"name": "pso", "pop_size": 8, "w": "x"}), None, ConfigError),
    "one candidate, called with blocks": (dict(problem=HELD), lambda x: float(np.sum(np.asarray(x) ** 2, axis=0).item()),
                                          UsageError),
}


def _held(problem):
    return {} if problem is None else {"problem": problem, "host": problem is not _nan}


@pytest.mark.single_process
@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_overwrite_keeps_the_run_it_would_replace_byte_for_byte(made, tmp_path, case):
    change, problem, error = REFUSALS[case]
    shape = "coco" if case.startswith("coco+") else "plain"
    out, cfg = existing(made, tmp_path, shape)
    before = snapshot(*roots(out))
    new = config(out, **change)
    with pytest.raises(error):
        hpcevo.run(new, quiet=True, overwrite=True, **_held(problem))
    assert snapshot(*roots(out)) == before


# Every step of a start, from the build to the first generation's check: an error or an interrupt
# there must put the replaced run back. (name, object, attribute)
STEPS = [
    ("build", execute.Built, "of"),
    ("rules", rules, "check"),
    ("prepare's probe", execute.checkpoint, "remove_partials"),
    ("coco logger", execute.CocoLog, "start"),
    ("limits", Loop, "limit"),
    ("config written", RunDir, "start"),
    ("banner", execute.Run, "announce"),
    ("compile", execute.Run, "compile"),
    ("first generation", Loop, "init"),
    ("first generation's check", execute.Run, "_check_some_evaluation_worked"),
]


@pytest.mark.single_process
@pytest.mark.parametrize("error", [UsageError("injected"), KeyboardInterrupt()], ids=["UsageError", "KeyboardInterrupt"])
@pytest.mark.parametrize("shape", ["coco", "outside"])
def test_whatever_ends_a_start_early_the_replaced_run_comes_back(made, tmp_path, monkeypatch, shape, error):
    """The property, over every step x error kind x run shape (each a new run of other settings
    over the old one): the old run's entries equal what they were, nothing set aside is left."""
    for step, owner, attr in STEPS:
        if step == "coco logger" and shape != "coco":
            continue
        case = tmp_path / step.replace(" ", "-").replace("'", "")
        case.mkdir()
        out, cfg = existing(made, case, shape)
        before = snapshot(*roots(out))
        # another run (its files would differ from the old one's), with a budget (Loop.limit)
        cfg["run"].update(seed=7, evaluations=1000)

        def fail(*a, **k):
            raise error

        with monkeypatch.context() as m:
            m.setattr(owner, attr, fail)
            with pytest.raises(type(error)) as raised:
                hpcevo.run(cfg, quiet=True, overwrite=True)
        assert raised.value is error, (step, raised.value)  # (the step was reached)
        assert snapshot(*roots(out)) == before, step


@pytest.mark.single_process
def test_the_replaced_run_goes_once_the_new_one_has_started(made, tmp_path):
    """After the first generation the new run owns the directory: the old files are gone (a run
    with COCO data gets its own data, not a second trial beside the old one's), nothing is left
    aside, and a failure later on does not bring the old run back."""
    out, cfg = existing(made, tmp_path, "coco")
    old_summary = json.loads((out / "summary.json").read_text())
    cfg["run"]["seed"] = 7
    new = hpcevo.run(cfg, quiet=True, overwrite=True)
    assert new.summary["state_digest"] != old_summary["state_digest"]
    assert not list(out.rglob(ASIDE)) and len(list((out / "checkpoints").glob("gen-*.h5"))) == 3
    (info,) = (out / "coco").glob("*.info")
    assert info.read_text().count("|") == 1  # one trial: the new run's


@pytest.mark.single_process
def test_a_start_killed_before_its_first_generation_leaves_the_old_run_and_says_where(made, tmp_path, monkeypatch):
    """A start killed between setting the old run aside and its first generation (SIGKILL: no
    handler runs) leaves it in .hpcevo-replaced; the next launch, whatever it asks, names the
    folder and touches nothing."""
    out, cfg = existing(made, tmp_path, "outside")
    before = snapshot(*roots(out))
    monkeypatch.setattr(RunDir, "abandon", lambda self: None)  # as if killed: nothing put back
    monkeypatch.setattr(execute.Run, "compile", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        hpcevo.run(cfg, quiet=True, overwrite=True)
    monkeypatch.undo()
    assert (out / ASIDE / "summary.json").read_bytes() == before[f"run/{'summary.json'}"]
    assert sorted(p.name for p in (out.parent / "ck" / ASIDE).iterdir()) == [
        "gen-000000002.h5", "gen-000000004.h5", "gen-000000006.h5"]
    left = snapshot(*roots(out))
    for kw in ({"overwrite": True}, {"resume": True}, {}):
        with pytest.raises(UsageError, match=r"\.hpcevo-replaced' holds the run that an earlier overwrite=True set "
                                             r"aside.*nothing of that run is lost"):
            hpcevo.run(cfg, quiet=True, **kw)
        assert snapshot(*roots(out)) == left


@pytest.mark.single_process
def test_the_cli_refuses_with_exit_2_and_keeps_the_run(made, tmp_path):
    out, cfg = existing(made, tmp_path, "plain")
    before = snapshot(out)
    r = subprocess.run([sys.executable, "-m", "hpcevo", "run", str(ROOT / "examples" / "cso.toml"), "--overwrite",
                        "--set", f"run.out={out}", "--set", "islands.count=2", "--set", "log.coco=true"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'log.coco'" in r.stderr, r.stderr
    assert snapshot(out) == before


@pytest.mark.ranks(1, 3)
def test_at_any_rank_count_a_refused_start_keeps_the_run(ctx, shared_tmp):
    """Rank 0 holds the files and puts them back; the refusals agreed by every rank (a rule of a
    problem held in Python, every evaluation NaN in the first generation, split over the ranks)."""
    out = shared_tmp / "run"
    assert hpcevo.run(config(out), ctx=ctx, quiet=True).status == "complete"
    before = snapshot(out) if ctx.is_root else None
    cases = [(dict(run={"target_precision": 1e-8}, problem=HELD), lambda x: jnp.sum(x * x), ConfigError,
              "optimal value"),
             (dict(problem=HELD), _nan, UsageError, "is kept")]
    for change, problem, error, said in cases:
        with pytest.raises(error, match=said):
            hpcevo.run(config(out, **change), problem=problem, ctx=ctx, quiet=True, overwrite=True)
        if ctx.is_root:
            assert snapshot(out) == before
    # and a start that does start replaces it, on every rank's word
    result = hpcevo.run(config(out, run={"generations": 6, "seed": 3}), ctx=ctx, quiet=True, overwrite=True)
    assert result.status == "complete"
    if ctx.is_root:
        assert snapshot(out) != before and not (out / ASIDE).exists()


@pytest.mark.single_process
@pytest.mark.parametrize("case", [c for c, (_, problem, error) in REFUSALS.items() if problem is None
                                  and error is ConfigError and c not in ("unknown key", "bad algorithm parameter")])
def test_the_rules_refuse_before_anything_is_built_or_written(tmp_path, case):
    """hpcevo.load_config (the CLI's first step, and study plan's) applies the same rules: the
    refusal comes before a run directory exists."""
    change = REFUSALS[case][0]
    with pytest.raises(ConfigError) as e:
        hpcevo.load_config(config(tmp_path / "run", **change))
    assert e.value.key is not None and e.value.key.split(".")[0] in ("run", "log")
    assert not (tmp_path / "run").exists()


@pytest.mark.single_process
@pytest.mark.parametrize("base, axis, said", [
    # one program (log.coco does not change it): only the second run breaks a rule
    ({"islands": {"count": 2}, "problem": {"name": "sphere", "dim": 2}}, {"key": "log.coco", "values": [False, True]},
     "run 'cocotrue__sphere__s0': 'log.coco' writes COCO's bbob data"),
    ({"algorithm": {"name": "nsga2", "pop_size": 8}, "problem": {"name": "zdt1", "dim": 3}},
     {"key": "run.reevaluate", "values": [0, 2]}, "run 'reevaluate2__zdt1__s0': run.reevaluate = 2: problem zdt1 has 2"),
], ids=["islands+coco, not bbob", "multiobjective+reevaluate"])
def test_study_plan_refuses_runs_that_every_run_would_refuse(tmp_path, base, axis, said):
    """`hpcevo study plan` (hpcevo.load_study) applies the rules to every run, also where only a
    setting outside the compiled program breaks them, in some runs."""
    spec = {"study": {"seeds": 1, "out": str(tmp_path / "s")},
            "base": {"run": {"generations": 5}, "algorithm": {"name": "pso", "pop_size": 8},
                     "problem": {"name": "bbob", "function": 1, "instance": 1, "dim": 2}, **base},
            "axis": [axis]}
    with pytest.raises(ConfigError, match=said):
        hpcevo.load_study(spec)
    assert not (tmp_path / "s").exists()


@pytest.mark.ranks(1, 3)
def test_an_unwritable_run_directory_is_one_message_on_every_rank(ctx, tmp_path):
    """Rank 0's OSError reached the other ranks as a bare RuntimeError (a traceback, exit 1)."""
    with pytest.raises(UsageError, match=r"run directory '/proc/hpcevo-test/run': .* cannot be written"):
        hpcevo.run(config(Path("/proc/hpcevo-test/run")), ctx=ctx, quiet=True)
