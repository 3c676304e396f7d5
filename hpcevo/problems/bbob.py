"""COCO's 24 noiseless BBOB functions (the ``bbob`` suite), pure JAX.

[HFRA09] N. Hansen, S. Finck, R. Ros, A. Auger, "Real-Parameter Black-Box Optimization
         Benchmarking 2009: Noiseless Functions Definitions", INRIA Research Report RR-6829,
         2009 (updated 2010).
[HAT21]  N. Hansen, A. Auger, R. Ros, O. Mersmann, T. Tusar, D. Brockhoff, "COCO: a platform
         for comparing continuous optimizers in a black-box setting", Optimization Methods and
         Software 36(1), 114-144, 2021.

The values follow COCO's C code (``coco.c`` of the ``coco-experiment`` 2.8.2 package, the
``cocoex`` Python module), which is what every published BBOB result was computed with, rather
than the prose of [HFRA09] where the two part. ``tests/test_bbob.py`` checks all 24 functions
against ``cocoex`` at dimensions 2 to 40 and many instances: xopt and fopt are COCO's bit for
bit, values agree to 7e-14 relative to f - fopt (to ~1e-11 where COCO's formulas themselves
cancel or amplify rounding: f16-f19, f23; see that file).

Instances. Everything random about an instance (the optimum ``xopt``, the optimal value
``fopt``, the rotation matrices, Gallagher's peaks) comes from COCO's legacy generator
(``bbob2009_unif``, ``bbob2009_gauss``, ``bbob2009_compute_xopt``/``_fopt``/``_rotation``),
reimplemented here in Python/NumPy float64 with the C code's arithmetic in the C code's order
(sequential sums, the same modified Gram-Schmidt, glibc's ``log``/``cos``/``pow`` through
Python's ``math``), once, at construction. The seed of function f, instance i is
``f + 10000 i``, except f4 and f18, which reuse the seeds (and optimal values) of f3 and f17.
Matrices that the C code multiplies together at construction (``R diag(lambda) Q`` and the
like) are formed here the same way and handed to the JAX part finished.

COCO quirks kept, because COCO's values are the reference:
  * f4 (Bueche-Rastrigin): the optimum of every odd coordinate (1-based) is made positive, a
    step of the legacy code that is not in [HFRA09].
  * f6 (attractive sector): the sector test compares the sign of the *rotated* z_i with the
    sign of the *unrotated* xopt_i.
  * f7 (step ellipsoid): rounding uses floor(z + 0.5) with |z| > 0.5 as the test.
  * f9 and f19 have no xopt of their own: the optimum is ``R^T 1 / (2 s)``, computed as COCO
    does; f12's optimum is drawn from seed + 1,000,000 (the rotation's seed).
  * f20 (Schwefel): COCO's ``xopt`` is +-4.2096874637/2; its stored optimum (the minimiser of
    the 1-D Schwefel term, 420.96874633/100) differs from it by ~1e-10.
  * f21/f22 (Gallagher): COCO's peak data, including the condition sqrt(1000) of f21's global
    peak (the legacy code's; a comment in COCO doubts it) and its 0.8-scaled global optimum.
  * Penalties (f_pen in [HFRA09]) always use COCO's box [-5, 5], whatever ``lb``/``ub`` the
    problem is given for the search: they are part of the function's definition.

COCO itself supports dimensions 2 to 44 (its fixed work arrays), and its suite offers 2, 3, 5,
10, 20, 40. The generator here has no such limit: dimensions above 44 continue the same
construction (as IOHprofiler does) but have no COCO values to be checked against.

One deliberate change of formula: T_osz (the oscillation of [HFRA09] that f2-f4, f6, f10, f11,
f15, f16, f21, f22 use) is written ``exp(0.1 (u + 0.49 (...)))`` where the C code has
``pow(exp(u + 0.49 (...)), 0.1)``, u = log|x| / 0.1. The two agree to a few float64 ulps, but
the C form leaves float32's range: ``exp(u)`` overflows for |x| above ~6.7e3 (f6 feeds its
objective value, ~1e5 and more, through T_osz) and underflows for |x| below ~1.6e-4, which
would make float32 values flat near every optimum.

Like ``numerical.py``, every function is bitwise block invariant: a row's value never depends
on the other rows of its block (matrix-vector products and sums as fenced element-wise
products and tree sums, never ``dot`` or a ``reduce``; see "Bitwise block invariance" in
``numerical.py``). One compiled program per (function, dimension, dtype, block shape) serves
every instance: the instance's data are arguments of ``evaluate_bbob``. A run's engine passes
the function's number in with them (``program_data``, ``evaluate_with``: one ``lax.switch``
over the 24 functions, so every function and instance of a dimension and box shares one set of
programs); ``BBOBProblem.evaluate`` jitted on its own compiles them in as constants. All three
give the same bits: the fences keep each function's arithmetic its own in any of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .base import Problem
from .numerical import BoundsLike, _as_float, _bounds

Array = jax.Array

FUNCTIONS = tuple(range(1, 25))
LB, UB = -5.0, 5.0
# Instances whose seeds stay where the C code's ``(int)floor(seed / 127773.)`` cannot overflow.
MAX_INSTANCE = 2**31 - 1

# [HFRA09]'s names, for messages and the documentation.
TITLES = {
    1: "sphere", 2: "separable ellipsoid", 3: "Rastrigin", 4: "Bueche-Rastrigin",
    5: "linear slope", 6: "attractive sector", 7: "step ellipsoid", 8: "Rosenbrock",
    9: "rotated Rosenbrock", 10: "ellipsoid", 11: "discus", 12: "bent cigar",
    13: "sharp ridge", 14: "different powers", 15: "rotated Rastrigin", 16: "Weierstrass",
    17: "Schaffer F7", 18: "ill-conditioned Schaffer F7", 19: "composite Griewank-Rosenbrock",
    20: "Schwefel", 21: "Gallagher 101 peaks", 22: "Gallagher 21 peaks", 23: "Katsuura",
    24: "Lunacek bi-Rastrigin",
}


# -- COCO's legacy random numbers and instance data, float64 on the host -----------------------
#
# Written as the C code computes them: a different summation order in the Gram-Schmidt step
# would move the rotations by an ulp, and step functions (f7) amplify any such difference.
# ``np.cumsum`` is a sequential sum, so ``cumsum(a * b)[-1]`` is the C loop ``s += a[k] * b[k]``
# from s = 0 (the C code is compiled with -ffp-contract=off: no fused multiply-adds).


def _unif(n: int, seed: int) -> np.ndarray:
    """``bbob2009_unif``: n uniform numbers in (0, 1) from a shuffled Park-Miller generator."""
    seed = abs(int(seed))
    akt = max(seed, 1)
    table = [0] * 32
    for i in range(39, -1, -1):
        tmp = math.floor(akt / 127773.0)  # the C code divides in double: kept
        akt = 16807 * (akt - tmp * 127773) - 2836 * tmp
        if akt < 0:
            akt += 2147483647
        if i < 32:
            table[i] = akt
    rand = table[0]
    out = np.empty(n)
    for i in range(n):
        tmp = math.floor(akt / 127773.0)
        akt = 16807 * (akt - tmp * 127773) - 2836 * tmp
        if akt < 0:
            akt += 2147483647
        j = math.floor(rand / 67108865.0)
        rand = table[j]
        table[j] = akt
        out[i] = rand / 2.147483647e9 or 1e-99
    return out


def _gauss(n: int, seed: int) -> np.ndarray:
    """``bbob2009_gauss``: Box-Muller on 2n uniform numbers, glibc's log/cos (as COCO)."""
    u = _unif(2 * n, seed)
    g = [math.sqrt(-2 * math.log(u[i])) * math.cos(2 * math.pi * u[n + i]) for i in range(n)]
    return np.array([v or 1e-99 for v in g])


