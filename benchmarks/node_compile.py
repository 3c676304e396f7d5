"""A run's first launch at N ranks on one node: every rank compiling its programs, or the node
compiling each program once (hpcevo/parallel/compiling.py).

    python benchmarks/node_compile.py                       # 1, 2 and 4 ranks, CSO and CMA-ES
    python benchmarks/node_compile.py --ranks 2 4 8 --repeats 3

Each row: ``mpiexec -n N python -m hpcevo run CONFIG`` (the config's own generations cut to
20), over an empty compilation cache of its own, with ``HPCEVO_NODE_COMPILE=every`` (each rank
compiles for itself: hpcevo before) and with the default (``once``), in alternating order. Measured:
the job's wall time and the CPU time of all its processes (user + system, from the kernel's
accounting of the finished children), medians of ``--repeats``, and the run's digest (the same
both ways). Where the ranks share fewer cores than they are (a test machine, a shared node), the
CPU saved is wall time saved. Writes benchmarks/results/node-compile-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {"cso": ROOT / "examples" / "cso.toml", "cmaes": ROOT / "examples" / "bbob_f8.toml"}


def launch(config: Path, ranks: int, mode: str, work: Path, mpiexec: str) -> dict:
    cache = work / f"cache-{mode}-{ranks}-{time.monotonic_ns()}"
    cache.mkdir(mode=0o700)
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "HPCEVO_NODE_COMPILE": mode}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    out = work / f"run-{mode}-{ranks}"
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "hpcevo", "run", str(config), "--quiet", "--overwrite",
           "--set", "run.generations=20", "--set", f"run.out={out}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    shutil.rmtree(cache, ignore_errors=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "digest": summary["state_digest"],
            "compile_s": summary.get("compile_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mpiexec", default=os.environ.get("HPCEVO_MPIEXEC", "mpiexec"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="hpcevo-node-compile-") as tmp:
        work = Path(tmp)
        for name in args.configs:
            launch(CONFIGS[name], 1, "once", work, args.mpiexec)  # (warm: imports, the OS's file cache)
            for n in args.ranks:
                got = rows[f"{name}, {n} rank(s)"] = {"every": [], "once": []}
                for r in range(args.repeats):
                    for mode in (("every", "once") if r % 2 == 0 else ("once", "every")):
                        got[mode].append(launch(CONFIGS[name], n, mode, work, args.mpiexec))
                print(f"{name} {n}: " + ", ".join(f"{m} {statistics.median(x['wall_s'] for x in v):.1f} s wall, "
                                                   f"{statistics.median(x['cpu_s'] for x in v):.1f} s CPU"
                                                   for m, v in got.items()), flush=True)
    print(f"\n| first launch, empty cache ({os.cpu_count()} cores) | wall, each rank compiles | wall, once a node "
          "| ratio | CPU, each rank | CPU, once a node | ratio | same digest |")
    print("|---|---|---|---|---|---|---|---|")
    for key, got in rows.items():
        med = {m: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s")} for m, v in got.items()}
        digests = {x["digest"] for v in got.values() for x in v}
        e, o = med["every"], med["once"]
        print(f"| {key} | {e['wall_s']:.1f} s | {o['wall_s']:.1f} s | {o['wall_s'] / e['wall_s']:.2f}x "
              f"| {e['cpu_s']:.1f} s | {o['cpu_s']:.1f} s | {o['cpu_s'] / e['cpu_s']:.2f}x | {len(digests) == 1} |")
    out = Path(args.out) if args.out else HERE / "results" / f"node-compile-{time.strftime('%Y%m%d-%H%M')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                               "repeats": args.repeats, "rows": rows}, indent=1))
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
