"""What a run keeps besides the algorithm's state: the loop state's extra fields, the
per-generation history series, and what the host reads from them at boundaries and at the end.

A recorder is the one place that knows what a run's fitness means. The engine's loop is the same
for every kind of run (ask, evaluate, tell, record, append a history row); the recorder decides
what "record" keeps:

* ``SingleObjective``: the best candidate seen so far, the batch's best/mean/std and the count of
  non-finite values (fitness of shape ``(n,)``).
* ``MultiObjective``: the current non-dominated front of the algorithm's population (fitness of
  shape ``(n, m)``), its hypervolume and IGD (``hpcevo/indicators.py``), in JAX, every generation.

Everything on the device is pure JAX, replicated and computed identically on every rank.
"""

from __future__ import annotations

import math

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import indicators
from ..algorithms.mo import non_dominated


# -- single objective ---------------------------------------------------------------------------
class LoopState(NamedTuple):
    """Everything a run carries between generations; replicated and bitwise equal on all ranks."""

    algo: Any
    best_x: jax.Array  # (dim,) best candidate seen so far
    best_f: jax.Array  # ()
    generation: jax.Array  # int32 (), generations completed
    nonfinite: jax.Array  # int32 (), evaluations that returned NaN or +-inf, counted as worst
    last: jax.Array  # (3,) best, mean, std of the latest generation's batch (finite values)


class History(NamedTuple):
    """One entry per generation of a dispatch (the first ``n`` of ``MAX_CHUNK`` rows are valid)."""

    best: jax.Array  # best fitness seen so far
    gen_best: jax.Array  # best / mean / std of the generation's finite fitness values
    gen_mean: jax.Array
    gen_std: jax.Array
    nonfinite: jax.Array  # int32: NaN or infinite fitness values in the generation


def _batch_stats(fitness: jax.Array) -> jax.Array:
    finite = jnp.isfinite(fitness)
    n = jnp.maximum(finite.sum(), 1)
    f0 = jnp.where(finite, fitness, 0)
    mean = f0.sum() / n
    std = jnp.sqrt(jnp.where(finite, (fitness - mean) ** 2, 0).sum() / n)
    best = jnp.where(finite, fitness, jnp.inf).min()
    return jnp.stack([best, mean, std])


class SingleObjective:
    """Best-so-far tracking and batch statistics for fitness of shape ``(n,)``."""

    kind = "single-objective"
    history_type = History
    # What a boundary record (a line of metrics.jsonl) holds besides the driver's own fields.
    record_fields = ("best", "gen_best", "gen_mean", "gen_std", "nonfinite")

    def empty(self, algorithm, algo: Any) -> LoopState:
        dtype = jnp.dtype(algorithm.dtype)
        return LoopState(
            algo=algo,
            best_x=jnp.zeros((algorithm.dim,), dtype),
            best_f=jnp.asarray(jnp.inf, dtype),
            generation=jnp.asarray(0, jnp.int32),
            nonfinite=jnp.asarray(0, jnp.int32),
            last=jnp.zeros((3,), dtype),
        )

    def record(self, algorithm, state: LoopState, raw: jax.Array, algo: Any,
               pick: Callable[[jax.Array], jax.Array], used: Any = None) -> LoopState:
        """``raw``: the generation's fitness as evaluated; ``pick(i)``: candidate ``i`` of it;
        ``used``: how many leading rows count (``Algorithm.rows_used``; None: all). Rows past
        it are neither the best nor in the statistics nor counted as non-finite."""
        del algorithm
        counted = jnp.ones(raw.shape, bool) if used is None else jnp.arange(raw.shape[0]) < used
        bad = ~jnp.isfinite(raw) & counted
        raw = jnp.where(counted, raw, jnp.nan)
        fitness = jnp.where(bad | ~counted, jnp.inf, raw)
        i = jnp.argmin(fitness)
        better = fitness[i] < state.best_f
        return LoopState(
            algo=algo,
            best_x=jnp.where(better, pick(i), state.best_x),
            best_f=jnp.where(better, fitness[i], state.best_f),
            generation=state.generation + 1,
            nonfinite=state.nonfinite + bad.sum(dtype=jnp.int32),
            last=_batch_stats(raw),
        )

    @staticmethod
    def row(before: LoopState, after: LoopState) -> tuple:
        return (after.best_f, after.last[0], after.last[1], after.last[2],
                after.nonfinite - before.nonfinite)

    @staticmethod
    def reached(state: LoopState, target: jax.Array) -> jax.Array:
        """Whether the best so far meets a target fitness (<=)."""
        return state.best_f <= target

    # -- host side -----------------------------------------------------------------------------
    def boundary(self, state: LoopState) -> dict[str, Any]:
        last = jax.device_get(state.last)
        return {"best": float(state.best_f), "gen_best": float(last[0]), "gen_mean": float(last[1]),
                "gen_std": float(last[2]), "nonfinite": int(state.nonfinite)}

    @staticmethod
    def progress(rec: dict[str, Any]) -> str:
        if not math.isfinite(rec["gen_best"]):  # every evaluation of the generation failed
            return f"best {rec['best']:.6e}  mean - (no finite fitness in this generation)"
        return f"best {rec['best']:.6e}  mean {rec['gen_mean']:.6e}"

    def summary(self, state: LoopState) -> dict[str, Any]:
        best_x = jax.device_get(state.best_x)
        return {"best_fitness": float(state.best_f), "best_solution": [float(v) for v in best_x],
                "nonfinite_evaluations": int(state.nonfinite)}


