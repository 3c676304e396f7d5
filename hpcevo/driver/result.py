"""What a run gives back (``Result``) and what a run directory holds (``RunRecord``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import checkpoint
from ..errors import UsageError
from . import rundir
from .recording import kind_of


@dataclasses.dataclass(frozen=True)
class Result:
    """The outcome of ``hpcevo.run``, the same on every rank.

    ``summary`` is what summary.json holds (written when the run completes); ``history`` holds
    one value per generation for each series the run keeps (``best``, ``gen_best``,
    ``gen_mean``, ``gen_std``, ``nonfinite``; multi-objective: ``hv``, ``igd``, ``front_size``,
    ``nonfinite``).
    """

    summary: dict[str, Any]
    history: dict[str, np.ndarray]
    run_dir: Path

    @property
    def status(self) -> str:
        """"complete", or "stopped" (a signal or the deadline; a checkpoint was written)."""
        return self.summary["status"]

    @property
    def best_fitness(self) -> float | None:
        """The best fitness found (None for a multi-objective run: see ``front``)."""
        return self.summary.get("best_fitness")

    @property
    def best_solution(self) -> np.ndarray | None:
        x = self.summary.get("best_solution")
        return None if x is None else np.asarray(x)

    @property
    def front(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Multi-objective runs: the final front's candidates and objective vectors."""
        if "front_f" not in self.summary:
            return None
        return np.asarray(self.summary["front_x"]), np.asarray(self.summary["front_f"])

    @property
    def digest(self) -> str:
        """SHA-256 of the final state: equal digests, bitwise equal runs."""
        return self.summary["state_digest"]

    @property
    def generations(self) -> int:
        return self.summary["generations"]

    @property
    def evaluations(self) -> int:
        return self.summary["evaluations"]


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint of a run directory: its header (None when unreadable) and what is wrong with
    it (None: its header reads; ``verify()`` checks every checksum)."""

    path: Path
    header: checkpoint.Header | None
    problem: str | None

    @property
    def generation(self) -> int:
        return checkpoint.generation_of(self.path)

    def verify(self) -> checkpoint.Report:
        return checkpoint.verify_file(self.path)


class RunRecord:
    """A run directory, read on this process alone (no MPI): ``hpcevo.open_run(path)``.

    ``config`` (the resolved config, as TOML data), ``summary`` (None until the run completes),
    ``metrics`` (one array per field of metrics.jsonl, one entry per log boundary), ``failures``
    (failed host evaluations), ``checkpoints`` (newest first), ``history()`` (per generation,
    from the newest valid checkpoint).
    """

    def __init__(self, path: str | Path):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise UsageError(f"open_run: 'path' must be a run directory's path (str or os.PathLike), got {path!r:.80}")
        path = Path(path)
        if not path.is_dir():
            raise UsageError(f"run directory '{path}' not found")
        self.paths = rundir.RunPaths.find(path)
        if not self.paths.config.is_file() and not checkpoint.list_checkpoints(self.paths.checkpoints):
            raise UsageError(f"'{path}' holds neither a run (config.toml) nor checkpoints (gen-*.h5)")

    @property
    def path(self) -> Path:
        return self.paths.root

    @property
    def config(self) -> dict[str, Any] | None:
        return rundir.read_config(self.paths)

    @property
    def summary(self) -> dict[str, Any] | None:
        return rundir.read_summary(self.paths)

    @property
    def records(self) -> list[dict[str, Any]]:
        """metrics.jsonl, one dict per log boundary (up to a torn last line)."""
        return rundir.read_records(self.paths.metrics)

    @property
    def metrics(self) -> dict[str, np.ndarray]:
        """metrics.jsonl as columns: one array per field (None becomes NaN); an archipelago's
        per-island fields as ``island3.best``..."""
        recs = [_flat_islands(r) for r in self.records]
        keys = list(dict.fromkeys(k for r in recs for k in r))
        return {k: self._column(recs, k) for k in keys}

    def _column(self, recs: list[dict[str, Any]], key: str) -> np.ndarray:
        values = [np.nan if r.get(key) is None else r[key] for r in recs]
        for line, v in enumerate(values, 1):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UsageError(f"'{self.paths.metrics}' line {line}: '{key}' is {str(v)[:40]!r}, not a "
                                 "number: the file is damaged (written by something other than hpcevo?)")
        return np.asarray(values)

    @property
    def kind(self) -> str | None:
        """"single-objective" or "multi-objective" (None: nothing logged yet)."""
        recs = self.records
        if not recs:
            return None
        try:
            return kind_of(recs[0])
        except ValueError as e:
            raise UsageError(f"'{self.paths.metrics}' line 1: {e}: the file is damaged") from None

    @property
    def failures(self) -> list[dict[str, Any]]:
        return rundir.read_records(self.paths.failures)

    @property
    def checkpoints(self) -> list[CheckpointInfo]:
        return [CheckpointInfo(r.path, r.header, r.problem)
                for r in map(checkpoint.describe, checkpoint.list_checkpoints(self.paths.checkpoints))]

    @property
    def partial_checkpoints(self) -> list[Path]:
        return checkpoint.list_partials(self.paths.checkpoints)

    def history(self) -> tuple[dict[str, np.ndarray], checkpoint.Header] | None:
        """The per-generation history in the newest checkpoint that validates, with its header;
        None when no checkpoint validates."""
        for info in self.checkpoints:
            report = info.verify()
            if report.problem is None:
                return checkpoint.read_history(info.path), report.header
        return None


def open_run(path: str | Path) -> RunRecord:
    """A run directory, read on this process alone: config, summary, metrics, checkpoints."""
    return RunRecord(path)


def _flat_islands(rec: dict[str, Any]) -> dict[str, Any]:
    """A metrics record with its "islands" list as numeric fields ``island<i>.<field>``."""
    if not isinstance(rec.get("islands"), list):
        return rec
    out = {k: v for k, v in rec.items() if k != "islands"}
    for i, isl in enumerate(rec["islands"]):
        if isinstance(isl, dict):
            out.update({f"island{i}.{k}": v for k, v in isl.items() if k not in ("island", "algorithm")})
    return out
