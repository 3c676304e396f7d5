"""Writer of COCO's "bbob" logger data, so that COCO's post-processor ``cocopp`` reads hpcevo runs.

COCO is described in N. Hansen, A. Auger, R. Ros, O. Mersmann, T. Tušar, D. Brockhoff, "COCO: a
platform for comparing continuous optimizers in a black-box setting", Optimization Methods and
Software 36(1), 2021. The files written here are, byte for byte, those the ``bbob`` observer of
cocoex 2.8.2 (``logger_bbob.c`` and ``coco_observer.c`` of coco-experiment 2.8.2, data format
``bbob-new2``) writes for the same sequence of evaluations on the noiseless ``bbob`` suite::

    <folder>/bbobexp_f{f}.info                     one per function, all dimensions and instances
    <folder>/data_f{f}/bbobexp_f{f}_DIM{d}.dat     lines at target-crossing improvements
    <folder>/data_f{f}/bbobexp_f{f}_DIM{d}.tdat    lines at evaluation counts
    <folder>/data_f{f}/bbobexp_f{f}_DIM{d}.rdat    lines after a signalled restart
    <folder>/data_f{f}/bbobexp_f{f}_DIM{d}.mdat    header only (hpcevo makes no recommendations)

Use::

    log = BBOBLogger("results/hpcevo-cso", function=8, instance=1, dim=5, fopt=fopt)
    for f, x in generations:        # f: (n,) measured values (not f - fopt), x: (n, 5)
        log.observe(f, x)           # consecutive evaluations, in order
    log.close()                     # the final lines and the end of the .info entry

    obs = BBOBObserver("results/hpcevo-cso")     # exactly cocoex.Observer's file layout, whatever
    log = obs.logger(function=8, instance=1, dim=5, fopt=fopt)   # the order of the problems

The rules, as in cocoex 2.8.2:

* Evaluation k is the k-th value passed to ``observe`` (rows in order, across calls), except
  that where ``x`` is given, a row whose point has an infinite or NaN coordinate is no
  evaluation (COCO returns inf/NaN for it without counting or logging it; without ``x`` such
  rows cannot be told and count). A value that is NaN is logged as 2e21, +-inf as 3e21 (COCO's
  NAN_FOR_LOGGING, INFINITY_FOR_LOGGING); the best value is ``max(f, fopt)`` (a value under
  ``fopt`` counts as ``fopt``, where COCO would fail an assertion).
* .dat: evaluation 1, and each strict improvement of the best value after it whose ``best - fopt``
  reaches a new logarithmic target (``ceil(20 log10(best - fopt))`` decreases; values under
  ``log_target_precision`` 1e-8 count as 1e-8, exactly 0 as 1e-9; ``number_target_triggers`` 20
  per decade) or a new linear target (``best - fopt`` rounded up to a multiple of
  ``lin_target_precision`` 1e5 decreases). Evaluation 1 does not consult the targets, so the
  first improvement after it always gives a line.
* .tdat: evaluations ``floor(10**(i/20))`` (20 per decade; COCO's ``number_evaluation_triggers``
  option is read but not used by this logger) and ``dim * b * 10**j`` for ``b`` in
  ``base_evaluation_triggers`` (1, 2, 5).
* close: the .info entry ends ``:evaluations|best - fopt``; .dat and .tdat get a line for the last
  evaluation (with the best point and value) if it has none.
* Lines: ``evaluations 0 best-fopt f best`` in ``%+10.9e`` (the 0 counts constraint evaluations),
  then the point in ``%+5.4e`` when ``dim < 7`` (COCO's LOGGER_BBOB_NUMBER_OF_VARIABLES_THRESHOLD;
  cocoex 2.8.2 has no option for it). ``log_variables`` is "low_dim" (that rule, the default),
  "all" or "none" (extensions: no COCO version writes them for bbob; cocopp ignores the columns).
* .info: a new line (header, the comment line ``% comment``, the .dat path) when the previous
  problem of the same folder had another function or dimension; otherwise the instance joins the
  line ``data_f1/bbobexp_f1_DIM2.dat, 1:291|1.2e-09, 2:...`` and its lines join the same .?dat
  files after a new header. A new line whose .dat exists already takes ``-0001`` etc.

Writes happen as COCO's do: the .info header and ``, instance`` and the file headers at the first
evaluation, the lines as they come (appended per ``observe`` call), ``:evaluations|best`` at close.
A run that ends without ``close`` leaves files cocopp still reads (it warns of an "ill-finalized
run" and uses the data). Resume: ``state()`` is a small JSON-able dict (evaluations, best value
and point, trigger positions, file sizes); ``BBOBLogger.from_state(state)`` continues the same
files, truncating what was written after the state was taken (the generations a resumed run
replays; for a state taken before the first evaluation, the start itself), and refuses, leaving
the files as they are, when another run has written to them since: what it cuts must be this
run's own data lines (evaluations from the state on, this instance's f_opt; the last one may be
torn by a kill), and each file's last bytes at the state must be found again where they were. Export the state with each
checkpoint, after that generation's ``observe``. Replaying the whole run into a fresh folder
gives the same files too.

"Which line": a standalone ``BBOBLogger`` joins the last line of ``bbobexp_f{f}.info`` when that
line is for the same dimension, which is what COCO does when the instances of one (function,
dimension) are run one after the other; ``BBOBObserver`` keeps COCO's in-memory rule (the
previous problem of the observer) for any order. One writer per (folder, function, dimension) at
a time: concurrent writers would interleave their blocks, as two COCO observers would.
"""

