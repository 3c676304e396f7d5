"""Where a run stops for the host: the schedule of boundaries and when a checkpoint is due.

Pure: no MPI, no clocks. The inputs that differ between ranks (signals, clocks, how long a
dispatch took) are agreed on before they get here (``stopping.StopControl``), so every rank
computes the same boundaries.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .engine import MAX_CHUNK

# A dispatch (a chunk of generations in one jitted call) aims to last about this long, so a stop
# signal or a deadline is acted on within seconds even when generations are slow.
DISPATCH_TARGET_S = 5.0


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Boundaries: every ``log_every`` generations, every ``checkpoint_every`` (0: none), the
    end, and wherever the dispatch length runs out first."""

    generations: int
    log_every: int
    checkpoint_every: int = 0

    def logs_at(self, gen: int) -> bool:
        return gen % self.log_every == 0 or gen == self.generations

    def next_target(self, gen: int, chunk: int) -> int:
        """The next boundary after ``gen`` when a dispatch may run ``chunk`` generations."""
        target = min((gen // self.log_every + 1) * self.log_every, self.generations, gen + chunk)
        if self.checkpoint_every:
            target = min(target, (gen // self.checkpoint_every + 1) * self.checkpoint_every)
        return target


def next_chunk(generations: int, seconds: float) -> int:
    """The length of the next dispatch after ``generations`` took ``seconds``: about
    ``DISPATCH_TARGET_S`` of work, at most ``MAX_CHUNK`` generations."""
    return int(max(1, min(MAX_CHUNK, DISPATCH_TARGET_S * generations / max(seconds, 1e-9))))


@dataclasses.dataclass
class CheckpointPolicy:
    """When a checkpoint is written: at multiples of ``every`` (0: never), when the clock says so,
    before a stop, and at the end (``final``); never twice at one generation."""

    every: int
    final: bool
    generations: int
    last: int  # the generation of the newest checkpoint (the resumed one, or 0)

    def due(self, gen: int, *, stopping: bool, time_due: bool, soon: bool = False) -> bool:
        """``soon``: a checkpoint by generation count would come too soon after the last one
        (the default ``every`` only: ``StopControl``); stops, the clock and the end still write."""
        if gen == self.last:
            return False
        return (stopping or time_due or (bool(self.every and gen % self.every == 0) and not soon)
                or (gen == self.generations and self.final))


# Measurements of a phase the watchdog's limit looks back on: enough to ride out one fast
# dispatch among slow ones, few enough to follow a run whose generations slow down.
RECENT = 8


class PhaseLimits:
    """How long each phase of a run may take before the watchdog (``parallel.watchdog``) ends
    the job: the ``[fault]`` settings and the times the phases took so far (each rank's own).

    A dispatch of generations, and the boundary work after it (logs, hooks, the stop poll), may
    take ``slowdown`` times the slowest of their last ``RECENT`` measurements, scaled up to the
    generations asked for, and never less than ``min_seconds``; before the first measurement
    they get ``compile_seconds`` (the first dispatch may compile). A run that slows down
    gradually moves its own limits; only a phase ``slowdown`` times slower than anything
    recent is taken for a rank that stopped answering. Start-up, compilation (with the first
    generation: ranks still compiling keep the others waiting there) and checkpoints have
    fixed allowances, a checkpoint at least ``slowdown`` times the slowest one written."""

    def __init__(self, fault: Any):
        self.fault = fault
        self.dispatches: list[tuple[int, float]] = []  # (generations, seconds)
        self.boundaries: list[float] = []
        self.checkpoints: list[float] = []

    def note_dispatch(self, generations: int, seconds: float) -> None:
        self.dispatches = [*self.dispatches, (max(1, generations), seconds)][-RECENT:]

    def note_boundary(self, seconds: float) -> None:
        self.boundaries = [*self.boundaries, seconds][-RECENT:]

    def note_checkpoint(self, seconds: float) -> None:
        self.checkpoints = [*self.checkpoints, seconds][-RECENT:]

    def _adaptive(self, expected: float | None, what: str) -> tuple[float, str]:
        f = self.fault
        if expected is None:
            return f.compile_seconds, f"fault.compile_seconds: nothing measured yet, {what} may compile"
        scaled = f.slowdown * expected
        if scaled <= f.min_seconds:
            return f.min_seconds, f"fault.min_seconds; {f.slowdown:g} x the recent {what} ({expected:.3g} s) is less"
        return scaled, f"fault.slowdown = {f.slowdown:g} x the slowest recent {what}, {expected:.3g} s"

    def dispatch(self, generations: int) -> tuple[float, str]:
        """(seconds, why) for a dispatch of ``generations``."""
        if not self.dispatches:
            return self._adaptive(None, "dispatch")
        expected = max(s * max(1.0, generations / g) for g, s in self.dispatches)
        return self._adaptive(expected, "dispatch")

    def boundary(self) -> tuple[float, str]:
        return self._adaptive(max(self.boundaries) if self.boundaries else None, "boundary")

    def checkpoint(self) -> tuple[float, str]:
        f = self.fault
        slowest = max(self.checkpoints) if self.checkpoints else 0.0
        if f.slowdown * slowest > f.checkpoint_seconds:
            return f.slowdown * slowest, f"fault.slowdown = {f.slowdown:g} x the slowest checkpoint, {slowest:.3g} s"
        return f.checkpoint_seconds, "fault.checkpoint_seconds"

    def startup(self) -> tuple[float, str]:
        return self.fault.startup_seconds, "fault.startup_seconds"

    def compile(self) -> tuple[float, str]:
        return self.fault.compile_seconds, "fault.compile_seconds"
