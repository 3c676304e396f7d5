"""A performance model of one hpcevo generation, to project runs to many ranks.

Per generation every rank runs the replicated algorithm (``ask`` and ``tell``: the same cost at
any rank count), evaluates its share of the population's micro-batches, and joins one exchange
of the fitness buffer. With ``P`` ranks:

    T(P) = t_algo + ceil(k / P) * m * t_eval + t_exchange(P) + t_host

    k, m        micro-batches and rows per micro-batch (hpcevo.parallel.microbatch_rows: they
                depend on the population only, which is what makes runs rank-count invariant)
    t_eval      seconds to evaluate one candidate (measured)
    t_algo      seconds of ask + tell per generation (measured at one rank)
    t_host      per-generation share of the host's work at boundaries (logging, checks)
    t_exchange  the allgather of each rank's ceil(k / P) * m fitness slots (padded to the
                busiest rank), modelled with the latency-bandwidth (alpha-beta) model of
                Hockney (1994) and the algorithms of Thakur, Rabenseifner and Gropp,
                "Optimization of collective communication operations in MPICH", IJHPCA 19(1),
                2005 (n = total bytes gathered, P * ceil(k / P) * m * itemsize):
                  ring:               (P-1) * alpha + (P-1)/P * n * beta
                  recursive doubling: log2(P) * alpha + (P-1)/P * n * beta
                MPI libraries switch between them by message size and rank count; the model
                takes the smaller.

An allreduce of the whole buffer (hpcevo's first exchange: a bitwise-OR merge) is there for
comparison:
    recursive doubling (small messages): log2(P) * (alpha + n * beta)
    Rabenseifner (large messages):      2 log2(P) * alpha + 2 (P-1)/P * n * beta

Alpha and beta are fitted to measurements (``fit_alpha_beta``) or taken from the network at hand;
``NETWORKS`` holds typical values. Parallel efficiency is T(1) / (P * T(P)).

Where the model stops holding: it has no term for load imbalance between candidates (a varying
evaluation cost makes every generation wait for the slowest rank), for operating-system noise,
which grows with rank count, for network contention between jobs, for GPU transfers (device to
host before MPI unless CUDA-aware MPI is used), or for ranks sharing cores. Past ``P = k`` extra
ranks get no micro-batch and only add exchange cost: raise ``k`` with a smaller
``parallel.microbatch``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

# Typical network parameters (alpha: seconds per message, beta: seconds per byte). Inputs, not
# measurements: use fit_alpha_beta on your own cluster's figures where you have them.
NETWORKS: dict[str, tuple[float, float]] = {
    # InfiniBand HDR (200 Gb/s): ~1.5-2 us MPI latency between nodes, ~23 GB/s per link.
    "ib-hdr": (2.0e-6, 1 / 23e9),
    # InfiniBand EDR (100 Gb/s).
    "ib-edr": (2.5e-6, 1 / 11.5e9),
    # 25 Gb/s Ethernet with TCP.
    "eth-25g": (15e-6, 1 / 2.8e9),
}


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    alpha: float  # seconds per message
    beta: float  # seconds per byte

    def allgather(self, p: int, total_bytes: float, algorithm: str = "best") -> float:
        if p <= 1:
            return 0.0
        bw = (p - 1) / p * total_bytes * self.beta
        ring = (p - 1) * self.alpha + bw
        rd = math.ceil(math.log2(p)) * self.alpha + bw
        return {"ring": ring, "recursive_doubling": rd, "best": min(ring, rd)}[algorithm]

    def allreduce(self, p: int, nbytes: float) -> float:
        if p <= 1:
            return 0.0
        steps = math.ceil(math.log2(p))
        rd = steps * (self.alpha + nbytes * self.beta)
        rab = 2 * steps * self.alpha + 2 * (p - 1) / p * nbytes * self.beta
        return min(rd, rab)


def network(name: str = "ib-hdr", alpha_us: float | None = None,
            bandwidth_gbs: float | None = None) -> tuple[AlphaBeta, str]:
    """A network by name (``NETWORKS``), with ``alpha_us`` (latency, us) or ``bandwidth_gbs``
    (GB/s) overriding its values; and a label saying where the values came from."""
    from ..errors import UsageError

    if name not in NETWORKS:
        raise UsageError(f"--network {name!r}: allowed: {', '.join(NETWORKS)}")
    alpha, beta = NETWORKS[name]
    if alpha_us is None and bandwidth_gbs is None:
        return AlphaBeta(alpha, beta), f"({name})"
    for value, option in ((alpha_us, "--alpha-us"), (bandwidth_gbs, "--bandwidth-gbs")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} {value}: must be a positive number")
    alpha = alpha_us * 1e-6 if alpha_us is not None else alpha
    beta = 1 / (bandwidth_gbs * 1e9) if bandwidth_gbs is not None else beta
    return AlphaBeta(alpha, beta), "(given)"


def workload(pop: int, eval_ms: float, algo_ms: float = 0.0, microbatch: int = 0, float64: bool = False) -> "Workload":
    """A ``Workload`` from the command line's units, every value checked (UsageError)."""
    from ..errors import UsageError

    if pop < 1:
        raise UsageError(f"--pop {pop}: must be >= 1")
    for value, option in ((eval_ms, "--eval-ms"), (algo_ms, "--algo-ms"), (microbatch, "--microbatch")):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{option} {value}: must be a number >= 0")
    if eval_ms == 0 and algo_ms == 0:
        raise UsageError("--eval-ms 0 and --algo-ms 0: a generation that costs nothing cannot be projected; "
                         "give the milliseconds one evaluation takes (--eval-ms)")
    return Workload(pop=pop, eval_s=eval_ms * 1e-3, algo_s=algo_ms * 1e-3, microbatch=microbatch,
                    itemsize=8 if float64 else 4)


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> AlphaBeta:
    """Fit t = alpha + beta * size to measurements by least squares on the relative error.

    Sizes span six orders of magnitude: a plain least-squares fit is ruled by the largest
    messages and leaves alpha (the small-message cost, which decides the exchange of a fitness
    vector) to their noise; weighting each point by 1 / t^2 gives every size the same say."""
    n = len(sizes)
    if n < 2:
        raise ValueError("need at least two sizes to fit alpha and beta")
    w = [1.0 / (t * t) for t in times]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes)) / sw
    my = sum(wi * y for wi, y in zip(w, times)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes))
    beta = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes, times)) / sxx
    alpha = my - beta * mx
    return AlphaBeta(max(alpha, 0.0), max(beta, 0.0))


