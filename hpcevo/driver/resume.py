"""Resuming: which checkpoint a run continues from, and which changes of config forbid it.

A resumed run gives bitwise the same result as one that never stopped, at any rank count, as
long as nothing that changes the computation differs (``RESUME_LOCKED``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..errors import UsageError
from ..parallel import ParallelContext, bcast_from_root
from .loop import Loop
from .report import Reporter

# What a resumed run may not change: anything that changes the computation itself. The rest
# (run.generations, names and paths, logging, checkpoint settings, device and threads) may change.
RESUME_LOCKED = ("algorithm", "problem", "run.seed", "run.dtype", "parallel.microbatch", "evaluation.penalty")
ALLOWED = ("run.generations, run.name, run.out, log.*, checkpoint.*, parallel.device, "
           "parallel.threads_per_rank")


def resume_conflicts(stored_text: str, new: dict[str, Any]) -> list[str]:
    """Differences between a checkpoint's resolved config and this run's (``new``, resolved)
    that forbid resuming it, one line each, naming the key and both values."""
    try:
        old = tomllib.loads(stored_text)
    except tomllib.TOMLDecodeError as e:
        return [f"the checkpoint's config cannot be read ({e})"]
    missing = object()
    out = []
    for locked in RESUME_LOCKED:
        section, _, key = locked.partition(".")
        a, b = old.get(section, {}), new.get(section, {})
        keys = [key] if key else sorted(set(a) | set(b))
        for k in keys:
            va, vb = a.get(k, missing), b.get(k, missing)
            if va != vb:
                show = lambda v: "(not set)" if v is missing else repr(v)  # noqa: E731
                out.append(f"{section}.{k}: checkpoint has {show(va)}, this run has {show(vb)}")
    return out


def resume_point(ctx: ParallelContext, ckdir: Path, resolved: dict[str, Any], generations: int, loop: Loop,
                 report: Reporter) -> checkpoint.Loaded | None:
    """The newest checkpoint in ``ckdir`` that validates and fits this run, loaded into
    ``loop``; None if there is none. Collective.

    A damaged checkpoint is reported and skipped in favour of the one before it. One that is
    sound but was written by a different configuration stops the run (UsageError, exit 2):
    resuming it would silently continue some other experiment.
    """
    paths = bcast_from_root(ctx, [str(p) for p in checkpoint.list_checkpoints(ckdir)] if ctx.is_root else None)
    if not paths:
        report.line(f"no checkpoint in {ckdir}: starting from generation 1")
        return None
    damaged = []
    for p in map(Path, paths):
        try:
            loaded = _load_fitting(ctx, p, resolved, generations, loop)
        except checkpoint.CheckpointDamaged as e:
            damaged.append(f"{p.name}: {e}")
            report.line(f"warning: checkpoint '{p}' is damaged ({e}); trying the one before it", err=True)
            continue
        report.line(f"resuming from '{p}' (generation {loaded.header.generation}, written by "
                    f"{loaded.header.writers})")
        return loaded
    raise UsageError(f"no usable checkpoint in '{ckdir}':\n  " + "\n  ".join(damaged)
                     + "\n  pass --overwrite to start the run again from generation 1")


def _load_fitting(ctx: ParallelContext, path: Path, resolved: dict[str, Any], generations: int,
                  loop: Loop) -> checkpoint.Loaded:
    header = checkpoint.read_header(ctx, path)
    conflicts = resume_conflicts(header.config_text, resolved)
    if conflicts:
        raise UsageError(f"cannot resume from '{path}': settings that change the computation differ from "
                         "the checkpoint's:\n  " + "\n  ".join(conflicts) + f"\n  allowed to change on resume: "
                         f"{ALLOWED}; or pass --overwrite to start a new run")
    if header.generation > generations:
        raise UsageError(f"cannot resume from '{path}': it is at generation {header.generation}, past "
                         f"run.generations = {generations}; raise run.generations to continue it")
    loaded = checkpoint.load(ctx, path, loop.template())
    loop.restore(loaded)
    return loaded
