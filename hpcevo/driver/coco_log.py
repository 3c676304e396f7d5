"""COCO data from a run on a BBOB problem (``[log] coco = true``): what ``cocopp`` reads.

Rank 0 logs every evaluation the algorithm used (``Algorithm.rows_used``), in the order they
were evaluated, from the fitness values every rank already holds after the allgather, into
``<run dir>/coco`` in COCO's bbob format (``hpcevo.coco``). The values are the run's own, so the
files are the same at any rank count. Writes happen between dispatches, under a collective
stage: a full disk on rank 0 is every rank's error, at once.

Resume: after each checkpoint the logger's state (``BBOBLogger.state``: counts, triggers, file
sizes) goes to ``coco/.hpcevo/gen-NNNNNNNNN.json``; a run resumed from that checkpoint cuts what
the files gained after it (the generations it evaluates again) and continues them, so a resumed
run's files equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..coco import BBOBLogger
from ..errors import ConfigError, UsageError
from ..parallel import ParallelContext, collective_stage

STATES_KEPT = 8  # states of the newest checkpoints (a checkpoint older than these cannot be resumed with coco)


def _state_path(folder: Path, generation: int) -> Path:
    return folder / ".hpcevo" / f"gen-{generation:09d}.json"


class CocoLog:
    """The COCO logger of one run (its methods are collective; rank 0 writes)."""

    def __init__(self, ctx: ParallelContext, problem: Any, run_dir: Path, algorithm: str, comment: str,
                 where: str):
        if not all(hasattr(problem, k) for k in ("function", "instance", "fopt")):
            raise ConfigError(f"{where}: 'log.coco' writes COCO's bbob data: it needs a BBOB problem "
                              f"([problem] name = \"bbob\"), not {problem.name}", "log.coco")
        self.ctx, self.problem, self.folder = ctx, problem, Path(run_dir) / "coco"
        self.algorithm = "".join(c if c.isalnum() or c in "-_." else "-" for c in algorithm) or "hpcevo"
        self.comment = comment.replace("'", "").replace("\n", " ")
        self.logger: BBOBLogger | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray | None]] = []

    @property
    def with_x(self) -> bool:
        """COCO's bbob lines carry the point below 7 dimensions: the run must bring them back."""
        return self.problem.dim < 7

    def observe(self, f: np.ndarray, x: np.ndarray | None = None) -> None:
        """``Loop(observe=...)``: each dispatch's evaluations, kept until the next ``flush``."""
        if self.ctx.is_root:
            self._pending.append((np.array(f, np.float64), None if x is None else np.array(x, np.float64)))

    def start(self, resumed_at: int | None) -> None:
        """A new logger (a fresh run), or the one the checkpoint of ``resumed_at`` left."""
        with collective_stage(self.ctx):
            if self.ctx.is_root:
                if self.folder.is_symlink() or (self.folder.exists() and not self.folder.is_dir()):
                    what = "a symbolic link" if self.folder.is_symlink() else "not a folder"
                    raise UsageError(f"log.coco: '{self.folder}' is {what}: a run writes its COCO data into a coco/ "
                                     "folder of its own, never through a link (it would land outside the run "
                                     "directory); remove it")
                if resumed_at is None:
                    self.logger = self._new()
                else:
                    self.logger = self._restored(resumed_at)

    def _new(self) -> BBOBLogger:
        p = self.problem
        return BBOBLogger(self.folder, function=p.function, instance=p.instance, dim=p.dim, fopt=p.fopt,
                          algorithm=self.algorithm, comment=self.comment)

    def _restored(self, generation: int) -> BBOBLogger:
        path = _state_path(self.folder, generation)
        if not path.is_file():
            raise UsageError(f"log.coco: no COCO logger state for the checkpoint of generation {generation} "
                             f"({path}): COCO's data needs every evaluation from the first, so a run can only "
                             "continue its COCO files from a checkpoint written with log.coco = true. Start "
                             "it again (--overwrite), or resume with log.coco = false")
        # (the folder the state names is where the run was: a copied or moved run writes its own)
        try:
            state = json.loads(path.read_text())
            return BBOBLogger.from_state(state, folder=self.folder)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise UsageError(f"log.coco: the COCO logger state for the checkpoint of generation {generation} "
                             f"({path}) is damaged ({type(e).__name__}: {e}): the run's COCO data cannot be "
                             "continued from it. Start the run again (--overwrite), or resume with log.coco = "
                             "false") from None

    def flush(self) -> None:
        """Write what was observed since the last flush (collective)."""
        with collective_stage(self.ctx):
            if self.ctx.is_root and self._pending:
                pending, self._pending = self._pending, []
                for f, x in pending:
                    assert self.logger is not None
                    self.logger.observe(f, x)

    def checkpointed(self, generation: int) -> None:
        """The logger's state for the checkpoint of ``generation`` (collective)."""
        self.flush()
        with collective_stage(self.ctx):
            if self.ctx.is_root and self.logger is not None:
                path = _state_path(self.folder, generation)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.logger.state()))
                os.replace(tmp, path)
                for old in sorted(path.parent.glob("gen-*.json"))[:-STATES_KEPT]:
                    old.unlink()

    def close(self) -> None:
        """The run is complete: the last lines and the .info entry's end (collective)."""
        self.flush()
        with collective_stage(self.ctx):
            if self.ctx.is_root and self.logger is not None:
                self.logger.close()
