"""CMA-ES with full covariance, sep-CMA-ES, and the IPOP restart strategy for both.

[H16] N. Hansen, "The CMA Evolution Strategy: A Tutorial", arXiv:1604.00772 (2016, rev. 2023).
      The full-covariance strategy follows its Fig. 6 summary (Eq. 39-47 for the updates,
      Eq. 48-58 and Table 1 for the defaults), active CMA (negative recombination weights for the
      worse half) included, as pycma does by default.
[RH08] R. Ros and N. Hansen, "A Simple Modification in CMA-ES Achieving Linear Time and Space
      Complexity", PPSN X, LNCS 5199, pp. 296-305, 2008. sep-CMA-ES: C is diagonal and its
      learning rates are multiplied by (n + 2) / 3 (Sec. 2, Eq. 2 and the text after it).
[AH05] A. Auger and N. Hansen, "A Restart CMA Evolution Strategy With Increasing Population
      Size", IEEE CEC 2005, pp. 1769-1776. IPOP: on stagnation, restart with a fresh mean and
      twice the population (Sec. 2: the stopping criteria and the factor 2).
[H09] N. Hansen, "Benchmarking a BI-Population CMA-ES on the BBOB-2009 Function Testbed",
      GECCO 2009 workshop on black-box optimization benchmarking, pp. 2389-2396. BIPOP:
      restarts alternate between IPOP's growing populations and small populations with a
      random smaller step size, each regime given a comparable share of the evaluations. The
      rules follow pycma's ``fmin(bipop=True)`` (its budget accounting and random draws), the
      reference implementation a BBOB user compares with.

Restarts and compiled programs. XLA compiles fixed shapes, but IPOP and BIPOP change lambda.
``pop_size`` is the largest lambda the run may use (lambda0 * 2^9 by default), and the state
holds that many sample rows. A generation is computed by a program of ``rows`` rows, one of the
buckets lambda0 * 2^k capped at pop_size (``row_buckets``): the bucket of the current lambda, the
smallest size >= lambda, so a generation costs at most twice what its lambda costs. Only the first
``lam`` rows (a traced integer in the state) take part in the update; the rest of the bucket are
samples its update ignores (``rows_used``: the evaluation count, the best so far and COCO's data
see only the first ``lam``). ``Loop`` runs each generation in its bucket's program and moves to
another at the restart that changes the bucket (``fits`` ends a chunk there); the bucket is read
from the state, so every rank moves alike and a resumed run moves as the run never stopped.
Everything else is data, not shape: every rank count gives bitwise the same run. (Before
2026-11-27 every generation computed pop_size rows in one program: at lambda 8 in 5-D, 4,096
rows, 0.95 ms a generation against 0.017 ms in its bucket of 8. ``Loop.functions`` still gives that
one program of pop_size rows, the fixed shape a user's own ``jax.jit`` or ``lax.scan`` needs.)
Once doubling would exceed ``pop_size``, later restarts keep lambda = pop_size. Without restarts
(``restart = "none"``) lambda = pop_size throughout, one program and no masking.

Conventions (see ``_es.py``): mean uniform in the box, sigma0 = ``sigma_init`` times the mean box
width, C0 = diag((width_i / mean width)^2) (the identity for a cubic box); candidates are not
clipped unless ``clip`` is true. float64 (``run.dtype``) is advised for targets below ~1e-6 on
ill-conditioned problems: C's condition number reaches 1e6 on the ellipsoid and float32 has 7
digits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from . import _es
from .base import BaseAlgorithm


class CMAState(NamedTuple):
    key: jax.Array
    mean: jax.Array  # (n,)
    sigma: jax.Array  # ()
    C: jax.Array  # (n, n) full; (n,) diagonal for sep-CMA-ES
    B: jax.Array  # (n, n) eigenvectors of C; (0,) for sep-CMA-ES
    D: jax.Array  # (n,) square roots of C's eigenvalues (of its diagonal for sep)
    p_sigma: jax.Array  # (n,)
    p_c: jax.Array  # (n,)
    z: jax.Array  # (pop, n) standard normal draws of the asked generation
    y: jax.Array  # (pop, n) their steps B D z, kept so that tell need not recompute them
    gen: jax.Array  # int32, generations since the last (re)start
    lam: jax.Array  # int32, active population size (<= pop_size)
    restarts: jax.Array  # int32
    evals: jax.Array  # int32, evaluations the strategy used (active rows only)
    history: jax.Array  # (H,) best fitness of the latest generations, newest first (IPOP TolFun)
    # Restart bookkeeping (BIPOP; IPOP reads sigma0 and max_gen only):
    sigma0: jax.Array  # () the current run's initial step size (TolX is relative to it)
    max_gen: jax.Array  # int32, generations the current run may take (a small BIPOP run's budget)
    regime: jax.Array  # int32, 0: the first run or a small-population run; 1: a large one
    large_runs: jax.Array  # int32, large-population runs started
    spent: jax.Array  # (2,) int32, evaluations used by small (with the first) and large runs
    run_start: jax.Array  # int32, evals when the current run started


@dataclasses.dataclass(frozen=True)
class _CMABase(BaseAlgorithm):
    initial: ClassVar[tuple[str, ...]] = ("sigma_init", "x0")
    sigma_init: float = 0.3
    restart: Literal["none", "ipop", "bipop"] = "none"
    lambda0: int = 0  # first lambda with restarts; 0: 4 + floor(3 ln n) [H16, Eq. 48]
    clip: bool = False
    x0: tuple[float, ...] | None = None  # the first run's mean (default: uniform in the box)
    # The rows a program computes with restarts: one bucket of ``row_buckets`` (0: pop_size). Not
    # a hyper-parameter: a loop runs each restart's population in the program of its bucket
    # (``with_rows``); see the module docstring.
    rows: int = dataclasses.field(default=0, init=False)

    # [AH05] stopping criteria (TolFun and TolX from their Sec. 2; 1e-12 as there).
    tol_fun = 1e-12
    tol_x = 1e-12
    max_condition = 1e14

    def __post_init__(self) -> None:
        super().__post_init__()
        _es.check_positive(sigma_init=self.sigma_init)
        if self.restart not in ("none", "ipop", "bipop"):
            raise ConfigError(f"restart must be 'none', 'ipop' or 'bipop', got {self.restart!r}")
        if self.restart == "none" and self.lambda0:
            raise ConfigError("lambda0 applies only with restart = 'ipop' or 'bipop' (pop_size is lambda otherwise)")
        if self.lam_start < 2:
            raise ConfigError(f"the population (lambda) must be >= 2, got {self.lam_start}")
        if self.lam_start > self.pop_size:
            raise ConfigError(
                f"lambda0 = {self.lam_start} exceeds pop_size = {self.pop_size}; with restart = "
                f"'{self.restart}', pop_size is the largest population the restarts may grow to"
            )

    # Restarts that double lambda at most this many times by default (pycma's advice for BIPOP:
    # restarts <= 9): pop_size defaults to lambda0 * 2^9 with restarts.
    default_doublings = 9

    def initial_fields(self) -> tuple[str, ...]:
        # With restarts, each restart starts from sigma_init again: more than generation 1's.
        return self.initial if self.restart == "none" else ("x0",)

    @property
    def default_lambda(self) -> int:
        return 4 + int(3 * math.log(self.dim))

    @classmethod
    def default_pop_size(cls, dim: int, params: dict) -> int:
        """pop_size when a config gives none: lambda = 4 + floor(3 ln n) [H16, Eq. 48]; with
        restarts, the largest lambda they may reach, lambda0 * 2^9."""
        lam = int(params.get("lambda0") or 0) or 4 + int(3 * math.log(dim))
        return lam * 2**cls.default_doublings if params.get("restart", "none") != "none" else lam

    @property
    def lam_start(self) -> int:
        if self.restart != "none":
            return self.lambda0 or self.default_lambda
        return self.pop_size

    # -- population buckets: a generation costs what its lambda costs ---------------------------------
    @property
    def num_ask(self) -> int:
        return self.rows or self.pop_size

    def row_buckets(self) -> tuple[int, ...] | None:
        """The sizes of the programs a restarting run moves between: lambda0 * 2^k, capped at
        pop_size (the lambdas IPOP's restarts take; BIPOP's small ones fall between them, in the
        next size up: within 2x). None without restarts (lambda is pop_size throughout)."""
        if self.restart == "none":
            return None
        table = [self.lam_start]
        while table[-1] < self.pop_size:
            table.append(min(self.lam_start * 2 ** len(table), self.pop_size))
        return tuple(table)

    def population_size(self, state: CMAState) -> jax.Array:
        """The population (lambda) of ``state``'s run."""
        return state.lam

    def bucket_rows(self, lam: int) -> int:
        """The bucket a population of ``lam`` runs in: the smallest size >= lam."""
        return next(b for b in self.row_buckets() or (self.pop_size,) if b >= lam)

    def with_rows(self, rows: int) -> "_CMABase":
        """This algorithm computing ``rows`` rows a generation (a bucket of ``row_buckets``)."""
        copy = dataclasses.replace(self)
        object.__setattr__(copy, "rows", int(rows))
        return copy

    def fits(self, state: CMAState):
        """Traced: whether the population of ``state`` runs in this program's bucket (a loop's
        chunk ends where a restart moves it to another); None for the program of pop_size rows."""
        if not self.rows:
            return None
        buckets = self.row_buckets()
        i = buckets.index(self.rows)
        below = buckets[i - 1] if i else 0
        return (state.lam <= self.rows) & (state.lam > below)

    @property
    def max_gen_default(self) -> int:
        """A run's generations at most (BIPOP): pycma's default maxiter for the first lambda,
        100 + 150 (n + 3)^2 / sqrt(lambda0)."""
        return int(100 + 150 * (self.dim + 3) ** 2 / math.sqrt(self.lam_start))

    def rows_used(self, state: CMAState):
        return state.lam if self.restart != "none" else None

    def _history_len(self) -> int:
        return 10 + math.ceil(30 * self.dim / self.lam_start)

    def _scales(self) -> tuple[float, tuple[float, ...]]:
        width = [u - lo for lo, u in zip(self.lb, self.ub)]
        mean_w = sum(width) / len(width)
        return self.sigma_init * mean_w, tuple(w / mean_w for w in width)

    # -- what differs between full and separable covariance --------------------------------------
    def _fresh_cov(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        raise NotImplementedError

    def _rates(self, mueff, mueff_neg, n):
        raise NotImplementedError

    def _whiten(self, state: CMAState, z: jax.Array) -> jax.Array:
        raise NotImplementedError

    def _update_cov(self, state: CMAState, ys, zs, w, c1, cmu, hsig_loss, p_c):
        raise NotImplementedError

    def _steps(self, state: CMAState, z: jax.Array) -> jax.Array:
        raise NotImplementedError

    # -- protocol --------------------------------------------------------------------------------
    def init(self, key: jax.Array) -> CMAState:
        key, k_mean = jax.random.split(key)
        n, dt = self.dim, self.dtype
        C, B, D = self._fresh_cov()
        return CMAState(
            key=key,
            mean=self.initial_mean(k_mean),
            sigma=jnp.asarray(self._scales()[0], dt),
            C=C, B=B, D=D,
            p_sigma=jnp.zeros((n,), dt),
            p_c=jnp.zeros((n,), dt),
            z=jnp.zeros((self.pop_size, n), dt),
            y=jnp.zeros((self.pop_size, n), dt),
            gen=jnp.asarray(0, jnp.int32),
            lam=jnp.asarray(self.lam_start, jnp.int32),
            restarts=jnp.asarray(0, jnp.int32),
            evals=jnp.asarray(0, jnp.int32),
            history=jnp.full((self._history_len(),), jnp.inf, dt),
            sigma0=jnp.asarray(self._scales()[0], dt),
            max_gen=jnp.asarray(self.max_gen_default if self.restart == "bipop" else 2**31 - 1, jnp.int32),
            regime=jnp.asarray(0, jnp.int32),
            large_runs=jnp.asarray(0, jnp.int32),
            spent=jnp.zeros((2,), jnp.int32),
            run_start=jnp.asarray(0, jnp.int32),
        )

    def ask(self, state: CMAState) -> tuple[jax.Array, CMAState]:
        key, k_z = jax.random.split(state.key)
        # The ES library's sampler: Box-Muller on both outputs, half the cost of
        # jax.random.normal's erfinv on a CPU, and the same bits in every program.
        z = _es.block_noise(k_z, 0, self.num_ask, self.dim, self.dtype)
        y = self._steps(state, z)
        x = state.mean + state.sigma * y
        if self.clip:
            x = self.clip_to_box(x)
        if self.num_ask < self.pop_size:  # (a bucket: the rows past it are not this generation's)
            z, y = state.z.at[: self.num_ask].set(z), state.y.at[: self.num_ask].set(y)
        return x, state._replace(key=key, z=z, y=y)

    def weights(self, lam: jax.Array):
        """Recombination weights by rank for the active lambda [H16, Eq. 49-53]; zero past lam."""
        P, n, dt = self.num_ask, self.dim, self.dtype
        i = jnp.arange(1, P + 1, dtype=dt)
        lam_f = lam.astype(dt)
        raw = jnp.log((lam_f + 1) / 2) - jnp.log(i)
        active = jnp.arange(P) < lam
        pos = active & (jnp.arange(P) < lam // 2)
        neg = active & ~pos
        s_pos = jnp.where(pos, raw, 0).sum()
        mueff = s_pos**2 / jnp.where(pos, raw * raw, 0).sum()
        s_neg = -jnp.where(neg, raw, 0).sum()
        q_neg = jnp.where(neg, raw * raw, 0).sum()
        mueff_neg = jnp.where(q_neg > 0, s_neg**2 / jnp.where(q_neg > 0, q_neg, 1), 0)
        cs, ds, cc, c1, cmu, active_cma = self._rates(mueff, mueff_neg, n)
        if active_cma:
            scale_neg = jnp.minimum(jnp.minimum(1 + c1 / cmu, 1 + 2 * mueff_neg / (mueff + 2)),
                                    (1 - c1 - cmu) / (n * cmu))
            w_neg = jnp.where(neg, scale_neg * raw / jnp.where(s_neg > 0, s_neg, 1), 0)
        else:
            w_neg = jnp.zeros_like(raw)
        w = jnp.where(pos, raw / s_pos, w_neg)
        return w, mueff, (cs, ds, cc, c1, cmu)

    def tell(self, state: CMAState, fitness: jax.Array) -> CMAState:
        n, P, dt = self.dim, self.num_ask, self.dtype
        fitness = fitness.astype(dt)
        active = jnp.arange(P) < state.lam
        order = jnp.argsort(jnp.where(active, fitness, jnp.inf), stable=True)
        z, y = (state.z[:P], state.y[:P]) if P < self.pop_size else (state.z, state.y)
        zs, ys = z[order], y[order]
        w, mueff, (cs, ds, cc, c1, cmu) = self.weights(state.lam)
        w_pos = jnp.maximum(w, 0)

        y_w = w_pos @ ys  # [H16, Eq. 41]
        mean = state.mean + state.sigma * y_w  # c_m = 1
        chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))
        p_sigma = (1 - cs) * state.p_sigma + jnp.sqrt(cs * (2 - cs) * mueff) * self._whiten(state, w_pos @ zs)
        ps_norm = jnp.sqrt(jnp.sum(p_sigma * p_sigma))
        # [H16, Eq. 44]; the exponent is capped at 1 as in pycma, a guard that only acts on
        # wildly off-scale starts.
        sigma = state.sigma * jnp.exp(jnp.minimum(1.0, cs / ds * (ps_norm / chi_n - 1)))
        g1 = (state.gen + 1).astype(dt)
        hsig = ps_norm / jnp.sqrt(1 - (1 - cs) ** (2 * g1)) < (1.4 + 2 / (n + 1)) * chi_n
        hsig = hsig.astype(dt)
        p_c = (1 - cc) * state.p_c + hsig * jnp.sqrt(cc * (2 - cc) * mueff) * y_w
        # Negative weights are rescaled by n / ||C^-1/2 y||^2 = n / ||z||^2 [H16, Eq. 46].
        z_sq = jnp.sum(zs * zs, axis=1)
        w_circ = jnp.where(w >= 0, w, w * n / jnp.where(z_sq > 0, z_sq, 1))
        hsig_loss = (1 - hsig) * cc * (2 - cc)
        decay = 1 + c1 * hsig_loss - c1 - cmu * jnp.sum(w)
        C, B, D = self._update_cov(state, ys, w_circ, decay, c1, cmu, p_c)

        new = state._replace(
            mean=mean, sigma=sigma, C=C, B=B, D=D, p_sigma=p_sigma, p_c=p_c,
            gen=state.gen + 1, evals=state.evals + state.lam,
            history=jnp.roll(state.history, 1).at[0].set(jnp.min(jnp.where(active, fitness, jnp.inf))),
        )
        if self.restart != "none":
            new = self._maybe_restart(new, fitness, active)
        return new

    # -- IPOP ------------------------------------------------------------------------------------
    def _should_stop(self, s: CMAState, fitness: jax.Array, active: jax.Array) -> jax.Array:
        n = self.dim
        sigma0 = s.sigma0
        hist_len = 10 + jnp.ceil(30 * n / s.lam.astype(self.dtype)).astype(jnp.int32)
        recent = jnp.arange(s.history.shape[0]) < hist_len
        h_max = jnp.max(jnp.where(recent, s.history, -jnp.inf))
        h_min = jnp.min(jnp.where(recent, s.history, jnp.inf))
        f_max = jnp.max(jnp.where(active, fitness, -jnp.inf))
        f_min = jnp.min(jnp.where(active, fitness, jnp.inf))
        tol_fun = (s.gen >= hist_len) & (h_max - h_min < self.tol_fun) & (f_max - f_min < self.tol_fun)
        diag = s.D**2 if s.B.ndim == 1 else jnp.diagonal(s.C)
        spread = s.sigma * jnp.maximum(jnp.max(jnp.abs(s.p_c)), jnp.max(jnp.sqrt(diag)))
        tol_x = spread < self.tol_x * sigma0
        d2 = s.D**2
        condition = jnp.max(d2) > self.max_condition * jnp.min(d2)
        # NoEffectAxis: a tenth of a standard deviation along one principal axis leaves the mean
        # unchanged (cycling through the axes, one a generation); NoEffectCoord: the same for a
        # fifth of a deviation along any coordinate.
        axis = s.gen % n
        along = s.D[axis] * (s.B[:, axis] if s.B.ndim == 2 else jnp.zeros((n,), self.dtype).at[axis].set(1))
        no_axis = jnp.all(s.mean == s.mean + 0.1 * s.sigma * along)
        no_coord = jnp.any(s.mean == s.mean + 0.2 * s.sigma * jnp.sqrt(diag))
        broken = ~(jnp.isfinite(s.sigma) & jnp.all(jnp.isfinite(s.C)) & jnp.all(jnp.isfinite(s.mean)))
        return tol_fun | tol_x | condition | no_axis | no_coord | broken | (s.gen >= s.max_gen)

    def _maybe_restart(self, s: CMAState, fitness: jax.Array, active: jax.Array) -> CMAState:
        stop = self._should_stop(s, fitness, active)
        if self.restart == "bipop":
            key, k_mean, k_u = jax.random.split(s.key, 3)
            lam, sigma0, max_gen, regime, large_runs, spent = self._bipop_next(s, k_u)
        else:
            key, k_mean = jax.random.split(s.key)
            lam = jnp.where(2 * s.lam <= self.pop_size, 2 * s.lam, self.pop_size).astype(jnp.int32)
            sigma0, max_gen, regime, large_runs, spent = s.sigma0, s.max_gen, s.regime, s.large_runs, s.spent
        C, B, D = self._fresh_cov()
        fresh = s._replace(
            key=key,
            mean=self.uniform_in_bounds(k_mean, 1)[0],
            sigma=sigma0,
            C=C, B=B, D=D,
            p_sigma=jnp.zeros_like(s.p_sigma), p_c=jnp.zeros_like(s.p_c),
            gen=jnp.asarray(0, jnp.int32), lam=lam, restarts=s.restarts + 1,
            history=jnp.full_like(s.history, jnp.inf),
            sigma0=sigma0, max_gen=max_gen, regime=regime, large_runs=large_runs, spent=spent,
            run_start=s.evals,
        )
        # The restart's keys are drawn either way, so the key stream never depends on whether a
        # restart happened elsewhere than in this select.
        s = s._replace(key=key)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(stop, a, b), fresh, s)

    def _bipop_next(self, s: CMAState, key: jax.Array):
        """The next run of BIPOP-CMA-ES [H09], as pycma's ``fmin(..., bipop=True)`` chooses it.

        The ended run's evaluations go to its regime's budget (the first run counts as small).
        While the small runs have used less than the large ones (at least 1), the next run is
        small: lambda = floor(lambda0 * (2^L)^(u1^2)) with L the large runs so far, sigma0 times
        0.01^u2, and at most half the large runs' evaluations over lambda generations. Otherwise
        it is large: lambda = lambda0 * 2^(L+1), the default sigma0. Every run stops after
        ``max_gen_default`` generations at the most."""
        dt = self.dtype
        spent = s.spent.at[s.regime].add(s.evals - s.run_start)
        small = spent[0] < jnp.maximum(1, spent[1])
        u = jax.random.uniform(key, (2,), dt)
        L = s.large_runs
        lam0 = jnp.asarray(self.lam_start, dt)
        lam_small = jnp.floor(lam0 * jnp.exp2(L.astype(dt) * u[0] ** 2)).astype(jnp.int32)
        # lambda0 * 2^k capped at pop_size, tabulated exactly (exp2 in floating point may round
        # 512 down to 511.99...)
        table, k = [self.lam_start], 1
        while table[-1] < self.pop_size:
            table.append(min(self.lam_start * 2**k, self.pop_size))
            k += 1
        lam_large = jnp.asarray(table, jnp.int32)[jnp.minimum(L + 1, len(table) - 1)]
        lam = jnp.minimum(jnp.where(small, lam_small, lam_large), self.pop_size).astype(jnp.int32)
        base_sigma = jnp.asarray(self._scales()[0], dt)
        sigma0 = jnp.where(small, base_sigma * jnp.asarray(0.01, dt) ** u[1], base_sigma)
        small_gens = jnp.floor(0.5 * spent[1].astype(dt) / lam.astype(dt)).astype(jnp.int32)
        max_gen = jnp.where(small, jnp.minimum(self.max_gen_default, small_gens), self.max_gen_default)
        return (lam, sigma0, max_gen.astype(jnp.int32), jnp.where(small, 0, 1).astype(jnp.int32),
                L + jnp.where(small, 0, 1).astype(jnp.int32), spent)


