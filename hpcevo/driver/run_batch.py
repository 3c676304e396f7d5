"""Runs of one program driven together: what a study's group runs at once (``studies.runner``).

Each run is what ``execute`` makes of its config alone: its own ``Run`` (directory, metrics,
checkpoints, COCO data, limits, stop decisions, summary), driven boundary by boundary
(``execute.Drive``). Between boundaries, the generations of every active run are one ``Batch``
dispatch: each run's own compiled programs, back to back, the host waiting once for all, so each
run keeps **bitwise the digest of the same config run alone**, whatever its batch-mates, its
slot or the batch's size. At its own boundaries a run logs, polls the stop request, checkpoints
and ends exactly as alone; a run that fails (its start, a boundary, its summary) is recorded
alone and its batch-mates go on. Runs join between dispatches: a study fills the slot of a run
that ended with the next pending run of the program.

Runs that cannot share a dispatch (a host problem, islands) are advanced one by one; the study
gives such a program batches of one (``batchable``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from ..config import RunConfig
from ..errors import CheckpointError, DivergenceError, UsageError
from ..hooks import Hooks
from ..parallel import ParallelContext, agree_max
from ..parallel.watchdog import Watchdog
from . import build, startup
from .batch import Batch
from .engine import DeviceEngine
from .execute import Drive, Held, Run, RunOptions
from .loop import Loop
from .policy import PhaseLimits

# A run that fails on its own: recorded failed, its batch-mates go on (a study's verdict on a
# run, as for a run alone). A CheckpointError that strands ranks inside HDF5 ends the job.
RUN_ERRORS = (UsageError, DivergenceError, CheckpointError)

# The share of the memory left free (the host's, or the accelerator's) a batch's states may take.
MEMORY_SHARE = 0.25
UNKNOWN = 1 << 62  # (free memory not known: no bound)


@dataclasses.dataclass
class Ended:
    """A run of the batch that ended: its summary (``execute``'s), or the error that failed it."""

    tag: Any
    summary: dict[str, Any] | None
    error: BaseException | None
    wall_s: float


@dataclasses.dataclass
class _Member:
    drive: Drive
    stack: contextlib.ExitStack
    tag: Any
    t0: float
    first_pending: bool  # (a resumed run: its first dispatch is its start-up's last phase)


def batchable(loop: Any) -> bool:
    """Whether a run's loop can share a dispatch: one population on a device problem."""
    return isinstance(loop, Loop) and isinstance(loop._family, DeviceEngine)


class RunBatch:
    """Runs of one program (``StudyRun.program``: one JAX mode, one ``[fault]``), added with
    ``add`` and advanced with ``step``, on the ranks of ``ctx``. Collective: every rank of
    ``ctx`` makes the same calls with the same configs."""

    def __init__(self, ctx: ParallelContext):
        self.ctx = ctx
        self.members: list[_Member] = []
        self.batchable: bool | None = None  # known once its first run started
        self.state_bytes = 0  # one run's state (its first's)
        self._stack = contextlib.ExitStack()  # the batch's JAX mode and watchdog
        self._dog: Watchdog | None = None
        self._limits: PhaseLimits | None = None  # its dispatches'
        self._batches: dict[int, Batch] = {}  # by family: the loops of one program dispatched together
        self._free = UNKNOWN  # bytes free for the states (the group's least), once its first run started

    def __len__(self) -> int:
        return len(self.members)

    def add(self, cfg: RunConfig, tag: Any, options: RunOptions) -> list[Ended]:
        """Start the run of ``cfg`` (``tag``: the caller's name for it), to its first boundary.
        Returns it, ended, where it failed or ended there; else it is a member until ``step``
        ends it."""
        if self._dog is None:
            self._stack.enter_context(build.jax_mode(cfg))
            self._dog = self._stack.enter_context(Watchdog.start(
                self.ctx, heartbeat_seconds=cfg.fault.heartbeat_seconds, enabled=cfg.fault.watchdog))
            self._limits = PhaseLimits(cfg.fault)
        dog, t0 = self._dog, time.time()
        startup.begin_run()
        limits = PhaseLimits(cfg.fault)
        dog.arm("start-up", *limits.startup())
        try:
            run = Run.start(self.ctx, cfg, Held(), options)  # (its own failure closes what it opened)
        except RUN_ERRORS as e:
            return [self._failed(tag, e, t0)]
        finally:
            dog.disarm()
        member = _Member(Drive(run, dog, limits, Hooks()), contextlib.ExitStack(), tag, t0,
                         run.resumed_at is not None)
        try:
            member.stack.enter_context(run.stop)
            dog.arm("compiling and the first generation", *limits.compile())
            run.compile()
            member.drive.open(member.stack)
            run.startup = startup.phases()
            if self.batchable is None:
                self.batchable = batchable(run.loop)
                self.state_bytes = _nbytes(run.loop.state) if self.batchable else 0
                # (the least free memory of the group's ranks: every rank must size it alike)
                free = _free_memory(self.ctx)
                self._free = -int(agree_max(self.ctx, [-(UNKNOWN if free is None else free)])[0])
            going = member.drive.boundary()
        except RUN_ERRORS as e:
            return [self._fail(member, e)]
        except BaseException:
            self._drop(member)
            raise
        finally:
            dog.disarm()
        if not going:
            return [self._end(member)]
        self.members.append(member)
        return []

    def step(self) -> list[Ended]:
        """One dispatch of every member's generations up to the nearest boundary among them, then
        the boundaries reached; the members that ended there (or failed)."""
        if not self.members:
            return []
        assert self._dog is not None and self._limits is not None
        members, dog = list(self.members), self._dog
        n = min(m.drive.target - m.drive.gen for m in members)
        first = min(m.drive.gen for m in members)
        dog.arm(f"generations {first + 1}-{first + n} of {len(members)} run{'s' if len(members) > 1 else ''}",
                *self._limits.dispatch(n))
        ended: list[Ended] = []
        # (a host problem's failed evaluations, recorded after the dispatch: those it added)
        failures = {id(m): len(getattr(m.drive.run.loop, "failures", ())) for m in members}
        t = time.perf_counter()
        for group in self._dispatch_groups(members):
            for m in group:
                m.drive.run.compiled_in_dispatch = False
            try:
                if len(group) > 1 or batchable(group[0].drive.run.loop):
                    self._batch_of(group).advance(n)
                else:
                    group[0].drive.run.loop.advance(n)
            except RUN_ERRORS as e:  # (a dispatch's error: its runs', each recorded with it)
                ended += [self._fail(m, e) for m in group]
        seconds = time.perf_counter() - t
        live = [m for m in members if m in self.members]
        if not any(m.drive.run.compiled_in_dispatch for m in live):
            self._limits.note_dispatch(n, seconds)
        try:
            for m in live:
                run = m.drive.run
                try:
                    run.took(seconds, failures[id(m)])
                    if m.first_pending:  # (a resumed run's first generations end its start-up)
                        m.first_pending = False
                        run.startup = startup.phases()
                    m.drive.advanced(n, seconds, note=False)  # (the batch's dispatch: its chunk)
                    if m.drive.gen < m.drive.target and run.loop.check_limits() is None:
                        continue  # (not at a boundary of its own yet)
                    if not m.drive.boundary():
                        ended.append(self._end(m))
                except RUN_ERRORS as e:
                    ended.append(self._fail(m, e))
        finally:
            dog.disarm()
        return ended

    def close(self) -> None:
        """Every member's run directory closed as after an error (a run not begun is set back),
        the batch's watchdog stopped. After an exception, or at the end (no members left)."""
        for m in list(self.members):
            self._drop(m)
        self._stack.close()

    def capacity(self, wanted: int) -> int:
        """At most ``wanted`` runs, and as many as the memory left free holds (``MEMORY_SHARE``
        of it, for the states of the runs)."""
        if not self.batchable:
            return 1
        if self._free >= UNKNOWN or not self.state_bytes:
            return wanted
        return max(1, min(wanted, int(MEMORY_SHARE * self._free // self.state_bytes)))

    # -- the members -------------------------------------------------------------------------------
    def _dispatch_groups(self, members: list[_Member]) -> list[list[_Member]]:
        groups: dict[int, list[_Member]] = {}
        for m in members:
            loop = m.drive.run.loop
            key = id(loop._family) if batchable(loop) else id(m)
            groups.setdefault(key, []).append(m)
        return list(groups.values())

    def _batch_of(self, group: list[_Member]) -> Batch:
        loops = [m.drive.run.loop for m in group]
        key = id(loops[0]._family)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = Batch(loops)
        else:
            batch.loops = loops  # (members join and leave between dispatches: Batch allows it)
        return batch

    def _end(self, m: _Member) -> Ended:
        """The member's run finished (or stopped): its outcome, its files closed, its summary."""
        run = m.drive.run
        try:
            outcome = m.drive.outcome()
            m.stack.close()
            summary = m.drive.finish(outcome)
        except RUN_ERRORS as e:
            return self._fail(m, e)
        except BaseException:
            self._drop(m)
            raise
        self._forget(m)
        run.rundir.close()
        return Ended(m.tag, summary, None, time.time() - m.t0)

    def _fail(self, m: _Member, error: BaseException) -> Ended:
        self._drop(m, error)
        return self._failed(m.tag, error, m.t0)

    def _failed(self, tag: Any, error: BaseException, t0: float) -> Ended:
        if isinstance(error, CheckpointError) and error.stranded:
            raise error  # (the other ranks are stuck inside HDF5: the job must end)
        return Ended(tag, None, error, time.time() - t0)

    def _drop(self, m: _Member, error: BaseException | None = None) -> None:
        """The member's files closed as ``execute`` closes them after an error."""
        self._forget(m)
        run = m.drive.run
        try:
            if error is not None:
                m.stack.__exit__(type(error), error, error.__traceback__)
            else:
                m.stack.close()
        finally:
            run.rundir.abandon()
            run.rundir.close()

    def _forget(self, m: _Member) -> None:
        if m in self.members:
            self.members.remove(m)


def _nbytes(state: Any) -> int:
    import jax

    return int(sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree_util.tree_leaves(state)))


def _free_memory(ctx: ParallelContext) -> int | None:
    """Bytes free where the states live: the accelerator's (JAX's memory statistics), else the
    host's (MemAvailable, shared by the ranks on it)."""
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - a backend without statistics
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    per_node = max(1, getattr(ctx, "local_size", 1) or 1)
                    return int(line.split()[1]) * 1024 // per_node
    except OSError:
        pass
    return None
