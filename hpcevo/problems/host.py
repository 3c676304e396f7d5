"""Host problems: a NumPy function, or an external command (a simulator), evaluated outside JAX.

Both are evaluated by ``hpcevo.driver.host_engine.HostEngine``: the algorithm runs jitted and
replicated as always; the candidates come to the host, each rank evaluates its share with
``evaluation.concurrency`` evaluations at a time, and the values are gathered by index.

**NumPy function** (``problem.host = true``, named by import path like a JAX problem; keyword
arguments from ``[problem.args]``; a class is instantiated as for JAX problems). By default it
takes a block: ``f(x) -> values`` with ``x`` a float64 array ``(n, dim)`` and ``values`` of shape
``(n,)``. hpcevo calls it on fixed slices of the population (``parallel.microbatch`` rows, or
``evaluation.batch_size`` if smaller), the same slices at any rank count, so a function whose
row values depend on its block (BLAS kernels chosen by shape) still gives the same run
everywhere. With ``problem.batched = false`` (or a ``batched = False`` attribute) it takes one
candidate, ``(dim,) -> float``, and is called once per candidate. A call that raises, or returns
the wrong shape or no numbers, fails every candidate it was given (one, or the whole slice).
Concurrent calls run in threads of one process: they overlap only where the function releases
Python's GIL (NumPy's array kernels, compiled extensions, I/O). For pure-Python functions use
more ranks instead (one rank per core), or run the code as a command.

**External command** (``problem.name = "command"``; ``problem.dim``, ``lb``, ``ub`` required)::

    [problem.args]
    command = ["./sim", "--in", "{input}", "--out", "{output}"]   # or one string, split like a shell
    timeout = 60.0                                                # seconds per evaluation; 0: none

The protocol, per candidate:

1. The candidate is written as text, one number per line (``repr`` of the float64 value, which
   reads back exactly), to the file ``{input}`` if the command names it, else to its standard input.
2. The command runs with these placeholders replaced in its arguments: ``{input}`` and
   ``{output}`` (paths of ``input.txt`` / ``output.txt`` in ``{dir}``), ``{dir}`` (a fresh
   directory of its own, removed afterwards), ``{index}`` (the candidate's place in the
   generation's population, from 0), ``{generation}`` (1 = the initial population), ``{dim}``.
   ``{{`` and ``}}`` are literal braces. The program (the first word) is looked up at start-up:
   a path (relative to the working directory) or a name on ``PATH``. It runs in the working
   directory, in a session of its own.
3. The fitness (minimised) is the last non-empty line of the file ``{output}`` if the command
   names it, else of its standard output; it must be one number (``inf``, ``nan`` are numbers).
4. The evaluation fails if the program cannot be started, exits with a non-zero status or on a
   signal, runs past ``timeout`` (its whole process group is killed), or the fitness cannot be
   read. A failure never stops the run: the candidate gets ``evaluation.penalty`` (default
   +inf, the worst), and is counted and logged with its index and the reason (the last line of
   the command's standard error, where there is one).

Simulators are deterministic in most cases; if one is, the run is the same at any rank count,
with either schedule and any concurrency, and a resumed run equals an uninterrupted one.

Each evaluation returns ``(values, failures)`` for a slice of rows: ``failures`` lists
``(row, reason)``; the values of failed rows are ignored.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import string
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from .base import HostProblem
from .numerical import _bounds
from .user import Resolved, _exc, _fail, _where_in, held_name, resolve, resolve_object

Failures = list[tuple[int, str]]
PLACEHOLDERS = ("input", "output", "dir", "index", "generation", "dim")
COMMAND_ARGS = ("command", "timeout")
# Longest reason kept from a command's stderr or output (the failures log stays readable).
REASON_CHARS = 300


def _rows_failed(m: int, reason: str) -> tuple[np.ndarray, Failures]:
    return np.full(m, np.nan), [(i, reason) for i in range(m)]


@dataclass(frozen=True, eq=False)
class CallableProblem(HostProblem):
    """A NumPy function (see the module docstring); ``batched``: takes a block, not one row."""

    name: str
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    fn: Callable[[np.ndarray], Any]
    batched: bool = True
    num_objectives: ClassVar[int] = 1
    host: ClassVar[bool] = True

    @property
    def rows_per_call(self) -> int | None:
        """Rows one call takes: None = a slice of the engine's choosing, 1 = one candidate."""
        return None if self.batched else 1

    def evaluate_rows(self, x: np.ndarray, first: int, generation: int) -> tuple[np.ndarray, Failures]:
        """Values of the rows ``x`` (population rows ``first``...), and which failed, why."""
        m = x.shape[0]
        if not self.batched:
            out = [self._call(row, ()) for row in x]
            failed = [(i, why) for i, (_, why) in enumerate(out) if why]
            return np.array([v for v, _ in out]), failed
        value, why = self._call(x, (m,))
        return (value, []) if why is None else _rows_failed(m, why)

    def _call(self, x: np.ndarray, shape: tuple) -> tuple[Any, str | None]:
        try:
            out = self.fn(x)
        except Exception as e:  # noqa: BLE001 - a failed evaluation, whatever its cause
            return np.nan, f"raised {_exc(e)}{_where_in(e, None)}"
        try:
            values = np.asarray(out, dtype=np.float64)
        except (TypeError, ValueError):
            return np.nan, f"returned {type(out).__name__}, not numbers"
        if values.shape != shape:
            what = f"a block of {shape[0]} rows" if shape else "one candidate"
            return np.nan, f"returned shape {values.shape} for {what}, expected {shape}"
        return (values if shape else float(values)), None

    def cancel(self) -> None:
        """Nothing to stop: a Python call cannot be interrupted from another thread."""

    def close(self) -> None:
        pass


