"""The algorithm protocol every hpcevo algorithm follows, and the base class they share.

An algorithm is a frozen dataclass of static hyper-parameters (hashable, so it can be a static
argument of ``jax.jit``) with pure functions over a pytree state:

    state = algo.init(key)
    candidates, state = algo.ask(state)        # (algo.num_ask, dim)
    state = algo.tell(state, fitness)          # fitness: (algo.num_ask,), minimised

Some algorithms evaluate a differently sized batch on their first generation (CSO evaluates the
whole swarm once, then only the losers); they override ``init_ask``/``init_tell`` and
``num_init``. No MPI, no I/O, no host callbacks: the same code runs in a notebook and replicated
on every MPI rank, where identical inputs give bitwise identical states.

``Algorithm`` writes the protocol down, every optional member with its default; ``BaseAlgorithm``
(pop_size, the search box, the default first generation, helpers) is what hpcevo's algorithms
derive from, and what an algorithm of your own can derive from too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, ClassVar, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from .. import schema
from ..errors import ConfigError, did_you_mean

State = Any


@runtime_checkable
class Algorithm(Protocol):
    """What the loop relies on. Hyper-parameters are static: a new value is a new program."""

    pop_size: int
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    dtype: str
    # ``tell`` takes (n, m) fitness for m objectives; single-objective algorithms take (n,).
    multi_objective: ClassVar[bool] = False
    # No rank holds the whole population: the generation runs block by block
    # (``parallel.ShardedESStep``; OpenES, PGPE and SNES, which derive from ``_es.BlockedES``).
    distributed: bool = False
    # Can take part in island migration: defines ``with_population`` (population-based
    # algorithms; a strategy that keeps a search distribution has no rows to replace).
    migrates: ClassVar[bool] = False
    # Hyper-parameters that are data, evosax's ``params`` beside the state: read by ``ask`` and
    # ``tell`` (never by ``init`` alone) in array arithmetic only, never in Python control flow
    # or shapes. A loop passes them into its jitted step (``with_params``), so a new value takes
    # effect at the next dispatch without a recompile (``Loop.set_params``). Every other field is
    # static: a new value is a new program, and a running loop refuses it.
    dynamic: ClassVar[tuple[str, ...]] = ()
    # Static fields that only set the state at generation 1 (an initial step size, learning rate
    # or mean): the state carries its own value from then on (adapted, decayed), so a new value
    # mid-run would change nothing. Named apart so that a refusal says so, not "shapes the program".
    initial: ClassVar[tuple[str, ...]] = ()

    @property
    def num_init(self) -> int:
        """Candidates evaluated in generation 1."""
        ...

    @property
    def num_ask(self) -> int:
        """Candidates evaluated in every later generation."""
        ...

    def init(self, key: jax.Array) -> State: ...

    def ask(self, state: State) -> tuple[jax.Array, State]: ...

    def tell(self, state: State, fitness: jax.Array) -> State: ...

    def init_ask(self, state: State) -> tuple[jax.Array, State]:
        """Generation 1's ask (default: ``ask``)."""
        return self.ask(state)

    def init_tell(self, state: State, fitness: jax.Array) -> State:
        """Generation 1's tell (default: ``tell``)."""
        return self.tell(state, fitness)

    def population(self, state: State) -> tuple[jax.Array, jax.Array]:
        """The current population and its fitness, ``(pop, dim)`` and ``(pop,)`` (``(pop, m)``
        for m objectives). Strategies that keep a search distribution rather than a population
        (CMA-ES, NES, OpenES, PGPE) have none: read their state's mean and step sizes."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps a search distribution, not a population: read its state "
            "(e.g. state.mean) instead")

    def with_population(self, state: State, x: jax.Array, f: jax.Array) -> State:
        """``state`` with the population and fitness that ``population`` reads replaced by ``x``
        and ``f`` (how immigrants enter an island: ``algorithms.migration``). Only for
        algorithms with ``migrates = True``."""
        raise NotImplementedError(f"{type(self).__name__} has no population to replace rows of")


@dataclasses.dataclass(frozen=True)
class BaseAlgorithm(Algorithm):
    """Base for algorithms: ``pop_size``, the search box, and the default first generation."""

    pop_size: int
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        # The same checks as a config's [algorithm] section (hpcevo.schema), so an object built in
        # Python is refused where a config would be, naming the argument; NumPy scalars and
        # arrays become the plain numbers and tuples a static jit argument needs.
        where = type(self).__name__
        for name, kind in self.field_types().items():
            value = getattr(self, name)
            if name in ("lb", "ub") or (name == "x0" and value is not None):
                value = _box(where, name, value, self.dim)
            elif name != "x0":
                value = schema.check(kind, value, name, where)
            object.__setattr__(self, name, value)
        for i, (lo, hi) in enumerate(zip(self.lb, self.ub)):
            if not lo < hi:
                raise ConfigError(f"{where}: lb must be < ub in every coordinate; at coordinate {i} lb = {lo}, "
                                  f"ub = {hi}", "lb")

    @classmethod
    @functools.cache
    def field_types(cls) -> dict[str, Any]:
        """Each constructor argument's type as the schema checks it (the base fields' own
        ranges; a hyper-parameter's annotation, e.g. ``float`` or ``Literal["none", "ipop"]``)."""
        hints = typing.get_type_hints(cls)
        base = {"pop_size": schema.PopSize, "dim": schema.Dim, "dtype": schema.DType, "lb": None, "ub": None,
                "x0": typing.Optional[typing.Union[float, list[float]]]}
        return {f.name: base[f.name] if f.name in base else hints[f.name]
                for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def check_parameters(cls, values: dict[str, Any], where: str, label: str = "") -> dict[str, Any]:
        """``values`` (hyper-parameters by name) checked against their types: ConfigError names
        the first that is unknown or of the wrong type. Ranges are the constructor's to check.
        ``label``: the algorithm's name in messages (default: the class's)."""
        fields, out = cls.hyper_parameters(), {}
        for key, value in values.items():
            if key not in fields:
                valid = ["name", "pop_size", *fields]
                raise ConfigError(f"{where}: unknown key 'algorithm.{key}' for {label or cls.__name__.lower()}"
                                  f"{did_you_mean(key, valid, 0.5)} (valid: {', '.join(valid)})", f"algorithm.{key}")
            out[key] = schema.check(cls.field_types()[key], value, f"algorithm.{key}", where)
        return out

    # -- hyper-parameters that a config may set: the dataclass fields past the base ones --------
    @classmethod
    def hyper_parameters(cls) -> dict[str, dataclasses.Field]:
        base = {f.name for f in dataclasses.fields(BaseAlgorithm)}
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in base and f.init}

    # -- sizes of the batches handed to the evaluator ------------------------------------------
    @property
    def num_init(self) -> int:
        return self.num_ask

    @property
    def num_ask(self) -> int:
        return self.pop_size

    # -- protocol ------------------------------------------------------------------------------
    def init(self, key: jax.Array) -> State:
        raise NotImplementedError

    def ask(self, state: State) -> tuple[jax.Array, State]:
        raise NotImplementedError

    def tell(self, state: State, fitness: jax.Array) -> State:
        raise NotImplementedError

    # Optional, read with getattr (outside the protocol, whose members isinstance requires):
    def rows_used(self, state: State) -> Any:
        """How many leading rows of the batch just asked (``state``: after ``ask``) the strategy
        uses; the rest are samples its update ignores (IPOP/BIPOP-CMA-ES ask for their largest
        population every generation, one program for every restart). Only used rows count as
        evaluations, can be the best so far, or reach COCO's logger; a host problem evaluates
        only them, and the device skips the micro-batches past them. None: all of them."""
        return None

    # -- helpers -------------------------------------------------------------------------------
    def bounds(self) -> tuple[jax.Array, jax.Array]:
        return jnp.asarray(self.lb, self.dtype), jnp.asarray(self.ub, self.dtype)

    def uniform_in_bounds(self, key: jax.Array, n: int) -> jax.Array:
        lb, ub = self.bounds()
        return lb + (ub - lb) * jax.random.uniform(key, (n, self.dim), self.dtype)

    def initial_mean(self, key: jax.Array) -> jax.Array:
        """Where a strategy with a mean starts: ``x0`` when the algorithm has one and it is given
        (COCO and pycma hand an initial solution), else uniform in the box."""
        x0 = getattr(self, "x0", None)
        if x0 is not None:
            return jnp.asarray(x0, self.dtype)
        return self.uniform_in_bounds(key, 1)[0]

    def width(self) -> jax.Array:
        """Per-coordinate width of the search box, ub - lb."""
        lb, ub = self.bounds()
        return ub - lb

    def clip_to_box(self, x: jax.Array) -> jax.Array:
        lb, ub = self.bounds()
        return jnp.clip(x, lb, ub)