from __future__ import annotations

import errno
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ConfigError, UsageError

__all__ = ["BBOBLogger", "BBOBObserver", "COCO_VERSION", "DATA_FORMAT", "CocoFilesChanged"]

# Written into every .info header. Fixed rather than read from an installed cocoex: the files
# follow the logger of this version (format, triggers), and the number says which one; cocopp
# (2.9.1 tested) reads it as an informative string only.
COCO_VERSION = "2.8.2"
DATA_FORMAT = "bbob-new2"
_LOGGER_NAME = "bbob"
_PREFIX = "bbobexp"
_PRECISION = 1e-8  # the .info header's "Precision", a constant (pow(10, -8)) in logger_bbob.c
_X_THRESHOLD = 7  # LOGGER_BBOB_NUMBER_OF_VARIABLES_THRESHOLD: x logged when dim < 7
_NAN_FOR_LOGGING = 2e21
_INFINITY_FOR_LOGGING = 3e21
_EVALUATION_TRIGGERS_PER_DECADE = 20  # OBSERVER_DEFAULT_NUMBER_OF_EVALUATION_TRIGGERS, hard-wired
_INT_MAX = 2**31 - 1  # the log-target state starts at C's INT_MAX
_DBL_MAX = sys.float_info.max  # the linear-target state starts at DBL_MAX
_HEADER = ("%% f evaluations | g evaluations | best noise-free fitness - Fopt (%13.12e) + sum g_i+ | "
           "measured fitness | best measured fitness or single-digit g-values | x1 | x2...\n")
_EXTENSIONS = (".dat", ".tdat", ".rdat", ".mdat")
_STATE_FORMAT = "hpcevo.coco.BBOBLogger/1"
_LOG_VARIABLES = ("low_dim", "all", "none")


class CocoFilesChanged(UsageError):
    """A logger's files changed after its state was exported (another run wrote to them): the run
    cannot continue them; start the instance again or write to another folder."""


def _check_text(value: object, key: str, *, spaces: bool) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {type(value).__name__}", key)
    # A quote ends COCO's '...' fields and a newline its lines: cocopp would misread the .info.
    bad = "'\n\r" + ("" if spaces else " \t")
    if any(c in value for c in bad):
        raise ConfigError(f"{key} {value!r} must not contain quotes, newlines" + ("" if spaces else " or spaces"), key)
    return value


def _check_int(value: object, key: str, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
        raise ConfigError(f"{key} must be an integer >= {lowest}, got {value!r}", key)
    return int(value)


class _Settings:
    """The observer options that shape the files (COCO's names and defaults)."""

    def __init__(self, folder, algorithm, comment, suite, log_variables, number_target_triggers,
                 log_target_precision, lin_target_precision, base_evaluation_triggers):
        self.folder = Path(folder)
        self.algorithm = _check_text(algorithm, "algorithm", spaces=False)
        if not algorithm:
            raise ConfigError("algorithm must not be empty", "algorithm")
        self.comment = _check_text(comment, "comment", spaces=True)
        self.suite = _check_text(suite, "suite", spaces=False)
        if log_variables not in _LOG_VARIABLES:
            raise ConfigError(f"log_variables must be one of {_LOG_VARIABLES}, got {log_variables!r}", "log_variables")
        self.log_variables = log_variables
        self.number_target_triggers = _check_int(number_target_triggers, "number_target_triggers", 0)
        self.log_target_precision = float(log_target_precision)
        if not self.log_target_precision > 0 or not math.isfinite(self.log_target_precision):
            raise ConfigError(f"log_target_precision must be > 0, got {log_target_precision!r}", "log_target_precision")
        self.lin_target_precision = float(lin_target_precision)
        # coco_double_round_up_with_precision asserts precision > 1e-12
        if not self.lin_target_precision > 1e-12 or not math.isfinite(self.lin_target_precision):
            raise ConfigError(f"lin_target_precision must be > 1e-12, got {lin_target_precision!r}",
                              "lin_target_precision")
        bases = [_check_int(b, "base_evaluation_triggers", 1) for b in base_evaluation_triggers]
        if not bases:
            raise ConfigError("base_evaluation_triggers must not be empty", "base_evaluation_triggers")
        self.base_evaluation_triggers = bases

    def as_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "algorithm": self.algorithm, "comment": self.comment,
                "suite": self.suite, "log_variables": self.log_variables,
                "number_target_triggers": self.number_target_triggers,
                "log_target_precision": self.log_target_precision,
                "lin_target_precision": self.lin_target_precision,
                "base_evaluation_triggers": list(self.base_evaluation_triggers)}


