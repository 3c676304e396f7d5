"""Noisy fitness: the best seen is the luckiest draw, so evaluate it again on fresh draws.

A problem whose value is a random draw (episodes of a stochastic environment, a simulation with
noise) makes the best-so-far a biased estimate: among thousands of candidates, the one reported
is the one whose draw was luckiest (a Pendulum policy reported at -98.8 scored -501.7 on fresh
episodes). The remedy of the neuroevolution literature is to re-evaluate the elite on new draws
and report that mean (e.g. Salimans et al., "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning", 2017, who evaluate the final policy on fresh episodes).

Fresh draws: a JAX problem that draws its randomness from the generation number
(``Problem.wants_generation``, hpcevo's neuro problems) is evaluated at generation numbers -1,
-2, ..., -k, which no generation of a run uses; a host problem gets the same numbers and its own
randomness. A deterministic problem gives its one value k times.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def reevaluate(loop: Any, k: int) -> np.ndarray:
    """The fitness of ``loop``'s best solution on ``k`` fresh draws, the same on every rank.
    Collective for a host problem (its evaluations are shared out); a JAX problem is evaluated
    on every rank alike (k single evaluations: no communication)."""
    x = np.asarray(loop.best_solution)[None]  # (in the run's dtype)
    problem = loop.problem
    if getattr(problem, "host", False):
        return np.array([float(loop.engine.evaluate_batch(x, -(i + 1))[0]) for i in range(k)])
    dtype = x.dtype
    if problem.wants_generation:
        one = jax.jit(lambda x, g: problem.evaluate(x, g))
        values = [one(jnp.asarray(x, dtype), jnp.asarray(-(i + 1), jnp.int32)) for i in range(k)]
    else:
        values = [jax.jit(problem.evaluate)(jnp.asarray(x, dtype))] * k
    return np.array([float(np.asarray(v).reshape(-1)[0]) for v in values])


def report(summary: dict[str, Any], values: np.ndarray) -> dict[str, Any]:
    """``summary`` with the best fitness replaced by the mean of ``values`` (the seen one kept)."""
    return {**summary, "best_fitness": float(np.mean(values)), "best_fitness_seen": summary["best_fitness"],
            "reevaluations": [float(v) for v in values]}
