"""Hooks at log boundaries and stop criteria of the user's (``hpcevo.hooks``), through
``hpcevo.run`` on every rank count: who is called where, what a criterion's stop means, an
error in a hook on one rank, hyper-parameters changed by a hook and resumed, the loggers."""

from __future__ import annotations

import json
import struct
import sys
import types

import numpy as np
import pytest

import hpcevo
from hpcevo.hooks import Budget, Hooks, Stagnation, Target, TensorBoard, WandB, every_rank, scalars

from configs import small_config

# The rank matrix: what these MPI tests check (an error or an input on some ranks reaching
# every rank) needs a last rank and a middle one: 2 and 3 ranks have them, 4 repeats them.
pytestmark = pytest.mark.ranks(1, 2, 3)


def config(tmp, name, **sections):
    return small_config(tmp / name, run={"generations": 8}, **sections)


def test_hooks_run_on_rank_0_or_every_rank_with_each_boundary_record(ctx, shared_tmp):
    seen, everywhere = [], []

    def show(record, loop):
        seen.append(dict(record))
        assert isinstance(loop, hpcevo.Loop)

    result = hpcevo.run(config(shared_tmp, "observe"), quiet=True,
                        hooks=[show, every_rank(lambda r, loop: everywhere.append(r["generation"]))])
    logged = [r["generation"] for r in hpcevo.open_run(result.run_dir).records]
    assert everywhere == logged and logged[-1] == 8
    if ctx.is_root:
        assert [r["generation"] for r in seen] == logged
        assert seen[-1]["best"] == result.best_fitness and seen[-1]["params.phi"] == 0.1
    else:
        assert seen == []
    assert result.summary["stopped_by"] is None and result.summary["status"] == "complete"


@pytest.mark.ranks(1, 2)
def test_a_stop_criterion_ends_the_run_complete_and_names_itself(ctx, shared_tmp):
    result = hpcevo.run(config(shared_tmp, "target"), quiet=True, stop_when=Target(1e9))
    s = hpcevo.open_run(result.run_dir).summary  # written before run returned, on every rank
    assert s["status"] == "complete" and s["stopped_by"] == "target 1e+09 reached"
    assert s["generations"] == 2 < 8 and s["checkpoint"] and s["checkpoint"].endswith("gen-000000002.h5")

    def enough_evaluations(record, loop):
        return record["evaluations"] >= 20

    result = hpcevo.run(config(shared_tmp, "own"), quiet=True, stop_when=[Target(-1.0), enough_evaluations])
    assert result.summary["stopped_by"] == "enough_evaluations" and result.summary["generations"] == 4
    result = hpcevo.run(config(shared_tmp, "says"), quiet=True,
                        stop_when=lambda r, loop: "plateau" if r["generation"] >= 6 else "")
    assert result.summary["stopped_by"] == "plateau" and result.summary["generations"] == 6
    result = hpcevo.run(config(shared_tmp, "budget"), quiet=True, stop_when=Budget(16))
    assert result.summary["stopped_by"] == "budget of 16 evaluations spent"


def test_an_error_in_a_hook_on_one_rank_is_every_ranks(ctx, shared_tmp):
    def fails_on_the_last_rank(record, loop):
        if ctx.rank == ctx.size - 1 and record["generation"] == 4:
            raise RuntimeError("the hook broke")

    with pytest.raises(RuntimeError, match="the hook broke"):
        hpcevo.run(config(shared_tmp, "broken"), quiet=True, hooks=every_rank(fails_on_the_last_rank))