def _rotation(seed: int, dim: int) -> np.ndarray:
    """``bbob2009_compute_rotation``: modified Gram-Schmidt on a Gaussian matrix, B[row, col]."""
    b = _gauss(dim * dim, seed).reshape(dim, dim).T.copy()  # B[i][j] = g[j * dim + i]
    for i in range(dim):
        for j in range(i):
            prod = np.cumsum(b[:, i] * b[:, j])[-1]
            b[:, i] = b[:, i] - prod * b[:, j]
        prod = np.cumsum(b[:, i] * b[:, i])[-1]
        b[:, i] = b[:, i] / math.sqrt(prod)
    return b


def _xopt(seed: int, dim: int) -> np.ndarray:
    """``bbob2009_compute_xopt``: a point of the grid 8e-4 Z - 4 in [-4, 4), never exactly 0."""
    x = 8 * np.floor(1e4 * _unif(dim, seed)) / 1e4 - 4
    x[x == 0.0] = -1e-5
    return x


def _fopt(function: int, instance: int) -> float:
    """``bbob2009_compute_fopt``: a Cauchy-like draw rounded to 0.01, clipped to [-1000, 1000]."""
    rseed = {4: 3, 18: 17}.get(function, function) + 10000 * instance
    ratio = 100.0 * 100.0 * _gauss(1, rseed)[0] / _gauss(1, rseed + 1)[0]
    return min(1000.0, max(-1000.0, math.floor(ratio + 0.5) / 100.0))


def _powers(base: float, dim: int, scale: float = 1.0) -> np.ndarray:
    """``pow(base, scale * i / (dim - 1))`` for i = 0..dim-1, as the C code writes it."""
    return np.array([math.pow(base, scale * i / (dim - 1.0)) for i in range(dim)])


