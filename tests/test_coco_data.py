"""hpcevo.coco against COCO itself: the files cocoex's Observer writes, and cocopp reading them.

The oracle is cocoex (coco-experiment 2.8.2): the same points are evaluated by a cocoex problem
observed by ``cocoex.Observer("bbob", ...)``, one call per point, and the values it returns are
fed to hpcevo's writer in blocks of varying sizes. Every file of the two result folders must be
equal byte for byte; no field is normalised (the .info files hold no timestamp or absolute path,
and the writer's coco_version is the installed cocoex's, which the equality tests require).

cocopp (2.9.1) runs in a subprocess: its import tries to reach COCO's online data archive (it
warns and goes on offline; the socket timeout bounds the wait where the network is filtered
rather than absent), it caches under XDG_CACHE_HOME (pointed into the test's folder) and it keeps
module-level settings that should not leak into this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cocoex
from hpcevo.coco import COCO_VERSION, BBOBLogger, BBOBObserver, CocoFilesChanged
from hpcevo.errors import ConfigError, UsageError

same_version = pytest.mark.skipif(cocoex.__version__ != COCO_VERSION,
                                  reason=f"the format reproduced is cocoex {COCO_VERSION}'s logger")


def _problem(f: int, i: int, d: int):
    suite = cocoex.Suite("bbob", f"instances: {i}", f"function_indices: {f} dimensions: {d}")
    return suite, next(iter(suite))  # the suite is kept with its problem: it owns it


def _fopt(f: int, i: int, d: int, scratch: Path) -> float:
    """The instance's optimal value, as cocoex's logger writes it (%13.12e of a value with two
    decimals, so exact): cocoex's Python interface does not expose it."""
    obs = cocoex.Observer("bbob", f"outer_folder: {scratch} result_folder: fopt")
    suite, p = _problem(f, i, d)
    p.observe_with(obs)
    p(np.zeros(d))
    p.free()
    folder = Path(obs.result_folder)  # complete: a problem's logger writes its last lines when freed
    text = (folder / f"data_f{f}" / f"bbobexp_f{f}_DIM{d}.dat").read_text()
    return float(re.search(r"Fopt \(([^)]+)\)", text).group(1))


def _xopt(f: int, i: int, d: int, scratch: Path) -> np.ndarray:
    # _best_parameter("print") writes the optimum to a fixed file name in the working directory.
    suite, p = _problem(f, i, d)
    scratch.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(scratch):
        p._best_parameter("print")
        return np.atleast_1d(np.loadtxt("._bbob_problem_best_parameter.txt"))


def _approach(f: int, i: int, d: int, n: int, scratch: Path) -> np.ndarray:
    """Points shrinking towards the optimum (targets down to 1e-8 and below are crossed), every
    seventh one uniform in [-5, 5]^d (so that many rows do not improve)."""
    rng = np.random.default_rng([f, i, d])
    xo = _xopt(f, i, d, scratch)
    r = np.geomspace(1.0, 1e-7, n)[:, None] * rng.uniform(0.5, 1.5, (n, 1))
    x = xo + (rng.uniform(-5, 5, (n, d)) - xo) * r
    x[::7] = rng.uniform(-5, 5, (len(x[::7]), d))
    return x


def _coco(parent: Path, name: str, runs, options: str = "") -> tuple[Path, list[np.ndarray]]:
    """Evaluate each run's points with cocoex under one Observer; (f, i, d, x, restarts) per run,
    ``restarts``: the rows before which the observer is told of a restart."""
    obs = cocoex.Observer("bbob", f"outer_folder: {parent} result_folder: {name} algorithm_name: hpcevo "
                                  f'algorithm_info: "written by a test" {options}')
    values = []
    for f, i, d, x, restarts in runs:
        suite, p = _problem(f, i, d)
        p.observe_with(obs)
        y = np.empty(len(x))
        for k, row in enumerate(x):
            if k in restarts:
                obs.signal_restart(p)
            y[k] = p(row)
        p.free()
        values.append(y)
    folder = Path(obs.result_folder)  # (Observer.free of cocoex 2.8.2 raises; the problems are freed)
    assert folder == parent / name  # a fresh folder, not name-0001
    return folder, values


