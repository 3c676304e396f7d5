"""The CEC 2022 single-objective bound-constrained benchmark suite, F1-F12, pure JAX.

[KPM21] A. Kumar, K. V. Price, A. W. Mohamed, A. A. Hadi, P. N. Suganthan, "Problem Definitions
        and Evaluation Criteria for the CEC 2022 Special Session and Competition on Single
        Objective Bound Constrained Numerical Optimization", Technical Report, Nanyang
        Technological University, Singapore, 2021.

The functions follow the organisers' C code (``cec22_test_func.cpp``), which is what competition
entries were scored with, rather than the prose of [KPM21] where the two part. Two places where
the C code is not what the report's formulas say, kept here so values match published results:
  * F3 and the last component of F7 call Schaffer's F7 on the C code's global ``y``: for F3
    that is the shifted, unrotated candidate; inside F7 it is the first ``k`` entries of the
    rotated and shuffled candidate, not the component's own ``k`` entries.
  * F4's "step" does nothing (the C code rounds ``y`` and then overwrites it): F4 is the shifted
    and rotated Rastrigin function.
The organisers' Python port differs from their C code in exactly those two places (F3, F7).
``tests/test_cec2022.py`` checks every function against ``minionpy``, which compiles the
organisers' C code. The ``opfunu`` package (1.0.4) agrees with the organisers only on F2; see
that test file for the comparison.

Data: the shift vectors, rotation matrices and shuffles are the organisers' files. They are not
shipped with hpcevo (their repository states no licence); they are read at construction time
from an installed package that ships identical copies: ``opfunu`` (GPL-3.0; only its data files
are read, its code is never imported) or ``minionpy`` (MIT). ``pip install hpcevo[cec]``.

Every function maps the last axis to a scalar (``(..., D) -> (...)``) and, like
``numerical.py``, is bitwise block invariant: a row's value never depends on the other rows of
its block (pairwise sums over the last axis, products fenced before they feed an addition).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .base import Problem
from .numerical import _bounds, _fence, _prod, _square, _sum

Array = jax.Array

DIMS = (10, 20)
LB, UB = -100.0, 100.0
# Optimum values F*_i [KPM21, Table I].
BIAS = (300.0, 400.0, 600.0, 800.0, 900.0, 1800.0, 2000.0, 2200.0, 2300.0, 2400.0, 2600.0, 2700.0)
DATA_SOURCES = (("opfunu", "cec_based/data_2022"), ("minionpy", "cec_input_data/input_data_2022"))


def data_dir() -> Path:
    """Where the organisers' data files are, from the first installed package that has them."""
    for package, sub in DATA_SOURCES:
        spec = importlib.util.find_spec(package)  # finds, does not import
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root) / sub
            if (path / "shift_data_1.txt").is_file():
                return path
    raise ConfigError(
        "the CEC 2022 data files (shifts, rotations, shuffles) come from an installed package: "
        "pip install opfunu (or minionpy), or pip install 'hpcevo[cec]'"
    )


# -- elementary pieces, all over the last axis --------------------------------------------------


def _mul(a, b) -> Array:
    """a * b, rounded before any consumer (no fused multiply-add; see numerical.py)."""
    return _fence(a * b, a)


def _fn(f: Callable[[Array], Array], u: Array) -> Array:
    return _fence(f(u), u)


def _matvec(m: np.ndarray, y: Array) -> Array:
    """``m @ y`` per row as element-wise products and a pairwise sum: no ``dot`` whose
    accumulation order XLA could choose per block shape."""
    return _sum(_mul(y[..., None, :], jnp.asarray(m, y.dtype)))


def _sr(x: Array, shift: np.ndarray | None, rot: np.ndarray | None, rate: float) -> Array:
    """The C code's ``sr_func``: shift, scale by ``rate``, rotate (each step optional)."""
    y = x - jnp.asarray(shift, x.dtype) if shift is not None else x
    if rate != 1.0:
        y = _mul(y, rate)
    return _matvec(rot, y) if rot is not None else y


def _idx(k: int, dtype) -> np.ndarray:
    return np.arange(k, dtype=np.float64).astype(dtype)


