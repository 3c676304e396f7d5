"""Resuming: which checkpoint a run continues from, and which changes of config forbid it.

A resumed run gives bitwise the same result as one that never stopped, at any rank count, as
long as nothing that changes the computation differs: every key of the resolved config but
those ``FREE`` to change is compared.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..algorithms.base import dynamic_names, why_static
from ..errors import UsageError
from ..parallel import ParallelContext, bcast_from_root
from ..problems.user import held_names_match
from .loop import Loop
from .report import Reporter
from .rundir import option

# What a resumed run may change: the keys that never change a bit of the computation (how long
# it runs, where it writes, how it logs and checkpoints, how it is bound to its hardware, how
# host evaluations are scheduled: tested bitwise). Everything else in the resolved config is
# locked, so a key added to the schema is locked until it is shown to be harmless here.
FREE = ("run.generations", "run.evaluations", "run.target", "run.target_precision",
        "run.stagnation_generations", "run.stagnation_tolerance",
        "run.name", "run.out", "run.reevaluate", "log.*", "checkpoint.*", "fault.*", "parallel.device",
        "parallel.threads_per_rank", "parallel.compile_cache", "parallel.share_gpus", "evaluation.concurrency",
        "evaluation.schedule")
# Free only where it is known to change nothing: pieces of a micro-batch give the same bits as the
# whole for problems that are block invariant (hpcevo's own functions).
FREE_IF_BLOCK_INVARIANT = ("evaluation.batch_size",)


def is_free(key: str, free: tuple[str, ...] = FREE) -> bool:
    return any(key == f or (f.endswith(".*") and key.startswith(f[:-1])) for f in free)


def resume_conflicts(stored_text: str, new: dict[str, Any], free: tuple[str, ...] = FREE) -> list[str]:
    """Differences between a checkpoint's resolved config and this run's (``new``, resolved)
    that forbid resuming it, one line each, naming the key and both values: every key whose
    value differs, but for those ``free`` to change. Names of objects held in Python match when
    one is the other without its module (``held_names_match``): a script's function is
    recorded without ``__main__``, and another script may import it from its module."""
    try:
        old = tomllib.loads(stored_text)
    except tomllib.TOMLDecodeError as e:
        return [f"the checkpoint's config cannot be read ({e})"]
    show = lambda v: "(not set)" if v is MISSING else repr(v)  # noqa: E731
    return [f"{key}: checkpoint has {show(va)}, this run has {show(vb)}" for key, va, vb in changes(old, new, free)]


MISSING = object()  # (a key one side of ``changes`` does not set)


def changes(old: dict[str, Any], new: dict[str, Any], free: tuple[str, ...] = FREE) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every key of two configs whose values differ, but
    for those ``free`` to change; ``MISSING`` where one side does not set it. (A run's resume and
    a study's resume compare with it.)"""
    a, b = _flat(old), _flat(new)
    return [(key, a.get(key, MISSING), b.get(key, MISSING)) for key in sorted(set(a) | set(b))
            if not held_names_match(a.get(key, MISSING), b.get(key, MISSING)) and not is_free(key, free)]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Tables as dotted keys (``problem.args.scale``); other values, lists of tables included,
    as they are."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def resume_point(ctx: ParallelContext, ckdir: Path, resolved: dict[str, Any], generations: int, loop: Loop,
                 report: Reporter, free: tuple[str, ...] = FREE) -> checkpoint.Loaded | None:
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
            loaded = _load_fitting(ctx, p, resolved, generations, loop, free)
        except checkpoint.CheckpointDamaged as e:
            damaged.append(f"{p.name}: {e}")
            report.line(f"warning: checkpoint '{p}' is damaged ({e}); trying the one before it", err=True)
            continue
        report.line(f"resuming from '{p}' (generation {loaded.header.generation}, written by "
                    f"{loaded.header.writers})")
        return loaded
    raise UsageError(f"no usable checkpoint in '{ckdir}':\n  " + "\n  ".join(damaged)
                     + f"\n  pass {option('overwrite')} to start the run again from generation 1")


def _load_fitting(ctx: ParallelContext, path: Path, resolved: dict[str, Any], generations: int,
                  loop: Loop, free: tuple[str, ...]) -> checkpoint.Loaded:
    header = checkpoint.read_header(ctx, path)
    # The algorithm's dynamic hyper-parameters may change on resume as Loop.set_params changes
    # them mid-run (one rule for both): a new value given now applies from the checkpoint's
    # generation on; one left as it was keeps what the run had then (a hook's value included).
    dynamic = tuple(f"algorithm.{n}" for n in dynamic_names(loop.algorithm)) if isinstance(loop, Loop) else ()
    conflicts = resume_conflicts(header.config_text, resolved, free + dynamic)
    if conflicts:
        static = [c.split(":")[0] for c in conflicts if c.startswith("algorithm.")]
        reasons = [f"{s}: static, {why_static(loop.algorithm, s.split('.', 1)[1])}" if isinstance(loop, Loop)
                   else f"{s}: static, it shapes the compiled program" for s in static]
        why = (f"\n  ({'; '.join(reasons)}; the dynamic hyper-parameters of this algorithm, which may change: "
               f"{', '.join(d.split('.', 1)[1] for d in dynamic) or 'none'})" if static else "")
        raise UsageError(f"cannot resume from '{path}': settings that change the computation differ from "
                         "the checkpoint's:\n  " + "\n  ".join(conflicts) + why + "\n  allowed to change on resume: "
                         f"{', '.join(free + dynamic)}; or start a new run ({option('overwrite')}, or another "
                         "run.name)")
    if header.generation > generations:
        raise UsageError(f"cannot resume from '{path}': it is at generation {header.generation}, past "
                         f"run.generations = {generations}; raise run.generations to continue it")
    loaded = checkpoint.load(ctx, path, loop.template())
    loop.restore(loaded)
    changed = _changed_dynamic(header.config_text, resolved, dynamic)
    if changed:
        loop.set_params(**changed)
    return loaded


def _changed_dynamic(stored_text: str, new: dict[str, Any], dynamic: tuple[str, ...]) -> dict[str, float]:
    """The dynamic hyper-parameters the new config gives other values than the checkpoint's did."""
    if not dynamic:
        return {}
    return {key.split(".", 1)[1]: value for key, _, value in changes(tomllib.loads(stored_text), new, ())
            if key in dynamic and value is not MISSING}