def _feed(logger: BBOBLogger, y, x, sizes=(1, 7, 100, 3, 500), restarts=(), start=0, stop=None) -> None:
    """Rows start..stop in blocks of the cycling sizes, cut where a restart is signalled."""
    stop = len(y) if stop is None else stop
    a, j = start, 0
    while a < stop:
        b = min(stop, a + sizes[j % len(sizes)])
        b = min([b] + [r for r in restarts if a < r < b])
        j += 1
        if a in restarts:
            logger.signal_restart()
        logger.observe(y[a:b], None if x is None else x[a:b])
        a = b


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _assert_same_files(expected: Path, actual: Path) -> None:
    assert _files(expected) == _files(actual)
    for rel in _files(expected):
        a, b = (expected / rel).read_bytes(), (actual / rel).read_bytes()
        if a != b:
            la, lb = a.decode().splitlines(True), b.decode().splitlines(True)
            k = next((k for k, (u, v) in enumerate(zip(la, lb)) if u != v), min(len(la), len(lb)))
            pytest.fail(f"{rel} differs at line {k + 1}:\n  expected {la[k:k + 1]}\n  written  {lb[k:k + 1]}")


@same_version
@pytest.mark.single_process
def test_files_equal_cocoex_observer(tmp_path):
    """f1 2-D, f12 3-D (values above the 1e5 linear targets), f8 5-D (x logged up to dim 6), f21
    10-D and f24 20-D (x not logged), instances 1-3 each in one folder, one line per (f, d), plus
    100,000 evaluations of f5 3-D for the evaluation-count triggers up to 1e5."""
    scratch = tmp_path / "scratch"
    runs = [(f, i, d, _approach(f, i, d, 3000, scratch), ()) for f, d in ((1, 2), (12, 3), (8, 5), (21, 10), (24, 20))
            for i in (1, 2, 3)]
    runs.append((5, 1, 3, np.random.default_rng(5).uniform(-5, 5, (100_000, 3)), ()))
    coco, values = _coco(tmp_path, "coco", runs)
    for (f, i, d, x, _), y in zip(runs, values):
        log = BBOBLogger(tmp_path / "hpcevo", function=f, instance=i, dim=d, fopt=_fopt(f, i, d, scratch),
                         comment="written by a test")
        _feed(log, y, x)
        log.close()
    _assert_same_files(coco, tmp_path / "hpcevo")
    info = (coco / "bbobexp_f1.info").read_text()
    assert re.search(r"data_f1/bbobexp_f1_DIM2\.dat, 1:3000\|\S+, 2:3000\|\S+, 3:3000\|\S+$", info)
    lines = (coco / "data_f8" / "bbobexp_f8_DIM5.dat").read_text().splitlines()
    assert any(float(v.split()[2]) < 1e-8 for v in lines if not v.startswith("%"))  # the last targets