class _EvaluationTriggers:
    """coco_observer_evaluations_t: the evaluation counts that give a .tdat line. Stepped once per
    line, not per evaluation, so a block of thousands of evaluations costs a few steps."""

    def __init__(self, dim: int, bases: Sequence[int], state: Sequence[int] | None = None):
        self.dim = dim
        self.bases = list(bases)
        if state is None:
            self.value1, self.exponent1 = 1, 0
            self.value2, self.exponent2, self.base_index = dim * self.bases[0], 0, 0
        else:
            self.value1, self.exponent1, self.value2, self.exponent2, self.base_index = (int(v) for v in state)

    def state(self) -> list[int]:
        return [self.value1, self.exponent1, self.value2, self.exponent2, self.base_index]

    def _advance_first(self) -> None:
        # math.pow is the C library's pow, as in coco_observer.c, so the floors agree.
        n = _EVALUATION_TRIGGERS_PER_DECADE
        while math.floor(math.pow(10.0, self.exponent1 / n)) <= self.value1:
            self.exponent1 += 1
        self.value1 = math.floor(math.pow(10.0, self.exponent1 / n))

    def _advance_second(self) -> None:
        if self.base_index < len(self.bases) - 1:
            self.base_index += 1
        else:
            self.base_index = 0
            self.exponent2 += 1
        # coco_double_to_size_t rounds: floor(v + 0.5); the product in C's order
        self.value2 = math.floor(math.pow(10.0, self.exponent2) * float(self.dim)
                                 * float(self.bases[self.base_index]) + 0.5)

    def fire(self, first: int, last: int) -> list[int]:
        """The evaluations in first..last (consecutive, each checked by COCO in turn) that trigger."""
        out: list[int] = []
        k = first
        while True:
            # Each trigger fires at the first evaluation >= its value; checking both there (as COCO
            # checks both at every evaluation) keeps the states exactly in step.
            k = max(k, min(self.value1, self.value2))
            if k > last:
                return out
            if k >= self.value1:
                self._advance_first()
            if k >= self.value2:
                self._advance_second()
            out.append(k)
            k += 1


def _log_exponents(v: np.ndarray, per_decade: int, precision: float) -> np.ndarray:
    """ceil(log10(v') * per_decade) for v >= 0, v' as in coco_observer_log_targets_trigger."""
    verified = np.where(v == 0, precision / 10.0, np.where(v < precision, precision, v))
    t = np.log10(verified) * float(per_decade)
    e = np.ceil(t)
    # NumPy's log10 may differ from the C library's in the last bit; where that could move the
    # ceiling (t within a hair of an integer), use the C library's, as COCO does.
    for i in np.flatnonzero(np.abs(t - np.rint(t)) < 1e-6):
        e[i] = math.ceil(math.log10(float(verified[i])) * float(per_decade))
    return e.astype(np.int64)


def _lin_targets(v: np.ndarray, precision: float) -> np.ndarray:
    """coco_double_round_up_with_precision(v, precision), element-wise (exact IEEE operations)."""
    q = v / precision
    rounded_up = np.ceil(q) * precision
    rounded = np.floor(q + 0.5) * precision
    near = np.abs((v - rounded) - 0.0) < 1e-12
    return np.where(np.abs(rounded - rounded_up) < precision, rounded_up, np.where(near, rounded, rounded_up))