@dataclasses.dataclass(frozen=True)
class MultiObjectiveAlgorithm(BaseAlgorithm):
    """Base for algorithms whose fitness has shape (n, num_objectives), all minimised.

    ``num_objectives`` comes from the problem, not from the config (it is not a
    hyper-parameter). ``population(state)`` is the algorithm's current population and its
    objective vectors: what a run's recorder takes the non-dominated front from.
    """

    num_objectives: int = 2
    multi_objective: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_objectives < 2:
            raise ConfigError(f"a multi-objective algorithm needs >= 2 objectives, got {self.num_objectives}")

    @classmethod
    def hyper_parameters(cls) -> dict[str, dataclasses.Field]:
        fields = super().hyper_parameters()
        fields.pop("num_objectives")
        return fields

    def population(self, state: State) -> tuple[jax.Array, jax.Array]:
        raise NotImplementedError  # each multi-objective algorithm has one


def dynamic_names(algorithm: Any) -> tuple[str, ...]:
    """The names of ``algorithm``'s hyper-parameters that are data (``Algorithm.dynamic``)."""
    return tuple(getattr(type(algorithm), "dynamic", ()))


def why_static(algorithm: Any, name: str) -> str:
    """Why ``name`` of ``algorithm`` cannot change while a run goes on (for a refusal)."""
    initial = getattr(algorithm, "initial_fields", lambda: getattr(type(algorithm), "initial", ()))()
    if name in initial:
        carried = {"x0": "mean"}.get(name, name.removesuffix("_init"))
        return (f"it sets the state of generation 1 only; the run's state has carried its own {carried} since "
                "(adapted or decayed there), so a new value mid-run would change nothing: set it when a run starts")
    if isinstance(getattr(algorithm, name, None), float):
        return "a constant of the compiled program: a new value is a new program"
    return "it shapes the compiled program"