@same_version
@pytest.mark.single_process
def test_observer_order_options_restarts_nonfinite(tmp_path):
    """BBOBObserver keeps cocoex's line rule for any order (f1 2-D after f12 3-D starts a new line
    and data_f1/bbobexp_f1_DIM2-0001.dat); non-default target and evaluation triggers; restarts
    (.rdat lines; one before the first evaluation, ignored); points with inf/NaN coordinates (not
    evaluations for COCO) and with 1e200 (f = inf, logged as 3e21); 10-D without x columns."""
    scratch = tmp_path / "scratch"
    order = [(1, 1, 2), (12, 1, 3), (1, 2, 2), (1, 3, 2), (12, 2, 3), (12, 2, 10)]
    restarts = (0, 3, 50, 51, 399)
    runs = []
    for f, i, d in order:
        rng = np.random.default_rng([f, i, d])
        x = rng.uniform(-5, 5, (400, d)) * np.geomspace(1, 1e-3, 400)[:, None]
        x[5, 0], x[9, -1], x[11, 0] = np.nan, -np.nan, np.inf
        x[13], x[14, 0] = 1e200, -1e200
        runs.append((f, i, d, x, restarts))
    options = dict(number_target_triggers=5, base_evaluation_triggers=(1, 3), lin_target_precision=1e3,
                   log_target_precision=1e-5)
    coco, values = _coco(tmp_path, "coco", runs, " ".join(
        f"{k}: {','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in options.items()))
    obs = BBOBObserver(tmp_path / "hpcevo", comment="written by a test", **options)
    for (f, i, d, x, _), y in zip(runs, values):
        log = obs.logger(function=f, instance=i, dim=d, fopt=_fopt(f, i, d, scratch))
        _feed(log, y, x, sizes=(40, 1, 13), restarts=restarts)
        log.close()
        assert log.evaluations == 397  # the three points with inf/NaN coordinates are not evaluations
    _assert_same_files(coco, tmp_path / "hpcevo")
    assert (coco / "data_f1" / "bbobexp_f1_DIM2-0001.dat").exists()
    assert "+3.000000000e+21" in (coco / "data_f12" / "bbobexp_f12_DIM3.tdat").read_text()
    assert len((coco / "data_f12" / "bbobexp_f12_DIM3.rdat").read_text().splitlines()) == 5  # header + 4


_COCOPP = r"""
import socket; socket.setdefaulttimeout(5)
import json, sys, warnings
warnings.simplefilter("ignore")  # offline archive access, "less than 15 instances"
import cocopp, numpy as np
folder, targets, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sets = []
for ds in cocopp.pproc.DataSetList(folder):
    sets.append(dict(f=ds.funcId, d=ds.dim, instances=[int(i) for i in ds.instancenumbers],
                     evals=[[None if np.isnan(v) else int(v) for v in row] for row in ds.detEvals(targets)],
                     final=[float(v) for v in ds.finalfunvals], maxevals=[int(v) for v in ds.maxevals],
                     info_evals=[int(v) for v in ds.readmaxevals]))
print(json.dumps(sets))
cocopp.main(["--tab-only", "-o", out, folder])
"""


@pytest.mark.single_process
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_cocopp_reads_the_data(tmp_path):
    """cocopp's DataSetList gives, per instance, the evaluations to reach each target, the final
    best f - fopt and the evaluations of the written sequences; cocopp.main processes the folder
    (--tab-only: the tables, a fraction of a second; the figures would take ~10 s)."""
    targets = [1e2, 1.0, 1e-2, 1e-5, 1e-8]
    folder = tmp_path / "exdata" / "hpcevo"
    obs = BBOBObserver(folder, algorithm="hpcevo-test", comment="synthetic runs")
    expected = {}
    # f8 stops near 1e-3: unsolved, all evaluations count. f2 and f3: x columns left out in 2-D
    # and written in 10-D (log_variables "none", "all"), which cocopp reads all the same.
    for f, d, low, mode in ((1, 2, -9.5, None), (8, 10, -3.0, None), (2, 2, -9.5, "none"), (3, 10, -9.5, "all")):
        for i in (1, 2, 3):
            rng = np.random.default_rng([f, d, i])
            n = 2000 + 137 * i
            fopt = float(np.round(rng.uniform(-300, 300), 2))
            y = fopt + 10 ** (np.linspace(3, low, n) + rng.uniform(0, 2, n))
            log = (obs.logger(function=f, instance=i, dim=d, fopt=fopt) if mode is None else
                   BBOBLogger(folder, function=f, instance=i, dim=d, fopt=fopt, log_variables=mode))
            _feed(log, y, rng.uniform(-5, 5, (n, d)), sizes=(50, 1, 333))
            log.close()
            best = np.minimum.accumulate(y) - fopt
            reach = [int(np.argmax(best <= t)) + 1 if (best <= t).any() else None for t in targets]
            expected[f, d, i] = reach, float(best[-1]), n
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-c", _COCOPP, str(folder), json.dumps(targets), str(tmp_path / "pp")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    sets = json.loads(r.stdout.splitlines()[0])
    assert sorted((s["f"], s["d"]) for s in sets) == [(1, 2), (2, 2), (3, 10), (8, 10)]
    for s in sets:
        assert s["instances"] == [1, 2, 3]
        for k, i in enumerate(s["instances"]):
            reach, final, n = expected[s["f"], s["d"], i]
            assert [row[k] for row in s["evals"]] == reach, (s["f"], i)
            assert s["final"][k] == pytest.approx(final, rel=1e-9)  # printed with %+10.9e
            assert s["info_evals"][k] == n
            if reach[-1] is None:
                assert s["maxevals"][k] == n  # cocopp cuts maxevals of solved runs at the final target
    table = list((tmp_path / "pp").glob("*/pptable_f001_02D.tex"))
    assert table and "3 & /3" in table[0].read_text()  # 3 of 3 runs reached the final target


def _synthetic(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    fopt = float(np.round(rng.uniform(-300, 300), 2))
    return fopt + 10 ** (np.linspace(4, -9, n) + rng.uniform(0, 2, n)), rng.uniform(-5, 5, (n, d)), fopt


@pytest.mark.single_process
def test_resume_from_state_equals_uninterrupted(tmp_path):
    """Runs stopped and continued from an exported state (through JSON) give the files of runs
    never stopped: a state taken mid-run with lines written after it, one taken before the first
    evaluation (joining an existing line, and starting a new file), one taken before a close that
    happened anyway; a folder another run wrote to since refuses, untouched."""
    plan = [(1, 2, 1), (1, 2, 2), (1, 2, 3), (3, 10, 1), (3, 10, 2)]
    data = {key: _synthetic(1500, key[1], sum(key)) for key in plan}

    def logger(folder, key):
        y, x, fopt = data[key]
        return BBOBLogger(folder, function=key[0], instance=key[2], dim=key[1], fopt=fopt)

    for key in plan:
        log = logger(tmp_path / "straight", key)
        _feed(log, data[key][0], data[key][1])
        log.close()

    folder = tmp_path / "resumed"
    for key, (taken, crash) in zip(plan, [(None, None), (700, 1100), (0, 900), (0, 300), (1200, "closed")]):
        y, x, _ = data[key]
        if taken is None:
            log = logger(folder, key)
            _feed(log, y, x)
            log.close()
            continue
        log = logger(folder, key)
        _feed(log, y, x, sizes=(100,), stop=taken)
        state = json.loads(json.dumps(log.state()))
        if crash == "closed":
            _feed(log, y, x, sizes=(100,), start=taken)
            log.close()  # and then the run is resumed from the state before it, all the same
        else:
            _feed(log, y, x, sizes=(100,), start=taken, stop=crash)  # written, then lost with the process
        del log
        log = BBOBLogger.from_state(state)
        assert log.evaluations == taken
        _feed(log, y, x, sizes=(37, 250), start=taken)
        log.close()
    _assert_same_files(tmp_path / "straight", folder)

    # A run stopped, then another instance joined the line: the stopped one cannot continue.
    y, x, fopt = data[1, 2, 1]
    log = BBOBLogger(tmp_path / "other", function=1, instance=1, dim=2, fopt=fopt)
    _feed(log, y, x, stop=500)
    state = log.state()
    other = BBOBLogger(tmp_path / "other", function=1, instance=2, dim=2, fopt=fopt)
    _feed(other, y, x)
    other.close()
    # Nor one whose state predates its start, when another dimension's run has started since
    # (with the same instance number, in a line of its own).
    early = BBOBLogger(tmp_path / "other", function=1, instance=2, dim=3, fopt=fopt).state()
    _feed(BBOBLogger(tmp_path / "other", function=1, instance=2, dim=5, fopt=fopt), y[:50], np.ones((50, 5)))
    before = {rel: (tmp_path / "other" / rel).read_bytes() for rel in _files(tmp_path / "other")}
    for stale in (state, early):
        with pytest.raises(CocoFilesChanged, match="another run"):
            BBOBLogger.from_state(stale)
    assert BBOBLogger.from_state(other.state()).closed  # a finished run's state: files left alone
    assert {rel: (tmp_path / "other" / rel).read_bytes() for rel in _files(tmp_path / "other")} == before


@pytest.mark.single_process
@pytest.mark.parametrize("change", ["foreign line", "garbage", "torn garbage", "earlier evaluations", "edited",
                                    "header"])
def test_a_resume_refuses_coco_files_changed_behind_its_back_and_leaves_them(tmp_path, change):
    """What a resume cuts off must be the run's own later lines (it writes them again): lines of
    another instance (another f_opt), bytes that are no data line (whole or torn), evaluations
    from before the state, or an edit below the state's end were cut without a word before. (The
    run's own last line torn by a kill mid-write is its own: test_a_torn_own_line_is_cut.)"""
    y, x, fopt = _synthetic(1500, 2, 5)
    log = BBOBLogger(tmp_path, function=1, instance=1, dim=2, fopt=fopt)
    _feed(log, y, x, stop=700)
    state = json.loads(json.dumps(log.state()))
    _feed(log, y, x, start=700, stop=1100)  # the run's own lines after the state: cut on resume
    dat = next(tmp_path.rglob("*.dat"))
    own = dat.read_text()
    lines = own.splitlines(True)
    if change == "foreign line":  # a line of this function's run on another instance: another f_opt
        n, _, _, value, best, *xs = lines[-1].split()
        extra = "%s 0 %+10.9e %s %s %s\n" % (int(n) + 1, float(best) - (fopt + 3.5), value, best, " ".join(xs))
    elif change == "garbage":
        extra = "hello\n"
    elif change == "torn garbage":
        extra = "1x"
    elif change == "earlier evaluations":
        extra = lines[3]
    elif change == "header":
        extra = "% f evaluations | g evaluations | best noise-free fitness - Fopt\n"
    if change == "edited":  # a digit changed below the state's end, the size kept
        k = state["sizes"][".dat"] - 5
        data = bytearray(dat.read_bytes())
        data[k] = ord("7") if data[k] != ord("7") else ord("3")
        dat.write_bytes(bytes(data))
    else:
        dat.write_text(own + extra)
    before = {rel: (tmp_path / rel).read_bytes() for rel in _files(tmp_path)}
    with pytest.raises(CocoFilesChanged, match="did not write|was changed"):
        BBOBLogger.from_state(state)
    assert {rel: (tmp_path / rel).read_bytes() for rel in _files(tmp_path)} == before


@pytest.mark.single_process
def test_a_torn_own_line_is_cut_and_the_resume_writes_the_files_of_a_run_never_stopped(tmp_path):
    y, x, fopt = _synthetic(1500, 2, 5)
    for name, stop in (("straight", None), ("killed", 1100)):
        log = BBOBLogger(tmp_path / name, function=1, instance=1, dim=2, fopt=fopt)
        _feed(log, y, x, stop=700)
        state = json.loads(json.dumps(log.state()))
        if stop is None:
            _feed(log, y, x, start=700)
            log.close()
            continue
        _feed(log, y, x, start=700, stop=stop)
        dat = next((tmp_path / name).rglob("*.dat"))
        own = dat.read_text().splitlines(True)
        dat.write_text("".join(own[:-1]) + own[-1][: len(own[-1]) // 2])  # killed mid-line
        log = BBOBLogger.from_state(state)
        _feed(log, y, x, start=700)
        log.close()
    _assert_same_files(tmp_path / "straight", tmp_path / "killed")


@pytest.mark.single_process
def test_resume_with_observer(tmp_path):
    """An observer's line state and its open run's state restore together."""
    plan = [(1, 2, 1), (2, 2, 1), (1, 2, 2), (1, 2, 3)]
    data = {key: _synthetic(800, key[1], 7 * sum(key)) for key in plan}

    def run(folder, stop_at=None):
        obs = BBOBObserver(folder, algorithm="A")
        for key in plan:
            y, x, fopt = data[key]
            log = obs.logger(function=key[0], instance=key[2], dim=key[1], fopt=fopt)
            if key == stop_at:
                _feed(log, y, x, stop=300)
                states = json.loads(json.dumps([obs.state(), log.state()]))
                _feed(log, y, x, start=300, stop=600)
                obs = BBOBObserver.from_state(states[0])
                log = BBOBLogger.from_state(states[1], observer=obs)
                with pytest.raises(UsageError):
                    obs.logger(function=1, instance=9, dim=2, fopt=0.0)  # the run is still open
                _feed(log, y, x, start=300)
            else:
                _feed(log, y, x)
            log.close()

    run(tmp_path / "straight")
    run(tmp_path / "resumed", stop_at=(1, 2, 2))
    _assert_same_files(tmp_path / "straight", tmp_path / "resumed")
    assert (tmp_path / "resumed" / "data_f1" / "bbobexp_f1_DIM2-0001.dat").exists()


@pytest.mark.single_process
def test_log_variables_and_bad_input(tmp_path):
    kw = dict(function=1, instance=1, fopt=1.5)
    y, x = np.array([3.0, 2.0, 2.5]), np.arange(6.0).reshape(3, 2)

    log = BBOBLogger(tmp_path / "a", dim=2, **kw)
    with pytest.raises(ValueError, match=r"shape \(n,\)"):
        log.observe(y[:, None], x)
    with pytest.raises(ValueError, match=r"x must have shape \(n, dim\) = \(3, 2\)"):
        log.observe(y, x[:, :1])
    with pytest.raises(ValueError, match="x is needed"):
        log.observe(y)
    with pytest.raises(ValueError, match="numbers"):
        log.observe(["a", "b", "c"], x)
    assert log.evaluations == 0 and not (tmp_path / "a").exists()  # nothing written by a refusal
    log.observe(y, x)
    log.close()
    with pytest.raises(UsageError, match="closed"):
        log.observe(y, x)

    # 10-D needs no x ("low_dim" logs it below 7 variables, as COCO); "all" and "none" override.
    for mode, d, columns in (("low_dim", 10, 5), ("all", 10, 15), ("none", 2, 5), ("low_dim", 6, 11)):
        folder = tmp_path / f"{mode}{d}"
        log = BBOBLogger(folder, dim=d, log_variables=mode, **kw)
        log.observe(y, np.ones((3, d)) if columns > 5 else None)
        log.close()
        rows = [v.split() for v in (folder / "data_f1" / f"bbobexp_f1_DIM{d}.dat").read_text().splitlines()[1:]]
        assert {len(r) for r in rows} == {columns}

    for bad in (dict(function=0), dict(instance=-1), dict(dim=2.5), dict(fopt=float("nan")), dict(fopt="x"),
                dict(algorithm="two words"), dict(comment="it's"), dict(log_variables="some"),
                dict(number_target_triggers=-1), dict(lin_target_precision=0.0), dict(base_evaluation_triggers=())):
        args = {**kw, "dim": 2, **bad}
        with pytest.raises(ConfigError):
            BBOBLogger(tmp_path / "b", **args)
    with pytest.raises(ValueError, match="not a BBOBLogger state"):
        BBOBLogger.from_state({"format": "something else"})