class BBOBLogger:
    """One run (one instance of one function in one dimension) logged in COCO's bbob format.

    ``folder`` is the result folder itself (COCO's ``exdata/<result_folder>``; created if needed,
    never renamed). ``fopt`` is the instance's optimal value. ``comment`` is the .info comment line
    (COCO's ``algorithm_info``); ``algorithm`` the ``algId`` (no spaces, as COCO's plots need).
    ``number_target_triggers``, ``log_target_precision``, ``lin_target_precision`` and
    ``base_evaluation_triggers`` are COCO's observer options of those names, with its defaults.
    """

    def __init__(self, folder: str | os.PathLike, *, function: int, instance: int, dim: int, fopt: float,
                 algorithm: str = "hpcevo", comment: str = "", suite: str = "bbob", log_variables: str = "low_dim",
                 number_target_triggers: int = 20, log_target_precision: float = 1e-8,
                 lin_target_precision: float = 1e5, base_evaluation_triggers: Sequence[int] = (1, 2, 5),
                 _observer: BBOBObserver | None = None):
        self._settings = _Settings(folder, algorithm, comment, suite, log_variables, number_target_triggers,
                                   log_target_precision, lin_target_precision, base_evaluation_triggers)
        self.function = _check_int(function, "function", 1)
        self.instance = _check_int(instance, "instance", 1)
        self.dim = _check_int(dim, "dim", 1)
        try:
            self.fopt = float(fopt)
        except (TypeError, ValueError):
            raise ConfigError(f"fopt must be a number, got {fopt!r}", "fopt") from None
        if not math.isfinite(self.fopt):
            raise ConfigError(f"fopt must be finite, got {fopt!r}", "fopt")
        s = self._settings
        self.log_x = s.log_variables == "all" or (s.log_variables == "low_dim" and self.dim < _X_THRESHOLD)
        self._observer = _observer
        self._closed = False
        self._dat_base: str | None = None  # relative to the folder, without extension
        self.evaluations = 0
        self._best = math.inf  # C starts at DBL_MAX; evaluation 1 replaces it unconditionally
        self._best_x: np.ndarray | None = None
        self._last_dat = 0
        self._last_tdat = 0
        self._log_exponent = _INT_MAX
        self._lin_value = _DBL_MAX
        self._triggers = _EvaluationTriggers(self.dim, s.base_evaluation_triggers)
        self._restart_pending = False

    # --- the public face -------------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        return self._settings.folder

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def best(self) -> float | None:
        """The best measured value so far (``max(f, fopt)`` as logged), None before the first."""
        return self._best if self.evaluations else None

    @property
    def dat_path(self) -> Path | None:
        """The .dat file this run writes to (None before its first evaluation)."""
        return None if self._dat_base is None else self.folder / (self._dat_base + ".dat")

    @property
    def info_path(self) -> Path:
        return self.folder / f"{_PREFIX}_f{self.function}.info"

    def observe(self, f, x=None) -> None:
        """Log consecutive evaluations: ``f`` of shape (n,), the measured values (f itself, not
        f - fopt), ``x`` of shape (n, dim), needed where lines carry the variables (``log_x``)."""
        if self._closed:
            raise UsageError("observe() on a closed BBOBLogger")
        try:
            f = np.asarray(f, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"f must be an array of numbers: {e}") from None
        if f.ndim != 1:
            raise ValueError(f"f must have shape (n,), one value per evaluation; got shape {f.shape}")
        n = f.shape[0]
        if x is not None:
            try:
                x = np.asarray(x, dtype=np.float64)
            except (TypeError, ValueError) as e:
                raise ValueError(f"x must be an array of numbers: {e}") from None
            if x.shape != (n, self.dim):
                raise ValueError(f"x must have shape (n, dim) = ({n}, {self.dim}) for f of shape {f.shape}; "
                                 f"got {x.shape}")
        elif self.log_x:
            raise ValueError(f"x is needed: lines carry the variables in dimension {self.dim} "
                             f"(log_variables={self._settings.log_variables!r})")
        if x is not None:
            # COCO does not evaluate (count, log) a point with an infinite or NaN coordinate
            # (coco_evaluate_function returns before the logger sees it).
            finite = np.isfinite(x).all(axis=1)
            if not finite.all():
                f, x = f[finite], x[finite]
                n = f.shape[0]
        if n == 0:
            return
        if self.evaluations == 0:
            self._initialize()
        self._observe(f, x if self.log_x else None)

    def signal_restart(self) -> None:
        """The algorithm restarts: the next evaluation gets a .rdat line (as
        ``cocoex.Observer.signal_restart``; ignored before the first evaluation, as there)."""
        if self._closed:
            raise UsageError("signal_restart() on a closed BBOBLogger")
        if self.evaluations > 0:
            self._restart_pending = True

    def close(self) -> None:
        """Write the end of the .info entry and the last evaluation's lines; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._observer is not None and self._observer._open is self:
            self._observer._open = None
        if self.evaluations == 0:
            return  # COCO creates no file for a problem never evaluated
        n, best = self.evaluations, self._best
        with _append_to(self.info_path) as fh:
            fh.write(":%d|%.1e" % (n, best - self.fopt))
        for last, ext in ((self._last_dat, ".dat"), (self._last_tdat, ".tdat")):
            if last != n:
                self._append(ext, [self._line(n, best, best, self._best_x)])
        self._last_dat = self._last_tdat = n

    def __enter__(self) -> BBOBLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- resume -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This logger's state as a JSON-able dict (floats round-trip through json exactly)."""
        sizes: dict[str, int | None]
        tails: dict[str, str] = {}
        if self._dat_base is not None:
            sizes = {"info": self.info_path.stat().st_size}
            tails["info"] = _tail(self.info_path, sizes["info"])
            for ext in _EXTENSIONS:
                path = self.folder / (self._dat_base + ext)
                sizes[ext] = path.stat().st_size
                tails[ext] = _tail(path, sizes[ext])
        else:
            # Not started: what the .info file was, so that a start after this state can be undone.
            sizes = {"info": self.info_path.stat().st_size if self.info_path.exists() else None}
        return {"format": _STATE_FORMAT, **self._settings.as_dict(), "function": self.function,
                "instance": self.instance, "dim": self.dim, "fopt": self.fopt, "closed": self._closed,
                "dat_base": self._dat_base, "evaluations": self.evaluations,
                "best": self._best if self.evaluations else None,
                "best_x": None if self._best_x is None else [float(v) for v in self._best_x],
                "last_dat": self._last_dat, "last_tdat": self._last_tdat,
                "log_exponent": self._log_exponent, "lin_value": self._lin_value,
                "evaluation_triggers": self._triggers.state(), "restart_pending": self._restart_pending,
                "sizes": sizes, "tails": tails}

    @classmethod
    def from_state(cls, state: dict[str, Any], observer: BBOBObserver | None = None, *,
                   folder: str | os.PathLike | None = None) -> BBOBLogger:
        """A logger that continues the run ``state`` (from ``state()``) in the same files.

        What was appended after the state was taken (lines of the evaluations a resumed run
        evaluates again, or the end of a close) is cut off; anything else written since (another
        run's entry or block) raises ``CocoFilesChanged``, as COCO's files can only grow at the
        end. ``observer``: the ``BBOBObserver`` the run belonged to, if any (restored first).
        ``folder``: where the files are now, if not where the state was taken (a copied or moved
        run continues its own files, never the original's)."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a BBOBLogger state (format {_STATE_FORMAT!r} expected)")
        keys = ("folder", "function", "instance", "dim", "fopt", "algorithm", "comment", "suite", "log_variables",
                "number_target_triggers", "log_target_precision", "lin_target_precision", "base_evaluation_triggers")
        if observer is not None and not state["closed"] and observer._open is not None and not observer._open.closed:
            raise UsageError("the observer has an open logger: close it first")
        given = {k: state[k] for k in keys}
        if folder is not None:
            given["folder"] = folder
        self = cls(_observer=observer, **given)
        self._dat_base = state["dat_base"]
        self.evaluations = int(state["evaluations"])
        self._best = math.inf if state["best"] is None else float(state["best"])
        self._best_x = None if state["best_x"] is None else np.asarray(state["best_x"], dtype=np.float64)
        self._last_dat, self._last_tdat = int(state["last_dat"]), int(state["last_tdat"])
        self._log_exponent, self._lin_value = int(state["log_exponent"]), float(state["lin_value"])
        self._triggers = _EvaluationTriggers(self.dim, self._settings.base_evaluation_triggers,
                                             state["evaluation_triggers"])
        self._restart_pending = bool(state["restart_pending"])
        self._closed = bool(state["closed"])
        if self._closed:
            return self  # a finished run: nothing to continue, its files are left alone
        if self._dat_base is not None:
            self._rewind(state["sizes"], state.get("tails") or {})
        else:
            self._rewind_unstarted(state["sizes"]["info"])
        if observer is not None:
            observer._open = self
        return self

    def _rewind(self, sizes: dict[str, int], tails: dict[str, str]) -> None:
        # Checked in full before anything is cut, so a refusal leaves the files as they were.
        cuts = []
        base = str(self._dat_base)
        for key, path in [("info", self.info_path)] + [(ext, self.folder / (base + ext)) for ext in _EXTENSIONS]:
            size = int(sizes[key])
            try:
                actual = path.stat().st_size
            except FileNotFoundError:
                raise CocoFilesChanged(f"{path} is gone since the state was taken") from None
            if actual < size:
                raise CocoFilesChanged(f"{path} is shorter ({actual} bytes) than when the state was taken ({size})")
            if key in tails and _tail(path, size) != tails[key]:
                raise CocoFilesChanged(f"{path} was changed before its last {size} bytes since the state was taken "
                                       "(its end then is not there now)")
            if actual > size:
                with open(path, "rb") as fh:
                    fh.seek(size)
                    extra = fh.read().decode("ascii", errors="replace")
                # Only this run's own later output may go: its data lines (the evaluations the
                # resumed run evaluates again), or the end of its close. Anything else (a line of
                # another run, an edit, a stray byte) would be cut without a word: refused.
                own = (re.fullmatch(r":\d+\|[^,\s]+", extra) is not None if key == "info"
                       else self._own_lines(extra))
                if not own:
                    raise CocoFilesChanged(f"{path} holds lines that this run did not write after the state was "
                                           "taken (another run's output, or an edit)")
                cuts.append((path, size))
        for path, size in cuts:
            _truncate(path, size)

    def _own_lines(self, extra: str) -> bool:
        """Whether ``extra`` is whole data lines as this logger writes them after the state it
        resumes from: evaluations from there on, in order, f - f_opt of this instance's f_opt."""
        last = self.evaluations
        width = 5 + (self.dim if self.log_x else 0)
        lines = extra.split("\n")
        # A process killed while writing a block may leave its last line torn: a beginning of one.
        torn = lines.pop()
        if torn and (re.fullmatch(r"\d+( [0-9+\-.e ]*)?", torn) is None or int(torn.split(" ")[0]) < last):
            return False
        for line in lines:
            fields = line.split(" ")
            if len(fields) not in (5, width) or fields[1] != "0" or not fields[0].isdigit():
                return False
            try:
                n, precision, best = int(fields[0]), float(fields[2]), float(fields[4])
                float(fields[3]), [float(v) for v in fields[5:]]
            except ValueError:
                return False
            # (both printed to 10 digits: their difference is known to about 1e-9 of the larger)
            if n < last or not math.isclose(precision, best - self.fopt, rel_tol=1e-8,
                                            abs_tol=1e-8 * (abs(best) + abs(self.fopt)) + 1e-300):
                return False
            last = n
        return True

    def _rewind_unstarted(self, info_size: int | None) -> None:
        """Undo a start (first evaluation) made after a state taken before it: the .info text it
        added and its block in the .?dat files, so that starting again makes the same choices."""
        path = self.info_path
        if not path.exists():
            if info_size is not None:
                raise CocoFilesChanged(f"{path} is gone since the state was taken")
            return
        raw = path.read_bytes()
        size = 0 if info_size is None else info_size
        if len(raw) < size:
            raise CocoFilesChanged(f"{path} is shorter ({len(raw)} bytes) than when the state was taken ({size})")
        extra = raw[size:].decode("utf-8", errors="replace")
        if not extra:
            return  # the run wrote nothing after the state: the .info comes first at a start
        m = re.fullmatch(r"(?:\n?suite = [^\n]*\n%[^\n]*\n(data_f\d+/[^,\s]+)\.dat)?, (\d+)(?::\d+\|[^,\s]+)?", extra)
        if m is None or int(m.group(2)) != self.instance:
            raise CocoFilesChanged(f"{path} holds output of another run written after the state was taken")
        base = m.group(1)
        if base is None:  # the run joined the line that was the file's last
            line = raw[:size].decode("utf-8", errors="replace").rsplit("\n", 1)[-1]
            base = line.split(",", 1)[0][:-len(".dat")]
        if not re.fullmatch(self._base_pattern(), base):  # the same instance number in another dimension
            raise CocoFilesChanged(f"{path} holds output of another run written after the state was taken")
        cuts = []
        for ext in _EXTENSIONS:
            data = self.folder / (base + ext)
            try:
                content = data.read_bytes()
            except FileNotFoundError:
                continue  # the start ended before it wrote this header
            # The block starts at the file's last header: this run's (it wrote last, as the .info shows)
            last = content.rfind(b"\n%")
            if last < 0 and not content.startswith(b"%"):
                raise CocoFilesChanged(f"{data} has no header line")
            cuts.append((data, last + 1))
        for data, start in cuts:
            if start == 0:
                data.unlink()  # the run created it: gone, so the same unique name is chosen again
            else:
                _truncate(data, start)
        if info_size is None:
            path.unlink()
        else:
            _truncate(path, info_size)

    # --- the logic of logger_bbob.c -----------------------------------------------------------

    def _initialize(self) -> None:
        """logger_bbob_initialize: choose the .info line and .dat file, write the headers."""
        s, f, d = self._settings, self.function, self.dim
        (s.folder / f"data_f{f}").mkdir(parents=True, exist_ok=True)
        if (s.folder / f"data_f{f}").is_symlink():
            raise UsageError(f"{s.folder / f'data_f{f}'} is a symbolic link: COCO data is never written through a "
                             "link (it would land outside the folder); remove it")
        base = f"data_f{f}/{_PREFIX}_f{f}_DIM{d}"
        if self._observer is not None:
            new_line, current = self._observer._new_line(f, d)
        else:
            current = self._last_info_dat()
            new_line = current is None
        if new_line:
            current = base
            counter = 1
            while (s.folder / (current + ".dat")).exists():  # coco_create_unique_filename
                if counter >= 9999:
                    raise UsageError(f"no unique .dat name left for {s.folder / base}")
                current = f"{base}-{counter:04d}"
                counter += 1
            if self._observer is not None:
                self._observer._last = (f, d, current)
        self._dat_base = current
        exists = self.info_path.exists()
        with _append_to(self.info_path) as fh:
            if new_line:
                fh.write(("\n" if exists else "")
                         + f"suite = '{s.suite}', funcId = {f}, DIM = {d}, Precision = {_PRECISION:.3e}, "
                         f"algId = '{s.algorithm}', coco_version = '{COCO_VERSION}', logger = '{_LOGGER_NAME}', "
                         f"data_format = '{DATA_FORMAT}', settings = ''\n"
                         f"% {s.comment}\n{current}.dat")
            fh.write(f", {self.instance}")
        header = _HEADER % self.fopt
        for ext in _EXTENSIONS:
            self._append(ext, [header])

    def _last_info_dat(self) -> str | None:
        """The .dat (without extension) of the .info file's last line when it is for this
        dimension: the line a standalone logger joins."""
        try:
            text = self.info_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        lines = text.splitlines()
        m = re.match(r"(%s)\.dat(,|$)" % self._base_pattern(), lines[-1] if lines else "")
        return m.group(1) if m else None

    def _base_pattern(self) -> str:
        """The .?dat files' name without extension, as a regex (-0001 etc. where COCO made it unique)."""
        return r"data_f%d/%s_f%d_DIM%d(?:-\d{4})?" % (self.function, _PREFIX, self.function, self.dim)

    def _observe(self, y: np.ndarray, x: np.ndarray | None) -> None:
        s = self._settings
        n0, n = self.evaluations, y.shape[0]
        # logger_bbob_evaluate, vectorised: NaN/inf to their logging values, clip at fopt
        y = np.where(np.isnan(y), _NAN_FOR_LOGGING, np.where(np.isinf(y), _INFINITY_FOR_LOGGING, y))
        m = np.maximum(y, self.fopt)
        best_after = np.minimum.accumulate(np.concatenate(([self._best], m)))
        best_before, best_after = best_after[:-1], best_after[1:]
        improved = m < best_before  # COCO updates the best only on strict improvement
        rows = np.flatnonzero(improved)
        checked = rows[rows > 0] if n0 == 0 else rows  # evaluation 1 skips the targets
        dat_rows = [0] if n0 == 0 else []
        if checked.size:
            v = m[checked] - self.fopt  # >= 0: m >= fopt
            fire = np.zeros(checked.size, dtype=bool)
            if s.number_target_triggers > 0:
                e = _log_exponents(v, s.number_target_triggers, s.log_target_precision)
                before = np.minimum.accumulate(np.concatenate(([self._log_exponent], e)))
                fire |= e < before[:-1]
                self._log_exponent = int(before[-1])
            lin = _lin_targets(v, s.lin_target_precision)
            before = np.minimum.accumulate(np.concatenate(([self._lin_value], lin)))
            fire |= lin < before[:-1]
            self._lin_value = float(before[-1])
            dat_rows += checked[fire].tolist()
        tdat_rows = [k - n0 - 1 for k in self._triggers.fire(n0 + 1, n0 + n)]
        rdat_rows = [0] if self._restart_pending else []
        self._restart_pending = False
        for ext, rws in ((".dat", dat_rows), (".tdat", tdat_rows), (".rdat", rdat_rows)):
            if rws:
                self._append(ext, [self._line(n0 + r + 1, float(y[r]), float(best_after[r]),
                                              None if x is None else x[r]) for r in rws])
        if dat_rows:
            self._last_dat = n0 + dat_rows[-1] + 1
        if tdat_rows:
            self._last_tdat = n0 + tdat_rows[-1] + 1
        if rows.size:
            self._best = float(best_after[-1])
            if x is not None:
                self._best_x = x[rows[-1]].copy()
        self.evaluations = n0 + n

    def _line(self, evaluation: int, value: float, best: float, x: np.ndarray | None) -> str:
        """logger_bbob_output, without constraints (bbob has none: 0 constraint evaluations)."""
        line = "%d 0 %+10.9e %+10.9e %+10.9e" % (evaluation, best - self.fopt, value, best)
        if self.log_x and x is not None:
            line += "".join(" %+5.4e" % v for v in x.tolist())
        return line + "\n"

    def _append(self, ext: str, lines: list[str]) -> None:
        # Opened per block rather than held: nothing to leak when a run drops its logger, and
        # each block is on disk when observe returns (COCO flushes every line).
        with _append_to(self.folder / (str(self._dat_base) + ext)) as fh:
            fh.write("".join(lines))


