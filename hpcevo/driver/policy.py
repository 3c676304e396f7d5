"""Where a run stops for the host: the schedule of boundaries and when a checkpoint is due.

Pure: no MPI, no clocks. The inputs that differ between ranks (signals, clocks, how long a
dispatch took) are agreed on before they get here (``stopping.StopControl``), so every rank
computes the same boundaries.
"""

from __future__ import annotations

import dataclasses

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

    def due(self, gen: int, *, stopping: bool, time_due: bool) -> bool:
        if gen == self.last:
            return False
        return (stopping or time_due or bool(self.every and gen % self.every == 0)
                or (gen == self.generations and self.final))
