"""Parameters as pytrees: a function of a network's parameters (a dict of weight and bias arrays,
lists, tuples, NamedTuples, a Flax or Haiku params tree) as a problem on flat vectors.

    problem = hpcevo.problems.pytree_problem(loss, {"w": jnp.zeros((4, 8)), "b": jnp.zeros(8)})
    loop = hpcevo.Loop(OpenES(pop_size=64, dim=problem.dim, lb=problem.lb, ub=problem.ub), problem, ctx)
    params = problem.unravel(loop.advance(100).best_solution)   # {"w": (4, 8), "b": (8,)}

The algorithms search ``(n, dim)`` rows; ``dim`` is the number of scalars in ``example``, laid out
as ``jax.flatten_util.ravel_pytree`` lays them out (leaves in ``jax.tree_util.tree_flatten``
order, each in C order). Evaluation cuts each row into the leaves' shapes (slices and reshapes)
in the row's own dtype (the run's: float32 or float64, whatever the example's
leaves were), and calls ``fn`` on the tree, vectorised with ``jax.vmap`` unless ``fn`` takes a
batch of trees (``batched``). The result is a ``UserProblem`` (``user.py``) like any function
handed to ``hpcevo.run``: ``Loop``, ``run`` and ``Archipelago`` take it as they take any problem,
and it carries its own dim and bounds.

A problem held in Python is recorded in a run's resolved config as ``<python: NAME>``
(``user.held_name``): ``fn``'s qualified name unless ``name`` is given, so the command line never
takes it for a built-in problem, and a resume from Python must hand over the same name.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import schema
from ..errors import ConfigError
from .user import Named, UserProblem, _shape_of, held_name

__all__ = ["PytreeProblem", "pytree_problem"]


@dataclass(frozen=True, eq=False, repr=False)
class PytreeProblem(UserProblem):
    """A ``UserProblem`` whose rows are the flattened parameters of a pytree (``pytree_problem``).

    ``fn`` is the flat batch function (``(n, dim) -> (n,)``, so ``batched`` is always true here);
    ``meta`` is the function of a tree it calls. ``treedef`` and ``shapes``: the example's
    structure and its leaves' shapes, in flattening order; ``paths``: the leaves' key paths
    (``"['w1']"``), for messages.
    """

    treedef: Any = field(default=None, kw_only=True)
    shapes: tuple[tuple[int, ...], ...] = field(default=(), kw_only=True)
    paths: tuple[str, ...] = field(default=(), kw_only=True)

    def unravel(self, x: Any) -> Any:
        """The pytree of the flat vector ``x`` (``loop.best_solution``, ``result.best_solution``):
        leaves of the example's shapes and of ``x``'s dtype and kind (a NumPy array gives NumPy
        leaves, a JAX array JAX leaves). Leading axes are kept: ``(k, dim)`` rows give leaves of
        shape ``(k, *shape)``, e.g. for ``loop.population()[0]``."""
        if not hasattr(x, "shape") or not hasattr(x, "reshape"):
            x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.dim:
            raise ConfigError(f"problem '{self.name}': unravel: 'x' must end in an axis of {self.dim} "
                              f"(the problem's dim), got shape {tuple(x.shape)}", "x")
        return self.treedef.unflatten(_split(x, self.shapes))

    def ravel(self, tree: Any) -> jax.Array:
        """The flat vector of ``tree`` (a pytree of the example's structure and leaf shapes), as
        ``jax.flatten_util.ravel_pytree`` makes it: a start point, a hand-made network to evaluate."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self.treedef:
            raise ConfigError(f"problem '{self.name}': ravel: 'tree' has structure {_structure(treedef)}, "
                              f"the example's is {_structure(self.treedef)}", "tree")
        flat = []
        for path, shape, leaf in zip(self.paths, self.shapes, leaves):
            leaf = jnp.asarray(leaf)
            if leaf.shape != shape:
                raise ConfigError(f"problem '{self.name}': ravel: tree{path} has shape {leaf.shape}, the "
                                  f"example's is {shape}", "tree")
            flat.append(leaf.reshape(-1))
        return jnp.concatenate(flat)

    def __repr__(self) -> str:  # (the dataclass's would print every bound)
        return f"PytreeProblem(name={self.name!r}, dim={self.dim}, leaves={len(self.shapes)})"


def pytree_problem(fn: Callable[..., Any], example: Any, *, lb: Any = -1.0, ub: Any = 1.0,
                   name: str | None = None, batched: bool = False,
                   wants_generation: bool = False) -> PytreeProblem:
    """A problem (minimised) whose candidates are the parameters ``fn`` takes as a pytree.

    ``fn(params) -> ()``: ``params`` is a pytree shaped like ``example`` (dicts, lists, tuples,
    NamedTuples, ... of float arrays; only the structure, shapes and dtype kind of ``example``
    are used, never its values). ``batched=True``: ``fn`` takes a batch of trees (a leading axis
    ``n`` on every leaf) and returns ``(n,)``. ``wants_generation=True``: ``fn(params,
    generation)``, for problems that draw new scenarios each generation (``base.Problem``).

    ``lb``, ``ub``: a number for every parameter, or a pytree of ``example``'s structure whose
    leaves are numbers or arrays broadcast to each leaf's shape (per-layer or per-weight bounds).
    ``name``: what the run records (``<python: name>``); default ``fn``'s qualified name.

    The returned problem's ``dim`` is the number of scalars in ``example``; ``unravel(x)`` turns
    a flat solution into the tree, ``ravel(tree)`` a tree into a flat vector. Raises
    ``ConfigError`` naming the argument (and the leaf) that is wrong: an integer leaf, bounds of
    another structure or shape, ``lb >= ub``, ``fn`` returning another shape or failing to trace.
    """
    if not callable(fn):
        raise ConfigError(f"pytree_problem: 'fn' must be a function of a parameter tree, got "
                          f"{type(fn).__name__}", "fn")
    label = held_name(fn if name is None else Named(fn, _checked_name(name)))
    where = f"problem '{label}'"
    batched = schema.check(bool, batched, "batched", where)
    wants_generation = schema.check(bool, wants_generation, "wants_generation", where)
    paths, shapes, treedef = _layout(where, example)
    dim = sum(math.prod(s) for s in shapes)
    if dim == 0:
        raise ConfigError(f"{where}: 'example' holds no parameters (its leaves have no elements)", "example")
    lbs, ubs = (_bounds(where, which, value, treedef, paths, shapes) for which, value in (("lb", lb), ("ub", ub)))
    _check_order(where, lbs, ubs, paths, shapes)

    def unravel(x):
        return treedef.unflatten(_split(x, shapes))

    def one(row, *generation):
        return fn(unravel(row), *generation)

    if batched:
        def rows(x, *generation):
            return fn(unravel(x), *generation)
    else:
        def rows(x, *generation):
            return jax.vmap(lambda row: one(row, *generation))(x)

    _check_output(where, rows if batched else one, dim, batched, wants_generation)
    # The flat function is a batch function either way (batched=True below): a problem object
    # that is wrapped again (a config that changes its bounds: problems.as_problem) is then
    # probed as what its evaluate is.
    return PytreeProblem(label, dim, lbs, ubs, rows, True, wants_generation=wants_generation, meta=fn,
                         treedef=treedef, shapes=shapes, paths=paths)


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or name != name.strip() or not name.isprintable():
        raise ConfigError("pytree_problem: 'name' must be a non-empty line of text without surrounding spaces "
                          f"(e.g. \"mlp\"), got {schema.short(name)}", "name")
    return name


def _split(x: Any, shapes: tuple[tuple[int, ...], ...]) -> list[Any]:
    """``x`` (``(..., dim)``) cut into leaves of ``(..., *shape)``, in order."""
    lead, out, at = tuple(x.shape[:-1]), [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(x[..., at:at + size].reshape(lead + shape))
        at += size
    return out


def _layout(where: str, example: Any) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], Any]:
    """The example's leaf paths, leaf shapes and structure; every leaf must be floating point."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(example)
    if not with_paths:
        raise ConfigError(f"{where}: 'example' has no leaves: give a pytree of float arrays "
                          "(e.g. {'w': jnp.zeros((4, 8)), 'b': jnp.zeros(8)})", "example")
    paths, shapes = [], []
    for key, leaf in with_paths:
        path, kind = jax.tree_util.keystr(key), _not_float(leaf)
        if kind is not None:
            raise ConfigError(f"{where}: example{path} is {kind}, not floats: every leaf is a parameter "
                              "that evolution sets to real numbers (make it a float array, or close over it "
                              "in fn instead of passing it in the tree)", "example")
        paths.append(path)
        shapes.append(tuple(int(d) for d in np.shape(leaf)))
    return tuple(paths), tuple(shapes), treedef


def _not_float(leaf: Any) -> str | None:
    """None for a leaf of floats (an array, a ``jax.ShapeDtypeStruct``, a Python float); else
    what it is."""
    if isinstance(leaf, (bool, np.bool_)):
        return "a bool"
    if isinstance(leaf, float):
        return None
    if isinstance(leaf, int):
        return "an int"
    dtype = getattr(leaf, "dtype", None) if hasattr(leaf, "shape") else None
    if dtype is None:
        try:
            dtype = np.asarray(leaf).dtype
        except Exception:  # noqa: BLE001 - whatever is no array is refused as what it is
            return _a(type(leaf).__name__)
        if dtype == object:
            return _a(type(leaf).__name__)
    return None if jnp.issubdtype(dtype, jnp.floating) else f"an array of {dtype}"


def _structure(treedef: Any, limit: int = 120) -> str:
    text = str(treedef)  # PyTreeDef({'b': *, 'w': *}), cut short: a deep network's is long
    return text if len(text) <= limit else text[:limit] + " ..."


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _bounds(where: str, which: str, value: Any, treedef: Any, paths: tuple[str, ...],
            shapes: tuple[tuple[int, ...], ...]) -> tuple[float, ...]:
    """``lb`` or ``ub`` flattened like the example: a number, or a tree with the example's
    structure down to its leaves, each broadcast to its leaf's shape; finite."""
    parts: list[Any] | None = None
    if isinstance(value, (bool, np.bool_, str, bytes)):
        pass
    elif isinstance(value, numbers.Real) or getattr(value, "shape", None) == ():
        parts = [value] * len(shapes)
    else:
        try:  # what lies where the example has a leaf is that leaf's bound (a list too)
            parts = treedef.flatten_up_to(value)
        except (TypeError, ValueError):
            pass
    if parts is None:
        raise ConfigError(f"{where}: '{which}' must be a number or a pytree of the example's structure "
                          f"({_structure(treedef)}), got {schema.short(value)}", which)
    flat = []
    for path, shape, part in zip(paths, shapes, parts):
        try:
            array = np.asarray(part, np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {which}{path} must be numbers, got {schema.short(part)}", which) from None
        try:
            array = np.broadcast_to(array, shape)
        except ValueError:
            raise ConfigError(f"{where}: {which}{path} has shape {array.shape}, which does not broadcast to "
                              f"the leaf's shape {shape}", which) from None
        if not np.isfinite(array).all():
            raise ConfigError(f"{where}: {which}{path} must be finite, got {schema.short(part)}", which)
        flat.extend(array.reshape(-1).tolist())
    return tuple(flat)


def _check_order(where: str, lbs: tuple[float, ...], ubs: tuple[float, ...], paths: tuple[str, ...],
                 shapes: tuple[tuple[int, ...], ...]) -> None:
    bad = np.flatnonzero(~(np.asarray(lbs) < np.asarray(ubs)))
    if not bad.size:
        return
    i = int(bad[0])  # which leaf, and which element of it, coordinate i is
    ends = np.cumsum([math.prod(s) for s in shapes])
    leaf = int(np.searchsorted(ends, i, side="right"))
    index = np.unravel_index(i - (int(ends[leaf - 1]) if leaf else 0), shapes[leaf])
    element = f"[{', '.join(str(int(k)) for k in index)}]" if index else ""
    raise ConfigError(f"{where}: lb must be < ub for every parameter, but for {paths[leaf]}{element} "
                      f"(coordinate {i}) lb = {lbs[i]} and ub = {ubs[i]}", "lb")


def _check_output(where: str, call: Callable[..., Any], dim: int, batched: bool, wants_generation: bool) -> None:
    """Trace ``fn`` (nothing is computed) on one tree, or with ``batched`` on a batch of two:
    one number per tree."""
    n = 2
    probe = (lambda x: call(x, jnp.int32(1))) if wants_generation else call
    shape, why = _shape_of(probe, (n, dim) if batched else (dim,), jnp.float32)
    want = (n,) if batched else ()
    if shape == want:
        return
    got = why or f"returned shape {shape}"
    if why and ("TracerArrayConversionError" in why or "ConcretizationTypeError" in why):
        # (user.py's hint for these, problem.host, is for flat functions; a tree's is JAX only)
        got = why.partition("; if it is NumPy")[0] + " (fn runs inside the jitted step: JAX code, not NumPy)"
    if batched:
        raise ConfigError(f"{where}: batched=True: fn must map a batch of {n} parameter trees (a leading axis "
                          f"of {n} on every leaf) to shape {want}, but it {got}", "fn")
    hint = " (a function of a batch of trees: pass batched=True)" if shape is not None and len(shape) == 1 else ""
    raise ConfigError(f"{where}: fn must map one parameter tree to a number (shape ()), but it {got}{hint}", "fn")
