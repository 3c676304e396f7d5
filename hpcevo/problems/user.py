"""Problems users bring: a JAX function or class named by import path, checked at start-up.

``problem.name`` is ``"package.module:attribute"`` (imported like any module: installed, or on
``PYTHONPATH``; ``python -m hpcevo`` also finds modules in the working directory) or
``"path/to/file.py:attribute"`` (a path relative to the working directory). The attribute is

* a function, called as ``f(x, **args)`` with ``args`` the ``[problem.args]`` table; or
* a class, instantiated once as ``C(**args)`` (plus ``dim=`` when its constructor takes ``dim``
  and ``args`` does not give it); the instance's ``evaluate`` method, or the instance itself if
  it is callable, is then called as ``g(x)``.

Per-individual or batch: a function of one candidate (``(dim,) -> ()``) is vectorised with
``jax.vmap``; a batch function (``(n, dim) -> (n,)``) is used as is. Which one it is comes from a
declaration, ``problem.batched = true|false`` in the config or a ``batched`` attribute on the
function or instance, and otherwise from its shapes: ``jax.eval_shape`` (tracing only, nothing is
computed) on a block of ``n`` rows (``n`` = 2, or 3 when dim is 2, so that ``n != dim``); if that
returns ``(n,)`` the function is a batch function, else it must map ``(dim,)`` to ``()``. A
per-individual function that happens to work on blocks (``jnp.sum(x**2, axis=-1)``) is then
used as a batch function, which gives the same values.

Optional attributes of the function or instance: ``dim`` (must agree with ``problem.dim``),
``lb`` / ``ub`` (a number or one per coordinate; ``problem.lb`` / ``problem.ub`` win),
``num_objectives`` (default 1: one value per candidate; m > 1: ``(n, m)`` / ``(m,)``), and the
other optional members of ``problems.base.Problem`` (``wants_generation``, ``block_invariant``,
``pareto_front``, ``default_ref_point``).

A function or problem object held in Python (``hpcevo.run(cfg, problem=f)``) goes through the
same checks (``from_object``); its name in the resolved config is ``held_name(f)``, which only
Python can run again: ``<python: module.qualname>``, ``<python: qualname>`` for a script's own
(``__main__``) function, or ``<python: NAME>`` for one handed over as ``Named(f, NAME)``
(``hpcevo.run(problem_name=NAME)``). A resume compares them with ``held_names_match``.

Every mistake (a missing file or module, a missing attribute, arguments the function does not
take, a wrong output shape, an exception while tracing) raises ``ValueError`` with one message
that names the problem; the config layer turns it into ``ConfigError`` (exit 2).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, did_you_mean
from .base import Problem
from .numerical import _bounds

HELD_PREFIX = "<python: "


def is_import_path(name: str) -> bool:
    return ":" in name and not is_held_name(name)


@dataclass(frozen=True)
class Named:
    """A problem held in Python under the name its caller chose (``hpcevo.run(problem_name=)``):
    recorded as ``<python: name>``, checked and evaluated as ``obj``."""

    obj: Any
    name: str


def held_name(obj: Any) -> str:
    """The name a problem (or algorithm) object held in Python gets in a resolved config: its
    function's or class's ``module.qualname``; the qualname alone when the module is
    ``__main__``, which names whichever script runs, not the code (so a run a script started
    can be resumed by another that imports the same function from its module); a ``Named``
    object's own name."""
    if isinstance(obj, Named):
        return f"{HELD_PREFIX}{obj.name}>"
    what = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    module, qualname = getattr(what, "__module__", "?"), getattr(what, "__qualname__", repr(what))
    return f"{HELD_PREFIX}{qualname if module == '__main__' else f'{module}.{qualname}'}>"


def is_held_name(name: str) -> bool:
    return name.startswith(HELD_PREFIX)


def held_names_match(a: Any, b: Any) -> bool:
    """Whether two held names (``held_name``) may name the same code: equal, or one is the
    other with a dotted prefix (its module) dropped: ``<python: srr>``, a script's own function
    or one named ``srr``, matches ``<python: study_problem.srr>``. (Where a module ends and a
    qualname begins cannot be told from the text, so ``srr`` also matches ``mod.Outer.srr``.)
    Anything else, held names or not: equal."""
    if not (isinstance(a, str) and isinstance(b, str) and is_held_name(a) and is_held_name(b)):
        return a == b
    short, long = sorted((n[len(HELD_PREFIX):].removesuffix(">") for n in (a, b)), key=len)
    return short == long or bool(short) and long.endswith("." + short)


