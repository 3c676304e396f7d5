"""Work outside JIT spread over the ranks: tasks run by worker threads, results gathered by index.

A *task* is a fixed piece of work (for host problems: a fixed slice of the population), so its
result never depends on which rank ran it; results are placed by task index, and the assembled
whole is the same at any rank count and under either schedule:

* ``static``: rank r runs a contiguous block of the tasks (``shard_of``), in order;
* ``dynamic``: ranks take tasks one at a time from a shared counter, so a rank that drew cheap
  tasks takes more of them. For evaluations whose cost varies between candidates.

On each rank ``concurrency`` worker threads run tasks at the same time (a rank waiting for
simulator processes needs no core of its own for that); only the calling thread talks MPI.

Why the shared counter is a dispatcher on rank 0 and not an MPI-3 RMA counter
(``MPI_Fetch_and_op`` on a window): passive-target RMA progresses only when the target process
calls into MPI, unless the network does atomics in hardware or MPI runs an asynchronous progress
thread. Rank 0 spends the generation waiting for its own evaluations, outside MPI, so the other
ranks' fetch-and-ops would stall until it is done, quietly turning the dynamic schedule back into
a static one on exactly the networks (TCP, shared memory without shm windows) where nothing is
done in hardware. A dispatcher needs nothing but point-to-point messages, which every MPI
progresses: rank 0's calling thread answers requests (its worker threads evaluate, taking tasks
from the same counter under a lock), a request costs one round trip (microseconds on a node),
negligible next to the evaluations a dynamic schedule is for (milliseconds to hours).
Waiting is a ``Test`` loop with a short sleep, not a blocking receive: MPICH's blocking calls
spin a core, which the evaluations on the same node need.

Every function here is collective over the ranks of ``ctx``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Literal

import numpy as np

from .context import ParallelContext
from .evaluate import shard_of

Schedule = Literal["static", "dynamic"]
SCHEDULES = ("static", "dynamic")

_ASK, _TASK = 1, 2  # message tags: a rank asks rank 0 for a task; rank 0 replies with one
_DONE = -1  # the reply when no task is left
_POLL_MAX_S = 5e-4  # longest sleep between two tests of a pending message (latency vs. CPU)


class TaskRunner:
    """Runs ``fn(task)`` for ``task`` in ``range(num_tasks)`` over the ranks; see the module doc.

    Create it on every rank (collective: a dynamic runner duplicates a communicator, so the
    dispatcher's messages can never meet anyone else's) and ``close`` it on every rank.
    """

    def __init__(self, ctx: ParallelContext, concurrency: int = 1, schedule: Schedule = "static"):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        self.ctx, self.concurrency, self.schedule = ctx, concurrency, schedule
        # One static task at a time needs no thread: it runs in the calling thread.
        threads = concurrency if (concurrency > 1 or schedule == "dynamic") else 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="hpcevo-task") if threads else None
        self._comm = ctx.comm_ctl.Dup() if schedule == "dynamic" and ctx.size > 1 else None

    def map(self, num_tasks: int, fn: Callable[[int], Any]) -> dict[int, Any]:
        """Run every task once, somewhere; return ``{task: fn(task)}`` for the tasks run here.

        ``fn`` should turn a failed evaluation into a result; an exception from it (a bug) is
        raised on the rank that ran it, which then leaves the others waiting in MPI: the caller
        ends the job (the CLI prints the traceback and calls MPI_Abort). Collective: every rank
        calls it with the same ``num_tasks``.
        """
        if self.schedule == "static":
            first, count = shard_of(num_tasks, 1, self.ctx.size, self.ctx.rank)
            tasks = range(first, first + count)
            if self._pool is None:
                return {t: fn(t) for t in tasks}
            return self._run_local(_counter(tasks), fn)
        if self.ctx.size == 1:
            return self._run_local(_counter(range(num_tasks)), fn)
        if self.ctx.is_root:
            return self._dispatch(num_tasks, fn)
        return self._request(fn)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def _start_workers(self, take: Callable[[], int], fn, results: dict) -> list[Future]:
        """``concurrency`` threads, each running tasks until ``take`` has none left."""
        def worker() -> None:
            while (t := take()) != _DONE:
                results[t] = fn(t)

        return [self._pool.submit(worker) for _ in range(self.concurrency)]

    def _run_local(self, take: Callable[[], int], fn) -> dict[int, Any]:
        results: dict[int, Any] = {}
        _finish(self._start_workers(take, fn, results))
        return results

    # -- dynamic, rank 0: answer the others' requests while its own workers run ----------------
    def _dispatch(self, num_tasks: int, fn) -> dict[int, Any]:
        from mpi4py import MPI

        take = _counter(range(num_tasks))
        results: dict[int, Any] = {}
        workers = self._start_workers(take, fn, results)
        asked, reply, status = np.zeros(1, np.int64), np.zeros(1, np.int64), MPI.Status()
        waiting = self.ctx.size - 1  # ranks not yet told that no task is left
        try:
            while waiting:
                _wait(self._comm.Irecv(asked, MPI.ANY_SOURCE, _ASK), status)
                reply[0] = take()
                self._comm.Send(reply, status.Get_source(), _TASK)
                waiting -= int(reply[0] == _DONE)
        except BaseException:
            _abandon(workers)
            raise
        _finish(workers)
        return results

    # -- dynamic, other ranks: ask rank 0 for a task whenever a worker is free -----------------
    def _request(self, fn) -> dict[int, Any]:
        from mpi4py import MPI

        ask, reply = np.zeros(1, np.int64), np.zeros(1, np.int64)
        running: dict[Future, int] = {}
        results: dict[int, Any] = {}
        done = False
        try:
            while True:
                while not done and len(running) < self.concurrency:
                    self._comm.Send(ask, 0, _ASK)
                    _wait(self._comm.Irecv(reply, 0, _TASK), MPI.Status())
                    if reply[0] == _DONE:
                        done = True
                    else:
                        running[self._pool.submit(fn, int(reply[0]))] = int(reply[0])
                if not running:
                    return results
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    results[running.pop(f)] = f.result()
        except BaseException:
            _abandon(list(running))
            raise


def _counter(tasks: range) -> Callable[[], int]:
    """A thread-safe source of the tasks in ``tasks``, in order, then ``_DONE``."""
    lock, it = threading.Lock(), iter(tasks)

    def take() -> int:
        with lock:
            return next(it, _DONE)

    return take


def _finish(futures: list[Future]) -> None:
    """Wait for every future, then raise the first exception among them (waiting first: a
    failure on one thread must not leave the others running unobserved)."""
    wait(futures)
    for f in futures:
        if f.exception() is not None:
            raise f.exception()


def _abandon(futures: list[Future]) -> None:
    """On the way out with an error: drop what has not started. Running tasks are not waited
    for (a simulator may run for hours); their owner stops them (``HostProblem.cancel``)."""
    for f in futures:
        f.cancel()


def _wait(request, status) -> None:
    """Complete ``request`` without spinning a core: test, then sleep a little longer each time."""
    delay = 0.0
    while not request.Test(status):
        time.sleep(delay)
        delay = min(max(2 * delay, 1e-5), _POLL_MAX_S)


def allgather_rows(ctx: ParallelContext, n: int, index: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ``(n, ...)`` array whose row ``index[i]`` is ``rows[i]``, assembled from every rank's
    rows, on every rank (``MPI_Allgatherv``: ranks may hold any number of rows, none included).

    Each of the n indices must come from exactly one rank; ``rows`` must have the same trailing
    shape and dtype on every rank. Collective.
    """
    index = np.ascontiguousarray(index, np.int64).reshape(-1)
    rows = np.ascontiguousarray(rows)
    if rows.shape[0] != index.size:
        raise ValueError(f"allgather_rows: {index.size} indices but {rows.shape[0]} rows")
    counts = np.array([index.size], np.int64)
    if ctx.size > 1:
        counts = np.zeros(ctx.size, np.int64)
        ctx.comm_ctl.Allgather(np.array([index.size], np.int64), counts)
    if counts.sum() != n:  # every rank sees the same counts, so every rank raises
        raise RuntimeError(f"allgather_rows: the ranks hold {counts.sum()} rows in all, expected {n}")
    if ctx.size == 1:
        all_index, all_rows = index, rows
    else:
        from mpi4py import MPI

        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        all_index = np.empty(n, np.int64)
        ctx.comm_ctl.Allgatherv(index, [all_index, counts, displs, MPI.INT64_T])
        row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        all_rows = np.empty((n, *rows.shape[1:]), rows.dtype)
        ctx.comm_ctl.Allgatherv([rows, MPI.BYTE], [all_rows, counts * row_bytes, displs * row_bytes, MPI.BYTE])
    if not np.array_equal(np.sort(all_index), np.arange(n)):
        raise RuntimeError(f"allgather_rows: the indices gathered are not each of 0..{n - 1} exactly once")
    out = np.empty_like(all_rows)
    out[all_index] = all_rows
    return out
