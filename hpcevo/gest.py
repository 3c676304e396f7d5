"""hpcevo's algorithms as generators of the gest-api standard (``suggest`` / ``ingest`` /
``finalize``), for the engines that drive such generators: libEnsemble 1.6+, Xopt, Optimas.

    from gest_api.vocs import VOCS
    from hpcevo.gest import Generator

    vocs = VOCS(variables={"x0": [-5, 5], "x1": [-5, 5]}, objectives={"f": "MINIMIZE"})
    gen = Generator(vocs, "cmaes", seed=1)          # any single-objective algorithm of hpcevo's
    while ...:
        points = gen.suggest(gen.batch_size)        # a generation: [{"x0": .., "x1": .., "_id": 0}, ...]
        gen.ingest([{**p, "f": f(p)} for p in points])   # its values: any order, in pieces
    gen.finalize()
    gen.best_solution, gen.best_fitness, gen.generation, gen.loop

With libEnsemble: ``GenSpecs(generator=gen, initial_batch_size=gen.batch_size,
batch_size=gen.batch_size, vocs=vocs)`` (examples/libensemble_cmaes.py).

The generator runs hpcevo's own ``Loop`` on a host problem whose evaluation is the engine's:
the points ``suggest`` hands out are a generation's candidates, and the loop goes on once
``ingest`` has brought all their values. Its points and its state are therefore, bit for bit,
those of ``Loop(algorithm, f, hpcevo.parallel.alone(), microbatch=...)`` evaluating the same
values itself (tests/test_gest.py, driven by libEnsemble). An algorithm is generational: a
generation's points must all be evaluated before the next exists, so ``suggest`` hands out at
most what is left of the current one (more is a ``ValueError``, as the standard asks).

VOCS: continuous variables with a finite domain (their order is the vector's), one objective
(MINIMIZE, or MAXIMIZE: the value is negated for hpcevo, which minimises), constants (copied
into every point), no constraints (a penalty in the objective is the way). NaN or infinite
values count as the worst.
"""

from __future__ import annotations

import atexit
import math
import threading
from typing import Any

import numpy as np

from .algorithms import ALGORITHMS
from .algorithms.base import Algorithm
from .config import DEFAULT_POP_SIZE
from .driver.loop import Loop
from .parallel import alone
from .problems.host import CallableProblem

try:
    from gest_api import Generator as _Standard
except ImportError:  # gest-api is optional: the generator works without it (pip install gest-api)
    _Standard = object  # type: ignore[assignment,misc]


class _Finalized(BaseException):
    """finalize() was called: the loop's thread ends inside the evaluation it waits for (a
    BaseException: the host engine counts an Exception as a failed evaluation and goes on)."""