@dataclasses.dataclass(frozen=True)
class Workload:
    pop: int  # candidates evaluated per generation
    eval_s: float  # seconds per candidate
    algo_s: float = 0.0  # seconds of replicated ask + tell per generation
    host_s: float = 0.0  # per-generation share of the host's boundary work
    microbatch: int = 0  # rows per micro-batch (0: hpcevo's default)
    itemsize: int = 4  # bytes per fitness value (float32; 8 for float64)

    @property
    def rows(self) -> int:
        from ..parallel.evaluate import microbatch_rows

        return microbatch_rows(self.pop, self.microbatch or None)

    @property
    def microbatches(self) -> int:
        return -(-self.pop // self.rows)


def step_time(w: Workload, p: int, net: AlphaBeta) -> dict[str, float]:
    """Modelled seconds per generation at ``p`` ranks, split into its terms."""
    k, m = w.microbatches, w.rows
    evaluate = math.ceil(k / p) * m * w.eval_s
    exchange = net.allgather(p, p * math.ceil(k / p) * m * w.itemsize)
    total = w.algo_s + evaluate + exchange + w.host_s
    return {"ranks": p, "algo_s": w.algo_s, "eval_s": evaluate, "exchange_s": exchange,
            "host_s": w.host_s, "step_s": total}


def project(w: Workload, ranks: Sequence[int], net: AlphaBeta) -> list[dict[str, float]]:
    """Step time, speed-up and parallel efficiency at each rank count (relative to one rank)."""
    t1 = step_time(w, 1, net)["step_s"]
    rows = []
    for p in ranks:
        r = step_time(w, p, net)
        r["speedup"] = t1 / r["step_s"]
        r["efficiency"] = r["speedup"] / p
        r["busy_ranks"] = min(p, w.microbatches)
        rows.append(r)
    return rows


def render(w: Workload, rows: list[dict[str, float]], net: AlphaBeta, label: str = "") -> str:
    lines = [
        f"pop {w.pop} in {w.microbatches} micro-batches of {w.rows}; evaluation {w.eval_s * 1e3:.3g} ms per "
        f"candidate; ask+tell {w.algo_s * 1e3:.3g} ms; network alpha {net.alpha * 1e6:.3g} us, "
        f"beta {1 / net.beta / 1e9:.3g} GB/s {label}".rstrip(),
        f"{'ranks':>6} {'busy':>5} {'step ms':>10} {'eval ms':>10} {'exchange ms':>12} {'speed-up':>9} {'efficiency':>11}",
    ]
    for r in rows:
        lines.append(f"{r['ranks']:>6} {r['busy_ranks']:>5} {r['step_s'] * 1e3:>10.3f} {r['eval_s'] * 1e3:>10.3f} "
                     f"{r['exchange_s'] * 1e3:>12.4f} {r['speedup']:>9.1f} {100 * r['efficiency']:>10.1f}%")
    return "\n".join(lines)


def plot(w: Workload, rows: list[dict[str, float]], path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = [r["ranks"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for key, label in (("step_s", "step"), ("eval_s", "evaluation"), ("exchange_s", "exchange"), ("algo_s", "ask+tell")):
        a.plot(p, [max(r[key], 1e-12) * 1e3 for r in rows], marker="o", label=label)
    a.set(xscale="log", yscale="log", xlabel="ranks", ylabel="ms per generation")
    a.set_xscale("log", base=2)
    a.legend()
    a.grid(True, alpha=0.3)
    b.plot(p, [100 * r["efficiency"] for r in rows], marker="o")
    b.set_xscale("log", base=2)
    b.set(xlabel="ranks", ylabel="parallel efficiency (%)", ylim=(0, 105))
    b.grid(True, alpha=0.3)
    fig.suptitle(title or f"hpcevo model: pop {w.pop}, {w.eval_s * 1e3:.3g} ms per candidate")
    fig.savefig(path, dpi=120)
    plt.close(fig)
