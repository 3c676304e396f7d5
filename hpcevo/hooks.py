"""Hooks: optional observers at a run's log boundaries, and stop criteria of the user's.

Off by default and cheap: nothing here runs unless ``hpcevo.run`` is given it, and then only at
log boundaries (every ``log.every`` generations), never inside the jitted generations::

    import hpcevo
    from hpcevo.hooks import Target, Stagnation, TensorBoard

    def show(record, loop):                     # rank 0, at every log boundary
        print(record["generation"], record["best"])

    result = hpcevo.run(cfg, hooks=[show, TensorBoard("tb/")],
                        stop_when=[Target(1e-6), Stagnation(generations=500)])
    result.summary["stopped_by"]                # "target 1e-06 reached", or None

A hook is ``hook(record, loop)``: ``record`` is the boundary's line of metrics.jsonl (a dict:
generation, evaluations, best..., and ``params.NAME`` for each dynamic hyper-parameter), ``loop`` the
``Loop`` (or ``Archipelago``) being run; what it returns is ignored. It runs on rank 0 alone,
unless marked with ``every_rank`` (then on every rank, at the same point: what a hook that calls
a collective method, such as ``loop.set_params``, needs). An exception in a hook on any rank
ends the run on every rank with that error.

A stop criterion is ``criterion(record, loop) -> bool`` (or a reason: a non-empty str), asked on
rank 0 at each boundary; its answer is every rank's. A run it stops ends at that boundary as
``complete`` (exit 0: it reached what it was run for, unlike a stopped run, which waits to be
resumed), with a checkpoint, and the summary's ``stopped_by`` names the criterion: its ``name``
attribute, else the function's name. (Criteria that act exactly at the generation they are met,
between boundaries, belong to the run's config; these see what a boundary sees.)

``TensorBoard`` (tensorboardX) and ``WandB`` (wandb) write each boundary's numbers; their
packages are optional extras (``pip install hpcevo[tensorboard]``, ``hpcevo[wandb]``), imported
only when such a hook is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from typing import Any, Callable, Iterable, Mapping

from . import schema
from .errors import ConfigError, UsageError

Hook = Callable[[dict[str, Any], Any], Any]


def every_rank(hook: Hook) -> Hook:
    """``hook`` marked to run on every rank (default: rank 0 alone)."""
    if not callable(hook):
        raise UsageError(f"every_rank: 'hook' must be callable, got {type(hook).__name__}")
    try:
        hook.hpcevo_every_rank = True  # type: ignore[attr-defined]
        return hook
    except AttributeError:  # a bound method or a builtin: wrap it
        def wrapped(record: dict[str, Any], loop: Any) -> Any:
            return hook(record, loop)

        wrapped.hpcevo_every_rank = True  # type: ignore[attr-defined]
        wrapped.__name__ = name_of(hook)
        return wrapped


def name_of(hook: Any) -> str:
    """How a hook or criterion is named in messages and in the summary."""
    name = getattr(hook, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(hook, "__name__", None) or type(hook).__name__


def scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a boundary record, flat (a nested table's as ``table/key``), for loggers;
    the generation is the step, not a scalar."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "generation":
            continue
        if isinstance(value, Mapping):
            out.update(scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


# -- stop criteria --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    """Stop once the best fitness seen is at most ``value`` (minimisation)."""

    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", schema.check(float, self.value, "value", "Target"))

    @property
    def name(self) -> str:
        return f"target {self.value:g} reached"

    def __call__(self, record: dict[str, Any], loop: Any) -> bool:
        best = record.get("best")
        return best is not None and best <= self.value


@dataclasses.dataclass(frozen=True)
class Stagnation:
    """Stop when the best fitness seen has improved by no more than ``tolerance`` over the last
    ``generations`` generations (read from the loop's history, so a resumed run decides as the
    uninterrupted one would)."""

    generations: int
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "generations", schema.check(schema.Generations, self.generations, "generations",
                                                             "Stagnation"))
        tol = schema.check(float, self.tolerance, "tolerance", "Stagnation")
        if not tol >= 0:
            raise ConfigError(f"Stagnation: tolerance must be >= 0, got {tol}", "tolerance")
        object.__setattr__(self, "tolerance", tol)

    @property
    def name(self) -> str:
        return f"no improvement over {self.generations} generations"

    def __call__(self, record: dict[str, Any], loop: Any) -> bool:
        best = loop.history.get("best")
        if best is None or len(best) <= self.generations:
            return False
        then, now = float(best[-1 - self.generations]), float(best[-1])
        if not math.isfinite(then):
            return False
        return then - now <= self.tolerance


@dataclasses.dataclass(frozen=True)
class Budget:
    """Stop once ``evaluations`` evaluations are spent (at the first boundary at or past it)."""

    evaluations: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "evaluations", schema.check(schema.Generations, self.evaluations, "evaluations",
                                                             "Budget"))

    @property
    def name(self) -> str:
        return f"budget of {self.evaluations} evaluations spent"

    def __call__(self, record: dict[str, Any], loop: Any) -> bool:
        return record.get("evaluations", 0) >= self.evaluations


# -- loggers --------------------------------------------------------------------------------------
class TensorBoard:
    """Each boundary's numbers as TensorBoard scalars under ``logdir`` (step: the generation), via
    tensorboardX. Rank 0 writes."""

    def __init__(self, logdir: str, **writer_options: Any):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise UsageError("TensorBoard hook: the tensorboardX package is not installed "
                             "(pip install 'hpcevo[tensorboard]')") from None
        self.logdir = str(logdir)
        self._options = writer_options
        self._writer: Any = None
        self._make = SummaryWriter
        self.name = f"TensorBoard({self.logdir})"

    def __call__(self, record: dict[str, Any], loop: Any) -> None:
        if self._writer is None:  # made on first use: on rank 0 only, where hooks run
            self._writer = self._make(self.logdir, **self._options)
        step = int(record["generation"])
        for key, value in scalars(record).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandB:
    """Each boundary's numbers logged to Weights & Biases (``wandb.init(**init_options)`` on first
    use, on rank 0; step: the generation). ``run``: an already started ``wandb`` run instead."""

    def __init__(self, run: Any = None, **init_options: Any):
        try:
            import wandb
        except ImportError:
            raise UsageError("WandB hook: the wandb package is not installed (pip install 'hpcevo[wandb]')") from None
        self._wandb, self._run, self._options = wandb, run, init_options
        self.name = "WandB"

    def __call__(self, record: dict[str, Any], loop: Any) -> None:
        if self._run is None:
            self._run = self._wandb.init(**self._options)
        self._run.log(scalars(record), step=int(record["generation"]))

    def close(self) -> None:
        if self._run is not None and self._options:  # a run we started is ours to finish
            self._run.finish()
            self._run = None


# -- what hpcevo.run takes ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Hooks:
    """The hooks and stop criteria of one run (``hpcevo.run``'s ``hooks`` and ``stop_when``)."""

    observers: tuple[Hook, ...] = ()
    criteria: tuple[Hook, ...] = ()

    @classmethod
    def checked(cls, where: str, hooks: Any = None, stop_when: Any = None) -> "Hooks":
        return cls(_callables(where, "hooks", hooks), _callables(where, "stop_when", stop_when))

    def __bool__(self) -> bool:
        return bool(self.observers or self.criteria)

    def describe(self) -> dict[str, Any]:
        """What every rank must be given alike: the names, in order."""
        return {"hooks": [name_of(h) for h in self.observers], "stop_when": [name_of(c) for c in self.criteria]}

    def observe(self, record: dict[str, Any], loop: Any, is_root: bool,
                alone: Callable[[str], Any] | None = None) -> None:
        """Each observer on its ranks. ``alone(what)``: a context for code that runs on rank 0
        only (the driver's ``parallel.control.rank_local``: a collective called there raises)."""
        for hook in self.observers:
            every = getattr(hook, "hpcevo_every_rank", False)
            if is_root or every:
                with contextlib.nullcontext() if every or alone is None else alone(f"the hook {name_of(hook)}"):
                    _called("hook", hook, record, loop)

    def reason(self, record: dict[str, Any], loop: Any, alone: Callable[[str], Any] | None = None) -> str | None:
        """The first criterion that says stop, as the reason to report (rank 0 asks). A criterion
        answers True/False (a NumPy or JAX scalar too), or a reason (a non-empty str) or None."""
        for criterion in self.criteria:
            with contextlib.nullcontext() if alone is None else alone(f"the stop criterion {name_of(criterion)}"):
                said = _called("stop criterion", criterion, record, loop)
            if isinstance(said, str):
                if said:
                    return said
                continue
            if said is not None and (not hasattr(said, "__bool__") or getattr(said, "ndim", 0) != 0):
                raise UsageError(f"stop criterion {name_of(criterion)} returned {_shown(said)}: a stop criterion "
                                 "answers True or False (or a reason, a str); for an array, say which: .any() "
                                 "or .all()")
            if said:
                return name_of(criterion)
        return None

    def close(self) -> None:
        for hook in self.observers:
            close = getattr(hook, "close", None)
            if callable(close):
                close()


def _called(what: str, fn: Hook, record: dict[str, Any], loop: Any) -> Any:
    """``fn(record, loop)``. An exception of its own stays the user's (their type, every rank's),
    with a note naming the hook and the generation, which its traceback alone does not say."""
    try:
        return fn(record, loop)
    except UsageError:
        raise  # (hpcevo's own message, from a call the hook made)
    except Exception as e:
        e.add_note(f"(raised by the {what} {name_of(fn)} at generation {record.get('generation')})")
        raise


def _shown(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__} of shape {tuple(shape)}" if shape is not None else type(value).__name__


def _callables(where: str, name: str, value: Any) -> tuple[Hook, ...]:
    if value is None:
        return ()
    items = [value] if callable(value) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise UsageError(f"{where}: '{name}' must be a callable or a list of callables (record, loop), got "
                         f"{type(value).__name__}")
    items = list(items)
    for item in items:
        if not callable(item):
            raise UsageError(f"{where}: every entry of '{name}' must be callable as f(record, loop); got "
                             f"{type(item).__name__}")
        try:
            inspect.signature(item).bind({}, None)
        except TypeError:
            raise UsageError(f"{where}: '{name}': {name_of(item)} cannot be called as f(record, loop) "
                             f"(its signature: {inspect.signature(item)})") from None
        except ValueError:
            pass  # (no signature to read: a builtin; it is called and judged then)
    return tuple(items)
