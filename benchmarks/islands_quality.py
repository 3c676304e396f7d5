"""Solution quality of 8 islands against one population of the same total size, on the same
evaluations: CSO and DE, on Rastrigin and Schwefel (dim 50) and CEC 2022 F4 (dim 20), 10 seeds.

    python benchmarks/islands_quality.py                     # about 10 minutes on 2 cores
    python benchmarks/islands_quality.py --seeds 3 --generations 300
Writes benchmarks/results/islands_quality.json, docs/img/islands_quality.png, and prints a table
(median and quartiles of the final best fitness; lower is better), whichever way it falls.

Both sides run the same algorithm with the same hyper-parameters: one population of 8 x P, or 8
islands of P each (ring, the 5 best of each island replace the 5 worst of the next every 25
generations), for the same number of generations, hence the same evaluations. Seed s of one side
is not paired with seed s of the other (different streams); the comparison is of distributions.
Quality does not depend on the rank count (every layout gives the same bits), so this runs on
one rank.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROBLEMS = (("rastrigin", 50), ("schwefel", 50), ("cec2022_f4", 20))
ALGORITHMS = ("cso", "de")


def finals(name: str, problem_name: str, dim: int, islands: int, pop: int, generations: int, seeds: int,
           migration) -> list[float]:
    import hpcevo
    from hpcevo.algorithms import ALGORITHMS as BY_NAME
    from hpcevo.problems import create

    ctx = hpcevo.parallel.init()
    problem = create(problem_name, dim)
    cls = BY_NAME[name]
    if islands == 1:
        runner = hpcevo.Loop(cls(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub), problem, ctx)
    else:
        algorithms = [cls(pop_size=pop, dim=dim, lb=problem.lb, ub=problem.ub) for _ in range(islands)]
        runner = hpcevo.Archipelago(algorithms, problem, ctx, migration)
    out = []
    for seed in range(seeds):
        runner.init(seed).advance(generations - 1)
        out.append(runner.best_fitness)
    return out, runner.evaluations


def quartiles(v: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return float(q1), float(med), float(q3)


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PROBLEMS), figsize=(4.2 * len(PROBLEMS), 3.8))
    for ax, (pname, dim) in zip(axes, PROBLEMS):
        mine = [r for r in rows if r["problem"] == pname]
        data, labels = [], []
        for r in mine:
            data += [r["one_population"], r["islands"]]
            labels += [f"{r['algorithm']}\none pop", f"{r['algorithm']}\n8 islands"]
        box = ax.boxplot(data, patch_artist=True, widths=0.6)
        for i, patch in enumerate(box["boxes"]):
            patch.set_facecolor("C0" if i % 2 == 0 else "C1")
            patch.set_alpha(0.5)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_title(f"{pname} (dim {dim})", fontsize=10)
        ax.set_ylabel("final best fitness (lower is better)", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"8 islands vs one population of the same size and evaluations ({len(rows[0]['islands'])} seeds)",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--island-pop", type=int, default=50)
    args = ap.parse_args()
    import hpcevo

    migration = hpcevo.Migration(every=25, migrants=5, topology="ring", emigrants="best", replace="worst")
    rows = []
    for pname, dim in PROBLEMS:
        for name in ALGORITHMS:
            one, evals_one = finals(name, pname, dim, 1, 8 * args.island_pop, args.generations, args.seeds, migration)
            isl, evals_isl = finals(name, pname, dim, 8, args.island_pop, args.generations, args.seeds, migration)
            assert evals_one == evals_isl, (evals_one, evals_isl)
            rows.append({"problem": pname, "dim": dim, "algorithm": name, "evaluations": evals_one,
                         "one_population": one, "islands": isl})
            print(f"{pname} {name}: done", flush=True)
    path = HERE / "results" / "islands_quality.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generations": args.generations, "island_pop": args.island_pop,
                                "migration": migration._asdict(), "rows": rows}, indent=1) + "\n")
    figure(rows, HERE.parent / "docs" / "img" / "islands_quality.png")
    print("| problem | algorithm | evaluations | one population of 400: median [q1, q3] | "
          "8 islands of 50: median [q1, q3] | islands / one (medians) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b = quartiles(r["one_population"]), quartiles(r["islands"])
        print(f"| {r['problem']} ({r['dim']}) | {r['algorithm']} | {r['evaluations']} | {a[1]:.4g} [{a[0]:.4g}, {a[2]:.4g}] | "
              f"{b[1]:.4g} [{b[0]:.4g}, {b[2]:.4g}] | {b[1] / a[1] if a[1] else float('nan'):.3f} |")
    print(f"({args.seeds} seeds, {args.generations} generations; {path})")


if __name__ == "__main__":
    main()