@pytest.mark.ranks(1, 2)
def test_a_hook_that_changes_hyper_parameters_resumes_bitwise(ctx, shared_tmp):
    @every_rank
    def anneal(record, loop):  # a schedule: collective, so on every rank
        loop.set_params(phi=round(0.1 + 0.05 * record["generation"], 4))

    whole = hpcevo.run(config(shared_tmp, "anneal"), quiet=True, hooks=anneal)
    phis = hpcevo.open_run(whole.run_dir).metrics["params.phi"]
    assert list(phis) == [0.1, 0.2, 0.3, 0.4]  # each record: the values its generations ran with
    plain = hpcevo.run(config(shared_tmp, "plain"), quiet=True)
    assert whole.digest != plain.digest
    half = config(shared_tmp, "halves")
    hpcevo.run({**half, "run": {**half["run"], "generations": 4}}, quiet=True, hooks=anneal)
    resumed = hpcevo.run(half, quiet=True, resume=True, hooks=anneal)
    assert resumed.digest == whole.digest


def test_hooks_are_checked_and_agreed(ctx, shared_tmp):
    with pytest.raises(hpcevo.UsageError, match="'hooks' must be a callable or a list"):
        hpcevo.run(config(shared_tmp, "bad"), hooks=3)
    with pytest.raises(hpcevo.UsageError, match="every entry of 'stop_when' must be callable"):
        hpcevo.run(config(shared_tmp, "bad"), stop_when=[Target(0.0), "soon"])
    if ctx.size > 1:
        def one(r, loop):
            pass

        def other(r, loop):
            pass

        with pytest.raises(hpcevo.UsageError, match="differs between ranks"):
            hpcevo.run(config(shared_tmp, "bad"), hooks=one if ctx.rank == 0 else other)


# -- pure ---------------------------------------------------------------------------------------
class FakeLoop:
    def __init__(self, best):
        self.history = {"best": np.asarray(best, float)}


@pytest.mark.single_process
def test_criteria():
    assert Target(1.0)({"best": 1.0}, None) and not Target(1.0)({"best": 1.5}, None)
    stag = Stagnation(generations=3, tolerance=0.1)
    assert not stag({}, FakeLoop([5, 4, 3, 2.95]))  # 2 short of the window... and improving
    assert not stag({}, FakeLoop([9, 5, 4, 3, 2.5]))
    assert stag({}, FakeLoop([9, 5, 3, 2.97, 2.95, 2.95]))
    assert not stag({}, FakeLoop([np.inf, np.inf, np.inf, np.inf]))
    assert Budget(100)({"evaluations": 100}, None) and not Budget(100)({"evaluations": 99}, None)
    for bad in (lambda: Stagnation(0), lambda: Stagnation(5, -1.0), lambda: Budget(0), lambda: Target("x")):
        with pytest.raises(hpcevo.ConfigError):
            bad()
    h = Hooks.checked("t", None, [Target(0.0), lambda r, loop: True])
    assert h.reason({"best": 1.0}, None) == "<lambda>"
    assert scalars({"generation": 3, "best": 1.0, "params.F": 0.5, "x": "text", "d": {"a": 2}}) == {
        "best": 1.0, "params.F": 0.5, "d/a": 2.0}