@dataclass(frozen=True, eq=False)
class UserProblem(Problem):
    """A user's function, vectorised when it is per-individual; ``evaluate: (n, dim) -> (n,)``.

    ``meta``: the object that carried the function's attributes (the function itself, or the
    instance of a class); its ``pareto_front`` and ``default_ref_point``, if any, are used.
    """

    name: str
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    fn: Callable[..., jax.Array]
    batched: bool
    num_objectives: int = 1
    wants_generation: bool = False
    block_invariant: bool = False
    meta: Any = None

    def evaluate(self, x, *generation) -> jax.Array:
        if self.batched:
            return self.fn(x, *generation)
        if not generation:
            return jax.vmap(self.fn)(x)
        return jax.vmap(lambda row: self.fn(row, *generation))(x)

    __call__ = evaluate

    # Two wrappings of the same function (or object) with the same settings are the same
    # problem: Loops built from one function share an engine, so a seed sweep, or a Batch of
    # its runs, compiles one program (each wrapping was its own program before).
    def _settings(self) -> tuple:
        return (self.name, self.dim, self.lb, self.ub, self.batched, self.num_objectives, self.wants_generation,
                self.block_invariant)

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self.meta is other.meta  # type: ignore[attr-defined]
                and self.fn == other.fn and self._settings() == other._settings())  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self._settings(), id(self.meta)))

    def pareto_front(self) -> np.ndarray | None:
        front = getattr(self.meta, "pareto_front", None)
        return None if front is None else front()

    def default_ref_point(self) -> np.ndarray | None:
        ref = getattr(self.meta, "default_ref_point", None)
        return None if ref is None else ref()


def _fail(name: str, text: str) -> ConfigError:
    return ConfigError(f"problem '{name}': {text}")


def _exc(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0].rstrip(".")
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _where_in(e: BaseException, path: str | None) -> str:
    """' (file.py, line N)' for the innermost frame in ``path`` (or the innermost frame)."""
    frames = traceback.extract_tb(e.__traceback__)
    if isinstance(e, SyntaxError) and e.filename:
        return f" ({e.filename}, line {e.lineno})"
    if path is not None:
        frames = [f for f in frames if f.filename == path] or frames
    else:  # the user's own line, not the JAX or hpcevo frames around it
        frames = [f for f in frames if not _library_frame(f.filename)] or frames
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _library_frame(filename: str) -> bool:
    here = str(Path(__file__).resolve().parents[1])
    return filename.startswith(here) or "site-packages" in filename or filename.startswith("<frozen")


def _load_module(name: str, target: str):
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise _fail(name, f"file '{target}' not found (relative paths are taken from the "
                              f"working directory, {Path.cwd()})")
        path = path.resolve()
        # A name of its own per file, so two problem files called problem.py cannot collide.
        mod_name = f"hpcevo_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            del sys.modules[mod_name]
            if not isinstance(e, Exception):
                raise
            raise _fail(name, f"loading '{target}' failed: {_exc(e)}{_where_in(e, str(path))}") from None
        return module
    if not all(part.isidentifier() for part in target.split(".")):
        raise _fail(name, f"'{target}' is neither a module name (a.b.c) nor a .py file")
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and (target == e.name or target.startswith(e.name + ".")):
            raise _fail(name, f"no module named '{e.name}' (install it or put its directory on "
                              "PYTHONPATH; a file is named as path/to/file.py:function)") from None
        raise _fail(name, f"importing '{target}' failed: {_exc(e)}{_where_in(e, None)}") from None
    except Exception as e:
        raise _fail(name, f"importing '{target}' failed: {_exc(e)}{_where_in(e, None)}") from None


def _attribute(name: str, module, target: str, attr: str):
    obj = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = ".".join(attr.split(".")[:i]) or target
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise _fail(name, f"'{where}' has no attribute '{part}'{did_you_mean(part, public)}")
        obj = getattr(obj, part)
    return obj