def params_of(algorithm: Any) -> dict[str, float]:
    """``algorithm``'s dynamic hyper-parameters and their values, as plain floats."""
    return {name: float(getattr(algorithm, name)) for name in dynamic_names(algorithm)}


def params_data(algorithm: Any, params: dict[str, float] | None = None) -> dict[str, jax.Array]:
    """``params`` (default: the algorithm's own) as the arrays a jitted step takes: scalars of the
    algorithm's dtype, so that a new value is new data, never a new program."""
    values = params_of(algorithm) if params is None else params
    return {name: jnp.asarray(values[name], algorithm.dtype) for name in dynamic_names(algorithm)}


def with_params(algorithm: Any, params: dict[str, Any] | None) -> Any:
    """A copy of ``algorithm`` whose dynamic hyper-parameters are ``params`` (inside a jitted step:
    traced scalars). ``None``: ``algorithm`` itself. The copy skips the constructor's checks
    (they compare values in Python, which a traced value cannot); the values were checked when
    they were set (``Loop.set_params`` builds the algorithm they belong to)."""
    # (Keys that are no identifier, such as the engine's "@problem", carry other data.)
    params = {k: v for k, v in (params or {}).items() if k.isidentifier()}
    if not params:
        return algorithm
    copy = object.__new__(type(algorithm))
    copy.__dict__.update(algorithm.__dict__)
    for name, value in params.items():
        object.__setattr__(copy, name, value)
    return copy


def _box(where: str, name: str, value: Any, dim: int) -> tuple[float, ...]:
    """A bound as one float per coordinate: a number is the same for all."""
    value = schema.plain(value)
    if hasattr(value, "tolist"):  # a NumPy or JAX array
        value = value.tolist()
    values = [value] * dim if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or len(values) != dim or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise ConfigError(f"{where}: {name} must be a finite number or {dim} finite numbers (one per "
                          f"coordinate, dim = {dim}); got {schema.short(value)}", name)
    return tuple(float(v) for v in values)
