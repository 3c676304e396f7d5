"""The arguments of the collective API (``Loop``, ``Archipelago``): checked on every rank, agreed
on, named in every message.

A collective call with an argument that is bad on one rank, or different on one rank, must not
leave the others waiting: each helper here checks this rank's value with the schema the config
uses (``hpcevo.schema``) and agrees with the other ranks (``parallel.agreed``), so every rank
returns the same value or raises the same hpcevo error.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from .. import schema
from ..algorithms.base import Algorithm
from ..errors import ConfigError, UsageError
from ..parallel import ParallelContext, agreed
from ..problems.user import held_name

Count = Annotated[int, Field(ge=0, le=schema.INT32_MAX)]
Keep = Annotated[int, Field(ge=1, le=schema.INT32_MAX)]


def seed(ctx: ParallelContext, value: Any, where: str) -> int:
    return agreed(ctx, f"{where}: the seed", lambda: schema.check(schema.Seed, value, "seed", where))


def generations(ctx: ParallelContext, value: Any, done: int, where: str) -> int:
    """A number of generations to run after ``done``: the counter inside the step is 32-bit."""
    def check() -> int:
        n = schema.check(Count, value, "generations", where)
        if done + n > schema.INT32_MAX:
            raise ConfigError(f"{where}: 'generations': {done} + {n} passes the most generations a run can "
                              f"count ({schema.INT32_MAX})", "generations")
        return n

    return agreed(ctx, f"{where}: the number of generations", check)


def keep(ctx: ParallelContext, value: Any, where: str) -> int:
    return agreed(ctx, f"{where}: keep", lambda: schema.check(Keep, value, "keep", where))


def path(ctx: ParallelContext, value: Any, where: str, name: str, *, file: bool = False) -> Path:
    """A path argument, the same on every rank; ``file``: it must be a file that every rank sees
    (a path that exists on some nodes only is named with the ranks that miss it)."""
    def check() -> Path:
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise UsageError(f"{where}: '{name}' must be a path (str or os.PathLike), got {schema.short(value)}")
        p = Path(value)
        if file and not p.is_file():
            raise UsageError(f"{where}: '{name}': '{p}' is not a file" + (f" (rank {ctx.rank} on {ctx.host})"
                                                                        if ctx.size > 1 else ""))
        return p

    return agreed(ctx, f"{where}: '{name}'", check, str)


def checked_algorithm(value: Any, where: str) -> Algorithm:
    """``value`` if it is an hpcevo algorithm (follows ``hpcevo.Algorithm``), else ConfigError
    naming what it lacks."""
    if isinstance(value, Algorithm):
        return value
    missing = [m for m in ("pop_size", "dim", "lb", "ub", "dtype", "distributed", "num_init", "num_ask", "init",
                           "ask", "tell", "init_ask", "init_tell", "population") if not hasattr(value, m)]
    raise ConfigError(f"{where}: algorithm= {type(value).__name__} is not an hpcevo algorithm: it lacks "
                      f"{', '.join(missing) or 'what the protocol asks'} (use hpcevo.algorithms.CSO(...) and the "
                      "like, or derive your own from hpcevo.algorithms.BaseAlgorithm)", "algorithm")


def options(where: str, *, microbatch: Any = None, batch_size: Any = None, concurrency: Any = 1,
            schedule: Any = "static", penalty: Any = math.inf, host: Any = False) -> dict[str, Any]:
    """The evaluation options of a Loop (None or 0: automatic / whole micro-batches), checked
    as the config's ``[parallel]`` and ``[evaluation]`` keys are."""
    return {
        "microbatch": schema.check(schema.Microbatch, microbatch or 0, "microbatch", where) or None,
        "batch_size": schema.check(schema.BatchSize, batch_size or 0, "batch_size", where) or None,
        "concurrency": schema.check(schema.Concurrency, concurrency, "concurrency", where),
        "schedule": schema.check(schema.Schedule, schedule, "schedule", where),
        "penalty": schema.check(schema.Penalty, penalty, "penalty", where),
        "host": schema.check(bool, host, "host", where),
    }


def describe(algorithms: list[Algorithm], problem: Any, **settings: Any) -> str:
    """What must be the same on every rank for them to compute one run, as canonical text: each
    algorithm's class, box and hyper-parameters, the problem's name, box and kind, settings."""
    def algo(a: Algorithm) -> dict[str, Any]:
        fields = {k: getattr(a, k) for k in getattr(type(a), "hyper_parameters", dict)()}
        return {"class": held_name(a), "pop_size": a.pop_size, "dim": a.dim, "dtype": a.dtype,
                "lb": list(a.lb), "ub": list(a.ub), **fields}

    prob = {k: getattr(problem, k, None) for k in ("name", "dim", "lb", "ub", "num_objectives", "host")}
    return json.dumps({"algorithms": [algo(a) for a in algorithms], "problem": prob, **settings},
                      sort_keys=True, default=repr)


def differ(a: str, b: str) -> str:
    """The first entry in which two ``describe`` texts (or two flat JSON objects) differ."""
    try:
        x, y = _flat(json.loads(a)), _flat(json.loads(b))
    except ValueError:
        return f"rank 0 has {a[:80]!r}, the other has {b[:80]!r}"
    for key in sorted(set(x) | set(y)):
        if x.get(key) != y.get(key):
            return f"'{key}' is {schema.short(x.get(key))} on rank 0 and {schema.short(y.get(key))} there"
    return "they differ"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(data, list) and data and any(isinstance(v, (dict, list)) for v in data):
        out = {}
        for i, v in enumerate(data):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: data}