@dataclasses.dataclass(frozen=True)
class CMAES(_CMABase):
    """CMA-ES with full covariance and active CMA [H16], optional IPOP restarts [AH05].

    Hyper-parameters: ``pop_size`` is lambda (a config without one gets the [H16] default,
    4 + floor(3 ln n); with ``restart = "ipop"`` or ``"bipop"`` [H09] it is the largest lambda,
    default lambda0 * 2^9, and ``lambda0`` the first); ``x0`` the first mean (restarts draw theirs
    uniformly in the box); ``sigma_init`` the
    initial step size as a fraction of the mean box width ([H16]'s advice for an optimum
    expected in [a, b]^n: m0 uniform in the box, sigma0 = 0.3 (b - a)); every learning rate and the recombination weights are the [H16]
    defaults (Eq. 48-58), computed from the active lambda, so they follow lambda across
    restarts. mu = floor(lambda / 2), c_m = 1, alpha_cov = 2.

    C is eigendecomposed every generation (O(n^3); [H16] allows a lazier schedule, which would
    save time for large n and cost a program whose shape depends on the generation). Eigenvalues are
    floored at a tiny positive value so sampling never takes the root of a rounding-negative.
    """

    def _fresh_cov(self):
        scale = jnp.asarray(self._scales()[1], self.dtype)
        return jnp.diag(scale * scale), jnp.eye(self.dim, dtype=self.dtype), scale

    def _rates(self, mueff, mueff_neg, n):
        # [H16, Eq. 54-58] with alpha_cov = 2.
        cs = (mueff + 2) / (n + mueff + 5)
        ds = 1 + 2 * jnp.maximum(0.0, jnp.sqrt((mueff - 1) / (n + 1)) - 1) + cs
        cc = (4 + mueff / n) / (n + 4 + 2 * mueff / n)
        c1 = 2 / ((n + 1.3) ** 2 + mueff)
        cmu = jnp.minimum(1 - c1, 2 * (mueff - 2 + 1 / mueff) / ((n + 2) ** 2 + mueff))
        return cs, ds, cc, c1, cmu, True

    def _steps(self, state, z):
        return (z * state.D) @ state.B.T  # y = B D z

    def _whiten(self, state, z):
        return state.B @ z  # C^-1/2 (B D z) = B z

    def _update_cov(self, state, ys, w_circ, decay, c1, cmu, p_c):
        # [H16, Eq. 47]
        C = decay * state.C + c1 * jnp.outer(p_c, p_c) + cmu * (ys.T * w_circ) @ ys
        C = (C + C.T) / 2
        eig, B = jnp.linalg.eigh(C)
        floor = jnp.finfo(self.dtype).tiny
        D = jnp.sqrt(jnp.maximum(eig, floor))
        return C, B, D