def zakharov(z):
    i = _idx(z.shape[-1], z.dtype) + 1.0
    s1 = _sum(_square(z))
    s2 = _sum(_mul(z, 0.5 * i))
    s2sq = _square(s2)
    return s1 + s2sq + _square(s2sq)


def rosenbrock(z):
    z = z + 1.0
    a = _square(z[..., :-1]) - z[..., 1:]
    return _sum(_mul(_square(a), 100.0) + _square(z[..., :-1] - 1.0))


def _schaffer_f7(y):
    k = y.shape[-1]
    s = jnp.sqrt(_square(y[..., :-1]) + _square(y[..., 1:]))
    t = _fn(jnp.sin, _mul(_fn(lambda u: u**0.2, s), 50.0))
    r = _fn(jnp.sqrt, s)
    f = _sum(r + _mul(r, _square(t)))
    return _mul(_square(f), 1.0 / ((k - 1) * (k - 1)))


def rastrigin(z):
    c = _fn(jnp.cos, _mul(z, 2.0 * math.pi))
    return _sum(_square(z) - _mul(c, 10.0) + 10.0)


def levy(z):
    w = 1.0 + _mul(z, 0.25)
    s0 = _fn(jnp.sin, _mul(w[..., :1], math.pi))
    head = w[..., :-1]
    si = _fn(jnp.sin, _mul(head, math.pi) + 1.0)
    mid = _mul(_square(head - 1.0), 1.0 + _mul(_square(si), 10.0))
    last = w[..., -1:]
    sl = _fn(jnp.sin, _mul(last, 2.0 * math.pi))
    end = _mul(_square(last - 1.0), 1.0 + _square(sl))
    return _sum(jnp.concatenate([_square(s0), mid, end], axis=-1))


def bent_cigar(z):
    return _square(z[..., 0]) + _mul(_sum(_square(z[..., 1:])), 1e6)


def discus(z):
    return _mul(_square(z[..., 0]), 1e6) + _sum(_square(z[..., 1:]))


def ellips(z):
    k = z.shape[-1]
    w = np.array([10.0 ** (6.0 * i / (k - 1)) for i in range(k)]).astype(z.dtype)
    return _sum(_mul(_square(z), w))


def hgbat(z):
    z = z - 1.0
    k = z.shape[-1]
    r2 = _sum(_square(z))
    sz = _sum(z)
    a = _fn(jnp.sqrt, jnp.abs(_square(r2) - _square(sz)))
    return a + _mul(_mul(r2, 0.5) + sz, 1.0 / k) + 0.5


def happycat(z):
    z = z - 1.0
    k = z.shape[-1]
    r2 = _sum(_square(z))
    sz = _sum(z)
    a = _fn(lambda u: u**0.25, jnp.abs(r2 - k))
    return a + _mul(_mul(r2, 0.5) + sz, 1.0 / k) + 0.5


def katsuura(z):
    k = z.shape[-1]
    i = _idx(k, z.dtype) + 1.0
    terms = []
    for j in range(1, 33):
        t = _mul(z, 2.0**j)
        terms.append(_mul(jnp.abs(t - jnp.floor(t + 0.5)), 2.0**-j))
    inner = _sum(jnp.stack(terms, axis=-1))
    g = _fn(lambda u: u ** (10.0 / k**1.2), 1.0 + _mul(inner, i))
    c = 10.0 / k / k
    return _mul(_prod(g), c) - c


def ackley(z):
    k = z.shape[-1]
    r = _fn(jnp.sqrt, _mul(_sum(_square(z)), 1.0 / k))
    e1 = _fn(jnp.exp, _mul(r, -0.2))
    cs = _sum(_fn(jnp.cos, _mul(z, 2.0 * math.pi)))
    e2 = _fn(jnp.exp, _mul(cs, 1.0 / k))
    return math.e - _mul(e1, 20.0) - e2 + 20.0


