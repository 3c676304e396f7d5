"""Groups of ranks: a job split into sub-jobs, each with a context of its own.

    ctx = hpcevo.parallel.init()
    groups = hpcevo.parallel.split(ctx, ranks_per_group=2)   # collective
    groups.ctx          # this rank's group: a ParallelContext that run, Loop, Archipelago take
    groups.index, groups.count, groups.is_leader
    groups.send(obj, to=1); obj = groups.recv(source=0)   # leader to leader, point to point

Every group is a ``ParallelContext`` over its own communicators (``context_for``), so a run on
it is the run it would be alone on that many ranks: bitwise, whatever the other groups do.
Ranks beyond the last whole group (``size % ranks_per_group``) belong to no group
(``groups.ctx is None``): they take part in ``split`` and in the world's collectives only.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

from ..errors import UsageError
from .context import ParallelContext, context_for

# Tags of the leaders' point-to-point messages (the groups' own communicator: nothing else uses it).
_TAG_USER = 17


@dataclasses.dataclass(frozen=True)
class _Sent:
    data: bytes  # the object, pickled by the sender (so that a failure is the sender's to report)


@dataclasses.dataclass(frozen=True)
class _Unsent:
    group: int
    why: str


@dataclasses.dataclass
class Groups:
    """This rank's view of a job split into ``count`` groups of ``ranks_per_group`` ranks."""

    world: ParallelContext  # the job that was split
    ranks_per_group: int
    count: int  # whole groups
    index: int | None  # this rank's group (None: a rank left over)
    ctx: ParallelContext | None  # the group's context (None: a rank left over)
    leaders: Any  # a communicator of the groups' first ranks (None elsewhere): rank i leads group i

    @property
    def is_leader(self) -> bool:
        """Whether this rank is its group's rank 0 (the one that talks to other groups)."""
        return self.ctx is not None and self.ctx.rank == 0

    @property
    def idle(self) -> int:
        """Ranks that belong to no group."""
        return self.world.size - self.count * self.ranks_per_group

    def leader_of(self, group: int) -> int:
        """The world rank of ``group``'s leader."""
        return group * self.ranks_per_group

    def send(self, obj: Any, to: int) -> None:
        """Send a picklable ``obj`` from this group's leader to group ``to``'s leader (blocking
        until it is received or buffered). Called by leaders only. An ``obj`` that cannot be
        pickled raises UsageError here, and in the receiver's ``recv`` too (it would otherwise
        wait for a message that never comes)."""
        self._check_leader("send", to)
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, the receiver must hear of it
            why = f"{type(e).__name__}: {e}"
            self.leaders.send(_Unsent(self.index, why), dest=to, tag=_TAG_USER)
            raise UsageError(f"Groups.send: the object for group {to} cannot be sent: it cannot be pickled ({why}); "
                             f"group {to}'s recv raises too") from None
        self.leaders.send(_Sent(data), dest=to, tag=_TAG_USER)

    def recv(self, source: int) -> Any:
        """What group ``source``'s leader sent to this group's leader. Called by leaders only;
        waits, sleeping between polls, so a waiting rank leaves its core to the others."""
        from .control import receive

        self._check_leader("recv", source)
        got = receive(self.leaders, source, _TAG_USER)
        if isinstance(got, _Unsent):
            raise UsageError(f"Groups.recv: group {got.group} could not send its object: it cannot be pickled "
                             f"({got.why})")
        return pickle.loads(got.data) if isinstance(got, _Sent) else got

    def bcast(self, obj: Any) -> Any:
        """``obj`` from the group's leader, on every rank of the group (collective in the group)."""
        if self.ctx is None:
            raise UsageError("Groups.bcast: this rank belongs to no group")
        return self.ctx.comm_ctl.bcast(obj, root=0)

    def _check_leader(self, what: str, other: Any) -> None:
        if not self.is_leader:
            raise UsageError(f"Groups.{what}: only a group's leader (groups.is_leader) talks to other groups; "
                             "share what it receives with Groups.bcast")
        if isinstance(other, bool) or not isinstance(other, int) or not 0 <= other < self.count:
            raise UsageError(f"Groups.{what}: group {other!r} does not exist (groups 0..{self.count - 1})")
        if other == self.index:
            raise UsageError(f"Groups.{what}: group {other} is this group")


# The groups made so far, by (job, ranks per group): split again the same way, a job gets the
# same groups back, and with their communicators the programs compiled for them (mpi4jax
# compiles a communicator into a program: new communicators, new compilations), so a study
# stopped and resumed in one process, or a script that runs several, compiles once.
_MADE: dict[tuple[int, int], Groups] = {}


def split(ctx: ParallelContext, ranks_per_group: int) -> Groups:
    """Split ``ctx``'s ranks into groups of ``ranks_per_group`` consecutive ranks. Collective:
    every rank calls it with the same value (UsageError on every rank otherwise). Splitting the
    same context the same way again gives the same groups."""
    from .control import agreed

    if not isinstance(ctx, ParallelContext):  # (before anything asks it for its size)
        raise UsageError(f"split: 'ctx' must be a ParallelContext (hpcevo.parallel.init()), got {type(ctx).__name__}")

    def describe() -> str:
        if isinstance(ranks_per_group, bool) or not isinstance(ranks_per_group, int) or ranks_per_group < 1:
            raise UsageError(f"split: 'ranks_per_group' must be a whole number >= 1, got {ranks_per_group!r}")
        if ranks_per_group > ctx.size:
            raise UsageError(f"split: 'ranks_per_group' = {ranks_per_group} is more than the {ctx.size} "
                             f"rank{'s' if ctx.size != 1 else ''} of the job")
        return str(ranks_per_group)

    agreed(ctx, "split's ranks_per_group", describe, str)
    made = _MADE.get((id(ctx), ranks_per_group))
    if made is not None and made.world is ctx:
        return made
    count = ctx.size // ranks_per_group
    index = ctx.rank // ranks_per_group
    member = index < count
    from mpi4py import MPI

    sub = ctx.comm_ctl.Split(index if member else MPI.UNDEFINED, ctx.rank)
    lead = ctx.comm_ctl.Split(0 if member and ctx.rank % ranks_per_group == 0 else MPI.UNDEFINED, ctx.rank)
    group_ctx = context_for(sub) if member else None
    if member:
        sub.Free()  # (context_for made its own copies)
    made = Groups(ctx, ranks_per_group, count, index if member else None, group_ctx,
                  lead if lead != MPI.COMM_NULL else None)
    _MADE[(id(ctx), ranks_per_group)] = made
    return made