def _scaled_product(r1: np.ndarray, weights: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """``M[i][j] = sum_k r1[i][k] * w[k] * r2[k][j]``, summed over k in the C code's order."""
    m = np.zeros_like(r1)
    for k in range(r1.shape[0]):
        m = m + np.outer(r1[:, k] * weights[k], r2[k, :])
    return m


def _column_sums(m: np.ndarray) -> np.ndarray:
    return np.cumsum(m, axis=0)[-1]


def _asymmetry(beta: float, dim: int) -> np.ndarray:
    # T_asy's exponent is 1 + (beta i / (D - 1)) sqrt(x): this is the bracket.
    return np.array([beta * i / (dim - 1.0) for i in range(dim)])


def _gallagher(rseed: int, dim: int, peaks: int):
    """COCO's ``f_gallagher_bbob_problem_allocate``: rotation, peak heights, scales, centres."""
    rot = _rotation(rseed, dim)
    # The C code orders with qsort, argsort here: the same order, as one call's draws are
    # distinct (a Park-Miller stream does not repeat within its period), so there are no ties.
    order = np.argsort(_unif(peaks - 1, rseed), kind="stable")
    condition = np.empty(peaks)
    condition[0] = math.sqrt(1000.0) if peaks == 101 else 1000.0
    values = np.empty(peaks)
    values[0] = 10.0
    for i in range(1, peaks):
        condition[i] = math.pow(1000.0, order[i - 1] / (peaks - 2.0))
        values[i] = (i - 1) / (peaks - 2.0) * (9.1 - 1.1) + 1.1
    scales = np.empty((peaks, dim))
    for i in range(peaks):
        perm = np.argsort(_unif(dim, rseed + 1000 * i), kind="stable")
        scales[i] = [math.pow(condition[i], perm[j] / (dim - 1.0) - 0.5) for j in range(dim)]
    b, c = (10.0, 5.0) if peaks == 101 else (9.8, 4.9)
    y = b * _unif(dim * peaks, rseed).reshape(peaks, dim) - c  # y[j, k]: peak j, coordinate k
    xopt = 0.8 * y[0]
    # x_local[i][j] = sum_k rot[i][k] y[j][k], summed over k in order; peak 0 scaled by 0.8.
    local = np.cumsum(rot[:, None, :] * y[None, :, :], axis=-1)[..., -1]
    local[:, 0] *= 0.8
    # Both as (dim, peaks): the JAX part sums over the coordinates, the second-to-last axis.
    return xopt, rot, values, scales.T.copy(), local


def _instance(function: int, instance: int, dim: int) -> tuple[float, np.ndarray, dict]:
    """fopt, xopt and the arrays the JAX part needs, for one instance (all float64)."""
    rseed = function + 10000 * instance
    if function in (4, 18):
        rseed -= 1  # COCO's rseed_3 and rseed_17: f4 and f18 reuse f3's and f17's instances
    data: dict[str, np.ndarray] = {}
    build = _separable if function in (1, 2, 3, 4, 5, 8, 20) else _rotated
    xopt = build(function, dim, rseed, data)
    if function not in (9, 19):  # these two place their optimum through the rotation alone
        data["xopt"] = xopt
    fopt = _fopt(function, instance)
    data["fopt"] = np.array(fopt)
    return fopt, xopt, data


def _separable(f: int, d: int, rseed: int, data: dict) -> np.ndarray:
    """The data of f1-f5, f8 and f20 (into ``data``); returns xopt."""
    xopt = _xopt(rseed, d)
    if f == 2:
        data["w"] = _powers(1e6, d)
    elif f == 3:
        data.update(cond=_powers(10.0, d, 0.5), asy=_asymmetry(0.2, d))
    elif f == 4:
        xopt[::2] = np.abs(xopt[::2])
        w = np.array([math.pow(math.sqrt(10.0), i / (d - 1.0)) for i in range(d)])
        data["brs_pos"] = np.where(np.arange(d) % 2 == 0, w * 10.0, w)  # z_i > 0, i even (0-based)
        data["brs_neg"] = w
    elif f == 5:
        best = np.where(xopt < 0.0, LB, UB)
        mag = np.array([math.pow(math.sqrt(100.0), i / (d - 1.0)) for i in range(d)])
        s = np.where(best > 0.0, mag, -mag)
        data.update(best=best, s=s, five_abs_s=5.0 * np.abs(s), flat=5.0 * np.abs(s) - s * best)
        xopt = best
    elif f == 8:
        xopt = 0.75 * xopt
        data["factor"] = np.array(max(1.0, math.sqrt(d) / 8.0))
    elif f == 20:
        sign = np.where(_unif(d, rseed) < 0.5, -1.0, 1.0)
        xopt = sign * 0.5 * 4.2096874637
        data.update(sign=sign, two_abs=2 * np.abs(xopt), cond=_powers(10.0, d, 0.5))
    return xopt


def _rotated(f: int, d: int, rseed: int, data: dict) -> np.ndarray:
    """The data of f6, f7, f9-f19 and f21-f24 (into ``data``); returns xopt."""
    if f in (9, 19):
        r = _rotation(rseed, d)
        factor = max(1.0, math.sqrt(d) / 8.0)
        # f9 scales the matrix as it copies it; f19 scales the rotation itself, and so its xopt.
        data["m"] = factor * r
        return _column_sums(r if f == 9 else factor * r) / (2.0 * factor)
    if f in (21, 22):
        xopt, rot, values, scales, centres = _gallagher(rseed, d, 101 if f == 21 else 21)
        data.update(r=rot, peak=values, scales=scales, centres=centres)
        return xopt
    xopt = _xopt(rseed + 1000000 if f == 12 else rseed, d)
    r1 = _rotation(rseed + 1000000, d)
    if f in (10, 11, 12, 14):  # one rotation
        data["r"] = r1
        if f == 10:
            data["w"] = _powers(1e6, d)
        elif f == 12:
            data["asy"] = _asymmetry(0.5, d)
        elif f == 14:
            data["expo"] = np.array([2.0 + (4.0 * i) / (d - 1.0) for i in range(d)])
        return xopt
    r2 = _rotation(rseed, d)
    if f in (6, 13, 15, 16, 23):  # R diag(lambda) Q, formed as the C code forms it
        base = {6: math.sqrt(10.0), 13: math.sqrt(10.0), 15: math.sqrt(10.0), 16: 1.0 / math.sqrt(100.0),
                23: math.sqrt(100.0)}[f]
        data["m"] = _scaled_product(r1, _powers(base, d), r2)
        if f in (15, 16):
            data["r1"] = r1
        if f == 15:
            data["asy"] = _asymmetry(0.2, d)
    elif f == 7:
        c1 = np.sqrt(_powers(100.0 / 10.0, d))
        data.update(a=c1[:, None] * r2, r1=r1, w=_powers(100.0, d))
    elif f in (17, 18):
        cond = 10.0 if f == 17 else 1000.0
        data.update(r1=r1, m=r2 * _powers(math.sqrt(cond), d)[:, None], asy=_asymmetry(0.5, d))
    elif f == 24:
        xopt = np.where(_gauss(d, rseed) < 0.0, -1.25, 1.25)  # 0.5 mu0, the sign drawn
        data.update(sign=np.where(xopt < 0.0, -1.0, 1.0), a=_powers(math.sqrt(100.0), d)[:, None] * r2, r1=r1)
    return xopt


# -- per-point transformations and the 24 functions, pure JAX over the last axis ---------------
#
# Every product, and every transcendental result, is fenced before an addition or another
# transcendental consumes it (``numerical.py``): that keeps a row's value independent of its
# block. Constants are Python floats (weakly typed: the input's dtype is kept); instance arrays
# arrive in the input's dtype.


def _fence(value: Array) -> Array:
    """``value``, rounded to its dtype before its consumer sees it (no FMA contraction).

    ``numerical._fence`` with the select's other branch taken from ``value`` itself (``-value``
    is NaN exactly when ``value`` is) rather than from an operand. Keeping an operand alive for
    the select made XLA recompute it, with every sine behind it (sines are not "expensive" to
    XLA's fusion), in each consumer's fusion: five copies of T_osz in f3, and 40% more compile
    time over the suite. The block-invariance tests check that the select still keeps LLVM
    from fusing a multiply into the add after it.
    """
    return jnp.where(jnp.isnan(value), -value, value)


def _mul(a, b) -> Array:
    return _fence(a * b)


def _fn(f: Callable[[Array], Array], u: Array) -> Array:
    return _fence(f(u))


def _square(x: Array) -> Array:
    return _fence(x * x)


def _tree(t: Array, op: Callable[[Array, Array], Array], axis: int) -> Array:
    """Combine ``t`` along ``axis`` (-1 or -2) by ``op`` in a tree fixed by the axis length alone.

    The first half of the axis meets the second half until one entry is left; an odd entry out
    is set aside and joins at the end, in a fixed order. Unlike ``numerical._sum`` nothing is
    padded: at D = 40 the padding's ``concatenate`` made a matrix-vector product ten times
    slower on XLA:CPU, and compiled slower too.
    """
    take = (lambda a, i, j: a[..., i:j]) if axis == -1 else (lambda a, i, j: a[..., i:j, :])
    rest = None
    while t.shape[axis] > 1:
        n = t.shape[axis]
        if n % 2:
            last = take(t, n - 1, n)
            rest = last if rest is None else op(rest, last)
            n -= 1
        h = n // 2
        t = op(take(t, 0, h), take(t, h, n))
    if rest is not None:
        t = op(t, rest)
    return t[..., 0] if axis == -1 else t[..., 0, :]


def _sum(t: Array, axis: int = -1) -> Array:
    """Sum over ``axis`` in an order that depends on its length only, never on the rows."""
    return _tree(t, jnp.add, axis)


def _prod(t: Array) -> Array:
    """Product over the last axis (fenced, so its result may feed an add)."""
    return _tree(t, _mul, -1)


def _matvec(m: Array, y: Array) -> Array:
    """``m @ y`` per row: element-wise products and a tree sum (no ``dot``). The summed index
    is the second-to-last axis, so every step of the sum is a contiguous vector operation."""
    return _sum(_mul(y[..., :, None], jnp.swapaxes(m, -1, -2)), axis=-2)


def _penalty(x: Array) -> Array:
    """[HFRA09]'s f_pen: squared distance to COCO's box [-5, 5]^D."""
    return _sum(_square(jnp.maximum(jnp.abs(x) - UB, 0.0)))


def _osc(x: Array) -> Array:
    """T_osz, element-wise (see the module docstring for the exp(0.1 (...)) form)."""
    pos = x > 0.0
    u = _fence(jnp.log(jnp.abs(x)) / 0.1)
    # The branches of the C code differ only in the sines' frequencies: choose those first, so
    # two sines are computed rather than four (u * 1.0 is u, exactly).
    s = _fn(jnp.sin, _mul(u, jnp.where(pos, 1.0, 0.55))) + _fn(jnp.sin, _mul(u, jnp.where(pos, 0.79, 0.31)))
    y = _fn(jnp.exp, _mul(u + _mul(s, 0.49), 0.1))
    return jnp.where(pos, y, jnp.where(x < 0.0, -y, jnp.zeros_like(x)))


def _asy(x: Array, coef: Array) -> Array:
    """T_asy: x^(1 + coef_i sqrt(x)) where x > 0."""
    safe = jnp.where(x > 0.0, x, 1.0)
    expo = 1.0 + _mul(coef, _fn(jnp.sqrt, safe))
    return jnp.where(x > 0.0, _fence(jnp.power(safe, expo)), x)


def _rastrigin(z: Array) -> Array:
    d = z.shape[-1]
    c = _sum(_fn(jnp.cos, _mul(z, 2.0 * math.pi)))
    return _mul(d - c, 10.0) + _sum(_square(z))


def _rosenbrock(z: Array) -> Array:
    head, tail = z[..., :-1], z[..., 1:]
    s1 = _sum(_square(_square(head) - tail))
    s2 = _sum(_square(head - 1.0))
    return _mul(s1, 100.0) + s2


def _schaffer(z: Array) -> Array:
    d = z.shape[-1]
    s = _square(z[..., :-1]) + _square(z[..., 1:])
    t = _fn(jnp.sin, _mul(_fn(lambda v: jnp.power(v, 0.1), s), 50.0))
    total = _sum(_mul(_fn(lambda v: jnp.power(v, 0.25), s), 1.0 + _square(t)))
    return _square(_fence(total / (d - 1.0)))


def _f1(x, p):
    return _sum(_square(x - p["xopt"]))


def _f2(x, p):
    z = _osc(x - p["xopt"])
    return _sum(_mul(_mul(p["w"], z), z))


def _f3(x, p):
    z = _mul(p["cond"], _asy(_osc(x - p["xopt"]), p["asy"]))
    return _rastrigin(z)


def _f4(x, p):
    z = _osc(x - p["xopt"])
    z = _mul(jnp.where(z > 0.0, p["brs_pos"], p["brs_neg"]), z)
    return _rastrigin(z)


def _f5(x, p):
    # Past the box face the optimum lies on (x_i best_i >= 25, best_i = +-5) a coordinate
    # contributes its optimal value, 0: the slope does not go on falling outside the box.
    inside = _mul(x, p["best"]) < 25.0
    return _sum(jnp.where(inside, p["five_abs_s"] - _mul(p["s"], x), p["flat"]))


def _f6(x, p):
    z = _matvec(p["m"], x - p["xopt"])
    weight = jnp.where(_mul(p["xopt"], z) > 0.0, 1e4, 1.0)  # COCO: 100.0 * 100.0 * z * z
    raw = _sum(_mul(_mul(weight, z), z))
    return _fence(jnp.power(_osc(raw), 0.9))  # T_osz, then ^0.9, of the objective value


def _f7(x, p):
    z = _matvec(p["a"], x - p["xopt"])
    rounded = jnp.where(jnp.abs(z) > 0.5, jnp.floor(z + 0.5), _fence(jnp.floor(_mul(z, 10.0) + 0.5) / 10.0))
    zz = _matvec(p["r1"], rounded)
    s = _sum(_mul(_mul(p["w"], zz), zz))
    return _mul(jnp.maximum(_mul(jnp.abs(z[..., 0]), 1e-4), s), 0.1) + _penalty(x)


def _f8(x, p):
    return _rosenbrock(_mul(p["factor"], x - p["xopt"]) + 1.0)


def _f9(x, p):
    return _rosenbrock(_matvec(p["m"], x) + 0.5)


def _f10(x, p):
    z = _osc(_matvec(p["r"], x - p["xopt"]))
    return _sum(_mul(_mul(p["w"], z), z))


def _f11(x, p):
    z = _osc(_matvec(p["r"], x - p["xopt"]))
    return _mul(_mul(z[..., 0], 1e6), z[..., 0]) + _sum(_square(z[..., 1:]))


def _f12(x, p):
    z = _matvec(p["r"], _asy(_matvec(p["r"], x - p["xopt"]), p["asy"]))
    return _square(z[..., 0]) + _sum(_mul(_mul(z[..., 1:], 1e6), z[..., 1:]))


def _f13(x, p):
    z = _matvec(p["m"], x - p["xopt"])
    return _mul(_fn(jnp.sqrt, _sum(_square(z[..., 1:]))), 100.0) + _square(z[..., 0])


def _f14(x, p):
    z = jnp.abs(_matvec(p["r"], x - p["xopt"]))
    return _fn(jnp.sqrt, _sum(_fence(jnp.power(z, p["expo"]))))


def _f15(x, p):
    y = _asy(_osc(_matvec(p["r1"], x - p["xopt"])), p["asy"])
    return _rastrigin(_matvec(p["m"], y))


# Weierstrass: a_k = 0.5^k, b_k = 3^k (k < 12) and f0 = sum a_k cos(pi b_k), summed as COCO does.
_WEIER_A = np.array([math.pow(0.5, k) for k in range(12)])
_WEIER_B = np.array([math.pow(3.0, k) for k in range(12)])
_WEIER_F0 = 0.0
for _a, _b in zip(_WEIER_A, _WEIER_B):
    _WEIER_F0 += float(_a) * math.cos(2 * math.pi * float(_b) * 0.5)


def _f16(x, p):
    d = x.shape[-1]
    z = _matvec(p["m"], _osc(_matvec(p["r1"], x - p["xopt"])))
    a, b = jnp.asarray(_WEIER_A, x.dtype), jnp.asarray(_WEIER_B, x.dtype)
    arg = _mul(_mul(z + 0.5, 2.0 * math.pi)[..., None], b)
    s = _sum(_sum(_mul(_fn(jnp.cos, arg), a)))
    v = _fence(s / d) - _WEIER_F0
    return _mul(_mul(_square(v), v), 10.0)


def _f17(x, p):
    z = _matvec(p["m"], _asy(_matvec(p["r1"], x - p["xopt"]), p["asy"]))
    return _schaffer(z)


def _f19(x, p):
    d = x.shape[-1]
    z = _matvec(p["m"], x) + 0.5
    head, tail = z[..., :-1], z[..., 1:]
    c1 = _square(head) - tail
    t = _mul(_mul(c1, 100.0), c1) + _square(1.0 - head)
    s = _sum(_fence(t / 4000.0) - _fn(jnp.cos, t))
    return 10.0 + _fence(_mul(s, 10.0) / (d - 1.0))


def _f20(x, p):
    d = x.shape[-1]
    y = _mul(_mul(p["sign"], x), 2.0)
    # z_hat: each coordinate takes a quarter of its predecessor's distance from 2 |xopt|.
    prev = _mul(y[..., :-1] - p["two_abs"][:-1], 0.25)
    z = jnp.concatenate([y[..., :1], y[..., 1:] + prev], axis=-1)
    z = _mul(_mul(p["cond"], z - p["two_abs"]) + p["two_abs"], 100.0)
    pen = _sum(_square(jnp.maximum(jnp.abs(z) - 500.0, 0.0)))
    s = _sum(_mul(z, _fn(jnp.sin, _fn(jnp.sqrt, jnp.abs(z)))))
    return _mul(pen + 418.9828872724339 - _fence(s / d), 0.01)


def _gallagher_f(x, p):
    d = x.shape[-1]
    t = _matvec(p["r"], x)
    diff = t[..., :, None] - p["centres"]  # (..., D, peaks)
    q = _sum(_mul(_mul(p["scales"], diff), diff), axis=-2)
    g = _mul(p["peak"], _fn(jnp.exp, _mul(q, -0.5 / d)))
    f = 10.0 - jnp.max(g, axis=-1)  # a max is exact in any order: block invariant as it is
    return _square(_osc(f)) + _penalty(x)


def _f23(x, p):
    d = x.shape[-1]
    z = _matvec(p["m"], x - p["xopt"])
    two_j = jnp.asarray([2.0**j for j in range(1, 33)], x.dtype)
    t = _mul(z[..., None], two_j)  # exact: powers of two
    frac = _fence(jnp.abs(t - jnp.floor(t + 0.5)) / two_j)
    inner = 1.0 + _mul(jnp.asarray(np.arange(1, d + 1), x.dtype), _sum(frac))
    g = _fn(lambda v: jnp.power(v, 10.0 / math.pow(d, 1.2)), inner)
    return _mul(_prod(g) - 1.0, 10.0 / d / d)


def _f24(x, p):
    d = x.shape[-1]
    mu0 = 2.5
    s = 1.0 - 0.5 / (math.sqrt(d + 20.0) - 4.1)
    mu1 = -math.sqrt((mu0 * mu0 - 1.0) / s)
    xh = _mul(_mul(x, 2.0), p["sign"])
    z = _matvec(p["r1"], _matvec(p["a"], xh - mu0))
    s1 = _sum(_square(xh - mu0))
    s2 = _sum(_square(xh - mu1))
    c = _sum(_fn(jnp.cos, _mul(z, 2.0 * math.pi)))
    return jnp.minimum(s1, d + _mul(s2, s)) + _mul(d - c, 10.0) + _mul(_penalty(x), 1e4)


_FUNCTIONS: dict[int, Callable[[Array, dict], Array]] = {
    1: _f1, 2: _f2, 3: _f3, 4: _f4, 5: _f5, 6: _f6, 7: _f7, 8: _f8, 9: _f9, 10: _f10, 11: _f11, 12: _f12,
    13: _f13, 14: _f14, 15: _f15, 16: _f16, 17: _f17, 18: _f17, 19: _f19, 20: _f20, 21: _gallagher_f,
    22: _gallagher_f, 23: _f23, 24: _f24,
}

# The boundary penalty's factor (a function of D) where COCO adds it after fopt, with
# transform_obj_penalize; f7, f21, f22 and f24 add theirs inside the function, before fopt.
_PENALTY_AFTER_FOPT: dict[int, Callable[[int], float]] = {
    4: lambda d: 100.0, 16: lambda d: 10.0 / d, 17: lambda d: 10.0, 18: lambda d: 10.0, 23: lambda d: 1.0,
}


@partial(jax.jit, static_argnums=0)
def evaluate_bbob(function: int, x: Array, data: dict) -> Array:
    """BBOB function ``function`` at ``x`` (``(..., D) -> (...)``) for an instance's ``data``
    (``BBOBProblem.data(dtype)``). One compilation per function, dimension, dtype and shape
    serves every instance."""
    f = _FUNCTIONS[function](x, data) + data["fopt"]
    if function in _PENALTY_AFTER_FOPT:
        f = f + _mul(_penalty(x), _PENALTY_AFTER_FOPT[function](x.shape[-1]))
    # COCO answers NaN for a candidate with a NaN coordinate; the branches above could hide it.
    return jnp.where(jnp.any(jnp.isnan(x), axis=-1), jnp.nan, f)


# -- one program for all 24 functions -------------------------------------------------------------
#
# A run's engine takes the function too as data (``BBOBProblem.program_data``): one program per
# dimension and box serves all 24 functions and all their instances, so a campaign compiles and
# loads a handful of programs where it compiled one set per function (24x as many, each taking
# seconds to compile and ~0.1 s to load). The program holds every function as a branch of a
# ``lax.switch``; a generation runs only its own. The instance's arrays go in one dictionary
# whose keys and shapes depend on the dimension alone: each function's arrays under their own
# names, zeros where another function's would be (f22's Gallagher arrays, of another shape than
# f21's, under their own names).

_GALLAGHER_21 = ("peak", "scales", "centres")


def _layout(dim: int) -> dict[str, tuple[int, ...]]:
    """The key and shape of every array any function's instance has in ``dim`` dimensions."""
    d, dd = (dim,), (dim, dim)
    vectors = ("xopt", "w", "cond", "asy", "brs_pos", "brs_neg", "best", "s", "five_abs_s", "flat", "expo", "sign",
               "two_abs")
    return {"fopt": (), "factor": (), **{k: d for k in vectors}, **{k: dd for k in ("m", "a", "r1", "r")},
            "peak": (101,), "scales": (dim, 101), "centres": (dim, 101),
            **{f"{k}21": shape for k, shape in (("peak", (21,)), ("scales", (dim, 21)), ("centres", (dim, 21)))}}


def _slot(function: int, key: str) -> str:
    return f"{key}21" if function == 22 and key in _GALLAGHER_21 else key


def _all_functions_data(function: int, dim: int, data: dict) -> dict:
    """``data`` (one instance of ``function``) in the layout shared by every function of ``dim``."""
    layout = _layout(dim)
    out = {k: np.zeros(shape) for k, shape in layout.items()}
    for k, v in data.items():
        slot = _slot(function, k)
        if slot not in layout or layout[slot] != np.shape(v):
            raise RuntimeError(f"bbob f{function}: '{k}' {np.shape(v)} has no place in the shared layout")
        out[slot] = np.asarray(v, np.float64)
    return out


def _branch(function: int, x: Array, data: dict) -> Array:
    own = {k: data[_slot(function, k)] for k in _KEYS[function]}
    return evaluate_bbob(function, x, own)


# Which arrays each function reads (its instance's keys; the same for every instance and dim).
_KEYS: dict[int, tuple[str, ...]] = {f: tuple(_instance(f, 1, 2)[2]) for f in FUNCTIONS}
_BRANCHES = tuple(partial(_branch, f) for f in FUNCTIONS)


def evaluate_any(x: Array, data: dict) -> Array:
    """The BBOB function ``data["function"]`` (a traced integer, 1-24) at ``x`` for instance data in
    the shared layout: the one program of all 24 functions (``BBOBProblem.program_data``)."""
    arrays = {k: jnp.asarray(v).astype(x.dtype) for k, v in data.items() if k != "function"}
    index = jnp.clip(jnp.asarray(data["function"], jnp.int32) - 1, 0, len(FUNCTIONS) - 1)
    return jax.lax.switch(index, _BRANCHES, x, arrays)


# -- the problem ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BBOBProblem(Problem):
    """BBOB function ``function`` (1-24), COCO instance ``instance`` (>= 1), in ``dim`` (>= 2)
    dimensions. Its name is COCO's problem id, ``bbob_f{function:03d}_i{instance:02d}_d{dim:02d}``
    (``bbob_f001_i01_d10``). Equal arguments give equal, equally hashed problems (a jit static
    argument compiles once). Build it with ``make_bbob``."""

    function: int
    instance: int
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    fopt: float = field(compare=False)
    _xopt: np.ndarray = field(repr=False, compare=False)
    _data: dict = field(repr=False, compare=False)
    _by_dtype: dict = field(default_factory=dict, repr=False, compare=False)
    num_objectives: int = 1
    block_invariant: ClassVar[bool] = True  # tree sums, fenced products (module docstring)

    @property
    def name(self) -> str:
        return f"bbob_f{self.function:03d}_i{self.instance:02d}_d{self.dim:02d}"

    @property
    def title(self) -> str:
        return TITLES[self.function]

    @property
    def xopt(self) -> np.ndarray:
        """The optimum COCO stores for this instance (a copy, float64). f5's is a corner of the
        box; f9's and f19's are ``R^T 1 / (2 s)``; f20's is within ~1e-10 of COCO's."""
        return np.array(self._xopt)

    @property
    def optimum_value(self) -> float:
        return self.fopt

    def optimum_x(self) -> np.ndarray:
        return self.xopt

    def data(self, dtype) -> dict:
        """The instance's arrays for ``evaluate_bbob``, in ``dtype`` (rounded once from float64)."""
        dtype = np.dtype(dtype)
        if dtype not in self._by_dtype:
            self._by_dtype[dtype] = {k: np.asarray(v, dtype) for k, v in self._data.items()}
        return self._by_dtype[dtype]

    def _candidates(self, x) -> Array:
        x = _as_float(x)
        if x.shape[-1] != self.dim:
            raise ConfigError(f"{self.name}: expected candidates with last axis {self.dim}, got shape {x.shape}")
        return x

    def evaluate(self, x) -> Array:
        """Objective values: x of shape (..., dim) -> (...); dtype kept (integers promoted).
        Inside a jitted function the instance's data compile in as constants."""
        x = self._candidates(x)
        return evaluate_bbob(self.function, x, self.data(x.dtype))

    __call__ = evaluate

    # The protocol's instance data as program arguments (``base.Problem.program_data``): a run
    # passes ``program_data`` into its compiled programs, and every function and instance, in a
    # dimension and box, shares them (the section above).
    @property
    def program(self) -> tuple:
        return ("bbob", self.dim, self.lb, self.ub)

    @property
    def program_data(self) -> dict:
        """The function's number and the instance's arrays (float64, in the layout every function
        of this dimension shares; ``evaluate_with`` rounds them to the candidates' dtype)."""
        if "shared" not in self._by_dtype:
            shared = _all_functions_data(self.function, self.dim, self._data)
            self._by_dtype["shared"] = {"function": np.asarray(self.function, np.int32), **shared}
        return self._by_dtype["shared"]

    def evaluate_with(self, x, data, *generation) -> Array:
        """``evaluate`` with the function and instance data ``data`` (``program_data``, maybe
        traced) as an argument: the same values, bit for bit (rounded to x's dtype as
        ``data(dtype)`` rounds), for whichever function ``data`` names."""
        x = self._candidates(x)
        return evaluate_any(x, data)


def _integer(name: str, value) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ConfigError(f"bbob: {name} must be an integer, got {value!r}")
    return value.__index__()


def make_bbob(function: int, instance: int, dim: int, lb: BoundsLike = None, ub: BoundsLike = None) -> BBOBProblem:
    """BBOB function ``function`` (1-24), COCO instance ``instance`` (>= 1), ``dim`` >= 2;
    bounds default to COCO's [-5, 5] per coordinate. Raises ConfigError for bad arguments."""
    function, instance, dim = _integer("function", function), _integer("instance", instance), _integer("dim", dim)
    if function not in FUNCTIONS:
        raise ConfigError(f"bbob: function must be one of 1..24 (the noiseless BBOB functions), got {function}")
    if not 1 <= instance <= MAX_INSTANCE:
        raise ConfigError(f"bbob: instance must be an integer from 1 to {MAX_INSTANCE} (COCO numbers "
                         f"instances from 1), got {instance}")
    if dim < 2:
        raise ConfigError(f"bbob: dim must be >= 2 (COCO defines the BBOB functions from 2 dimensions "
                         f"on), got {dim}")
    name = f"bbob_f{function:03d}_i{instance:02d}_d{dim:02d}"
    fopt, xopt, data = _instance(function, instance, dim)
    return BBOBProblem(function, instance, dim, _bounds(name, "lb", lb, LB, dim), _bounds(name, "ub", ub, UB, dim),
                       fopt, xopt, data)