def _append_to(path: Path):
    """``path`` opened to append, never through a symbolic link planted in its place or in the
    place of its data_f* folder."""
    _no_linked_folder(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise _refused(path, e) from None
    return os.fdopen(fd, "a", encoding="utf-8")


def _tail(path: Path, size: int, length: int = 256) -> str:
    """The ``length`` bytes of ``path`` before ``size``: what a resume finds again where the
    state was taken, unless the file was changed below its end."""
    with open(path, "rb") as fh:
        fh.seek(max(0, size - length))
        return fh.read(min(size, length)).decode("ascii", errors="replace")


def _truncate(path: Path, size: int) -> None:
    _no_linked_folder(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise _refused(path, e) from None
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _no_linked_folder(path: Path) -> None:
    if path.parent.name.startswith("data_f") and path.parent.is_symlink():
        raise UsageError(f"{path.parent} is a symbolic link: COCO data is never written through a link (it "
                         "would land outside the folder); remove it")


def _refused(path: Path, e: OSError) -> Exception:
    if e.errno == errno.ELOOP:
        return UsageError(f"{path} is a symbolic link: COCO data is never written through a link (it would "
                          "land outside the folder); remove it")
    return e


class BBOBObserver:
    """A result folder shared by several runs, with cocoex.Observer's rule for the .info lines:
    a run starts a new line (and .dat file) when the previous run it observed had another
    function or dimension. ``logger(...)`` gives the run's ``BBOBLogger``; as in COCO, a run
    must be closed before the next one is observed. The options are ``BBOBLogger``'s."""

    def __init__(self, folder: str | os.PathLike, *, algorithm: str = "hpcevo", comment: str = "",
                 suite: str = "bbob", log_variables: str = "low_dim", number_target_triggers: int = 20,
                 log_target_precision: float = 1e-8, lin_target_precision: float = 1e5,
                 base_evaluation_triggers: Sequence[int] = (1, 2, 5)):
        self._options: dict[str, Any] = dict(
            algorithm=algorithm, comment=comment, suite=suite, log_variables=log_variables,
            number_target_triggers=number_target_triggers, log_target_precision=log_target_precision,
            lin_target_precision=lin_target_precision, base_evaluation_triggers=tuple(base_evaluation_triggers))
        _Settings(folder, **self._options)  # validate now rather than at the first logger
        self.folder = Path(folder)
        self._last: tuple[int, int, str] | None = None  # function, dim, .dat base of the last line
        self._open: BBOBLogger | None = None

    def logger(self, *, function: int, instance: int, dim: int, fopt: float) -> BBOBLogger:
        if self._open is not None and not self._open.closed:
            raise UsageError("the observed run must be closed before a new one is observed")
        self._open = BBOBLogger(self.folder, function=function, instance=instance, dim=dim, fopt=fopt,
                                _observer=self, **self._options)
        return self._open

    def _new_line(self, function: int, dim: int) -> tuple[bool, str | None]:
        if self._last is not None and self._last[:2] == (function, dim):
            return False, self._last[2]
        return True, None

    def state(self) -> dict[str, Any]:
        """The folder's line state (JSON-able); the open run's own state is its logger's."""
        return {"folder": str(self.folder), **self._options,
                "base_evaluation_triggers": list(self._options["base_evaluation_triggers"]),
                "last": None if self._last is None else list(self._last)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BBOBObserver:
        state = dict(state)
        last = state.pop("last")
        self = cls(state.pop("folder"), **state)
        self._last = None if last is None else (int(last[0]), int(last[1]), str(last[2]))
        return self