def _check_args(name: str, call: Callable, args: dict, lead: tuple) -> None:
    """Bind the arguments to the signature now, for a message naming the bad key."""
    try:
        sig = inspect.signature(call)
    except (TypeError, ValueError):
        return  # builtins without a signature: the trace below will tell
    try:
        sig.bind(*lead, **args)
    except TypeError as e:
        params = ", ".join(sig.parameters)
        raise _fail(name, f"[problem.args] do not fit its signature ({params}): {e}") from None


def _instantiate(name: str, cls: type, args: dict, dim: int | None):
    kwargs = dict(args)
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if "dim" in params and "dim" not in kwargs and dim is not None:
        kwargs["dim"] = dim
    _check_args(name, cls, kwargs, ())
    try:
        inst = cls(**kwargs)
    except Exception as e:
        raise _fail(name, f"{cls.__name__}(**args) raised {_exc(e)}{_where_in(e, None)}") from None
    fn = getattr(inst, "evaluate", None)
    if fn is None:
        if not callable(inst):
            raise _fail(name, f"an instance of {cls.__name__} has no evaluate method and is not callable")
        fn = inst
    return inst, fn


def _shape_of(fn, shape, dtype):
    try:
        out = jax.eval_shape(fn, jax.ShapeDtypeStruct(shape, dtype))
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError) as e:
        return None, (f"raised {_exc(e)}; if it is NumPy (or other non-JAX) code, set "
                      "problem.host = true to evaluate it outside JAX")
    except Exception as e:
        return None, f"raised {_exc(e)}{_where_in(e, None)}"
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        return None, f"returned {type(out).__name__}, not an array"
    if not (jnp.issubdtype(out.dtype, jnp.floating) or jnp.issubdtype(out.dtype, jnp.integer)):
        return None, f"returned an array of {out.dtype}, not numbers"
    return out.shape, None


def _detect_batched(name: str, fn, dim: int, m: int, dtype, declared: bool | None, wants_generation: bool) -> bool:
    tail = () if m == 1 else (m,)
    n = 3 if dim == 2 else 2
    want = f"{tail}" if m > 1 else "()"
    if wants_generation:  # probe it as the loop calls it
        fn = functools.partial(lambda f, x: f(x, jnp.int32(1)), fn)
    if declared is not True:
        single, why_single = _shape_of(fn, (dim,), dtype)
    if declared is not False:
        block, why_block = _shape_of(fn, (n, dim), dtype)
        if block == (n, *tail):
            return True
        if declared:
            got = why_block or f"returned shape {block}"
            raise _fail(name, f"declared batched: a block of shape ({n}, {dim}) must give "
                              f"{(n, *tail)}, but it {got}")
    if single == tail:
        return False
    got = why_single or f"returned shape {single}"
    several = m == 1 and single is not None and len(single) == 1
    objectives = " (for several objectives, declare num_objectives on the problem)" if several else ""
    if declared is False:
        raise _fail(name, f"declared per-individual: a candidate of shape ({dim},) must give "
                          f"shape {want}, but it {got}{objectives}")
    block_got = why_block or f"returned shape {block}"
    raise _fail(name, f"it must map one candidate of shape ({dim},) to shape {want}, or a block "
                      f"({n}, {dim}) to {(n, *tail)}; for one candidate it {got}, for a block it "
                      f"{block_got}{objectives}")


@dataclass(frozen=True)
class Resolved:
    """A problem's function and checked attributes (shared by JAX and host problems)."""

    fn: Callable[..., Any]  # what to call
    meta: Any  # what carries its attributes: the function, or the instance of a class
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    num_objectives: int


def resolve(name: str, dim: int | None, lb, ub, args: dict[str, Any]) -> Resolved:
    """Import the problem ``name`` (``module:attribute``, ``file.py:attribute``), instantiate it
    if it is a class, and check it (``resolve_object``)."""
    target, _, attr = name.rpartition(":")
    if not target or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise _fail(name, "expected 'package.module:function' or 'path/to/file.py:function'")
    obj = _attribute(name, _load_module(name, target), target, attr)
    return resolve_object(name, obj, dim, lb, ub, args, what=f"'{attr}'")


