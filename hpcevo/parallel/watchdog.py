"""A watchdog on every rank: a job whose rank stopped answering ends in seconds, not minutes.

A rank whose node dies leaves the others inside a blocking collective (the fitness Allgather in
the jitted step, or a call of the host's) that nothing at the Python level can interrupt, and
that MPI over TCP does not end on its own: they wait until the scheduler notices the node,
SlurmdTimeout + KillWait later (330 s with Slurm's defaults), every rank of the allocation idle.

Each rank runs a daemon thread (it runs while the main thread waits in MPI or XLA, which
release the GIL). The run tells it which phase it is in and how long that phase may take
(``arm``); the driver derives the allowances from measured phase times and the ``[fault]``
settings (``driver/policy.py``'s ``PhaseLimits``). A phase that overruns ends the job with
``EXIT_PEER_LOST`` (76), which the job scripts read as "relaunch on the nodes that are left".

Heartbeats, a UDP datagram every ``heartbeat_seconds`` from every rank to two listeners (rank 0
and a deputy: the first rank on another host), let the message name the ranks and hosts that
stopped answering. They never end a job by themselves: a rank whose thread cannot run (a long
call that holds the GIL) would look dead. A rank is named silent only when a heartbeat of its
came before and none for ``SILENT_BEATS`` periods since, so a network that drops them (a
firewall, a host name that resolves to loopback) names no one rather than the wrong ones.

Who speaks: rank 0, or the deputy where rank 0 is silent. The speaker prints one message (the
phase, how long it ran, its limit and where the limit came from, the silent ranks and hosts),
writes the exit code to ``$HPCEVO_EXIT_FILE`` and the lost hosts, one per line, to
``$HPCEVO_EXIT_FILE.lost`` (the job script excludes them when it relaunches), and calls
MPI_Abort. Every other rank whose own limit has passed waits ``SPEAK_GRACE`` seconds for that
abort; where it has not come (the speaker is gone, or its own measured limit is longer), that rank
speaks and aborts itself, so a job never ends without its message; a launcher that cannot reach a
dead node may never end the ranks (srun waits for it), which is why every speaker also exits by
itself ``ABORT_BACKSTOP`` seconds after its abort.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..launcher import launcher_rank
from .context import ParallelContext, real_exit

EXIT_PEER_LOST = 76
SILENT_BEATS = 5  # heartbeat periods without one before a rank counts as silent
SPEAK_GRACE = 5.0  # seconds the ranks that do not speak wait for the speaker's abort
ABORT_BACKSTOP = 10.0  # seconds after which a speaker whose MPI_Abort has not ended it exits
_BEAT = struct.Struct("!4sII")  # magic, rank, sequence
_MAGIC = b"hpwd"


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str  # "generations 101-200", "a checkpoint at generation 100"
    limit: float  # seconds; for an open phase, how long a host may be silent
    why: str  # where the limit comes from, for the message
    start: float  # the clock's reading when it was armed
    open: bool = False  # no limit of its own: ends the job only when a whole host is silent
    rank_limit: float | None = None  # (open) or when one rank has been silent this long


class Watchdog:
    """One rank's watchdog (see the module docstring). ``start`` is collective; ``arm`` and
    ``disarm`` are each rank's own; ``close`` stops the thread. With one rank, or ``enabled``
    false, it does nothing. ``clock`` is for tests."""

    def __init__(self, ctx: ParallelContext, heartbeat_seconds: float = 2.0, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.ctx, self.heartbeat = ctx, heartbeat_seconds
        self.enabled = enabled and ctx.size > 1
        self.clock = clock
        self._phase: Phase | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._listeners: list[tuple[str, int]] = []  # where this rank sends its heartbeats
        self.heard: dict[int, float] = {}  # rank -> the clock when its last heartbeat came (listeners)
        self.deputy: int | None = None
        self._rank_why = ""  # (arm_open's rank_silence: where it comes from)

    @classmethod
    def start(cls, ctx: ParallelContext, **kwargs: Any) -> "Watchdog":
        """Collective: a running watchdog for each rank of ``ctx``."""
        dog = cls(ctx, **kwargs)
        if dog.enabled:
            dog._open_channel()
            dog._thread = threading.Thread(target=dog._watch, name="hpcevo-watchdog", daemon=True)
            dog._thread.start()
        STARTUP_GUARD.end()  # (every rank has come this far: the start-up before it is over)
        return dog

    # -- the phases ---------------------------------------------------------------------------
    def arm(self, name: str, limit: float, why: str) -> None:
        """From now the run is in phase ``name``, which may last ``limit`` seconds (``why``: where
        that comes from, for the message)."""
        with self._lock:
            self._phase = Phase(name, float(limit), why, self.clock())

    def arm_open(self, name: str, silence: float, why: str, rank_silence: float | None = None,
                 rank_why: str = "") -> None:
        """From now the run is in phase ``name``, which may last as long as it must (waiting for
        other ranks' work of any length): the listeners end the job when every rank of a host
        has sent no heartbeat for ``silence`` seconds (a lost node), or, given ``rank_silence``,
        when one rank has sent none for that long (a stopped or hung process: one rank alone
        may be in a call that holds the GIL, so this limit is the longest such call may take).
        The other ranks wait for them."""
        with self._lock:
            self._phase = Phase(name, float(silence), why, self.clock(), open=True,
                                rank_limit=None if rank_silence is None else float(rank_silence))
            self._rank_why = rank_why

    def disarm(self) -> None:
        with self._lock:
            self._phase = None

    def close(self) -> None:
        self.disarm()
        self._stop.set()
        if self._sock is not None:  # wake the thread from its select at once
            try:
                self._sock.sendto(b"", ("127.0.0.1", self._sock.getsockname()[1]))
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "Watchdog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def _hosts(self) -> tuple[str, ...]:
        """The host of every rank."""
        return self.ctx.rank_hosts or (self.ctx.host,) * self.ctx.size

    # -- heartbeats ---------------------------------------------------------------------------
    def _open_channel(self) -> None:
        """Every rank's UDP socket; the listeners' (host, port) known to every rank. A rank that
        cannot open one still takes part in the exchange (its watchdog works without names)."""
        from . import control

        hosts = self._hosts
        others = [r for r in range(self.ctx.size) if hosts[r] != hosts[0]]
        # (on one host, rank 1: someone must speak where rank 0 itself stopped)
        self.deputy = others[0] if others else (1 if self.ctx.size > 1 else None)
        port = 0
        try:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.bind(("", 0))
            self._sock.setblocking(False)
            port = self._sock.getsockname()[1]
        except OSError:
            self._sock = None
        ports = control.allgather_obj(self.ctx, port)
        listeners = [0] + ([self.deputy] if self.deputy is not None else [])
        for r in listeners:
            if r == self.ctx.rank or not ports[r]:
                continue
            try:
                addr = socket.getaddrinfo(hosts[r], ports[r], socket.AF_INET, socket.SOCK_DGRAM)[0][4]
            except OSError:
                continue
            self._listeners.append(addr)

    def _beat(self, seq: int) -> None:
        if self._sock is None:
            return
        packet = _BEAT.pack(_MAGIC, self.ctx.rank, seq)
        for addr in self._listeners:
            try:
                self._sock.sendto(packet, addr)
            except OSError:
                pass  # a dead listener's host: nothing to do about it here

    def _drain(self) -> None:
        if self._sock is None:
            return
        now = self.clock()
        while True:
            try:
                data = self._sock.recv(64)
            except OSError:  # (BlockingIOError: nothing more to read)
                return
            if len(data) == _BEAT.size:
                magic, rank, _ = _BEAT.unpack(data)
                if magic == _MAGIC and 0 <= rank < self.ctx.size:
                    self.heard[rank] = now

    def silent(self, now: float | None = None, limit: float | None = None) -> list[int]:
        """Ranks (listeners only know) whose heartbeats came once and have not for ``limit``
        seconds (default ``SILENT_BEATS`` periods)."""
        now = self.clock() if now is None else now
        limit = SILENT_BEATS * self.heartbeat if limit is None else limit
        return sorted(r for r, t in self.heard.items() if now - t > limit)

    def lost_hosts(self, silent: list[int]) -> list[str]:
        """The hosts every rank of which is in ``silent``."""
        hosts = self._hosts
        return sorted({hosts[r] for r in silent} - {hosts[r] for r in range(self.ctx.size) if r not in silent})

    # -- the thread ---------------------------------------------------------------------------
    def _watch(self) -> None:
        import select

        seq, next_beat = 0, 0.0
        tick = min(0.5, self.heartbeat / 2)
        while not self._stop.is_set():
            now = self.clock()
            if now >= next_beat:
                self._beat(seq)
                seq, next_beat = seq + 1, now + self.heartbeat
            if self._sock is not None:
                try:
                    select.select([self._sock], [], [], tick)
                except (OSError, ValueError):
                    self._stop.wait(tick)
                self._drain()
            else:
                self._stop.wait(tick)
            with self._lock:
                phase = self._phase
            if phase is not None and not self._stop.is_set():
                elapsed = self.clock() - phase.start
                if phase.open:
                    lost = self.lost_hosts(self.silent(limit=phase.limit))
                    if phase.rank_limit is not None and not lost:
                        lost = [str(r) for r in self.silent(limit=phase.rank_limit)]
                    over = bool(lost) and self.speaks()
                else:
                    over = elapsed > phase.limit
                if over:
                    self._end_job(phase, elapsed)
                    return

    def speaks(self) -> bool:
        """Whether this rank reports: rank 0, or the deputy where rank 0 stopped answering."""
        if self.ctx.rank == 0:
            return True
        return self.ctx.rank == self.deputy and 0 in self.silent()

    def report(self, phase: Phase, elapsed: float) -> tuple[str, list[str]]:
        """The message, and the hosts all of whose ranks are silent."""
        hosts = self._hosts
        silent = self.silent()
        lost = self.lost_hosts(silent)
        me = f"rank {self.ctx.rank} ({self.ctx.host})"
        if phase.open and not lost and phase.rank_limit is not None:
            text = (f"watchdog on {me}: during {phase.name} ({elapsed:.1f} s so far), a rank sent no heartbeat for "
                    f"more than {phase.rank_limit:g} s ({self._rank_why or 'the limit'}): stopped "
                    "or hung.")
        elif phase.open:
            text = (f"watchdog on {me}: during {phase.name} ({elapsed:.1f} s so far), every rank of a host sent no "
                    f"heartbeat for more than {phase.limit:g} s ({phase.why}).")
        else:
            text = (f"watchdog on {me}: {phase.name} has taken {elapsed:.1f} s, past its limit of {phase.limit:g} s "
                    f"({phase.why}).")
        if silent:
            by_host: dict[str, list[int]] = {}
            for r in silent:
                by_host.setdefault(hosts[r], []).append(r)
            named = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {_ranges(rs)} on {h}" for h, rs in by_host.items())
            quiet = max(self.clock() - self.heard[r] for r in silent)
            text += (f" Stopped answering (no heartbeat for up to {quiet:.0f} s): {named}"
                     + (f"; host{'s' if len(lost) > 1 else ''} lost: {', '.join(lost)}" if lost else "") + ".")
        elif len(self.heard) >= self.ctx.size - 1:
            text += (" Every rank still answers: one of them is stuck (in the problem's code, in I/O) or far "
                     "slower than the limits allow ([fault] in the README).")
        else:
            text += " (Which ranks stopped answering cannot be told: their heartbeats do not reach this rank.)"
        text += (f" Ending the job (exit code {EXIT_PEER_LOST}); resume it from its newest checkpoint with --resume, "
                 "at any rank count")
        return text, lost

    def _end_job(self, phase: Phase, elapsed: float) -> None:
        late = not self.speaks()
        if late:
            # The speaker's abort normally ends this rank within the grace. Where it has not, the
            # speaker is gone or has not judged its phase overrun: each rank times its phase by its
            # own measured dispatches, and a speaker whose recent ones were slower allows more. A
            # rank that then ended itself quietly left a job ended with 76 and no word of why
            # (seen in CI under load), so this rank speaks, without overwriting what a speaker wrote.
            time.sleep(SPEAK_GRACE)
            self._drain()
            elapsed += SPEAK_GRACE
        # Silence is told after SILENT_BEATS periods; a phase limit shorter than that waits for it.
        wait = 0.0 if phase.open or late else SILENT_BEATS * self.heartbeat + 0.5 - elapsed
        if wait > 0:
            time.sleep(wait)
            self._drain()
            elapsed += wait
        text, lost = self.report(phase, elapsed)
        print(f"hpcevo: error: {text}", file=sys.stderr, flush=True)
        path = os.environ.get("HPCEVO_EXIT_FILE")
        if path and not (late and os.path.exists(path)):
            try:
                with open(path + ".lost", "w") as f:
                    f.write("".join(f"{h}\n" for h in lost))
                with open(path, "w") as f:
                    f.write(f"{EXIT_PEER_LOST}\n")
            except OSError:
                pass
        threading.Timer(ABORT_BACKSTOP, real_exit, (EXIT_PEER_LOST,)).start()
        self.ctx.abort(EXIT_PEER_LOST)
        real_exit(EXIT_PEER_LOST)


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> "0-2, 5"."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


class StartupGuard:
    """Start-up watched from MPI_Init on, before there is a watchdog (``Watchdog.start`` needs
    every rank): the imports, the context's first collectives, reading and agreeing on the
    config, binding. A rank stopped or lost there left the others waiting forever in their
    first collective call. Each rank keeps a clock of its own, with no communication: past
    ``limit`` seconds since ``arm`` it ends the job (exit code 76, as the watchdog does), rank 0
    first (the others a little later, so that one message is seen: the launcher ends them)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._since: float | None = None
        self._limit, self._why = 0.0, ""
        self._thread: threading.Thread | None = None
        self.rank = launcher_rank()

    @property
    def armed(self) -> bool:
        return self._since is not None

    def arm(self, limit: float, why: str, *, keep_start: bool = False) -> None:
        """From now (``keep_start``: from the first ``arm``, if still armed), start-up may take
        ``limit`` seconds (``why``: where that comes from, for the message)."""
        with self._cond:
            if not (keep_start and self._since is not None):
                self._since = time.monotonic()
            self._limit, self._why = float(limit), why
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="hpcevo-startup-guard", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._since = None
            self._cond.notify_all()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._since is None:
                    self._cond.wait()
                    continue
                # (rank r fires r/2 s after rank 0, up to 5 s: the lowest rank still running speaks)
                left = self._since + self._limit + min(self.rank, 10) * 0.5 - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                elapsed = time.monotonic() - self._since
                sys.stderr.write(
                    f"hpcevo: error: start-up has taken {elapsed:.0f} s on rank {self.rank} ({socket.gethostname()}), "
                    f"past its limit of {self._limit:g} s ({self._why}): a rank of the job has not come to its "
                    "first collective calls (stopped, lost, or slow to start: its imports, a shared file system). "
                    f"Ending the job (exit code {EXIT_PEER_LOST}).\n")
                sys.stderr.flush()
                real_exit(EXIT_PEER_LOST)


STARTUP_GUARD = StartupGuard()