# -- multi objective ----------------------------------------------------------------------------
class MOLoopState(NamedTuple):
    """The loop state of a multi-objective run; replicated and bitwise equal on all ranks."""

    algo: Any
    front_x: jax.Array  # (pop, dim): the population's non-dominated candidates first, zeros after
    front_f: jax.Array  # (pop, m): their objective vectors, zeros after
    front_size: jax.Array  # int32 (): rows of front_x / front_f that hold the front
    generation: jax.Array  # int32 ()
    nonfinite: jax.Array  # int32 (): candidates with a NaN or infinite objective, counted as worst
    indicators: jax.Array  # (2,): hypervolume and IGD of the front (NaN where not defined)


class MOHistory(NamedTuple):
    hv: jax.Array  # hypervolume of the front after each generation (NaN: not computed)
    igd: jax.Array  # IGD of the front to the problem's reference front (NaN: none known)
    front_size: jax.Array  # int32
    nonfinite: jax.Array  # int32


class MultiObjective:
    """The algorithm population's non-dominated front, its hypervolume and IGD, every generation.

    ``ref_point`` (m,): hypervolume reference point, or None (HV not computed; also for m > 3,
    where no exact algorithm here is cheap enough). ``ref_front`` (r, m): points of the problem's
    Pareto front for IGD, or None. Both are host arrays (float64), rounded to the run's dtype once.
    The algorithm must provide ``population(state) -> (x (pop, dim), f (pop, m))``.
    """

    kind = "multi-objective"
    history_type = MOHistory
    record_fields = ("hv", "igd", "front_size", "nonfinite")

    def __init__(self, num_objectives: int, ref_point: np.ndarray | None, ref_front: np.ndarray | None):
        self.m = int(num_objectives)
        if ref_point is not None and self.m > 3:
            raise ValueError(f"exact hypervolume is implemented for 2 and 3 objectives, not {self.m}")
        self.ref_point = None if ref_point is None else np.asarray(ref_point, np.float64)
        self.ref_front = None if ref_front is None else np.asarray(ref_front, np.float64)

    def empty(self, algorithm, algo: Any) -> MOLoopState:
        dtype = jnp.dtype(algorithm.dtype)
        return MOLoopState(
            algo=algo,
            front_x=jnp.zeros((algorithm.pop_size, algorithm.dim), dtype),
            front_f=jnp.zeros((algorithm.pop_size, self.m), dtype),
            front_size=jnp.asarray(0, jnp.int32),
            generation=jnp.asarray(0, jnp.int32),
            nonfinite=jnp.asarray(0, jnp.int32),
            indicators=jnp.zeros((2,), dtype),
        )

    def _indicators(self, f: jax.Array, mask: jax.Array) -> jax.Array:
        nan = jnp.asarray(jnp.nan, f.dtype)
        hv = nan if self.ref_point is None else indicators.hypervolume(f, jnp.asarray(self.ref_point, f.dtype), mask)
        igd = nan if self.ref_front is None else indicators.igd(f, jnp.asarray(self.ref_front, f.dtype), mask)
        return jnp.stack([hv, igd])

    def record(self, algorithm, state: MOLoopState, raw: jax.Array, algo: Any, pick, used: Any = None) -> MOLoopState:
        del pick, used  # the front is the algorithm's population's, not the latest batch's
        bad = ~jnp.all(jnp.isfinite(raw), axis=-1)
        x, f = algorithm.population(algo)
        mask = non_dominated(f) & jnp.all(jnp.isfinite(f), axis=-1)
        order = jnp.argsort(~mask, stable=True)  # the front first, each part in index order
        size = mask.sum(dtype=jnp.int32)
        keep = (jnp.arange(mask.shape[0]) < size)[:, None]
        return MOLoopState(
            algo=algo,
            front_x=jnp.where(keep, x[order], 0),
            front_f=jnp.where(keep, f[order], 0),
            front_size=size,
            generation=state.generation + 1,
            nonfinite=state.nonfinite + bad.sum(dtype=jnp.int32),
            indicators=self._indicators(f, mask),
        )

    @staticmethod
    def row(before: MOLoopState, after: MOLoopState) -> tuple:
        return (after.indicators[0], after.indicators[1], after.front_size, after.nonfinite - before.nonfinite)

    @staticmethod
    def reached(state: MOLoopState, target: jax.Array) -> jax.Array:
        return jnp.asarray(False)  # a front has no single fitness to meet a target

    # -- host side -----------------------------------------------------------------------------
    def boundary(self, state: MOLoopState) -> dict[str, Any]:
        hv, igd = (float(v) for v in jax.device_get(state.indicators))
        return {"hv": _none_if_nan(hv), "igd": _none_if_nan(igd), "front_size": int(state.front_size),
                "nonfinite": int(state.nonfinite)}

    @staticmethod
    def progress(rec: dict[str, Any]) -> str:
        def show(v):
            return "-" if v is None else f"{v:.6e}"

        return f"hv {show(rec['hv'])}  igd {show(rec['igd'])}  front {rec['front_size']}"

    def summary(self, state: MOLoopState) -> dict[str, Any]:
        n = int(state.front_size)
        fx, ff = jax.device_get((state.front_x[:n], state.front_f[:n]))
        hv, igd = (float(v) for v in jax.device_get(state.indicators))
        return {
            "front_size": n,
            "front_f": [[float(v) for v in row] for row in ff],
            "front_x": [[float(v) for v in row] for row in fx],
            "hypervolume": _none_if_nan(hv),
            "ref_point": None if self.ref_point is None else [float(v) for v in self.ref_point],
            "igd": _none_if_nan(igd),
            "nonfinite_evaluations": int(state.nonfinite),
        }