def resolve_object(name: str, obj: Any, dim: int | None, lb, ub, args: dict[str, Any],
                   fallback: tuple = (None, None, None), what: str = "it") -> Resolved:
    """Check a problem given as a function, a class (instantiated here with ``args``) or an
    object with an ``evaluate`` method: its dim, bounds and objectives. The config's values
    (``dim``, ``lb``, ``ub``) come first, then the object's attributes, then ``fallback`` (the
    dim and bounds of an algorithm object handed over with it)."""
    if isinstance(obj, Named):
        obj = obj.obj  # (its name is ``name`` already)
    if isinstance(obj, type):
        meta, fn = _instantiate(name, obj, args, dim)
    elif hasattr(obj, "evaluate") and not inspect.isroutine(obj):
        if args:
            raise _fail(name, f"[problem.args] do not apply to a problem object ({', '.join(sorted(args))})")
        meta, fn = obj, obj.evaluate
    elif callable(obj):
        _check_args(name, obj, args, (None, None) if getattr(obj, "wants_generation", False) else (None,))
        meta, fn = obj, (functools.partial(obj, **args) if args else obj)
    else:
        raise _fail(name, f"{what} is a {type(obj).__name__}, not a function or a class")
    dim = _checked_dim(name, dim, getattr(meta, "dim", None), fallback[0])
    m = getattr(meta, "num_objectives", 1)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise _fail(name, f"num_objectives must be a positive integer, got {m!r}")
    lbs, ubs = (_checked_bounds(name, which, given, getattr(meta, which, None), extra, dim)
                for which, given, extra in (("lb", lb, fallback[1]), ("ub", ub, fallback[2])))
    for i, (lo, hi) in enumerate(zip(lbs, ubs)):
        if not lo < hi:
            raise _fail(name, f"lb must be < ub in every coordinate, but at coordinate {i} lb = {lo} and ub = {hi}")
    return Resolved(fn, meta, dim, lbs, ubs, m)


def _checked_dim(name: str, given: int | None, own: int | None, fallback: int | None) -> int:
    if own is not None and given is not None and own != given:
        raise _fail(name, f"problem.dim = {given} but the problem says its dim is {own}")
    dim = next((d for d in (given, own, fallback) if d is not None), None)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise _fail(name, "set problem.dim (a positive integer), or give the problem a dim attribute"
                    if dim is None else f"dim must be a positive integer, got {dim!r}")
    return dim


def _checked_bounds(name: str, which: str, given, own, fallback, dim: int) -> tuple[float, ...]:
    value = next((v for v in (given, own, fallback) if v is not None), None)
    if value is None:
        raise _fail(name, f"no {which}: set problem.{which} (a number or one per coordinate), "
                          f"or give the problem an {which} attribute")
    bounds = _bounds(name, which, value, 0.0, dim)
    if not all(math.isfinite(v) for v in bounds):
        raise _fail(name, f"{which} must be finite, got {value!r}")
    return bounds


def load_user_problem(name: str, dim: int | None, lb, ub, args: dict[str, Any],
                      batched: bool | None = None, dtype: str = "float32") -> UserProblem:
    """Import, instantiate and check the problem ``name`` (see the module docstring)."""
    return _user_problem(name, resolve(name, dim, lb, ub, args), batched, dtype)


def from_object(obj: Any, dim: int | None, lb, ub, batched: bool | None = None, dtype: str = "float32",
                fallback: tuple = (None, None, None)) -> UserProblem:
    """A JAX function or problem object held in Python, checked as one named by import path."""
    name = held_name(obj)
    return _user_problem(name, resolve_object(name, obj, dim, lb, ub, {}, fallback), batched, dtype)


def _user_problem(name: str, r: Resolved, batched: bool | None, dtype: str) -> UserProblem:
    if batched is None:
        batched = getattr(r.meta, "batched", None)
    wants = bool(getattr(r.meta, "wants_generation", False))
    is_batched = _detect_batched(name, r.fn, r.dim, r.num_objectives, jnp.dtype(dtype), batched, wants)
    return UserProblem(name, r.dim, r.lb, r.ub, r.fn, is_batched, r.num_objectives, wants,
                       bool(getattr(r.meta, "block_invariant", False)), r.meta)
