"""A study's journal and where each of its runs stands. One process, no MPI.

    <study out>/journal.jsonl          one JSON record per event, appended by the job's rank 0
    <study out>/journal-<i>of<k>.jsonl the same for slice i of k (array tasks: a file each)

Events: ``study`` (a launch: ranks, groups, runs to do), ``start`` (a run given to a group: its
ranks and hosts), ``end`` (``status`` complete, stopped or failed; the error, best fitness,
digest, seconds), ``halt`` (no more runs given: a signal, the deadline, a fatal error) and
``finished`` (a launch's counts and the share of rank-time left idle).

Where a run stands is read from its run directory first (a complete summary is done, whatever
the journal says) and from the journal's last word on it otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from ..driver.rundir import RunPaths, read_summary
from ..errors import UsageError
from .spec import Study, StudyRun

STATES = ("done", "failed", "stopped", "running", "pending")


def journal_path(out: Path, part: tuple[int, int] | None = None) -> Path:
    return out / ("journal.jsonl" if part is None else f"journal-{part[0]}of{part[1]}.jsonl")


def journal_files(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if re.fullmatch(r"journal(-\d+of\d+)?\.jsonl", p.name) and p.is_file())


class Journal:
    """Appends events, each flushed and synced as it comes (a killed job loses none that were
    written); never through a link planted in its place."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise UsageError(f"study journal '{path}' cannot be written: {e.strerror}") from None
        self.path = path

    def write(self, event: dict[str, Any]) -> None:
        try:
            os.write(self._fd, (json.dumps(event, default=_plain) + "\n").encode())
            os.fsync(self._fd)
        except OSError as e:
            raise UsageError(f"study journal '{self.path}' cannot be written: {e.strerror}; the runs finished so "
                             "far are complete in their directories: free space or fix the directory, then "
                             "resume the study") from None

    def close(self) -> None:
        os.close(self._fd)


def _plain(value: Any) -> Any:
    try:
        return value.item()  # NumPy scalars
    except AttributeError:
        return repr(value)


def read_events(out: Path) -> list[dict[str, Any]]:
    """Every journal's events, in time order (a torn last line, from a killed job, ends its file)."""
    events = []
    for path in journal_files(out):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                break
            if isinstance(event, dict) and isinstance(event.get("time"), (int, float)):
                events.append(event)
    return sorted(events, key=lambda e: e["time"])


@dataclasses.dataclass(frozen=True)
class RunState:
    run: StudyRun
    state: str  # one of STATES
    detail: str = ""  # the error of a failed run; how far a stopped one got
    summary: dict[str, Any] | None = None


def is_done(run: StudyRun, summary: dict[str, Any] | None) -> bool:
    """A complete summary for at least the run's generations (or ended early by a criterion)."""
    if not summary or summary.get("status") != "complete":
        return False
    planned = run.data.get("run", {}).get("generations")
    return summary.get("stopped_by") is not None or planned is None or summary.get("generations", 0) >= planned


def states(study: Study, events: list[dict[str, Any]] | None = None) -> list[RunState]:
    """Where every run of ``study`` stands."""
    events = read_events(study.out) if events is None else events
    last: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("event") in ("start", "end") and isinstance(e.get("run"), str):
            last[e["run"]] = e
    out = []
    for run in study.runs:
        try:
            summary = read_summary(RunPaths.of(run.out))
        except UsageError:
            summary = None
        e = last.get(run.name)
        if is_done(run, summary):
            out.append(RunState(run, "done", summary=summary))
        elif e is not None and e["event"] == "end" and e.get("status") == "failed":
            out.append(RunState(run, "failed", str(e.get("error", ""))))
        elif e is not None and e["event"] == "end" and e.get("status") == "stopped":
            out.append(RunState(run, "stopped", f"stopped at generation {e.get('generations')}"))
        elif e is not None or RunPaths.of(run.out).config.is_file():
            out.append(RunState(run, "running", "started, not finished: running now, or its job ended"))
        else:
            out.append(RunState(run, "pending"))
    return out
