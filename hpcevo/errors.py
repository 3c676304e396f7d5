"""Errors the CLI maps to exit codes, and the exit codes themselves.

    0   the run finished
    1   unexpected error (traceback prefixed with its rank; MPI_Abort ends the whole job)
    2   bad input: config, argument, run directory, checkpoint that does not fit the config
    3   replicas of the algorithm state diverged between ranks
    4   a checkpoint could not be written (disk full, directory not writable)
    5   a study ended with runs that failed on their own (recorded in its journal); the others ran
    75  stopped early on a signal or deadline after writing a checkpoint: requeue and --resume
        (75 is EX_TEMPFAIL of sysexits.h: "temporary failure, the user is invited to retry")
"""

from __future__ import annotations

import difflib
import traceback
from pathlib import Path
from typing import Iterable

EXIT_STOPPED = 75
EXIT_RUNS_FAILED = 5


class UsageError(Exception):
    """Bad input from the user (config, argument, run directory): exit code 2, no traceback."""

    exit_code = 2


class ConfigError(UsageError, ValueError):
    """A problem in the run configuration, or in a setting handed over from Python (an
    algorithm's hyper-parameter, an argument of ``hpcevo.run`` or ``hpcevo.Loop``). ``key`` is
    the config key or argument it is about ("run.seed", "algorithm.phi", "migrants"; "" when the
    message names several or none). Also a ``ValueError``: a bad value."""

    def __init__(self, message: str, key: str = ""):
        super().__init__(message)
        self.key = key


class UserCodeExit(UsageError):
    """Code of the user's (a problem, an algorithm of one's own) ended its process: ``sys.exit``
    where it should have returned a value or raised. Every rank raises it, naming the rank."""


class CheckpointDamaged(UsageError):
    """A checkpoint file that cannot be trusted (truncated, bad checksum, unfinished, missing):
    a resume skips it for the one before; loading it by name raises this."""


class DivergenceError(RuntimeError):
    """Replicas of the algorithm state differ between ranks: the run can no longer be trusted."""

    exit_code = 3


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the checkpoints published before it are intact."""

    exit_code = 4
    # True when the other ranks are stuck inside HDF5's own collective and cannot hear of the
    # error (parallel.agree_on_error's stranded_after): the rank holding it must report it and
    # end the job itself.
    stranded = False


def did_you_mean(word: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """"; did you mean 'x'?" for the choice closest to ``word``, or "" when none is close enough
    (``cutoff``: difflib's similarity ratio, 0..1)."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=cutoff)
    return f"; did you mean '{close[0]}'?" if close else ""


_PACKAGE = str(Path(__file__).resolve().parent)


def is_library_frame(filename: str) -> bool:
    """A frame of hpcevo's, an installed package's or Python's own (not the user's code)."""
    return (filename.startswith(_PACKAGE) or "site-packages" in filename or "dist-packages" in filename
            or filename.startswith("<frozen") or "/lib/python3" in filename)


def user_location(error: BaseException) -> str | None:
    """"file.py, line N" of the innermost frame of ``error``'s traceback that is the user's own
    code (None when every frame is a library's)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not is_library_frame(f.filename)]
    return f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else None
