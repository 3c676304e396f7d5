"""The run directory: the one owner of its files, their names and their record formats.

    <run dir>/config.toml      the resolved config (every default filled in)
    <run dir>/metrics.jsonl    one JSON record per log boundary
    <run dir>/summary.json     the outcome, written when the run completes
    <run dir>/failures.jsonl   host problems: one JSON record per failed evaluation
    <checkpoint dir>/          gen-NNNNNNNNN.h5 (``hpcevo.checkpoint``); default <run dir>/checkpoints

``RunDir`` writes them during a run (collectively: rank 0 writes, every rank learns the outcome);
the module functions read them on one process (``hpcevo inspect``, ``plot``, ``hpcevo.open_run``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Iterator

from .. import checkpoint
from ..errors import UsageError
from ..parallel import ParallelContext, collective_stage

CONFIG, METRICS, SUMMARY, FAILURES = "config.toml", "metrics.jsonl", "summary.json", "failures.jsonl"
RUN_FILES = (CONFIG, METRICS, SUMMARY, FAILURES)


@dataclasses.dataclass(frozen=True)
class RunPaths:
    root: Path
    checkpoints: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def failures(self) -> Path:
        return self.root / FAILURES

    @classmethod
    def of(cls, root: str | Path, checkpoint_dir: str | Path | None = None) -> "RunPaths":
        root = Path(root)
        return cls(root, Path(checkpoint_dir) if checkpoint_dir else root / "checkpoints")

    @classmethod
    def find(cls, root: str | Path) -> "RunPaths":
        """The paths of an existing run directory (its config may move the checkpoints)."""
        root = Path(root)
        ckdir = None
        if (root / CONFIG).is_file():
            try:
                ckdir = tomllib.loads((root / CONFIG).read_text()).get("checkpoint", {}).get("dir")
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
                ckdir = None
        return cls.of(root, ckdir)


class RunDir:
    """A run directory being written by the ranks of ``ctx`` (rank 0 writes)."""

    def __init__(self, ctx: ParallelContext, paths: RunPaths):
        self.ctx, self.paths = ctx, paths

    def prepare(self, overwrite: bool, resume: bool) -> None:
        """Check and create the directories. Collective.

        An existing run is continued only with ``resume``, replaced only with ``overwrite``: never
        silently. Both directories are probed for writing now, not an hour into the run.
        """
        def unwritable(error: BaseException) -> BaseException:
            if isinstance(error, OSError):
                where = error.filename or self.paths.root
                return UsageError(f"run directory '{where}' cannot be written: {error.strerror}")
            return error

        with collective_stage(self.ctx, convert=unwritable):
            if self.ctx.is_root:
                self._prepare(overwrite, resume)

    def _prepare(self, overwrite: bool, resume: bool) -> None:
        out, ckdir = self.paths.root, self.paths.checkpoints
        existing = [f for f in RUN_FILES if (out / f).exists()]
        checkpoints = checkpoint.list_checkpoints(ckdir)
        if checkpoints:
            existing.append(f"{len(checkpoints)} checkpoint(s) in {ckdir}")
        if existing and not (overwrite or resume):
            raise UsageError(
                f"run directory '{out}' already holds a run ({', '.join(existing)}); pass --resume "
                "to continue it, --overwrite to replace it, or choose another with --set run.out=DIR")
        if existing and overwrite:
            for f in RUN_FILES:
                (out / f).unlink(missing_ok=True)
            for path in checkpoints:
                path.unlink()
        for d in (out, ckdir):
            d.mkdir(parents=True, exist_ok=True)
            probe = d / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        checkpoint.remove_partials(ckdir)

    def start(self, config_text: str, resumed_at: int | None) -> None:
        """Write the resolved config; a resumed run keeps the records up to its checkpoint (it
        writes the rest again) and no run keeps failures of generations still to come."""
        if not self.ctx.is_root:
            return
        self.paths.config.write_text(config_text)
        if resumed_at is not None:
            truncate_records(self.paths.metrics, resumed_at)
        truncate_records(self.paths.failures, resumed_at or 0)

    def metrics_writer(self, append: bool) -> "RecordWriter":
        return RecordWriter(self.paths.metrics if self.ctx.is_root else None, append)

    def append_failures(self, records: list[dict]) -> None:
        if self.ctx.is_root and records:
            with open(self.paths.failures, "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in records)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.ctx.is_root:
            tmp = self.paths.summary.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, self.paths.summary)


class RecordWriter:
    """JSON lines appended and flushed one at a time (a no-op on ranks other than 0)."""

    def __init__(self, path: Path | None, append: bool):
        self._file = open(path, "a" if append else "w") if path is not None else None

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_records(path: Path, generation: int) -> None:
    """Keep the records up to ``generation`` (and stop at a torn last line from a killed run)."""
    if not path.exists():
        return
    keep = [line + "\n" for line, r in _lines(path) if r["generation"] <= generation]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


# -- readers (one process, no MPI) ---------------------------------------------------------------
def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, up to the first that cannot be read (a torn line)."""
    return [record for _, record in _lines(path)]


def _lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if not Path(path).is_file():
        return
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict) or not isinstance(record.get("generation"), int):
            return
        yield line, record


def read_config(paths: RunPaths) -> dict[str, Any] | None:
    """The resolved config as TOML data, or None when the directory has none."""
    if not paths.config.is_file():
        return None
    try:
        return tomllib.loads(paths.config.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"'{paths.config}' is not a readable config: {e}") from None


def read_summary(paths: RunPaths) -> dict[str, Any] | None:
    if not paths.summary.is_file():
        return None
    try:
        return json.loads(paths.summary.read_text())
    except ValueError as e:
        raise UsageError(f"'{paths.summary}' is not readable JSON: {e}") from None


def run_config_path(run_dir: str | Path) -> Path:
    """The resolved config a run directory holds (for `hpcevo resume RUN_DIR`)."""
    if not Path(run_dir).is_dir():
        raise UsageError(f"run directory '{run_dir}' not found")
    path = RunPaths.of(run_dir).config
    if not path.is_file():
        raise UsageError(f"'{run_dir}' is not a run directory: it has no config.toml")
    return path