def schwefel(z):
    """The C code's modified Schwefel (``schwefel_func``), with its out-of-range penalties."""
    k = z.shape[-1]
    z = z + 4.209687462275036e2
    m = jnp.fmod(jnp.abs(z), 500.0)
    hi = 500.0 - m
    inner = _mul(z, _fn(jnp.sin, _fn(jnp.sqrt, jnp.abs(z))))
    over = _mul(hi, _fn(jnp.sin, _fn(jnp.sqrt, hi)))
    pen_hi = _mul(_square(_mul(z - 500.0, 0.01)), 1.0 / k)
    pen_lo = _mul(_square(_mul(z + 500.0, 0.01)), 1.0 / k)
    # Beyond +-500 the C code mirrors z back into the box and adds a quadratic penalty.
    term = jnp.where(z > 500.0, pen_hi - over, jnp.where(z < -500.0, pen_lo + over, -inner))
    return _sum(term) + 4.189828872724338e2 * k


def grie_rosen(z):
    z = z + 1.0
    nxt = jnp.roll(z, -1, axis=-1)
    a = _square(z) - nxt
    t = _mul(_square(a), 100.0) + _square(z - 1.0)
    return _sum(_mul(_square(t), 1.0 / 4000.0) - _fn(jnp.cos, t) + 1.0)


def escaffer6(z):
    nxt = jnp.roll(z, -1, axis=-1)
    s = _square(z) + _square(nxt)
    t = _square(_fn(jnp.sin, _fn(jnp.sqrt, s)))
    d = _square(1.0 + _mul(s, 0.001))
    return _sum(0.5 + _fence((t - 0.5) / d, t))


def griewank(z):
    k = z.shape[-1]
    inv = (1.0 / np.sqrt(np.arange(1, k + 1, dtype=np.float64))).astype(z.dtype)
    p = _prod(_fn(jnp.cos, _mul(z, inv)))
    return 1.0 + _mul(_sum(_square(z)), 1.0 / 4000.0) - p


# -- the suite -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Data:
    shift: np.ndarray  # (D,) or (components, D)
    rot: np.ndarray  # (D, D) or (components * D, D)
    shuffle: np.ndarray | None  # (D,) zero-based, hybrids only


def _load(number: int, dim: int) -> _Data:
    root = data_dir()
    shift = np.loadtxt(root / f"shift_data_{number}.txt")
    shift = shift.reshape(-1)[:dim] if number < 9 else shift[:, :dim]
    rot = np.loadtxt(root / f"M_{number}_D{dim}.txt")
    shuffle = None
    if 6 <= number <= 8:
        shuffle = np.loadtxt(root / f"shuffle_data_{number}_D{dim}.txt").astype(np.int64).reshape(-1) - 1
    return _Data(shift, rot, shuffle)


def _sizes(props: tuple[float, ...], dim: int) -> list[int]:
    # The C code's ceil(p * D) in double precision (0.3 * 10 rounds up to 4).
    sizes = [math.ceil(p * dim) for p in props[:-1]]
    return sizes + [dim - sum(sizes)]


# Hybrid functions [KPM21 Sec. 2.3]: (component, rate) in order, and the proportions p_i.
_HYBRIDS = {
    6: (((bent_cigar, 1.0), (hgbat, 0.05), (rastrigin, 0.0512)), (0.4, 0.4, 0.2)),
    7: (((hgbat, 0.05), (katsuura, 0.05), (ackley, 1.0), (rastrigin, 0.0512), (schwefel, 10.0),
         (_schaffer_f7, None)), (0.1, 0.2, 0.2, 0.2, 0.1, 0.2)),
    8: (((katsuura, 0.05), (happycat, 0.05), (grie_rosen, 0.05), (schwefel, 10.0), (ackley, 1.0)),
        (0.3, 0.2, 0.2, 0.1, 0.2)),
}

