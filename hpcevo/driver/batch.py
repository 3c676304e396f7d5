"""``Batch``: many runs of one program advanced together, each bitwise the run alone.

A campaign is many small runs: seeds, problem instances, dynamic hyper-parameters, budgets and
targets of one algorithm on one problem program. A batch compiles their programs once and
advances them together: every run's chunk is dispatched to the run's own programs back to back,
and the host waits once for all (``engine.DeviceEngine.advance_runs``)::

    ctx = hpcevo.parallel.init()
    loops = [hpcevo.Loop(algorithm, problem, ctx) for _ in seeds]   # one program: built once
    batch = hpcevo.Batch(loops).init(seeds)     # generation 1 of every run, one wait
    batch.advance(500)                          # 500 more for each (fewer where a limit ends it)
    [loop.best_fitness for loop in batch]       # each run is an ordinary Loop

Each run is a ``Loop`` and stays one: its own limits (``Loop.limit``: budgets and targets end
runs one by one, each at its exact generation), dynamic hyper-parameters (``set_params``),
problem instance (BBOB's ``program_data``), history, checkpoints (``save``; ``load`` one into a
Loop and batch it again, at any rank count), and its digest: **bitwise the digest of the same
loop advanced alone**, whatever its batch-mates, its slot or the batch's size: it runs the very
programs the run alone runs. A batch runs on the ranks of its loops' context: the evaluation of
each run is split over them as a run alone's is.

Loops can join or leave between calls (``batch.loops`` is a list): a study puts a pending run
in the slot of one that ended. Device problems only (a host problem evaluates on the host,
generation by generation: nothing to batch).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from .. import schema
from ..errors import UsageError
from ..parallel import agreed, collective_stage, user_code
from . import arguments
from .engine import DeviceEngine
from .loop import Loop, user_errors


class Batch:
    """The runs of ``loops`` (``Loop`` objects of one algorithm, problem program, context and
    options, so of one compiled program) advanced together. Collective, as a Loop's methods."""

    def __init__(self, loops: Sequence[Loop]):
        def check() -> list[Loop]:
            if isinstance(loops, Loop) or not isinstance(loops, Sequence) or not len(loops):
                raise UsageError("Batch: 'loops' must be a non-empty list of hpcevo.Loop objects, got "
                                 f"{type(loops).__name__}")
            bad = [i for i, loop in enumerate(loops) if not isinstance(loop, Loop)]
            if bad:
                raise UsageError(f"Batch: loops[{bad[0]}] is a {type(loops[bad[0]]).__name__}, not an hpcevo.Loop")
            first = loops[0]
            if not isinstance(first.engine, DeviceEngine):
                raise UsageError("Batch: a host problem (NumPy function, command) is evaluated on the host generation "
                                 "by generation: there is nothing to batch; advance its loops one by one")
            for i, loop in enumerate(loops[1:], 1):
                if loop.ctx is not first.ctx:
                    raise UsageError(f"Batch: loops[{i}] runs on another parallel context than loops[0]")
                if loop._family is not first._family:
                    raise UsageError(
                        f"Batch: loops[{i}] is not the program of loops[0]: a batch's runs differ only in data (seed, "
                        "dynamic hyper-parameters, problem instance, limits); build them with the same algorithm "
                        f"(static settings), problem function, dim and options ({_differs(first, loop)})")
            if len({id(loop) for loop in loops}) != len(loops):
                raise UsageError("Batch: a Loop appears twice in 'loops'")
            return list(loops)

        ctx = loops[0].ctx if isinstance(loops, Sequence) and len(loops) and isinstance(loops[0], Loop) else None
        if ctx is None:
            check()  # (raises: no context to agree on)
        self.loops: list[Loop] = agreed(ctx, "Batch", check, lambda ls: f"{len(ls)} loops")
        self.ctx = ctx

    def __len__(self) -> int:
        return len(self.loops)

    def __iter__(self) -> Iterator[Loop]:
        return iter(self.loops)

    def __getitem__(self, i: int) -> Loop:
        return self.loops[i]

    def init(self, seeds: Sequence[int]) -> "Batch":
        """Start run i from ``seeds[i]`` and evaluate every initial population, the host waiting
        once for all (what ``loop.init(seed)`` does for each)."""
        def check() -> list[int]:
            given = list(seeds) if isinstance(seeds, (Sequence, np.ndarray)) and not isinstance(seeds, (str, bytes)) else None
            if given is None or len(given) != len(self.loops):
                raise UsageError(f"Batch.init: 'seeds' must be a list of {len(self.loops)} seeds (one per loop), "
                                 f"got {seeds!r:.80}")
            return [schema.check(schema.Seed, int(s) if isinstance(s, np.integer) else s, f"seeds[{i}]", "Batch.init")
                    for i, s in enumerate(given)]

        seeds = agreed(self.ctx, "Batch.init: the seeds", check)
        params = [loop._data() for loop in self.loops]
        for loop in self.loops:
            loop._start_engine()
        engine = self.loops[0].engine  # (one family: generation 1's program is the same for all)
        out = self._dispatch(lambda: engine.start_runs(seeds, params))
        for loop, seed, (state, part) in zip(self.loops, seeds, out):
            loop.state, loop.seed, loop.generation, loop._pending = state, seed, 1, None
            loop._restart_history()
            loop._took(part)
        return self

    def advance(self, generations: int = 1) -> "Batch":
        """``generations`` more for every run, as ``loop.advance(generations)`` would for each:
        a run whose limit is met (``Loop.limit``) stops at that very generation and the others go
        on. Each chunk of generations: every active run dispatched, then one wait for all."""
        done = max(loop.generation for loop in self.loops)
        n = arguments.generations(self.ctx, generations, done, "Batch.advance")
        for loop in self.loops:
            loop._require_state()
            loop._require_no_pending("Batch.advance")
        left = {id(loop): n for loop in self.loops}
        while True:
            active = [loop for loop in self.loops if left[id(loop)] and loop.check_limits() is None]
            if not active:
                break
            # Runs whose population changed size at a restart run in another program (Loop's
            # population buckets): each program's runs are dispatched together.
            programs: dict[Any, list[Loop]] = {}
            for loop in active:
                loop._select_engine()
                programs.setdefault(loop.engine, []).append(loop)
            k = min(min(left[id(loop)] for loop in active), min(e.max_chunk for e in programs))
            for engine, runs in programs.items():
                limits = [loop._dispatch_limits() for loop in runs]
                params = [loop._data() for loop in runs]
                states = [loop.state for loop in runs]
                out = self._dispatch(lambda: engine.advance_runs(states, k, params, limits))
                for loop, (state, part) in zip(runs, out):
                    done = len(part["evaluations"])
                    loop.state = state
                    loop.generation += done
                    loop._took(part)
                    # (fewer than k: a limit, met, or a move to another bucket: the next round)
                    left[id(loop)] -= done if loop._buckets else k
        for loop in self.loops:
            loop.check_limits()
        return self

    def _dispatch(self, call: Any) -> Any:
        # A program's first call traces the user's problem: its error is every rank's (as
        # Loop.compile makes it).
        result = None
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            result = call()
        return result

    def digests(self) -> list[str]:
        """Each run's ``Loop.digest()``."""
        return [loop.digest() for loop in self.loops]


def _differs(a: Loop, b: Loop) -> str:
    if type(a.algorithm) is not type(b.algorithm):
        return f"{type(a.algorithm).__name__} and {type(b.algorithm).__name__}"
    if a.algorithm.num_ask != b.algorithm.num_ask or a.algorithm.dim != b.algorithm.dim:
        return f"pop {a.algorithm.num_ask} dim {a.algorithm.dim} and pop {b.algorithm.num_ask} dim {b.algorithm.dim}"
    program = [getattr(p, "program", p) if getattr(p, "program_data", None) is not None else p
               for p in (a.problem, b.problem)]
    if program[0] != program[1]:
        return f"problems {a.problem.name!r} and {b.problem.name!r}"
    return "a static hyper-parameter or an option (microbatch, batch_size, observe...) differs"

