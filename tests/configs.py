"""Configs the tests share."""

from __future__ import annotations


def small_config(out, **sections) -> dict:
    """A run config as a dict: CSO (pop 8) on the 3-D sphere from seed 2, 4 generations, logged
    and checkpointed every 2, written to ``out``; each of ``sections`` updates its table."""
    data = {"run": {"name": "small", "seed": 2, "generations": 4, "out": str(out)},
            "algorithm": {"name": "cso", "pop_size": 8}, "problem": {"name": "sphere", "dim": 3},
            "log": {"every": 2}, "checkpoint": {"every": 2, "every_seconds": 0}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def problem_file(ctx, path, source: str):
    """``source`` written to ``path`` by rank 0, seen by every rank when this returns (a problem
    file of a test's own, imported by path); returns ``path``."""
    if ctx.is_root:
        path.write_text(source)
    ctx.comm_ctl.Barrier()
    return path
