"""Tasks handed out to groups of ranks as they ask: the dynamic balance of a study.

A dispatcher thread on the job's rank 0 holds the queue. Each group's leader reports the
outcome of its last task and asks for the next (one small message each way, on a communicator
of the queue's own); the group learns it with a broadcast. Groups that finish early take more,
so runs of different lengths balance themselves. The dispatcher polls and sleeps between
messages (its thread costs rank 0 nothing while it waits), and whoever waits for an answer
does the same, never spinning in MPI on a core another rank needs.

Events (a task given to a group, a task's outcome) reach ``on_event`` on rank 0, in the
dispatcher's thread, one at a time, in the order they happened: the one place that writes a
study's journal and prints its progress. An exception there halts the queue (no more tasks
are given) and ``close`` raises it on every rank.

Needs MPI_THREAD_MULTIPLE (mpi4py's default), since rank 0's main thread talks to its own
dispatcher like any leader does.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Sequence

from ..errors import UsageError
from .control import agree_on_error, arrive, bcast_from_root, receive
from .groups import Groups

_REQUEST, _REPLY = 31, 32
POLL_S = 0.002


class WorkQueue:
    """``tasks`` (any picklable values, given out in this order) for the groups of ``groups``.
    Collective over ``groups.world``: every rank creates it, and every rank calls ``close``."""

    def __init__(self, groups: Groups, tasks: Sequence[Any], on_event: Callable[[dict], None] | None = None,
                 kinds: dict[Any, tuple[Any, Any]] | None = None):
        """``kinds`` (rank 0's): task -> (its class, its kind). A group is given the first pending
        task of the head's class whose kind it has run before, else the head: a study's group
        takes the next run of a program it has loaded (class: the run's length, so longest
        first still holds), not one another group has."""
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise UsageError("a work queue needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default: "
                             "leave mpi4py.rc.thread_level as it is)")
        self.groups = groups
        self.comm = groups.world.comm_ctl.Dup()
        self._halted_here = False
        self._dispatcher: _Dispatcher | None = None
        if groups.world.is_root:
            self._dispatcher = _Dispatcher(self.comm, list(tasks), groups.count, on_event, kinds)
            self._dispatcher.start()

    def next(self, outcome: dict | None = None, halt: str | None = None) -> Any:
        """Collective in the group: its leader reports ``outcome`` (of the task it ran last;
        None the first time) and gets the next task, which every rank of the group returns.
        None: there is nothing more for this group (the queue is empty or halted). ``halt``:
        a reason to give out no more tasks to anyone (a stop signal, a fatal error)."""
        tasks = self.take([] if outcome is None else [outcome], halt, 1)
        return tasks[0] if tasks else None

    def take(self, outcomes: Sequence[dict] = (), halt: str | None = None, want: int = 1, kind: Any = None,
             busy: int = 0) -> list[Any]:
        """Collective in the group: its leader reports ``outcomes`` (of tasks that ended) and takes
        up to ``want`` more, the list every rank of the group returns. ``kind``: only tasks of
        this kind (``kinds``); None: the next task as ``next`` chooses it, then more of its kind
        (the runs of one program, for a batch). ``busy``: the tasks the group still runs; a
        group that asks with none left and is given none is done (it asks no more)."""
        if self.groups.ctx is None:
            raise UsageError("WorkQueue.take: this rank belongs to no group")
        tasks: list[Any] = []
        if self.groups.is_leader:
            if self._halted_here:
                return []
            self.comm.send(("take", self.groups.index, list(outcomes), halt, int(want), kind, int(busy)),
                           dest=0, tag=_REQUEST)
            tasks = receive(self.comm, 0, _REPLY)
            self._halted_here = not tasks and not busy
        return bcast_from_root(self.groups.ctx, tasks)

    def close(self) -> list[Any]:
        """Collective over the whole job, once every group has had its None from ``next``: the
        tasks never given out (on every rank). An exception ``on_event`` raised is raised on
        every rank (rank 0's own, the others a copy of its type and message)."""
        arrive(self.groups.world)  # (groups done early sleep here while the others finish)
        left, error = [], None
        if self._dispatcher is not None:
            self._dispatcher.join()
            left, error = list(self._dispatcher.pending), self._dispatcher.error
        left = bcast_from_root(self.groups.world, left)
        self.comm.Free()
        error = agree_on_error(self.groups.world, error)
        if error is not None:
            raise error
        return left


class _Dispatcher(threading.Thread):
    """Rank 0's thread: answers every group's requests until each group has been told None."""

    def __init__(self, comm: Any, tasks: list[Any], groups: int, on_event: Callable[[dict], None] | None,
                 kinds: dict[Any, tuple[Any, Any]] | None = None):
        super().__init__(name="hpcevo-work-queue", daemon=True)
        self.comm, self.pending, self.groups = comm, collections.deque(tasks), groups
        self.on_event = on_event
        self.kinds = kinds
        self.ran: dict[int, set] = {}  # group -> the kinds of task it has run
        self.halted: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from mpi4py import MPI

        done = 0
        status = MPI.Status()
        while done < self.groups:
            if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_REQUEST, status=status):
                time.sleep(POLL_S)
                continue
            source = status.Get_source()
            _, group, outcomes, halt, want, kind, busy = self.comm.recv(source=source, tag=_REQUEST)
            for outcome in outcomes:
                self._emit({"event": "end", "group": group, "time": time.time(), **outcome})
            if halt and not self.halted:
                self.halted = halt
                self._emit({"event": "halt", "group": group, "time": time.time(), "reason": halt})
            tasks: list[Any] = []
            of = kind  # (asked for none: the first as _take chooses, then more of its kind)
            while len(tasks) < want and not self.halted and self.pending:
                task = self._take(group) if of is None and not tasks else self._take_kind(group, of)
                if task is None:
                    break
                tasks.append(task)
                if of is None and self.kinds is not None:
                    of = self.kinds[task][1]
                self._emit({"event": "start", "group": group, "time": time.time(), "task": task})
            if not tasks and not busy:
                done += 1
            self.comm.send(tasks, dest=source, tag=_REPLY)

    def _take(self, group: int) -> Any:
        """The next task for ``group``: among the pending tasks of the head's class, the first of
        a kind it has run, else the first of a kind no group has taken yet, else the head."""
        if self.kinds is None:
            return self.pending.popleft()
        head_class = self.kinds[self.pending[0]][0]
        mine = self.ran.setdefault(group, set())
        taken = set().union(*self.ran.values())
        fresh = None
        for i, task in enumerate(self.pending):
            cls, kind = self.kinds[task]
            if cls != head_class:
                break
            if kind in mine:
                fresh = i
                break
            if fresh is None and kind not in taken:
                fresh = i
        i = fresh or 0
        task = self.pending[i]
        del self.pending[i]
        mine.add(self.kinds[task][1])
        return task

    def _take_kind(self, group: int, kind: Any) -> Any:
        """The first pending task of ``kind`` for ``group`` (None: none left; without kinds,
        every task is of one kind)."""
        for i, task in enumerate(self.pending):
            if self.kinds is None or self.kinds[task][1] == kind:
                del self.pending[i]
                if self.kinds is not None:
                    self.ran.setdefault(group, set()).add(kind)
                return task
        return None

    def _emit(self, event: dict) -> None:
        if self.on_event is None or self.error is not None:
            return
        try:
            self.on_event(event)
        except BaseException as e:  # noqa: BLE001 - every rank hears of it in close()
            self.error = e
            self.halted = self.halted or "error"
