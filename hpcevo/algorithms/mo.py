"""Pareto dominance in JAX with static shapes: dominance matrix, non-dominated sorting, crowding.

[DPAM02] K. Deb, A. Pratap, S. Agarwal and T. Meyarivan, "A Fast and Elitist Multiobjective
         Genetic Algorithm: NSGA-II", IEEE Trans. Evolutionary Computation 6(2):182-197, 2002.
         Fast non-dominated sort (Sec. III-A), crowding distance (Sec. III-B), crowded comparison
         (Sec. III-B, the partial order <_n).

All objectives are minimised. Every function is deterministic, ties included: where an order is
needed among equals it is index order (stable sorts), so the same input gives the same bits on
every rank.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def dominates(f: jax.Array) -> jax.Array:
    """(n, m) -> (n, n) bool: [i, j] is True when row i Pareto-dominates row j (no worse in every
    objective, better in at least one)."""
    a, b = f[:, None, :], f[None, :, :]
    return jnp.all(a <= b, axis=-1) & jnp.any(a < b, axis=-1)


def non_dominated(f: jax.Array) -> jax.Array:
    """(n, m) -> (n,) bool: rows that no other row dominates."""
    return ~jnp.any(dominates(f), axis=0)


def non_dominated_rank(f: jax.Array) -> jax.Array:
    """(n, m) -> (n,) int32: the front each row belongs to, 0 for the non-dominated ones
    ([DPAM02] Sec. III-A). Fronts are peeled one at a time: each row keeps the count of its
    dominators not yet assigned; rows whose count is zero form the next front, and their rows of
    the dominance matrix are subtracted. O(n^2 m) for the matrix, O(n^2) per front."""
    n = f.shape[0]
    dom = dominates(f).astype(jnp.int32)
    unassigned = jnp.asarray(-1, jnp.int32)

    def cond(c):
        rank, _, _ = c
        return jnp.any(rank == unassigned)

    def body(c):
        rank, count, level = c
        front = (count == 0) & (rank == unassigned)
        rank = jnp.where(front, level, rank)
        count = count - front.astype(jnp.int32) @ dom
        return rank, count, level + 1

    rank, _, _ = lax.while_loop(cond, body, (jnp.full((n,), unassigned), dom.sum(axis=0), jnp.asarray(0, jnp.int32)))
    return rank


def crowding_distance(f: jax.Array, rank: jax.Array) -> jax.Array:
    """(n, m), (n,) -> (n,): [DPAM02] crowding distance of each row within its front.

    For every objective the front's members are sorted by that objective (ties in index order);
    the two ends get infinity, every other member the gap between its neighbours divided by the
    front's range in that objective (0 when the range is 0); the distance is the sum over
    objectives. All fronts at once: rows sorted by (front, objective), neighbours taken only
    within the same front.
    """
    n, m = f.shape
    idx = jnp.arange(n)
    total = jnp.zeros((n,), f.dtype)
    for j in range(m):  # static: a fixed order of the per-objective terms
        order = jnp.lexsort((idx, f[:, j], rank))
        r, v = rank[order], f[order, j]
        first = jnp.concatenate([jnp.array([True]), r[1:] != r[:-1]])
        last = jnp.concatenate([r[1:] != r[:-1], jnp.array([True])])
        # the front's extremes in this objective: its first and last sorted members
        lo = jax.ops.segment_min(v, r, num_segments=n)[r]
        hi = jax.ops.segment_max(v, r, num_segments=n)[r]
        span = hi - lo
        prev = jnp.concatenate([v[:1], v[:-1]])
        nxt = jnp.concatenate([v[1:], v[-1:]])
        inner = jnp.where(span > 0, (nxt - prev) / jnp.where(span > 0, span, 1), 0)
        inner = jnp.where(jnp.isnan(inner), 0, inner)  # inf - inf: objectives that were non-finite
        d = jnp.where(first | last, jnp.inf, inner)
        total = total + jnp.zeros((n,), f.dtype).at[order].set(d)
    return total


def crowded_order(rank: jax.Array, crowding: jax.Array) -> jax.Array:
    """Indices sorted by [DPAM02]'s crowded comparison: lower front first, then larger crowding
    distance, then index order (what makes selection among exact ties deterministic)."""
    return jnp.lexsort((jnp.arange(rank.shape[0]), -crowding, rank))


def das_dennis(m: int, h: int) -> np.ndarray:
    """All C(h + m - 1, m - 1) points w of the unit simplex with w_i = k_i / h (host, float64):
    I. Das and J. E. Dennis, "Normal-Boundary Intersection", SIAM J. Optim. 8(3):631-657, 1998.
    Rows in decreasing lexicographic order of (k_1, k_2, ...)."""
    rows: list[list[int]] = []

    def fill(prefix: list[int], left: int) -> None:
        if len(prefix) == m - 1:
            rows.append(prefix + [left])
            return
        for k in range(left, -1, -1):
            fill(prefix + [k], left - k)

    fill([], h)
    out = np.asarray(rows, np.float64) / h
    assert len(out) == math.comb(h + m - 1, m - 1)
    return out
