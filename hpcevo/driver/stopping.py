"""When to stop early: signals from the scheduler or the user, and wall-clock deadlines.

Nothing here acts: handlers only set a flag, and the driver looks at it at the next chunk
boundary, where all ranks agree on it with one collective (``StopControl.poll``) and stop at the
same generation with a checkpoint.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import subprocess
import threading
import time
from typing import Protocol

from ..config import parse_deadline
from ..errors import UsageError
from ..parallel import ParallelContext, agree_max, bcast_from_root, collective_stage


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopSource(Protocol):
    """What a run polls for a stop request: ``signum`` (0: none) and a context in which it is
    listening. ``StopFlag`` listens to signals; a test or a program can hand in its own."""

    signum: int

    def __enter__(self) -> "StopSource": ...

    def __exit__(self, *exc) -> None: ...


class StopFlag:
    """Records the first stop signal this process receives.

    SIGTERM (scheduler preemption / ``scancel``), SIGUSR1 (Slurm's ``--signal`` warning) and SIGINT
    (Ctrl-C) ask for a checkpoint and a clean exit. A second SIGINT means "now": it raises
    KeyboardInterrupt, which ends the job without a checkpoint.

    Python lets only the main thread install signal handlers: used from another thread (a run
    started in a ``threading.Thread``), a StopFlag installs none and never fires; the signals
    keep whatever handlers the main thread gave them. A stop source of one's own still works there.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}
        self._depth = 0

    def install(self) -> "StopFlag":
        """Nested installs of one flag (a study's, then each of its runs', which may overlap) keep
        the handlers found by the outermost: the last ``uninstall`` puts those back. (Before,
        an inner install saved the flag's own handler as "previous": after ``hpcevo.study``
        returned, Ctrl-C in the user's script only set the flag instead of interrupting.)"""
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal would raise ValueError: signals are the main thread's
        self._depth += 1
        if self._depth == 1:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread() or not self._depth:
            return
        self._depth -= 1
        if self._depth:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.signum:
            self.signum = signum

    def __enter__(self) -> "StopFlag":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def scheduler_end_time(env: dict[str, str] | None = None, timeout: float = 5.0) -> float | None:
    """The job's end time as an epoch time when the batch system says so, else None.

    Slurm 23.02+ exports SLURM_JOB_END_TIME; older Slurm answers ``squeue -o %e``. Other
    schedulers: the job script passes --deadline (the templates in jobs/ do).
    """
    env = os.environ if env is None else env
    raw = env.get("SLURM_JOB_END_TIME", "")
    if raw.isdigit():
        return float(raw)
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True,
                             timeout=timeout).stdout.strip()
        return datetime.datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None  # no squeue, "N/A", "Unknown": no end time known


class Deadline:
    """Decides when a run must stop to leave time for its last checkpoint.

    It stops when what is left is less than the margin plus twice the longest dispatch and
    checkpoint seen so far: the next chunk and the checkpoint after it must both still fit.
    """

    def __init__(self, at: float | None, margin: float, source: str = ""):
        self.at, self.margin, self.source = at, margin, source
        self.longest_chunk = 0.0
        self.longest_checkpoint = 0.0

    def note_chunk(self, seconds: float) -> None:
        self.longest_chunk = max(self.longest_chunk, seconds)

    def note_checkpoint(self, seconds: float) -> None:
        self.longest_checkpoint = max(self.longest_checkpoint, seconds)

    def due(self, now: float | None = None) -> bool:
        if self.at is None:
            return False
        now = time.time() if now is None else now
        return self.at - now < self.margin + 2.0 * (self.longest_chunk + self.longest_checkpoint)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank agreed on at a boundary."""

    signum: int  # a stop signal some rank received (0: none)
    late: bool  # the deadline is near on some rank's clock
    time_due: bool  # checkpoint.every_seconds has passed on some rank's clock
    chunk: int  # the next dispatch's length: the least any rank asked for
    soon: bool = False  # a checkpoint now would exceed the default's share of the run (StopControl)

    @property
    def stop(self) -> bool:
        return bool(self.signum or self.late)

    @property
    def why(self) -> str:
        return signal_name(self.signum) if self.signum else "the deadline"


class StopControl:
    """Signals, the deadline and the checkpoint clock, turned into one decision that every rank
    takes at the same generation: one collective (``agree_max``) per boundary."""

    def __init__(self, ctx: ParallelContext, source: StopSource, deadline: Deadline,
                 every_seconds: float = 0.0, share: float = 0.0):
        """``share``: with the default ``checkpoint.every``, the most of a run's time its checkpoints
        by generation count may take (0: no limit): such a checkpoint comes no sooner than
        ``1 / share`` times the last one's writing time after it."""
        self.ctx, self.source, self.deadline, self.every_seconds = ctx, source, deadline, every_seconds
        self.share, self.last_write_s = share, 0.0
        self.last_checkpoint = time.monotonic()

    def __enter__(self) -> "StopControl":
        self.source.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.source.__exit__(*exc)

    def poll(self, chunk: int) -> Decision:
        """Collective: what every rank agrees on now (``chunk``: the length this rank wants)."""
        since = time.monotonic() - self.last_checkpoint
        time_due = bool(self.every_seconds) and since >= self.every_seconds
        soon = bool(self.share) and since * self.share < self.last_write_s
        signum, late, due, neg_chunk, too_soon = agree_max(
            self.ctx, [self.source.signum, self.deadline.due(), time_due, -chunk, soon])
        return Decision(int(signum), bool(late), bool(due), int(-neg_chunk), bool(too_soon))

    def checkpoint_written(self, seconds: float) -> None:
        self.last_checkpoint = time.monotonic()
        self.last_write_s = seconds
        self.deadline.note_checkpoint(seconds)


def find_deadline(ctx: ParallelContext, given: str | None, configured: str | int | None, margin: float,
                  now: float) -> Deadline:
    """The earliest of ``given`` (--deadline), ``configured`` (checkpoint.deadline) and the
    scheduler's end time: rank 0's reading of them, broadcast, since every rank must stop at the
    same generation. Collective; UsageError for a --deadline that cannot be read."""
    found: tuple[float, str] | None = None
    with collective_stage(ctx):
        if ctx.is_root:
            candidates = []
            if given is not None:
                try:
                    candidates.append((parse_deadline(given, now), f"--deadline {given}"))
                except ValueError as e:
                    raise UsageError(f"--deadline: {e}") from None
            if configured is not None:
                candidates.append((parse_deadline(configured, now), f"checkpoint.deadline = {configured!r}"))
            end = scheduler_end_time()
            if end is not None:
                candidates.append((end, "the batch job's end time"))
            found = min(candidates) if candidates else None
    found = bcast_from_root(ctx, found)
    return Deadline(found[0] if found else None, margin, found[1] if found else "")