@dataclass(eq=False)
class CommandProblem(HostProblem):
    """An external command evaluated once per candidate (see the module docstring)."""

    name: str
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    command: tuple[str, ...]  # the program resolved to an absolute path, then the arguments
    timeout: float = 0.0
    num_objectives: ClassVar[int] = 1
    host: ClassVar[bool] = True
    rows_per_call: ClassVar[int] = 1
    _running: set = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _scratch: Path | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        used = {f for arg in self.command[1:] for f in _fields(arg)}
        self.to_file = "input" in used
        self.from_file = "output" in used
        self.needs_dir = bool(used & {"input", "output", "dir"})

    def evaluate_rows(self, x: np.ndarray, first: int, generation: int) -> tuple[np.ndarray, Failures]:
        values = np.full(x.shape[0], np.nan)
        failed = []
        for i, row in enumerate(x):
            value, why = self._evaluate(row, first + i, generation)
            if why is None:
                values[i] = value
            else:
                failed.append((i, why))
        return values, failed

    def _evaluate(self, row: np.ndarray, index: int, generation: int) -> tuple[float, str | None]:
        text = "".join(f"{float(v)!r}\n" for v in row)
        workdir = self._scratch_dir() / f"g{generation}-c{index}" if self.needs_dir else None
        try:
            if workdir is not None:
                workdir.mkdir()
                if self.to_file:
                    (workdir / "input.txt").write_text(text)
            names = {"input": workdir / "input.txt" if workdir else "", "dim": self.dim,
                     "output": workdir / "output.txt" if workdir else "", "dir": workdir or "",
                     "index": index, "generation": generation}
            argv = [self.command[0], *(arg.format(**names) for arg in self.command[1:])]
            out, why = self._run(argv, None if self.to_file else text)
            if why is not None:
                return np.nan, why
            if self.from_file:
                try:
                    out = (workdir / "output.txt").read_text(errors="replace")
                except FileNotFoundError:
                    return np.nan, "wrote no output file {output}"
            return _parse_fitness(out, "the output file" if self.from_file else "standard output")
        except OSError as e:  # the scratch directory: a full or read-only disk
            return np.nan, f"scratch directory: {e.strerror or e}"
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _run(self, argv: list[str], stdin_text: str | None) -> tuple[str, str | None]:
        """Run one evaluation's process; (its standard output, failure reason or None)."""
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                stdout=subprocess.DEVNULL if self.from_file else subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, errors="replace",
                # Its own session: a timeout or a cancel kills everything it started (a shell
                # script's children too), and a Ctrl-C at the terminal reaches hpcevo only.
                start_new_session=True)
        except OSError as e:
            return "", f"could not start {argv[0]}: {e.strerror or e}"
        with self._lock:
            self._running.add(proc)
        try:
            out, err = proc.communicate(stdin_text, timeout=self.timeout or None)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return "", f"timed out after {self.timeout:g} s"
        finally:
            with self._lock:
                self._running.discard(proc)
        if proc.returncode != 0:
            if proc.returncode < 0:
                why = f"killed by signal {_signal_name(-proc.returncode)}"
            else:
                why = f"exit status {proc.returncode}"
            last = _last_line(err)
            return "", f"{why} after {time.monotonic() - t0:.2f} s" + (f": {last}" if last else "")
        return out or "", None

    def _scratch_dir(self) -> Path:
        """This process's scratch directory (in $TMPDIR: node-local on most clusters)."""
        with self._lock:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="hpcevo-eval-"))
                atexit.register(shutil.rmtree, self._scratch, True)
            return self._scratch

    def cancel(self) -> None:
        """Kill every evaluation running now (on an error or interrupt, before leaving)."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            _kill_group(proc)

    def close(self) -> None:
        self.cancel()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:REASON_CHARS] if lines else ""


def _parse_fitness(text: str, where: str) -> tuple[float, str | None]:
    last = _last_line(text)
    if not last:
        return np.nan, f"{where} is empty: no fitness"
    try:
        return float(last), None
    except ValueError:
        return np.nan, f"last line of {where} is not a number: {last!r}"


def _fields(arg: str) -> list[str]:
    """The placeholder names in ``arg`` (ValueError for unbalanced braces)."""
    return [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]


# -- construction: every mistake is a ConfigError naming the problem and the fix -------------------
def make_command(dim: int | None, lb, ub, args: dict[str, Any], batched: bool | None = None) -> CommandProblem:
    name = "command"
    unknown = sorted(set(args) - set(COMMAND_ARGS))
    if unknown:
        raise _fail(name, f"unknown [problem.args] key '{unknown[0]}' (valid: {', '.join(COMMAND_ARGS)})")
    if batched is not None:
        raise _fail(name, "problem.batched does not apply: a command evaluates one candidate per run")
    if dim is None or lb is None or ub is None:
        missing = [k for k, v in (("dim", dim), ("lb", lb), ("ub", ub)) if v is None]
        raise _fail(name, f"set problem.{', problem.'.join(missing)}: a command does not say its own")
    lbs, ubs = _bounds(name, "lb", lb, 0.0, dim), _bounds(name, "ub", ub, 0.0, dim)
    for i, (lo, hi) in enumerate(zip(lbs, ubs)):
        if not lo < hi:
            raise _fail(name, f"lb must be < ub in every coordinate, but at coordinate {i} lb = {lo} and ub = {hi}")
    command = args.get("command")
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as e:
            raise _fail(name, f"[problem.args] command: {e}") from None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise _fail(name, '[problem.args] command must be a list of strings, e.g. '
                          'command = ["./sim", "{input}", "{output}"], or one string')
    for position, arg in enumerate(command):
        try:
            fields = _fields(arg)
            arg.format(**{k: 1 for k in PLACEHOLDERS})
        except (KeyError, IndexError, ValueError) as e:
            bad = [f for f in _fields_lenient(arg) if f not in PLACEHOLDERS]
            what = f"unknown placeholder {{{bad[0]}}}" if bad else f"bad braces ({e})"
            raise _fail(name, f"command argument {arg!r}: {what}; placeholders: "
                              + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                              + "; write {{ and }} for literal braces") from None
        if fields and position == 0:
            raise _fail(name, f"the program {arg!r} may not contain placeholders")
    timeout = args.get("timeout", 0.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise _fail(name, f"[problem.args] timeout must be a number of seconds >= 0 (0: none), got {timeout!r}")
    return CommandProblem(name, dim, lbs, ubs, (_program(command[0]), *command[1:]), float(timeout))


def _fields_lenient(arg: str) -> list[str]:
    try:
        return _fields(arg)
    except ValueError:
        return []


def _program(word: str) -> str:
    """The absolute path of the command's program, checked now rather than at the first
    evaluation (where it would only fail every candidate)."""
    name = "command"
    if "/" in word:
        path = Path(word).expanduser()
        if not path.exists():
            raise _fail(name, f"program '{word}' not found (relative paths are taken from the "
                              f"working directory, {Path.cwd()})")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise _fail(name, f"program '{word}' is not an executable file (chmod +x?)")
        return str(path.resolve())
    found = shutil.which(word)
    if found is None:
        raise _fail(name, f"program '{word}' not found on PATH (give a path, e.g. './{word}')")
    return found


def load_host_callable(name: str, dim: int | None, lb, ub, args: dict[str, Any],
                       batched: bool | None = None) -> CallableProblem:
    """A NumPy function by import path (checked like a JAX problem's, but never called here:
    a host function may be expensive, and JAX cannot trace it)."""
    return _callable_problem(name, resolve(name, dim, lb, ub, args), batched)


def host_from_object(obj: Any, dim: int | None, lb, ub, batched: bool | None = None,
                     fallback: tuple = (None, None, None)) -> HostProblem:
    """A NumPy function held in Python; a ``HostProblem`` object is taken as it is."""
    if isinstance(obj, HostProblem):
        return obj
    name = held_name(obj)
    return _callable_problem(name, resolve_object(name, obj, dim, lb, ub, {}, fallback), batched)


def _callable_problem(name: str, r: Resolved, batched: bool | None) -> CallableProblem:
    if r.num_objectives != 1:
        raise _fail(name, f"host problems have one objective for now; it declares num_objectives = {r.num_objectives}")
    if batched is None:
        batched = getattr(r.meta, "batched", True)
    return CallableProblem(name, r.dim, r.lb, r.ub, r.fn, bool(batched))
