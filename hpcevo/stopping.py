"""When to stop early: signals from the scheduler or the user, and wall-clock deadlines.

Nothing here acts: handlers only set a flag, and the runner looks at it at the next chunk
boundary, where all ranks agree on it with one collective and stop at the same generation with a
checkpoint. Host-side and MPI-free.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import time


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopFlag:
    """Records the first stop signal this process receives.

    SIGTERM (scheduler preemption / ``scancel``), SIGUSR1 (Slurm's ``--signal`` warning) and SIGINT
    (Ctrl-C) ask for a checkpoint and a clean exit. A second SIGINT means "now": it raises
    KeyboardInterrupt, which ends the job without a checkpoint.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def install(self) -> "StopFlag":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.signum:
            self.signum = signum

    def __enter__(self) -> "StopFlag":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(value: str | int | float, now: float) -> float:
    """A deadline as an epoch time. Accepts seconds from now (``5400``), a duration (``90m``,
    ``1.5h``, ``01:30:00``, ``1-06:00:00`` as Slurm writes days), or an absolute local time in ISO
    form (``2026-11-23T18:00``, with or without a UTC offset). Raises ValueError saying what is
    allowed."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration or a time, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return now + float(value)
    text = str(value).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
        if seconds <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return now + seconds
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?", text)
    if m:
        days, a, b, c = (int(g) if g else 0 for g in m.groups())
        seconds = days * 86400 + (a * 3600 + b * 60 + c if m.group(4) else a * 60 + b)
        return now + seconds
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read {text!r}; allowed: seconds (5400), a duration (90m, 1.5h, "
            "01:30:00, 1-06:00:00) or a local time (2026-11-23T18:00)") from None
    return t.timestamp()


def scheduler_end_time(env: dict[str, str] | None = None, timeout: float = 5.0) -> float | None:
    """The job's end time as an epoch time when the batch system says so, else None.

    Slurm 23.02+ exports SLURM_JOB_END_TIME; older Slurm answers ``squeue -o %e``. Other
    schedulers: the job script passes --deadline (the templates in jobs/ do).
    """
    env = os.environ if env is None else env
    raw = env.get("SLURM_JOB_END_TIME", "")
    if raw.isdigit():
        return float(raw)
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True,
                             timeout=timeout).stdout.strip()
        return datetime.datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None  # no squeue, "N/A", "Unknown": no end time known


class Deadline:
    """Decides when a run must stop to leave time for its last checkpoint.

    It stops when what is left is less than the margin plus twice the longest dispatch and
    checkpoint seen so far: the next chunk and the checkpoint after it must both still fit.
    """

    def __init__(self, at: float | None, margin: float, source: str = ""):
        self.at, self.margin, self.source = at, margin, source
        self.longest_chunk = 0.0
        self.longest_checkpoint = 0.0

    def note_chunk(self, seconds: float) -> None:
        self.longest_chunk = max(self.longest_chunk, seconds)

    def note_checkpoint(self, seconds: float) -> None:
        self.longest_checkpoint = max(self.longest_checkpoint, seconds)

    def due(self, now: float | None = None) -> bool:
        if self.at is None:
            return False
        now = time.time() if now is None else now
        return self.at - now < self.margin + 2.0 * (self.longest_chunk + self.longest_checkpoint)