def _none_if_nan(v: float) -> float | None:
    return None if v != v else v


RECORDERS = (SingleObjective, MultiObjective)


def history_kind(history) -> str:
    """Which recorder keeps a per-generation history with these series."""
    keys = set(history)
    for recorder in RECORDERS:
        if keys >= set(recorder.history_type._fields):
            return recorder.kind
    raise ValueError(f"no recorder keeps the series {sorted(keys)}")


def kind_of(fields) -> str:
    """Which recorder wrote a metrics record with these keys ("single-objective",
    "multi-objective"); ValueError when none did."""
    keys = set(fields)
    for recorder in RECORDERS:
        if keys >= set(recorder.record_fields):
            return recorder.kind
    raise ValueError(f"no recorder writes records with the fields {sorted(keys)}")


def recorder_for(problem, ref_point=None):
    """What a run on ``problem`` records: best-so-far for one objective; for several, the front,
    its hypervolume (m <= 3; reference point ``ref_point``, else the problem's default) and IGD
    to the problem's known front (none for a user's problem that knows none)."""
    m = problem.num_objectives
    if m == 1:
        return SingleObjective()
    if ref_point is None and m <= 3:
        ref_point = problem.default_ref_point()
    return MultiObjective(m, ref_point, problem.pareto_front())
