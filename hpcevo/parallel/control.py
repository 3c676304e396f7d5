"""Host-side collectives on the control communicator: agreement, replica checks, metadata.

Each function is collective: every rank must call it, in the same order.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from ..errors import DivergenceError, UsageError, UserCodeExit, user_location
from .context import ON_DISCOVER, ParallelContext, real_exit

T = TypeVar("T")

# A rank that waits in a host-side collective (for rank 0 writing files, for a rank still
# compiling) spins this long, then sleeps between polls: MPICH waits by spinning, and ranks that
# share cores (more ranks than cores, a study's groups done before the others) would take the
# cores from the ranks still working. The jitted step's own collectives are not these: they spin.
SPIN_S = 0.002
NAP_S = 0.0005


def arrive(ctx: ParallelContext) -> None:
    """Collective: return once every rank has reached this point; a rank that waits long sleeps
    between polls rather than spinning in MPI."""
    if ctx.size > 1:
        wait(ctx.comm_ctl.Ibarrier())


def wait(request: Any) -> None:
    """Complete a non-blocking MPI request: spin ``SPIN_S``, then sleep ``NAP_S`` between polls."""
    start = time.monotonic()
    while not request.Test():
        if time.monotonic() - start > SPIN_S:
            time.sleep(NAP_S)


def receive(comm: Any, source: int, tag: int) -> Any:
    """The next object ``source`` sends with ``tag`` on ``comm`` (point to point), waiting as
    ``wait`` does: spin ``SPIN_S``, then sleep between polls."""
    start = time.monotonic()
    while not comm.Iprobe(source=source, tag=tag):
        if time.monotonic() - start > SPIN_S:
            time.sleep(NAP_S)
    return comm.recv(source=source, tag=tag)


def agree_on_error(ctx: ParallelContext, error: BaseException | None, *,
                   stranded_after: float | None = None) -> BaseException | None:
    """Share each rank's outcome of a step; return the first rank's error, on every rank.

    Used after work that could fail on some ranks only (a file missing on one node), so that
    every rank takes the same exit instead of some entering a collective the others never reach.

    ``stranded_after`` is for steps that call into another library's own collectives, which a
    rank may leave early on an error while the others wait inside for it forever: HDF5 1.10's
    parallel metadata flush is one (a rank whose share of the writes fails on a full disk skips
    the flush's closing barrier). Every rank then first enters a non-blocking barrier; a rank
    with an error waits for the others at most this many seconds, and if they do not all
    arrive it returns its own error with ``error.stranded = True`` without talking to them
    again. Nobody else can end the job then: the caller must report the error and call
    ``ctx.abort``. Ranks without an error wait without limit (the abort ends them).
    """
    if ctx.size == 1:
        return error
    if stranded_after is not None:
        arrived = ctx.comm_ctl.Ibarrier()
        if error is None:
            wait(arrived)
        else:
            deadline = time.monotonic() + stranded_after
            while not arrived.Test():
                if time.monotonic() > deadline:
                    error.stranded = True
                    return error
                time.sleep(0.005)
    else:
        arrive(ctx)
    # (type, message, the config key of a ConfigError): what it takes to raise it again elsewhere
    report = None if error is None else (type(error).__name__, str(error), getattr(error, "key", ""))
    reports = ctx.comm_ctl.allgather(report)
    for r, rep in enumerate(reports):
        if rep is not None:
            if error is not None and r == ctx.rank:
                return error
            return _rebuild(rep, r, ctx.rank)
    return None


# The code running now on some ranks only (a hook, on rank 0), or None: a collective called from
# it would wait for ranks that never join (a hang the watchdog ended 30 s later blaming "the
# problem's code"). Thread-local, as the hook runs on the run's own thread.
_ALONE: contextvars.ContextVar[str | None] = contextvars.ContextVar("hpcevo_alone", default=None)


@contextlib.contextmanager
def rank_local(what: str) -> Iterator[None]:
    """``what`` (e.g. "the hook log_to_wandb") runs on some ranks only: a collective call inside
    raises UsageError at once, on those ranks, instead of waiting for the others forever."""
    token = _ALONE.set(what)
    try:
        yield
    finally:
        _ALONE.reset(token)


def _not_alone(call: str) -> None:
    alone = _ALONE.get()
    if alone is not None:
        raise UsageError(f"{call} is collective (every rank of the run makes it), but {alone} runs on rank 0 alone: "
                         "the other ranks would never join it. Run it on every rank: hpcevo.hooks.every_rank(...) "
                         "(then it must do the same on every rank)")


@contextlib.contextmanager
def collective_stage(ctx: ParallelContext, *, stranded_after: float | None = None,
                     convert: Callable[[BaseException], BaseException] | None = None,
                     catch: type[BaseException] | tuple[type[BaseException], ...] = Exception) -> Iterator[None]:
    """Capture, agree, re-raise: the block may fail on some ranks only; afterwards every rank
    raises the first failing rank's error (``convert(error)`` when given), or none does.

        with collective_stage(ctx):
            if ctx.is_root:
                prepare_directory()        # an OSError on rank 0 reaches every rank

    The block's exception (of the ``catch`` types; others propagate on their own rank, as bugs
    do, to end the job) is caught and shared with ``agree_on_error`` (``stranded_after``: see
    there). Put a collective after the block, never inside it: a rank whose block failed early
    skips what follows in the block.
    """
    _not_alone("a collective step")
    error: BaseException | None = None
    try:
        yield
    except catch as e:  # any failure of these kinds must reach the other ranks
        error = e
    error = agree_on_error(ctx, error, stranded_after=stranded_after)
    if error is not None:
        raise convert(error) if convert is not None else error


def agreed(ctx: ParallelContext, what: str, check: Callable[[], T], canonical: Callable[[T], str] = repr,
           differ: Callable[[str, str], str] | None = None) -> T:
    """Collective: the input of a collective call, checked on every rank and agreed on.

    ``check()`` validates this rank's input and returns it (raising, typically ``UsageError``,
    when it is bad); afterwards either every rank has the same value (compared as
    ``canonical(value)``) and gets it back, or every rank raises the same error: the first
    failing rank's, or a UsageError saying which ranks were given something else than rank 0
    (``differ(rank 0's text, theirs)``: one line on how they differ; default: both).

    A rank given other input than the others (a seed, a generation count, a config file that
    exists on some nodes only) would otherwise compute something else or enter a different
    number of collectives, and leave the others waiting. Costs one Allreduce of 24 bytes when
    all is well; the ranks exchange more only to report what is wrong.
    """
    _not_alone(f"the call that agrees on {what}")
    value, error = None, None
    try:
        value = check()
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        error = e
    if ctx.size == 1:
        if error is not None:
            raise error
        return value  # type: ignore[return-value]
    text = canonical(value) if error is None else ""
    # (the call's name is hashed too: ranks that reached different collective calls learn it here)
    h = int.from_bytes(hashlib.sha256(f"{what}\0{text}".encode()).digest()[:7], "little")
    top = agree_max(ctx, [int(error is not None), h, -h])  # (any error, the largest, minus the smallest)
    if top[0]:
        raise agree_on_error(ctx, error)  # type: ignore[misc]
    if top[1] == -top[2]:
        return value  # type: ignore[return-value]
    calls = ctx.comm_ctl.allgather((what, text))
    other = [r for r, (w, _) in enumerate(calls) if w != calls[0][0]]
    if other:
        ctx.broken = True
        raise UsageError(f"the ranks are in different collective calls: rank 0 in {calls[0][0]}, rank"
                         f"{'s' if len(other) > 1 else ''} {', '.join(map(str, other))} in {calls[other[0]][0]}. Every "
                         "rank must make the same collective calls in the same order (a call made on some ranks "
                         "only, under `if rank == 0:`, waits for the others)")
    texts = [t for _, t in calls]
    odd = [r for r, t in enumerate(texts) if t != texts[0]]
    detail = differ(texts[0], texts[odd[0]]) if differ else f"rank 0 has {_short(texts[0])}, rank {odd[0]} has {_short(texts[odd[0]])}"
    raise UsageError(f"{what} differs between ranks (rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                     f"against rank 0): {detail}. A collective call needs the same input on every rank")


def agree_same(ctx: ParallelContext, value: str, what: str, differ: Callable[[str, str], str] | None = None) -> None:
    """Collective: UsageError on every rank unless every rank passed the same ``value`` (see
    ``agreed``)."""
    agreed(ctx, what, lambda: value, str, differ)


def _short(text: str, limit: int = 120) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + " ..."


# -- code of the user's: a process that ends itself must end the job, not hang it ----------------
_GUARDS: list[tuple[ParallelContext, str, int]] = []  # (ctx, what runs, pid that entered)


@contextlib.contextmanager
def user_code(ctx: ParallelContext, what: str) -> Iterator[None]:
    """Run code of the user's (``what``: "problem 'f'", "the problem") so that it cannot end its
    process silently while the other ranks wait for it in a collective:

    * ``sys.exit`` (a ``SystemExit`` out of the block, from any thread of it) becomes
      ``UserCodeExit`` naming the rank and the user's line; run the block inside
      ``collective_stage`` and every rank raises it (or see ``HostEngine``, which carries it
      through the generation's gather).
    * ``os._exit`` cannot be caught: while the block runs, a call of it from this process prints
      one message naming the rank and what ran, then ends the whole job (MPI_Abort) with
      ``UserCodeExit``'s exit code. A forked child's ``os._exit`` is left alone.
    """
    _GUARDS.append((ctx, what, os.getpid()))
    os._exit = _guarded_exit  # type: ignore[assignment]
    try:
        yield
    except SystemExit as e:
        where = user_location(e)
        raise UserCodeExit(f"{what} called sys.exit({e.code!r}) on rank {ctx.rank}"
                           + (f" ({where})" if where else "") + ": code run by hpcevo must return "
                           "a value or raise an exception, not end the process") from None
    finally:
        _GUARDS.pop()
        if not _GUARDS:
            os._exit = real_exit  # type: ignore[assignment]


def _guarded_exit(code: int) -> None:
    if not _GUARDS or _GUARDS[-1][2] != os.getpid():
        real_exit(code)
    ctx, what, _ = _GUARDS[-1]
    print(f"hpcevo: error: {what} called os._exit({code}) on rank {ctx.rank} ({ctx.host}): code run by "
          "hpcevo must return a value or raise an exception; ending the job", file=sys.stderr, flush=True)
    if ctx.size > 1:
        ctx.abort(UserCodeExit.exit_code)
    real_exit(UserCodeExit.exit_code)


def _rebuild(report: tuple[str, str, str], origin: int, me: int) -> BaseException:
    from .. import errors

    name, text, key = report
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = RuntimeError
    error = cls(text if origin == me else f"{text} (reported by rank {origin})")
    if key:
        error.key = key
    return error


def check_replicas(ctx: ParallelContext, fingerprint: np.ndarray, generation: int) -> None:
    """Raise DivergenceError on every rank if the replicated state differs between ranks."""
    if ctx.size == 1:
        return
    mine = np.ascontiguousarray(fingerprint, dtype=np.uint32)
    everyone = np.empty((ctx.size, mine.size), np.uint32)
    arrive(ctx)
    ctx.comm_ctl.Allgather(mine, everyone)
    differs = [r for r in range(ctx.size) if not np.array_equal(everyone[r], everyone[0])]
    if differs:
        raise DivergenceError(
            f"replicated algorithm state diverged at generation {generation}: ranks "
            f"{', '.join(map(str, differs))} differ from rank 0. The run cannot be trusted; "
            "this is a bug in a non-deterministic problem or algorithm, please report it."
        )


def agree_max(ctx: ParallelContext, values) -> np.ndarray:
    """Element-wise maximum over ranks of a small int64 vector: one Allreduce.

    Lets ranks turn local, possibly different, observations (a signal arrived here, my clock says
    the deadline is near) into one decision that every rank takes at the same generation.
    """
    mine = np.ascontiguousarray(values, dtype=np.int64)
    if ctx.size == 1:
        return mine.copy()
    from mpi4py import MPI

    out = np.empty_like(mine)
    arrive(ctx)
    ctx.comm_ctl.Allreduce(mine, out, op=MPI.MAX)
    return out


def allgather_obj(ctx: ParallelContext, obj: Any) -> list[Any]:
    if ctx.size == 1:
        return [obj]
    arrive(ctx)
    return ctx.comm_ctl.allgather(obj)


def gather_to_root(ctx: ParallelContext, obj: Any) -> list[Any] | None:
    if ctx.size == 1:
        return [obj]
    arrive(ctx)
    return ctx.comm_ctl.gather(obj, root=0)


def bcast_from_root(ctx: ParallelContext, obj: Any) -> Any:
    if ctx.size == 1:
        return obj
    arrive(ctx)
    return ctx.comm_ctl.bcast(obj, root=0)


def barrier(ctx: ParallelContext) -> None:
    arrive(ctx)


@contextlib.contextmanager
def abort_if_stuck(ctx: ParallelContext, seconds: float, code: int, message: str) -> Iterator[None]:
    """End the whole job if the block has not returned after ``seconds``.

    For a block that enters another library's collective after an error is already known, where
    the error can leave ranks waiting inside the library in different collectives (HDF5 1.10's
    close of a file whose metadata cannot be written). Nothing at the Python level can reach
    them there; a thread can, since the library waits with the GIL released. Rank 0 reports
    ``message``; the others wait a few seconds longer, so that its report comes first, and end
    the job silently (when rank 0 is not stuck, it has already reported through the CLI).
    """
    if ctx.size == 1:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds if ctx.is_root else seconds + 5.0):
            return
        if ctx.is_root:
            print(f"hpcevo: error: {message}", file=sys.stderr, flush=True)
        ctx.abort(code)

    threading.Thread(target=watch, name="hpcevo-abort-if-stuck", daemon=True).start()
    try:
        yield
    finally:
        done.set()


# -- the end of the program: one more collective call -------------------------------------------
END_OF_PROGRAM = "the end of the program (no more collective calls on this rank)"
_END = {"skip": False}


def skip_end_agreement() -> None:
    """For a program whose ranks end together by construction (hpcevo's command line, whose
    ranks take one agreed exit): no agreement at exit. (With it, MPICH's mpiexec reported exit
    code 0 for ranks that exited 75 after a forwarded SIGUSR1, one launch in three.)"""
    _END["skip"] = True


def _end_together(ctx: ParallelContext) -> None:
    """At exit, every rank agrees that it is ending, as one more collective call. A program that
    makes a collective call on some ranks only (``loop.ask()`` under ``if rank == 0:``) left
    that rank waiting forever while the others ended in MPI_Finalize; now it is told, at once,
    which ranks ended (``agreed``: "ranks are in different collective calls"), and raises there.
    The ranks ending say nothing (the message belongs where the call was made) and go on to
    MPI_Finalize, which that rank's uncaught error ends with MPI_Abort."""
    from mpi4py import MPI

    if ctx.broken or _END["skip"] or MPI.Is_finalized():
        return
    try:
        agreed(ctx, END_OF_PROGRAM, lambda: None, lambda _: "")
    except (UsageError, MPI.Exception):
        pass


def _at_exit(ctx: ParallelContext) -> None:
    import atexit

    atexit.register(_end_together, ctx)  # (after mpi4py's own: runs before MPI_Finalize)


ON_DISCOVER.append(_at_exit)