def _events(directory):
    """Scalars from TensorBoard event files (TFRecord framing: length, its CRC, data, its CRC)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
    return out


@pytest.mark.single_process
def test_tensorboard_writes_each_boundary(tmp_path):
    result = hpcevo.run(config(tmp_path, "tb"), quiet=True, hooks=TensorBoard(str(tmp_path / "tb")))
    events = _events(tmp_path / "tb")
    best = [(step, value) for step, tag, value in events if tag == "best"]
    assert [s for s, _ in best] == [2, 4, 6, 8]
    assert best[-1][1] == pytest.approx(result.best_fitness, rel=1e-6)
    assert {tag for _, tag, _ in events} >= {"evaluations", "gen_mean", "params.phi"}


@pytest.mark.single_process
def test_wandb_logs_each_boundary_through_its_api(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, data, step):
            calls.append((step, data))

        def finish(self):
            calls.append("finish")

    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or Run())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    hpcevo.run(config(tmp_path, "wb"), quiet=True, hooks=WandB(project="p", mode="offline"))
    assert calls[0] == ("init", {"project": "p", "mode": "offline"}) and calls[-1] == "finish"
    assert [c[0] for c in calls[1:-1]] == [2, 4, 6, 8] and "best" in calls[1][1]
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: one message, no traceback
    with pytest.raises(hpcevo.UsageError, match="pip install 'hpcevo\\[wandb\\]'"):
        WandB(project="p")
    json.dumps(calls[1][1])  # what reaches W&B is plain numbers


@pytest.mark.ranks(1, 3)
def test_a_collective_called_from_a_rank_0_hook_raises_at_once_with_the_cure(ctx, shared_tmp):
    """A hook runs on rank 0 unless marked every_rank: a collective call from it (set_params,
    evaluate) would wait for ranks that never join (the watchdog ended such a run after 30 s,
    blaming the problem's code). It raises at once, on every rank, at any rank count."""
    import time

    def anneal(record, loop):
        loop.set_params(phi=0.2)

    def evaluates(record, loop):
        return bool(loop.evaluate(np.zeros((2, 3))).min() < 0)

    t = time.monotonic()
    with pytest.raises(hpcevo.UsageError, match=r"is collective .* but the hook anneal runs on rank 0 alone.*"
                                                r"hpcevo.hooks.every_rank"):
        hpcevo.run(config(shared_tmp, "rank0-hook"), quiet=True, hooks=anneal)
    with pytest.raises(hpcevo.UsageError, match=r"the stop criterion evaluates runs on rank 0 alone"):
        hpcevo.run(config(shared_tmp, "rank0-criterion"), quiet=True, stop_when=evaluates, overwrite=True)
    assert time.monotonic() - t < 60
    # marked every_rank, the same hook is a schedule (test_a_hook_that_changes_hyper_parameters...)
    assert hpcevo.run(config(shared_tmp, "every"), quiet=True, hooks=every_rank(anneal)).status == "complete"


@pytest.mark.ranks(2, 3)
@pytest.mark.slow  # (out of the quick tier: CLI processes / waits; the full suite runs it)
def test_a_hook_that_takes_long_once_does_not_end_a_healthy_run(ctx, shared_tmp):
    """The watchdog's boundary limit (fault.min_seconds = 1 s here) is for hpcevo's own work; a
    rank-0 hook that takes 3 s once (an upload, a plot) is the user's, and the run goes on (it
    used to end with 76, "stuck in the problem's code")."""
    import time

    def slow_once(record, loop):
        if record["generation"] == 4:
            time.sleep(3)

    cfg = config(shared_tmp, "slow-hook", fault={"min_seconds": 1.0, "heartbeat_seconds": 0.5})
    assert hpcevo.run(cfg, quiet=True, hooks=slow_once).status == "complete"


@pytest.mark.ranks(1, 3)
def test_a_dynamic_hyper_parameter_changes_on_resume_as_set_params_changes_it(ctx, shared_tmp):
    """One rule: what Loop.set_params may change mid-run, `--resume --set` may change from the
    checkpoint on, to the bits of a hook that sets it at that generation; a static one is refused
    on resume, and the message says why."""
    @every_rank
    def at_4(record, loop):
        if record["generation"] == 4:
            loop.set_params(phi=0.25)

    hooked = hpcevo.run(config(shared_tmp, "hooked"), quiet=True, hooks=at_4)
    half = config(shared_tmp, "resumed")
    half["run"]["generations"] = 4
    hpcevo.run(half, quiet=True)
    half["run"]["generations"] = 8
    half["algorithm"]["phi"] = 0.25
    resumed = hpcevo.run(half, quiet=True, resume=True)
    assert resumed.summary["resumed_from"] == 4 and resumed.digest == hooked.digest
    assert list(hpcevo.open_run(resumed.run_dir).metrics["params.phi"])[-1] == 0.25
    half["algorithm"]["pop_size"] = 10
    with pytest.raises(hpcevo.UsageError, match=r"algorithm.pop_size: static, it shapes the compiled program; the "
                                                r"dynamic hyper-parameters of this algorithm, which may change: phi"):
        hpcevo.run({**half, "run": {**half["run"], "generations": 10}}, quiet=True, resume=True)
