"""``Archipelago``: several islands evolving on the ranks of a parallel context (see
``islands.py``), with the interface of ``Loop``, so ``execute`` runs either.

Every method that computes is collective (every rank calls it). Unlike a ``Loop``'s, the state a
rank holds is only its own islands' (``state``, in the order of ``local``); what the whole
archipelago reports (history, best, digest, checkpoints) is gathered from the islands' groups.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import checkpoint
from ..algorithms import migration as mig
from ..algorithms.base import Algorithm
from ..errors import DivergenceError, UsageError
from ..parallel import ParallelContext, agree_same, agreed, allgather_obj, collective_stage, user_code
from . import arguments, build
from .engine import Limits, state_digest
from .islands import IslandsEngine, Totals
from .loop import HistoryBuffer, as_loop_problem, checked_limits, context, evaluations, user_errors

FIELDS = ("best", "gen_best", "gen_mean", "gen_std", "nonfinite")


class Archipelago:
    """``algorithms[i]`` on island i, all on ``problem`` (a JAX ``Problem``), over ``ctx``.

    ``names``: how the log and the summary call each island's algorithm (default: the class
    name). ``microbatch``, ``batch_size``, ``compile_cache``: as for ``Loop``, for every island.
    ``observe`` (and ``observe_x``): as for ``Loop``, every evaluation of the archipelago, a
    generation at a time and within it island by island (what COCO's data of the archipelago
    as one optimiser holds). ``limit``: budgets, targets and stagnation over the whole
    archipelago, as ``Loop.limit``.
    """

    def __init__(self, algorithms: Sequence[Algorithm], problem: Any, ctx: ParallelContext | None = None,
                 migration: mig.Migration = mig.Migration(50, 1), *, names: Sequence[str] | None = None,
                 microbatch: int | None = None, batch_size: int | None = None,
                 compile_cache: str | os.PathLike = "auto", observe: Callable[..., None] | None = None,
                 observe_x: bool = False):
        ctx = context(ctx, "Archipelago")
        opts: dict[str, Any] = {}
        with collective_stage(ctx), user_code(ctx, "the problem"):
            self.compile_cache = build.enable_api_compile_cache(compile_cache, "Archipelago")  # as Loop's
            opts = arguments.options("Archipelago", microbatch=microbatch, batch_size=batch_size)
            algorithms, names = _checked_islands(algorithms, names, migration)
            problem = as_loop_problem(problem, algorithms[0], opts.pop("host"))
            _check(algorithms, problem, migration)
        settings = {**opts, "migration": list(migration), "names": names}
        agree_same(ctx, arguments.describe(algorithms, problem, **settings),
                   "Archipelago's algorithms, problem, migration or options", arguments.differ)
        self.ctx, self.problem, self._algorithms, self.names = ctx, problem, tuple(algorithms), names
        self.engine = IslandsEngine(algorithms, problem, ctx, migration, microbatch=opts["microbatch"],
                                    batch_size=opts["batch_size"],
                                    trace="" if observe is None else "fx" if observe_x else "f")
        self._observe = observe
        self._limits = Limits()
        self.met: str | None = None  # which limit ended advance() (Loop.met)
        # Called on every rank (with the generations) before a dispatch runs again to the
        # generation a target met inside it: a run's driver gives the watchdog a dispatch's
        # allowance for it (driver.execute), as Loop.on_compile a compile's.
        self.on_redispatch: Callable[[int], None] | None = None
        self.algorithm = Totals(sum(a.pop_size for a in algorithms), sum(a.num_init for a in algorithms),
                                sum(a.num_ask for a in algorithms))
        self.local = self.engine.local
        self.seed: int | None = None
        self.state: tuple | None = None
        self.generation = 0
        self._histories = [HistoryBuffer() for _ in algorithms]
        self._compiled: set[bool] = set()
        self.failures: list[dict] = []

    @property
    def algorithms(self) -> tuple[Algorithm, ...]:
        """Each island's algorithm (a tuple: fixed for the archipelago's life)."""
        return self._algorithms

    @algorithms.setter
    def algorithms(self, new: Any) -> None:
        raise UsageError("Archipelago.algorithms cannot change while it runs: the islands' algorithms and their "
                         "hyper-parameters are compiled into its program. Build a new Archipelago with them and "
                         "load a checkpoint of this one (a Loop takes new values of its dynamic hyper-parameters: "
                         "Loop.set_params)")

    @property
    def count(self) -> int:
        return len(self.algorithms)

    # -- running -----------------------------------------------------------------------------------
    def init(self, seed: int) -> "Archipelago":
        seed = arguments.seed(self.ctx, seed, "Archipelago.init")
        self.compile(seed, first=True)
        self.state, part = self.engine.start(seed)
        self.seed, self.generation = seed, 1
        self._histories = [HistoryBuffer() for _ in self.algorithms]
        self._took(self._gathered(part))
        return self

    def advance(self, generations: int = 1) -> "Archipelago":
        """``generations`` more, or fewer where a limit (``limit``) ends the run: at the very
        generation that meets it (``met`` says which), as a Loop's."""
        n = arguments.generations(self.ctx, generations, self.generation, "Archipelago.advance")
        self._require_state()
        if n:
            self.compile(self.seed or 0, first=False)
        left = n
        while left and self.check_limits() is None:
            k = min(left, self.engine.max_chunk, self._to_budget())
            # Each rank holds only its own islands: the archipelago's best is known after the
            # dispatch, from every island's history. Where a target or stagnation ends the run
            # inside it, the same program runs again from the state before it, to that
            # generation: the same bits, and no collective in the generations' loop.
            watch = self._limits.target is not None or self._limits.stagnation is not None
            before = self.engine.copy(self.state) if watch else None
            state, part = self.engine.advance(self.state, k, self.seed)
            rows = self._gathered(part)
            done = self._first_met(rows, k) if watch else k
            if done < k:
                if self.on_redispatch is not None:
                    self.on_redispatch(done)
                state, _ = self.engine.advance(before, done, self.seed)
                rows = {i: {c: v[:done] for c, v in r.items()} for i, r in rows.items()}
            self.state = state
            self.generation += done
            self._took(rows)
            left -= done
        self.check_limits()
        return self

    def _gathered(self, part: dict[int, dict[str, np.ndarray]]) -> dict[int, dict[str, np.ndarray]]:
        """Every island's rows of a dispatch, from the ranks that hold them (collective)."""
        if not self._observe:  # (the fitness values and candidates only travel for a logger)
            part = {i: {k: v for k, v in r.items() if k not in ("fitness", "x")} for i, r in part.items()}
        return _by_island(allgather_obj(self.ctx, part))

    def _took(self, rows: dict[int, dict[str, np.ndarray]]) -> None:
        if self._observe is not None:
            self._observe_rows(rows)
        for i, r in rows.items():
            self._histories[i].append({k: v for k, v in r.items() if k in FIELDS})

    def _observe_rows(self, rows: dict[int, dict[str, np.ndarray]]) -> None:
        order = range(self.count)
        n = len(rows[0]["evaluations"])
        f = [rows[i]["fitness"][g][: rows[i]["evaluations"][g]] for g in range(n) for i in order]
        if not f:
            return
        if "x" not in rows[0]:
            self._observe(np.concatenate(f))
        else:
            x = [rows[i]["x"][g][: rows[i]["evaluations"][g]] for g in range(n) for i in order]
            self._observe(np.concatenate(f), np.concatenate(x))

    # -- limits (as Loop's, over the whole archipelago) --------------------------------------------
    def limit(self, evaluations: int | None = None, target: float | None = None, stagnation: int | None = None,
              tolerance: float = 0.0) -> "Archipelago":
        """As ``Loop.limit``, for the archipelago: ``evaluations`` counts every island's, the
        target and stagnation are about the best of all islands. The run ends at the generation
        that meets one, the same at any layout of the islands on ranks. Collective."""
        def check() -> Limits:
            return checked_limits("Archipelago.limit", True, evaluations, target, stagnation, tolerance)

        self._limits = agreed(self.ctx, "Archipelago.limit", check, repr, arguments.differ)
        self.met = None
        return self

    def check_limits(self) -> str | None:
        """Which limit the archipelago has met ("evaluations", "target", "stagnation"), or None;
        sets ``met``. The same on every rank (every island's history is on every rank)."""
        lim, self.met = self._limits, None
        if self.state is None:
            return None
        if lim.evaluations is not None and self.evaluations >= lim.evaluations:
            self.met = "evaluations"
        elif lim.target is not None or lim.stagnation is not None:
            best = self._best_tail(1 + (lim.stagnation or 0))
            self.met = self._fitness_limit(best, len(best) - 1)
        return self.met

    def _best_tail(self, n: int) -> np.ndarray:
        """The archipelago's best so far over its last ``n`` generations (fewer at the start), in
        the run's dtype: what ``history["best"]`` ends with, without gathering the whole history
        at every dispatch."""
        if n <= 0 or not self.generation:
            return np.zeros(0, self._dtype)
        return np.stack([h.view()["best"][-n:] for h in self._histories]).min(0).astype(self._dtype)

    def _fitness_limit(self, best: np.ndarray, g: int) -> str | None:
        """"target" or "stagnation" where the series ``best`` meets it at index ``g``, or None."""
        lim, dt = self._limits, self._dtype
        if lim.target is not None and g >= 0 and best[g] <= dt.type(lim.target):
            return "target"
        s = lim.stagnation
        if s is not None and g >= s and best[g - s] - best[g] <= dt.type(lim.tolerance):
            return "stagnation"
        return None

    @property
    def _dtype(self) -> np.dtype:
        return np.dtype(self.algorithms[0].dtype)

    def _to_budget(self) -> int:
        """Generations until the evaluations reach the budget (every island's rows count; the
        generation that reaches it is the last, as a Loop's)."""
        budget = self._limits.evaluations
        if budget is None:
            return self.engine.max_chunk
        per = sum(a.num_ask for a in self.algorithms)
        return max(1, -(-(budget - self.evaluations) // per))

    def _first_met(self, rows: dict[int, dict[str, np.ndarray]], k: int) -> int:
        """The generations of this dispatch's ``k`` up to the first that meets the target or
        stagnation (k where none does), by the rule ``check_limits`` applies."""
        new = np.stack([np.asarray(rows[i]["best"]) for i in range(self.count)]).min(0).astype(self._dtype)
        best = np.concatenate([self._best_tail(self._limits.stagnation or 0), new])
        start = len(best) - k
        for j in range(k):
            if self._fitness_limit(best, start + j) is not None:
                return j + 1
        return k

    def compile(self, seed: int = 0, first: bool = True) -> "Archipelago":
        """As ``Loop.compile``: an error while tracing any rank's islands is every rank's."""
        want = {True, False} if first else {False}
        if want <= self._compiled:
            return self
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            self.engine.compile(seed, first=first)
        self._compiled |= want
        return self

    def idle_ranks(self) -> tuple[int, int]:
        """(ranks with nothing to evaluate, the micro-batch that would give every rank work)."""
        return self.engine.idle_ranks()

    def close(self) -> None:
        self.engine.close()

    # -- reading -----------------------------------------------------------------------------------
    @property
    def history(self) -> dict[str, np.ndarray]:
        """The whole archipelago's series (``best``...) and each island's (``island3.best``...)."""
        per = [h.view() for h in self._histories]
        out = _overall(per, [a.pop_size for a in self.algorithms])
        for i, cols in enumerate(per):
            out.update({f"island{i}.{k}": v for k, v in cols.items()})
        return out

    def island_history(self, island: int) -> dict[str, np.ndarray]:
        return self._histories[island].view()

    def island_records(self) -> list[dict[str, Any]]:
        """Each island's boundary record (best, gen_best, gen_mean, gen_std, nonfinite)."""
        mine = {i: self.engine.recorder.boundary(s) for i, s in zip(self.local, self._require_state())}
        merged = _by_island(allgather_obj(self.ctx, mine))
        return [{"island": i, "algorithm": self.names[i], **merged[i]} for i in range(self.count)]

    def boundary(self) -> dict[str, Any]:
        islands = self.island_records()
        latest = [{k: np.asarray([r[k]]) for k in FIELDS} for r in islands]
        overall = {k: v[0].item() for k, v in _overall(latest, [a.pop_size for a in self.algorithms]).items()}
        return {**overall, "islands": islands}

    def detail_lines(self, rec: dict[str, Any]) -> list[str]:
        """One log line per island under the boundary's overall line."""
        return [f"    island {r['island']:>3} {r['algorithm']:<8} " + self.engine.recorder.progress(r)
                for r in rec["islands"]]

    def counters(self) -> dict[str, int]:
        return {}

    @property
    def evaluations(self) -> int:
        return sum(evaluations(a, self.generation) for a in self.algorithms)

    def island_best(self) -> list[tuple[float, np.ndarray]]:
        """(best fitness, where) of every island, in island order."""
        mine = {i: (float(s.best_f), np.asarray(jax.device_get(s.best_x))) for i, s in zip(self.local, self._require_state())}
        merged = _by_island(allgather_obj(self.ctx, mine))
        return [merged[i] for i in range(self.count)]

    @property
    def best_fitness(self) -> float:
        return min(f for f, _ in self.island_best())

    @property
    def best_solution(self) -> np.ndarray:
        bests = self.island_best()
        return bests[int(np.argmin([f for f, _ in bests]))][1]

    def outcome(self) -> dict[str, Any]:
        bests = self.island_best()
        i = int(np.argmin([f for f, _ in bests]))
        records = self.island_records()
        return {"best_fitness": bests[i][0], "best_solution": [float(v) for v in bests[i][1]],
                "nonfinite_evaluations": sum(r["nonfinite"] for r in records), "best_island": i,
                "islands": [{"island": k, "algorithm": self.names[k], "pop_size": a.pop_size,
                             "best_fitness": bests[k][0]} for k, a in enumerate(self.algorithms)]}

    def full_state(self) -> tuple:
        """Every island's state on the host, in island order (gathered: collective)."""
        mine = {i: jax.device_get(s) for i, s in zip(self.local, self._require_state())}
        merged = _by_island(allgather_obj(self.ctx, mine))
        return tuple(merged[i] for i in range(self.count))

    def digest(self) -> str:
        """SHA-256 of every island's state in island order: equal at any layout on ranks."""
        return state_digest(self.full_state())

    def check_replicas(self) -> None:
        """Collective: DivergenceError on every rank if two ranks of an island's group hold
        different states of it."""
        everyone = allgather_obj(self.ctx, self.engine.fingerprints(self._require_state()))
        for i in range(self.count):
            prints = [(r, fp[i]) for r, fp in enumerate(everyone) if i in fp]
            differs = [r for r, fp in prints if not np.array_equal(fp, prints[0][1])]
            if differs:
                raise DivergenceError(
                    f"island {i}'s replicated state diverged at generation {self.generation}: ranks "
                    f"{', '.join(map(str, differs))} differ from rank {prints[0][0]}. The run cannot be "
                    "trusted; this is a bug in a non-deterministic problem or algorithm, please report it.")

    def _require_state(self) -> tuple:
        if self.state is None:
            raise UsageError("this Archipelago has no state yet: call init(seed) or load(path) first")
        return self.state

    # -- checkpoints (collective) ------------------------------------------------------------------
    def snapshot(self, config_text: str = "") -> checkpoint.Snapshot:
        a, state = self.algorithm, self.full_state()
        return checkpoint.Snapshot(self.generation, self.evaluations, int(self.seed), config_text,
                                   state, self.history, a.num_init, a.num_ask)

    def save(self, directory: str | Path, *, keep: int = 3, config_text: str = "") -> Path:
        directory = arguments.path(self.ctx, directory, "Archipelago.save", "directory")
        keep = arguments.keep(self.ctx, keep, "Archipelago.save")
        agreed(self.ctx, "Archipelago.save", self._require_state, lambda _: "")
        return checkpoint.write(self.ctx, directory, self.snapshot(str(config_text)), keep=keep)

    def template(self) -> tuple:
        return self.engine.template()

    def load(self, path: str | Path) -> "Archipelago":
        path = arguments.path(self.ctx, path, "Archipelago.load", "path", file=True)
        with collective_stage(self.ctx), user_code(self.ctx, "the problem"), user_errors():
            template = self.template()
        return self.restore(checkpoint.load(self.ctx, path, template))

    def restore(self, loaded: checkpoint.Loaded) -> "Archipelago":
        expected = sorted([*FIELDS, *(f"island{i}.{k}" for i in range(self.count) for k in FIELDS)])
        if sorted(loaded.history) != expected:
            raise UsageError(f"cannot resume from '{loaded.header.path}': it was written by another kind of run "
                             f"(its history has {len(loaded.history)} series, {self.count} islands keep "
                             f"{len(expected)})")
        self.state = tuple(jax.device_put(loaded.state[i]) for i in self.local)
        self.seed, self.generation = loaded.header.seed, loaded.header.generation
        self._histories = [HistoryBuffer() for _ in self.algorithms]
        for i, h in enumerate(self._histories):
            h.append({k: loaded.history[f"island{i}.{k}"] for k in FIELDS})
        return self


def _checked_islands(algorithms: Any, names: Any, migration: Any) -> tuple[list[Algorithm], list[str]]:
    if isinstance(algorithms, (str, bytes)) or not isinstance(algorithms, Sequence) or not algorithms:
        raise UsageError("Archipelago: 'algorithms' must be a non-empty list of algorithms, one per island; got "
                         f"{type(algorithms).__name__}")
    checked = [arguments.checked_algorithm(a, f"Archipelago: island {i}") for i, a in enumerate(algorithms)]
    if names is None:
        names = [type(a).__name__ for a in checked]
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or len(names) != len(checked) \
            or not all(isinstance(n, str) for n in names):
        raise UsageError(f"Archipelago: 'names' must be a list of {len(checked)} strings, one per island")
    if not isinstance(migration, mig.Migration):
        raise UsageError("Archipelago: 'migration' must be an hpcevo.Migration(every=..., migrants=...), got "
                         f"{type(migration).__name__}")
    return checked, list(names)


def _check(algorithms: Sequence[Algorithm], problem: Any, migration: mig.Migration) -> None:
    found = mig.unfit(list(algorithms), migration, bool(getattr(problem, "host", False)))
    if found is not None:
        raise UsageError(found[1])


def _by_island(gathered: list[dict[int, Any]]) -> dict[int, Any]:
    """Merge what every rank sent, keyed by island (the ranks of a group send the same)."""
    out: dict[int, Any] = {}
    for part in gathered:
        for i, v in part.items():
            out.setdefault(i, v)
    return out


def _overall(per: list[dict[str, np.ndarray]], weights: list[int]) -> dict[str, np.ndarray]:
    """The archipelago's series from its islands': best of bests, population-weighted mean,
    pooled standard deviation, total non-finite count."""
    col = {k: np.stack([np.asarray(p[k], np.float64) for p in per]) for k in FIELDS}
    w = np.asarray(weights, np.float64)[:, None]
    mean = (w * col["gen_mean"]).sum(0) / w.sum()
    var = (w * (col["gen_std"] ** 2 + (col["gen_mean"] - mean) ** 2)).sum(0) / w.sum()
    dtype = np.asarray(per[0]["best"]).dtype
    return {"best": col["best"].min(0).astype(dtype), "gen_best": col["gen_best"].min(0).astype(dtype),
            "gen_mean": mean.astype(dtype), "gen_std": np.sqrt(var).astype(dtype),
            "nonfinite": col["nonfinite"].sum(0).astype(np.asarray(per[0]["nonfinite"]).dtype)}