@dataclasses.dataclass(frozen=True)
class SepCMAES(_CMABase):
    """sep-CMA-ES [RH08]: diagonal covariance, O(n) time and memory per sample.

    Defaults are those of [RH08, Sec. 2]: the 2006-tutorial rates with mu_cov = mu_eff,
    c_cov = 2 / (mu_cov (n + sqrt 2)^2) + (1 - 1/mu_cov) min(1, (2 mu_eff - 1) / ((n + 2)^2 +
    mu_eff)) multiplied by (n + 2) / 3, c_c = 4 / (n + 4), c_sigma = (mu_eff + 2) / (n + mu_eff + 3),
    positive recombination weights only. Step size, restarts and conventions as in CMA-ES.
    """

    def _fresh_cov(self):
        scale = jnp.asarray(self._scales()[1], self.dtype)
        return scale * scale, jnp.zeros((0,), self.dtype), scale

    def _rates(self, mueff, mueff_neg, n):
        cs = (mueff + 2) / (n + mueff + 3)
        ds = 1 + 2 * jnp.maximum(0.0, jnp.sqrt((mueff - 1) / (n + 1)) - 1) + cs
        cc = 4 / (n + 4)
        mucov = mueff
        ccov = 2 / (mucov * (n + math.sqrt(2)) ** 2) + (1 - 1 / mucov) * jnp.minimum(
            1.0, (2 * mueff - 1) / ((n + 2) ** 2 + mueff))
        ccov = jnp.minimum(1.0, ccov * (n + 2) / 3)
        return cs, ds, cc, ccov / mucov, ccov * (1 - 1 / mucov), False

    def _steps(self, state, z):
        return z * state.D

    def _whiten(self, state, z):
        return z

    def _update_cov(self, state, ys, w_circ, decay, c1, cmu, p_c):
        C = decay * state.C + c1 * p_c * p_c + cmu * (w_circ @ (ys * ys))
        return C, state.B, jnp.sqrt(jnp.maximum(C, jnp.finfo(self.dtype).tiny))