# Composition functions [KPM21 Sec. 2.4]: (component, rate, rotated, lambda), delta_i, bias_i.
_COMPOSITIONS = {
    9: (((rosenbrock, 2.048 / 100.0, True, 1.0), (ellips, 1.0, True, 1e-6),
         (bent_cigar, 1.0, True, 1e-26), (discus, 1.0, True, 1e-6), (ellips, 1.0, False, 1e-6)),
        (10, 20, 30, 40, 50), (0, 200, 300, 100, 400)),
    10: (((schwefel, 10.0, False, 1.0), (rastrigin, 0.0512, True, 1.0), (hgbat, 0.05, True, 1.0)),
         (20, 10, 10), (0, 200, 100)),
    11: (((escaffer6, 1.0, True, 5e-4), (schwefel, 10.0, True, 1.0), (griewank, 6.0, True, 10.0),
          (rosenbrock, 2.048 / 100.0, True, 1.0), (rastrigin, 0.0512, True, 10.0)),
         (20, 20, 30, 30, 20), (0, 200, 300, 400, 200)),
    12: (((hgbat, 0.05, True, 10.0), (rastrigin, 0.0512, True, 10.0), (schwefel, 10.0, True, 2.5),
          (bent_cigar, 1.0, True, 1e-26), (ellips, 1.0, True, 1e-6), (escaffer6, 1.0, True, 5e-4)),
         (10, 20, 30, 40, 50, 60), (0, 300, 500, 100, 400, 200)),
}


def _hybrid(number: int, x: Array, d: _Data) -> Array:
    parts, props = _HYBRIDS[number]
    dim = x.shape[-1]
    y = _sr(x, d.shift, d.rot, 1.0)[..., d.shuffle]
    total, start = None, 0
    for (g, rate), k in zip(parts, _sizes(props, dim)):
        # rate None: the C code's Schaffer F7 reads the first k entries (see module docstring).
        v = g(y[..., :k]) if rate is None else g(_sr(y[..., start : start + k], None, None, rate))
        total = v if total is None else total + v
        start += k
    return total


def _composition(number: int, x: Array, d: _Data) -> Array:
    parts, deltas, biases = _COMPOSITIONS[number]
    dim = x.shape[-1]
    fits, logw, zero = [], [], []
    for i, ((g, rate, rotated, lam), delta, bias) in enumerate(zip(parts, deltas, biases)):
        o = d.shift[i]
        rot = d.rot[i * dim : (i + 1) * dim] if rotated else None
        fits.append(_mul(g(_sr(x, o, rot, rate)), lam) + float(bias))
        dist = _sum(_square(x - jnp.asarray(o, x.dtype)))
        zero.append(dist == 0)
        # w_i = dist^-1/2 exp(-dist / (2 D delta^2)), normalised: in log space, so float32 does
        # not underflow to the C code's all-zero fallback far from every optimum.
        logw.append(_mul(_fn(jnp.log, dist), -0.5) - _mul(dist, 1.0 / (2.0 * dim * delta * delta)))
    fits, logw, zero = jnp.stack(fits, -1), jnp.stack(logw, -1), jnp.stack(zero, -1)
    top = jnp.max(jnp.where(zero, -jnp.inf, logw), axis=-1, keepdims=True)
    w = _fn(jnp.exp, jnp.where(zero, -jnp.inf, logw) - top)
    # At a component's own optimum (dist 0) the C code gives that component weight 1e99: all.
    w = jnp.where(jnp.any(zero, axis=-1, keepdims=True), zero.astype(x.dtype), w)
    num = _sum(_mul(w, fits))
    return _fence(num / _sum(w), num)


def _evaluate(number: int, x: Array, d: _Data) -> Array:
    if number == 1:
        f = zakharov(_sr(x, d.shift, d.rot, 1.0))
    elif number == 2:
        f = rosenbrock(_sr(x, d.shift, d.rot, 2.048 / 100.0))
    elif number == 3:
        f = _schaffer_f7(_sr(x, d.shift, None, 1.0))  # unrotated: see module docstring
    elif number == 4:
        f = rastrigin(_sr(x, d.shift, d.rot, 5.12 / 100.0))
    elif number == 5:
        f = levy(_sr(x, d.shift, d.rot, 1.0))
    elif number in _HYBRIDS:
        f = _hybrid(number, x, d)
    else:
        f = _composition(number, x, d)
    return f + BIAS[number - 1]


NAMES = tuple(f"cec2022_f{i}" for i in range(1, 13))


