"""A study of many short runs in one job against one launch per run (a shell loop, a job array).

    python benchmarks/study_launches.py              # 200 runs on 2 ranks (about 10 minutes on 2 cores)
    python benchmarks/study_launches.py --runs 40    # a quicker look

The same runs (2 algorithms x 2 problems x runs/4 seeds; 20 generations of 16 candidates in 5-D:
seconds of work in all, so what is measured is what each launch costs) three ways, each on the
same 2 ranks:

  - ``study``: ``mpiexec -n 2 python -m hpcevo study FILE`` (groups of 1 rank take the runs);
  - ``loop x2``: two shell loops side by side, each launching ``python -m hpcevo run`` for half of
    the runs (one rank each: what a job array of one-rank tasks does on those 2 ranks);
  - ``mpiexec loop``: one loop of ``mpiexec -n 2 python -m hpcevo run`` per run (each run on both
    ranks).

Every way first runs once untimed, so JAX's compilation cache is warm for all of them (a study
compiles each program once per group anyway; launches load it from the cache). Also: the share
of rank-time the study left idle (its journal) and the time ``load_study`` takes to expand and
check a study of 2,000 runs (median of 3). Writes benchmarks/results/study.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUDY = """
[study]
name = "bench"
out = "{out}"
seeds = {seeds}

[base]
run.generations = 20
algorithm.pop_size = 16
problem.dim = 5
log.every = 10

[[axis]]
key = "algorithm.name"
values = ["cso", "de"]

[[axis]]
key = "problem.name"
values = ["sphere", "rastrigin"]
"""


def sh(cmd: list[str], cwd: Path) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")


def timed_study(work: Path, seeds: int, tag: str) -> tuple[float, dict]:
    out = work / f"study-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    path = work / f"study-{tag}.toml"
    path.write_text(STUDY.format(out=out, seeds=seeds))
    t = time.perf_counter()
    sh(["mpiexec", "-n", "2", sys.executable, "-m", "hpcevo", "study", str(path), "-q"], work)
    wall = time.perf_counter() - t
    events = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    return wall, events[-1]


def run_configs(work: Path, seeds: int, tag: str) -> list[Path]:
    """One run config file per run of the study (what a shell loop or an array would launch)."""
    from hpcevo.studies.spec import load_study

    import tomli_w

    study = load_study({"study": {"out": str(work / f"loop-{tag}"), "seeds": seeds}, "base": {
        "run": {"generations": 20}, "algorithm": {"pop_size": 16}, "problem": {"dim": 5}, "log": {"every": 10}},
        "axis": [{"key": "algorithm.name", "values": ["cso", "de"]},
                 {"key": "problem.name", "values": ["sphere", "rastrigin"]}]}, check=False)
    shutil.rmtree(work / f"loop-{tag}", ignore_errors=True)
    files = []
    for r in study.runs:
        f = work / "configs" / f"{tag}-{r.name}.toml"
        f.parent.mkdir(exist_ok=True)
        f.write_text(tomli_w.dumps(r.data))
        files.append(f)
    return files


def timed_loops(work: Path, files: list[Path], launcher: list[str], streams: int) -> float:
    def stream(part: list[Path]) -> None:
        for f in part:
            sh([*launcher, sys.executable, "-m", "hpcevo", "run", str(f), "-q"], work)

    t = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(stream, [files[i::streams] for i in range(streams)]))
    return time.perf_counter() - t


def validation_seconds() -> float:
    from hpcevo.studies.spec import load_study

    spec = {"study": {"seeds": 100}, "base": {"run": {"generations": 500}, "problem": {"dim": 30}},
            "axis": [{"key": "algorithm.name", "values": ["cso", "de", "pso", "cmaes"]},
                     {"key": "problem.name", "values": ["sphere", "rastrigin", "ackley", "rosenbrock", "griewank"]}]}
    times = []
    for _ in range(3):
        t = time.perf_counter()
        study = load_study(spec)
        times.append(time.perf_counter() - t)
        assert len(study.runs) == 2000
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200, help="runs (a multiple of 4)")
    args = p.parse_args()
    seeds = max(1, args.runs // 4)
    runs = 4 * seeds
    work = Path(tempfile.mkdtemp(prefix="hpcevo-bench-study-"))
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(work / "jax-cache"))
    try:
        timed_study(work, 1, "warm")  # warm: every program compiled once into the cache
        for f in run_configs(work, 1, "warm"):
            sh([sys.executable, "-m", "hpcevo", "run", str(f), "-q"], work)
        study_s, finished = timed_study(work, seeds, "timed")
        loop_s = timed_loops(work, run_configs(work, seeds, "x2"), [], 2)
        mpi_s = timed_loops(work, run_configs(work, seeds, "mpi"), ["mpiexec", "-n", "2"], 1)
        check_s = validation_seconds()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "runs": runs, "ranks": 2, "study_s": study_s, "loop_x2_s": loop_s, "mpiexec_loop_s": mpi_s,
        "speedup_vs_loop_x2": loop_s / study_s, "speedup_vs_mpiexec_loop": mpi_s / study_s,
        "study_idle": finished["idle"], "validate_2000_runs_s": check_s,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "study.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{runs} runs on 2 ranks ({os.cpu_count()} cores), seconds, warm compilation cache")
    print(f"| way | wall s | per run s | study is faster by |\n|---|---|---|---|")
    for label, s in (("study (one job)", study_s), ("2 shell loops of hpcevo run", loop_s),
                     ("loop of mpiexec -n 2 hpcevo run", mpi_s)):
        print(f"| {label} | {s:.1f} | {s / runs:.3f} | {s / study_s:.1f}x |")
    print(f"study: {finished['idle']:.1%} of rank-time idle; load_study of 2,000 runs: {check_s:.2f} s")


if __name__ == "__main__":
    main()
