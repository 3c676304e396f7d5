"""Island migration, pure JAX: who leaves an island, where they go, whom they replace.

The island model: several populations evolve apart and every few generations exchange a few
candidates along a topology (Whitley, Rana & Heckendorn, "The island model genetic algorithm:
on separability, population size and convergence", J. Comput. Inf. Technol. 7(1), 1999;
Cantu-Paz, "Efficient and Accurate Parallel Genetic Algorithms", Kluwer 2000, ch. 6-8 on
migration rate, topology and the choice of emigrants and of the replaced).

Everything here is a function of the emigrant table (every island's emigrants, in island order)
and of keys derived from the run's seed and the generation: the same on every rank, whatever the
layout of islands on ranks. Migration is synchronous: immigrants are the emigrants of the same
generation, chosen before any island takes any in.

* emigrants: ``best`` (the m best of the island, ties by index) or ``random`` (m distinct);
* topology: ``ring`` (island i takes from i - 1), ``random`` (a ring over a fresh seeded
  permutation of the islands each migration: everyone sends once, takes once, never from itself),
  ``all`` (the m best of every other island's emigrants);
* replacement: ``worst`` (the m worst rows, NaN counted worst) or ``random`` (m distinct rows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import schema

TOPOLOGIES = ("ring", "all", "random")
# fold_in data for the migration keys: beyond any island index, so no island shares its stream.
_MIGRATION_STREAM = 2**31 - 1


class _Fields(NamedTuple):
    every: int  # generations between migrations: after each generation g with g % every == 0
    migrants: int  # m, per island
    topology: str = "ring"
    emigrants: str = "best"
    replace: str = "worst"


class Migration(_Fields):
    """How islands exchange candidates (the ``[islands]`` keys, checked as the config checks
    them: ConfigError names the argument)."""

    __slots__ = ()
    _TYPES = {"every": schema.MigrateEvery, "migrants": schema.Migrants, "topology": schema.Topology,
              "emigrants": schema.Emigrants, "replace": schema.Replace}

    def __new__(cls, every: int, migrants: int, topology: str = "ring", emigrants: str = "best",
                replace: str = "worst") -> "Migration":
        given = {"every": every, "migrants": migrants, "topology": topology, "emigrants": emigrants,
                 "replace": replace}
        values = {k: schema.check(cls._TYPES[k], v, k, "Migration") for k, v in given.items()}
        return super().__new__(cls, **values)


def unfit(algorithms: list, migration: Migration, host: bool) -> tuple[str, str] | None:
    """Why these algorithms cannot run as islands with ``migration`` (None: they can): the config
    key at fault and the reason. One home for the rule, raised as ConfigError from a config and
    as UsageError from ``hpcevo.Archipelago``."""
    if host:
        return "islands", "islands run JAX problems for now, not host problems (a NumPy function or a command)"
    moving = len(algorithms) > 1 and migration.migrants > 0
    for i, a in enumerate(algorithms):
        name = type(a).__name__.lower()
        if a.multi_objective or a.distributed:
            kind = "multi-objective" if a.multi_objective else "distributed"
            return "islands", (f"island {i} runs {name}, which is {kind}; islands run single-objective "
                               "algorithms with a replicated population")
        if moving and not a.migrates:
            return "islands", (f"island {i} runs {name}, which keeps a search distribution, not a population: "
                               "immigrants have no rows to replace (islands that migrate: cso, pso, slpso, de, jade, ga; "
                               "or set islands.migrants = 0)")
        if moving and migration.migrants > a.pop_size:
            return "islands.migrants", (f"{migration.migrants} migrants, but island {i} has a population of "
                                        f"{a.pop_size}")
        if (a.dim, a.dtype) != (algorithms[0].dim, algorithms[0].dtype):
            return "islands", f"island {i}: dim and dtype must be the same on every island"
    return None


def island_key(key: jax.Array, island: int) -> jax.Array:
    """Island ``island``'s own stream, derived from the run's key."""
    return jax.random.fold_in(key, island)


def migration_key(key: jax.Array, generation: jax.Array) -> jax.Array:
    """The key of the migration after ``generation``."""
    return jax.random.fold_in(jax.random.fold_in(key, _MIGRATION_STREAM), generation)


def emigrants(x: jax.Array, f: jax.Array, m: int, how: str, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The m candidates that leave an island of population ``x`` (n, dim), fitness ``f`` (n,)."""
    if how == "best":
        idx = jnp.argsort(f, stable=True)[:m]
    else:
        idx = jax.random.permutation(key, f.shape[0])[:m]
    return x[idx], f[idx]


def sources(topology: str, count: int, key: jax.Array) -> jax.Array | None:
    """(count,): the island each island takes its immigrants from (None for ``all``)."""
    if topology == "ring":
        return jnp.asarray((np.arange(count) - 1) % count, jnp.int32)
    if topology == "random":
        order = jax.random.permutation(key, count).astype(jnp.int32)
        return jnp.zeros((count,), jnp.int32).at[order].set(jnp.roll(order, 1))
    return None


def immigrants(table_x: jax.Array, table_f: jax.Array, island: int, src: jax.Array | None,
               m: int) -> tuple[jax.Array, jax.Array]:
    """What island ``island`` takes in, from the table of every island's emigrants
    (count, m, dim) and (count, m)."""
    if src is not None:
        return table_x[src[island]], table_f[src[island]]
    others = np.array([j for j in range(table_x.shape[0]) if j != island])
    pool_x = table_x[others].reshape(-1, table_x.shape[-1])
    pool_f = table_f[others].reshape(-1)
    idx = jnp.argsort(pool_f, stable=True)[:m]
    return pool_x[idx], pool_f[idx]


def replace(x: jax.Array, f: jax.Array, new_x: jax.Array, new_f: jax.Array, how: str,
            key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The population with m of its rows replaced by ``new_x``, ``new_f``."""
    m = new_f.shape[0]
    if how == "worst":
        slots = jnp.argsort(f, stable=True, descending=True)[:m]
    else:
        slots = jax.random.permutation(key, f.shape[0])[:m]
    return x.at[slots].set(new_x.astype(x.dtype)), f.at[slots].set(new_f.astype(f.dtype))
