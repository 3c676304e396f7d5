"""The only part of hpcevo that knows MPI: ranks, device binding, sharded evaluation, control,
and host evaluation (tasks over ranks and threads, gathered by index); groups of ranks
(``split``) and a queue that hands tasks to them (``WorkQueue``).

``init()`` gives a program its ``ParallelContext``: ``rank``, ``size``, ``local_rank``,
``device``, ``hosts``, and ``print`` (rank 0 only).
"""

from .binding import Binding, Probe, Request, cpu_list, decide
from .context import ParallelContext, alone, bind, context_for, discover, mpi_library
from .control import (
    abort_if_stuck,
    agree_max,
    agree_on_error,
    agree_same,
    agreed,
    arrive,
    allgather_obj,
    barrier,
    bcast_from_root,
    check_replicas,
    collective_stage,
    gather_to_root,
    user_code,
)
from .es import ShardedESStep
from .evaluate import ShardedEvaluator, microbatch_rows, shard_of
from .host import TaskRunner, allgather_rows
from .groups import Groups, split
from .job import init
from .queue import WorkQueue

__all__ = [
    "Binding",
    "ParallelContext",
    "Probe",
    "Request",
    "abort_if_stuck",
    "agree_max",
    "agree_on_error",
    "agree_same",
    "agreed",
    "allgather_obj",
    "alone",
    "barrier",
    "bcast_from_root",
    "bind",
    "check_replicas",
    "collective_stage",
    "context_for",
    "cpu_list",
    "decide",
    "discover",
    "gather_to_root",
    "Groups",
    "arrive",
    "init",
    "mpi_library",
    "ShardedESStep",
    "ShardedEvaluator",
    "TaskRunner",
    "allgather_rows",
    "microbatch_rows",
    "shard_of",
    "split",
    "WorkQueue",
    "user_code",
]
