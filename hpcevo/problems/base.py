"""The problem protocols, written down: what the loop, the builder and the recorder may rely on.

Every attribute that is optional for a problem is declared here with its default. hpcevo's own
problem classes derive from these protocols (so they inherit the defaults); a problem a user
hands to ``hpcevo.run`` is checked and wrapped once, where it enters (``problems.user``), so
nothing downstream ever has to ask whether an attribute exists.

Two kinds:

* ``Problem``: pure JAX, evaluated inside the jitted step: ``evaluate(x) -> f`` for a block
  ``x`` of shape ``(n, dim)``, ``f`` of shape ``(n,)``, or ``(n, m)`` for ``m`` objectives;
  minimised. With ``wants_generation = True`` it is called ``evaluate(x, generation)``, with the
  number of the generation being evaluated (1 = the initial population).
* ``HostProblem``: NumPy code or an external program, evaluated on the host outside JIT
  (``problems/host.py``): ``evaluate_rows(x, first, generation) -> (values, failures)``.

One more optional part of a JAX problem, read with ``getattr`` and so left out of the protocol
(a protocol's every member is required by ``isinstance``, which would refuse objects written to
the members above): instance data as arguments of the compiled programs rather than constants
in them. ``program_data`` (a pytree of arrays; None or absent: none), ``program`` (a hashable id
of the code, e.g. BBOB's dimension and box) and ``evaluate_with(x, program_data[,
generation])``: a run passes the data into its programs, and problems with equal ``program``
share one compiled program whatever their data (COCO's 24 functions x 15 instances of a
dimension compile once: the function's number is data too; ``bbob.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Problem(Protocol):
    """A JAX problem (minimised)."""

    name: str
    dim: int
    lb: tuple[float, ...]  # one bound per coordinate
    ub: tuple[float, ...]
    num_objectives: int = 1
    # evaluate(x, generation): for problems that draw new random scenarios each generation
    # (neuroevolution), identically on every rank.
    wants_generation: bool = False
    # A row's value never depends on the block it is evaluated in (tested bitwise for hpcevo's
    # own functions), so evaluation.batch_size changes nothing and needs no probe.
    block_invariant: bool = False
    host: ClassVar[bool] = False

    def evaluate(self, x: Any, *generation: Any) -> Any:
        """``(n, dim) -> (n,)``, or ``(n, num_objectives)``."""
        ...

    def pareto_front(self) -> np.ndarray | None:
        """Points of the true Pareto front, float64 ``(r, m)``, for IGD; None: unknown."""
        return None

    def default_ref_point(self) -> np.ndarray | None:
        """The hypervolume reference point when the config gives none; None: no hypervolume."""
        return None


@runtime_checkable
class HostProblem(Protocol):
    """A problem evaluated on the host, outside JAX (single-objective)."""

    name: str
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    num_objectives: int = 1
    host: ClassVar[bool] = True
    # Rows one call takes: None = a slice of the engine's choosing, 1 = one candidate.
    rows_per_call: int | None = None

    def evaluate_rows(self, x: np.ndarray, first: int, generation: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Values of the rows ``x`` (population rows ``first``...), and which failed, why."""
        ...

    def cancel(self) -> None:
        """Stop evaluations running now (on an error or an interrupt)."""
        return None

    def close(self) -> None:
        """Free what the problem holds (processes, scratch directories)."""
        return None