class Generator(_Standard):  # type: ignore[misc,valid-type]
    """An hpcevo algorithm (a name of ``hpcevo.algorithms.ALGORITHMS`` with its hyper-parameters,
    or an ``Algorithm`` object for the VOCS's dimension and box) as a gest-api generator.
    ``seed``: the run's seed (``Loop.init(seed)``)."""

    returns_id = True

    def __init__(self, vocs: Any, algorithm: str | Algorithm = "cmaes", *, seed: int = 0, **hyper: Any) -> None:
        self.vocs = vocs
        self._validate_vocs(vocs)
        self.names = list(vocs.variables)
        lb = tuple(float(vocs.variables[k].domain[0]) for k in self.names)
        ub = tuple(float(vocs.variables[k].domain[1]) for k in self.names)
        (self.objective, kind), = ((k, type(v).__name__) for k, v in vocs.objectives.items())
        self.sign = -1.0 if kind == "MaximizeObjective" else 1.0
        self.constants = {k: getattr(c, "value", c) for k, c in (getattr(vocs, "constants", None) or {}).items()}
        if isinstance(algorithm, str):
            if algorithm not in ALGORITHMS:
                raise ValueError(f"algorithm {algorithm!r}: not one of hpcevo's ({', '.join(sorted(ALGORITHMS))})")
            cls = ALGORITHMS[algorithm]
            if "pop_size" not in hyper:  # a config's default: CMA-ES's lambda, else DEFAULT_POP_SIZE
                default = getattr(cls, "default_pop_size", None)
                hyper["pop_size"] = default(len(lb), hyper) if default else DEFAULT_POP_SIZE
            algorithm = cls(dim=len(lb), lb=lb, ub=ub, **hyper)
        elif hyper:
            raise ValueError("hyper-parameters go into the Algorithm object you pass, not to Generator")
        if not isinstance(algorithm, Algorithm) or algorithm.dim != len(lb) or algorithm.multi_objective:
            raise ValueError(f"algorithm must be a single-objective hpcevo algorithm of dim {len(lb)} (the VOCS's "
                             f"variables), got {algorithm!r}")
        self.algorithm, self.seed = algorithm, seed
        self.loop: Loop | None = None
        self._cond = threading.Condition()
        self._x: np.ndarray | None = None  # the open generation's candidates
        self._values = np.zeros(0)
        self._got = np.zeros(0, bool)
        self._first_id = self._next_id = 0
        self._handed = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ended = self._closed = False
        if _Standard is not object:
            super().__init__(vocs)

    # -- the standard --------------------------------------------------------------------------
    def _validate_vocs(self, vocs: Any) -> None:
        variables = getattr(vocs, "variables", None) or {}
        if not variables:
            raise ValueError("hpcevo's generator needs at least one variable")
        for name, v in variables.items():
            domain = getattr(v, "domain", None)
            if domain is None or len(domain) != 2 or not all(math.isfinite(float(d)) for d in domain):
                raise ValueError(f"variable {name!r}: hpcevo's algorithms search a box: give it a finite "
                                 "domain [low, high] (a continuous variable)")
        objectives = getattr(vocs, "objectives", None) or {}
        kinds = [type(o).__name__ for o in objectives.values()]
        if len(kinds) != 1 or kinds[0] not in ("MinimizeObjective", "MaximizeObjective"):
            raise ValueError(f"hpcevo's generator takes one objective to MINIMIZE or MAXIMIZE, got {kinds}")
        if getattr(vocs, "constraints", None):
            raise ValueError("hpcevo's algorithms take no constraints: add a penalty to the objective instead")

    @property
    def batch_size(self) -> int:
        """The points of a generation (the most ``suggest`` hands out at a time)."""
        return max(self.algorithm.num_init, self.algorithm.num_ask)

    def suggest(self, num_points: int | None = None) -> list[dict]:
        """Points of the open generation not handed out yet: ``num_points`` of them (all without
        it). Starts the run on the first call (its programs compile then)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hpcevo-generator", daemon=True)
            self._thread.start()
            # A program that ends without finalize(): the loop's thread ends first, not killed
            # inside JAX at interpreter exit.
            atexit.register(self._stop)
        with self._cond:
            while self._x is None and not self._ended:  # the loop is computing the next generation
                self._cond.wait()
            self._raise_if_ended()
            x, left = self._x, len(self._x) - self._handed  # type: ignore[arg-type]
            if left == 0 or (num_points is not None and num_points > left):
                raise ValueError(
                    f"{num_points} points asked, {left} left in this generation of {len(x)}: the next one needs "  # type: ignore[arg-type]
                    "this one's values first (ingest them), so suggest at most what is left (batch_size points "
                    "a generation; libEnsemble: initial_batch_size = batch_size = gen.batch_size)")
            k = left if num_points is None else num_points
            lo = self._handed
            self._handed += k
            rows, first = x[lo:lo + k], self._first_id + lo  # type: ignore[index]
        return [{**{name: float(v) for name, v in zip(self.names, row)}, **self.constants, "_id": first + i}
                for i, row in enumerate(rows)]

    def ingest(self, results: list[dict]) -> None:
        """Values of points this generator suggested (with their ``_id``, or else the same
        variable values), in any order and pieces; the generation closes when all are in."""
        with self._cond:
            self._raise_if_ended()
            for r in results:
                row = self._row_of(r)
                value = float(r[self.objective]) if r.get(self.objective) is not None else math.nan
                self._values[row], self._got[row] = self.sign * value, True
            if self._x is not None and self._got.all():
                self._x = None  # (closed now: a suggest waits for the next generation)
                self._cond.notify_all()

    def finalize(self) -> None:
        """End the run where it is: the last generation whose values all came in. Then
        ``best_solution``, ``best_fitness``, ``generation`` and ``loop`` are final."""
        self._stop()
        if self._error is not None:
            raise RuntimeError(f"hpcevo's generator failed: {self._error}") from self._error

    def _stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # -- results -------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """Generations whose values all came in."""
        return 0 if self.loop is None else self.loop.generation

    @property
    def best_solution(self) -> dict[str, float] | None:
        if self.loop is None:
            return None
        return dict(zip(self.names, map(float, np.asarray(self.loop.best_solution))))

    @property
    def best_fitness(self) -> float | None:
        """The best value of the objective, as the engine gave it (not negated)."""
        return None if self.loop is None else self.sign * float(self.loop.best_fitness)

    # -- the loop, in a thread of its own --------------------------------------------------------
    def _run(self) -> None:
        try:
            problem = CallableProblem("gest-api generator", self.algorithm.dim, self.algorithm.lb, self.algorithm.ub,
                                      self._evaluate, batched=True)
            loop = Loop(self.algorithm, problem, alone(), microbatch=self.batch_size)  # a generation: one call
            self.loop = loop.init(self.seed)
            while True:
                loop.advance(1)
        except _Finalized:
            pass
        except BaseException as e:  # noqa: BLE001 - suggest and finalize raise it in the engine's thread
            self._error = e
        finally:
            with self._cond:
                self._ended, self._x = True, None
                self._cond.notify_all()

    def _evaluate(self, x: np.ndarray) -> np.ndarray:
        """The host problem's block function: hand the generation out, wait for its values."""
        with self._cond:
            self._x, self._values, self._got = x, np.full(len(x), math.nan), np.zeros(len(x), bool)
            self._first_id, self._handed = self._next_id, 0
            self._next_id += len(x)
            self._cond.notify_all()
            while not self._got.all():
                if self._closed:
                    raise _Finalized()
                self._cond.wait()
            return self._values.copy()

    def _row_of(self, r: dict) -> int:
        if self._x is None:
            raise ValueError("ingest: no generation is open (every point suggested has its value)")
        if "_id" in r:
            row = int(r["_id"]) - self._first_id
            if not 0 <= row < self._handed:
                raise ValueError(f"ingest: _id {r['_id']} is not a point of the open generation "
                                 f"({self._first_id}..{self._first_id + self._handed - 1} were suggested)")
            return row
        try:
            want = np.array([float(r[k]) for k in self.names])
        except KeyError as e:
            raise ValueError(f"ingest: a result without _id or variable {e}") from None
        for row in range(self._handed):  # (the same point twice: the first not yet in)
            if not self._got[row] and np.array_equal(self._x[row], want):
                return row
        raise ValueError("ingest: a point this generator did not suggest in the open generation "
                         "(a generational algorithm cannot use other points)")

    def _raise_if_ended(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"hpcevo's generator failed: {self._error}") from self._error
        if self._ended or self._closed:
            raise ValueError("the generator was finalized")