# -- one program for all 12 functions ------------------------------------------------------------
#
# A run's engine takes the function's number and the suite's data as arguments
# (``CEC2022Problem.program_data``): one program per dimension and box serves all 12 functions,
# each a branch of one ``lax.switch`` (a generation runs only its own), where each function was a
# program of its own, compiled for seconds. The data are every function's arrays of the
# dimension (the compositions' first k components only), one dictionary for all: the same
# values as the constants ``evaluate`` compiles in, so the same bits.

_SUITE: dict[tuple[int, str], dict[str, np.ndarray]] = {}


def _suite_data(dim: int) -> dict[str, np.ndarray]:
    key = (dim, str(data_dir()))
    if key not in _SUITE:
        out: dict[str, np.ndarray] = {}
        for number in range(1, 13):
            d = _load(number, dim)
            k = len(_COMPOSITIONS[number][0]) if number in _COMPOSITIONS else None
            out[f"shift{number}"] = d.shift if k is None else d.shift[:k]
            out[f"rot{number}"] = d.rot if k is None else d.rot[: k * dim]
            if d.shuffle is not None:
                out[f"shuffle{number}"] = d.shuffle
        _SUITE[key] = out
    return _SUITE[key]


def _branch(number: int, x: Array, data: dict, *generation) -> Array:
    d = _Data(data[f"shift{number}"], data[f"rot{number}"], data.get(f"shuffle{number}"))
    return _evaluate(number, x, d)


_BRANCHES = tuple(partial(_branch, n) for n in range(1, 13))


@dataclass(frozen=True)
class CEC2022Problem(Problem):
    """CEC 2022 function ``number`` (1-12) in ``dim`` (10 or 20) dimensions, box [-100, 100].
    Equal arguments give equal, equally hashed problems (the data are the organisers' files for
    that function and dimension): the runs of a function share one engine and its compiled
    programs in a process, where each run built its own (0.5 s a run)."""

    number: int
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    data: _Data = field(repr=False, compare=False)
    num_objectives: int = 1
    block_invariant: ClassVar[bool] = True  # pairwise sums, fenced products (module docstring)

    @property
    def name(self) -> str:
        return f"cec2022_f{self.number}"

    @property
    def optimum_value(self) -> float:
        return BIAS[self.number - 1]

    def optimum_x(self) -> np.ndarray:
        return np.asarray(self.data.shift if self.number < 9 else self.data.shift[0])

    def _candidates(self, x) -> Array:
        x = jnp.asarray(x)
        if x.shape[-1] != self.dim:
            raise ConfigError(f"{self.name}: expected candidates with last axis {self.dim}, got shape {x.shape}")
        return x

    def evaluate(self, x) -> Array:
        return _evaluate(self.number, self._candidates(x), self.data)

    __call__ = evaluate

    # The protocol's program data (``base.Problem.program_data``; the section above): every
    # function of a dimension and box is one program.
    @property
    def program(self) -> tuple:
        return ("cec2022", self.dim, self.lb, self.ub)

    @cached_property  # (a loop reads it at every dispatch; not a field: equality ignores it)
    def program_data(self) -> dict:
        """The function's number and the suite's arrays for this dimension."""
        return {"function": np.asarray(self.number, np.int32), **_suite_data(self.dim)}

    def evaluate_with(self, x, data, *generation) -> Array:
        """``evaluate`` for the function ``data`` names, its data as arguments: the same bits."""
        index = jnp.clip(jnp.asarray(data["function"], jnp.int32) - 1, 0, len(NAMES) - 1)
        return jax.lax.switch(index, _BRANCHES, self._candidates(x), data)


def make_cec2022(name: str, dim: int | None, lb=None, ub=None) -> CEC2022Problem:
    number = int(name.removeprefix("cec2022_f"))
    if dim not in DIMS:
        raise ConfigError(f"{name}: dim must be one of {', '.join(map(str, DIMS))} (the dimensions "
                         f"the CEC 2022 data is defined for), got {dim}")
    return CEC2022Problem(number, dim, _bounds(name, "lb", lb, LB, dim), _bounds(name, "ub", ub, UB, dim),
                          _load(number, dim))
