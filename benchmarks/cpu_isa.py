"""What compiling for AVX2 (hpcevo's default on x86-64, for bits that do not depend on the CPU)
costs against compiling for this machine's own instruction set.

    python benchmarks/cpu_isa.py

CSO, PSO and DE on Rastrigin (pop 1,024, dim 100, one rank, one thread): milliseconds per
generation of ``Loop.advance(256)`` in a process whose ``XLA_FLAGS`` say
``--xla_cpu_max_isa=AVX2``, and in one that names the newest set this CPU has (AVX512 where the
CPU has it; hpcevo adds no flag when the user sets one). Each process warms its programs first;
the two alternate, 5 rounds each, medians and ranges. Writes benchmarks/results/cpu_isa.json and
prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = 5
WORKER = r"""
import json, sys, time
import jax
import hpcevo
from hpcevo.algorithms import CSO, DE, PSO
ctx = hpcevo.parallel.init()
p = hpcevo.problems.make_problem("rastrigin", 100)
out = {}
for cls in (CSO, PSO, DE):
    loop = hpcevo.Loop(cls(pop_size=1024, dim=100, lb=p.lb, ub=p.ub), p, ctx).init(0)
    loop.advance(256); jax.block_until_ready(loop.state)
    t = time.perf_counter(); loop.advance(256); jax.block_until_ready(loop.state)
    out[cls.__name__] = (time.perf_counter() - t) / 256 * 1e3
print(json.dumps(out))
"""


def native_isa() -> str:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "AVX512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "SSE4_2"


def one(isa: str) -> dict[str, float]:
    env = {**os.environ, "XLA_FLAGS": f"--xla_cpu_max_isa={isa}"}
    r = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit("an x86-64 question: this machine is " + platform.machine())
    native = native_isa()
    runs: dict[str, list[dict[str, float]]] = {"AVX2": [], native: []}
    for _ in range(ROUNDS):
        for isa in runs:
            runs[isa].append(one(isa))
    rows = {}
    for alg in runs["AVX2"][0]:
        a = [r[alg] for r in runs["AVX2"]]
        b = [r[alg] for r in runs[native]]
        rows[alg] = {"avx2_ms": statistics.median(a), "native_ms": statistics.median(b),
                     "avx2_range": [min(a), max(a)], "native_range": [min(b), max(b)],
                     "ratio": statistics.median(a) / statistics.median(b)}
    result = {"native": native, "cpu": platform.processor() or platform.machine(), "rows": rows,
              "pop": 1024, "dim": 100, "rounds": ROUNDS}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "cpu_isa.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"ms per generation, pop 1,024, dim 100, Rastrigin, 1 rank (native: {native})")
    print("| algorithm | AVX2 | native | AVX2 / native |\n|---|---|---|---|")
    for alg, r in rows.items():
        print(f"| {alg} | {r['avx2_ms']:.3f} | {r['native_ms']:.3f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
