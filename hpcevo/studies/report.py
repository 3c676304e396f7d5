"""``hpcevo study report``: a study's runs as a paper reports them. One process, no MPI.

Per problem and configuration: n, the median and quartiles of the final best, the success rate
and the expected running time to the target, ERT (evaluations summed over all runs, each up to
the first generation that reached the target or to its end, divided by the runs that reached
it; Hansen et al., "Real-Parameter Black-Box Optimization Benchmarking: Experimental Setup",
COCO 2009/2021). Against the baseline configuration: the Wilcoxon rank-sum test of the final
bests on each problem (two-sided, ``scipy.stats.mannwhitneyu``), Holm-corrected over all those
comparisons; over the problems, the Friedman test of the configurations' median final bests
(``scipy.stats.friedmanchisquare``, three configurations or more) with their mean ranks, and the
Wilcoxon signed-rank test of each configuration against the baseline over the problems
(``scipy.stats.wilcoxon``), Holm-corrected (Holm 1979, "A simple sequentially rejective multiple
test procedure"; Demsar 2006, "Statistical comparisons of classifiers over multiple data sets").

Figures: the best so far against evaluations (median and quartile band per configuration, one
panel per problem); the empirical runtime distribution (the share of run-target pairs reached
against evaluations, over all problems, 51 targets per problem as COCO does); box plots of the
final bests. Lower is better throughout (multi-objective runs: the final IGD).

BBOB runs are judged as COCO judges them: every value is the precision f - f_opt (the
instance's optimum is known), a problem is a function in a dimension and its instances are the
repeats (so the instances of f1 in 5-D are one problem's n runs, not n problems of one run
each), success and ERT are at the target precision (default COCO's final 1e-8) with the exact
evaluation counts of the run's own COCO data where it wrote some (``log.coco``), and the runtime
distribution uses COCO's 51 targets 1e2 .. 1e-8 (Hansen et al., "COCO: Performance assessment",
2016/2021). The numbers agree with ``cocopp``'s on the same runs (tests/test_study_bbob.py).
Other problems whose optimum is known (a CEC 2022 function's bias, a built-in function's
minimum: ``summary.json``'s ``f_opt``) are judged in f - f_opt too, the target included, and
their runtime distribution's targets count down from the optimum, not from the best run found.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..driver.rundir import write_new
from ..errors import UsageError
from .journal import states
from .spec import Study

ALPHA = 0.05
TARGETS = 51  # per problem, as COCO's runtime distributions use
COCO_TARGETS = np.logspace(2, -8, TARGETS)  # precisions f - f_opt: COCO's bbob targets
COCO_FINAL_TARGET = 1e-8


@dataclasses.dataclass
class RunData:
    name: str
    configuration: str
    problem: str
    final: float  # the final best (minimised)
    evals: np.ndarray  # evaluations after each generation (BBOB with COCO data: at each improvement)
    best: np.ndarray  # the best so far after each generation (a known optimum: its precision f - f_opt)
    bbob: bool = False  # problem = function and dimension (instances are its runs); COCO's targets
    known: bool = False  # the optimum is known: values are precisions f - f_opt (BBOB, CEC, built-ins)


@dataclasses.dataclass
class Report:
    markdown: str
    rows: list[dict[str, Any]]  # one per (problem, configuration)
    overall: dict[str, Any]
    files: list[Path]


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; NaN stays NaN): the i-th smallest
    of m is multiplied by m - i, then made non-decreasing in that order, capped at 1."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * pvalues[i]))
        out[i] = running
    return out


def ert(runs: list[RunData], target: float) -> tuple[float, int]:
    """(ERT to ``target``, runs that reached it): evaluations until the first generation whose best
    so far is <= target, or all of a run's evaluations when it never got there, summed over the
    runs and divided by the runs that reached it (inf when none did)."""
    spent, hits = 0.0, 0
    for r in runs:
        reached = np.flatnonzero(r.best <= target)
        if reached.size:
            hits += 1
            spent += float(r.evals[reached[0]])
        else:
            spent += float(r.evals[-1]) if r.evals.size else 0.0
    return (spent / hits if hits else math.inf), hits


def load_runs(study: Study) -> list[RunData]:
    """The done runs' final bests and histories (BBOB runs: as precisions, ``_bbob_run``)."""
    from ..tools.inspection import history_of

    out = []
    for s in states(study):
        if s.state != "done" or s.summary is None:
            continue
        bbob = _bbob_run(s.run, s.summary)
        if bbob is not None:
            out.append(bbob)
            continue
        hist, evals, _, kind = history_of(s.run.out)
        if kind == "multi-objective":
            series = np.asarray(hist["igd"], float)
            best = np.fmin.accumulate(np.where(np.isnan(series), np.inf, series))
            final = float(best[-1]) if best.size else math.nan
        else:
            best = np.asarray(hist["best"], float)
            final = float(s.summary.get("best_fitness", best[-1] if best.size else math.nan))
        fopt = s.summary.get("f_opt") if kind != "multi-objective" else None
        if isinstance(fopt, (int, float)):
            # (a CEC function's optimum is its bias, 300 to 2700: raw values would judge the
            # bias, and a target of 1e-8 would never be met)
            best, final = best - float(fopt), float(s.summary.get("best_precision", final - float(fopt)))
        out.append(RunData(s.run.name, s.run.configuration, s.run.problem, final, np.asarray(evals, float), best,
                           known=isinstance(fopt, (int, float))))
    return out


def _bbob_run(run, summary: dict[str, Any]) -> RunData | None:
    """A BBOB run as COCO sees it, or None for other problems: its problem "f<function>-d<dim>"
    (instances are repeats), its best so far as f - f_opt, at the exact evaluations of its COCO
    data when it has some, else at the generations its history records."""
    from ..problems.bbob import _fopt
    from ..tools.inspection import history_of

    p = run.data.get("problem", {})
    if not isinstance(p, dict) or p.get("name") != "bbob":
        return None
    function, instance, dim = int(p.get("function", 1)), int(p.get("instance", 1)), int(p["dim"])
    fopt = _fopt(function, instance)
    evals = best = None
    dats = sorted((Path(run.out) / "coco" / f"data_f{function}").glob(f"bbobexp_f{function}_DIM{dim}*.dat"))
    if dats:
        rows = [line.split() for line in dats[-1].read_text().splitlines() if line and not line.startswith("%")]
        if rows:
            evals = np.asarray([float(r[0]) for r in rows])
            best = np.fmin.accumulate(np.asarray([float(r[2]) for r in rows]))
    if evals is None:
        hist, evals, _, _ = history_of(run.out)
        best = np.asarray(hist["best"], float) - fopt
        evals = np.asarray(evals, float)
    final = float(summary.get("best_fitness", math.nan)) - fopt if summary.get("best_fitness") is not None else (
        float(best[-1]) if best.size else math.nan)
    return RunData(run.name, run.configuration, f"f{function}-d{dim}", final, evals, best, bbob=True, known=True)


def report(study: Study, output: str | Path | None = None, *, baseline: str | None = None,
           target: float | None = None) -> Report:
    """Compute the statistics of ``study``'s done runs; write table.md, table.csv, stats.json and
    the figures into ``output`` (default ``<study out>/report``)."""
    runs = load_runs(study)
    if not runs:
        raise UsageError(f"study {study.name}: no run is done yet in '{study.out}' (hpcevo study status shows "
                         "where the runs stand)")
    configs = [c for c in study.configurations if any(r.configuration == c for r in runs)]
    problems = list(dict.fromkeys(r.problem for r in runs))  # (BBOB: function x dimension, not the labels)
    base = baseline or study.baseline or configs[0]
    if base not in configs:
        raise UsageError(f"--baseline {base!r}: no done run has this configuration (configurations: "
                         f"{', '.join(configs)})")
    bbob = {r.problem for r in runs if r.bbob}
    targets = {p: target if target is not None else (
        study.targets.get(p, study.target if study.target is not None else COCO_FINAL_TARGET) if p in bbob
        else study.target_for(p)) for p in problems}
    rows = _rows(runs, configs, problems, base, targets)
    overall = _overall(rows, configs, problems, base)
    out = Path(output) if output else study.out / "report"
    # The study's own folders are written, never a link planted in their place (an -o the user
    # names may be a link: that is their choice).
    _not_a_link(*(() if output else (out,)), out / "coco", *(out / "coco" / c for c in configs))
    out.mkdir(parents=True, exist_ok=True)
    # (a problem is judged in precisions only where every run of it knows the optimum)
    known = {p for p in problems if all(r.known for r in runs if r.problem == p)}
    text = _markdown(study, rows, overall, configs, problems, base, targets, bbob, known)
    files = [out / "table.md", out / "table.csv", out / "stats.json"]
    write_new(files[0], text + "\n")
    write_new(files[1], _csv(rows))
    write_new(files[2], json.dumps({"study": study.name, "baseline": base, "targets": targets, "rows": rows,
                                    "overall": overall}, indent=1, default=_json) + "\n")
    files += _figures(runs, configs, problems, out, study.name)
    files += coco_folders(study, runs, out / "coco")
    return Report(text, rows, overall, files)


def _not_a_link(*paths: Path) -> None:
    for path in paths:
        if path.is_symlink():
            raise UsageError(f"'{path}' is a symbolic link (to {os.readlink(path)}): a study's report is never "
                             "written through a link planted in its folders (it would land outside them); remove "
                             "it, or name another folder with -o")


def coco_folders(study: Study, runs: list[RunData], out: Path) -> list[Path]:
    """COCO's data of the done runs that wrote some (``log.coco``), gathered per configuration:
    ``<out>/<configuration>/<run>/``, what ``python -m cocopp <out>/<A> <out>/<B>`` compares
    (cocopp merges the instances of a function and dimension found under one folder). Copies,
    rebuilt on every report: a run's own files stay where it wrote them."""
    import shutil

    made = []
    for config in dict.fromkeys(r.configuration for r in runs):
        folder = out / config
        sources = [(r.name, study.out / "runs" / r.name / "coco") for r in runs if r.configuration == config]
        sources = [(name, src) for name, src in sources if src.is_dir()]
        if not sources:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        for name, src in sources:
            shutil.copytree(src, folder / name, ignore=shutil.ignore_patterns(".hpcevo"))
        made.append(folder)
    return made


def _rows(runs: list[RunData], configs: list[str], problems: list[str], base: str,
          targets: dict[str, float | None]) -> list[dict[str, Any]]:
    from scipy import stats

    rows = []
    for p in problems:
        ref = [r.final for r in runs if r.problem == p and r.configuration == base]
        for c in configs:
            mine = [r for r in runs if r.problem == p and r.configuration == c]
            x = np.asarray([r.final for r in mine], float)
            row: dict[str, Any] = {"problem": p, "configuration": c, "n": int(x.size)}
            if x.size:
                q1, med, q3 = np.nanpercentile(x, [25, 50, 75])
                row.update(median=float(med), q1=float(q1), q3=float(q3), best=float(np.nanmin(x)),
                           evaluations=float(np.median([r.evals[-1] if r.evals.size else 0 for r in mine])))
            t = targets[p]
            if t is not None and mine:
                e, hits = ert(mine, t)
                row.update(target=t, successes=hits, success_rate=hits / len(mine), ert=e)
            if c != base and x.size and ref:
                row["p"] = float(stats.mannwhitneyu(x, ref, alternative="two-sided").pvalue)
            rows.append(row)
    compared = [r for r in rows if "p" in r]
    for r, adj in zip(compared, holm([r["p"] for r in compared])):
        r["p_holm"] = adj
        r["verdict"] = _verdict(r["median"], _median_of(rows, r["problem"], base), adj)
    return rows


def _median_of(rows: list[dict[str, Any]], problem: str, config: str) -> float:
    return next(r["median"] for r in rows if r["problem"] == problem and r["configuration"] == config)


def _verdict(mine: float, ref: float, p: float) -> str:
    if math.isnan(p) or p >= ALPHA:
        return "="
    return "better" if mine < ref else "worse" if mine > ref else "="


def _overall(rows: list[dict[str, Any]], configs: list[str], problems: list[str], base: str) -> dict[str, Any]:
    from scipy import stats

    table = np.full((len(problems), len(configs)), np.nan)
    for r in rows:
        if "median" in r:
            table[problems.index(r["problem"]), configs.index(r["configuration"])] = r["median"]
    complete = table[~np.isnan(table).any(axis=1)]
    out: dict[str, Any] = {"problems": len(complete)}
    if len(complete):
        ranks = np.vstack([stats.rankdata(row) for row in complete])
        out["mean_rank"] = dict(zip(configs, map(float, ranks.mean(axis=0))))
    if len(configs) >= 3 and len(complete) >= 2:
        out["friedman_p"] = float(stats.friedmanchisquare(*complete.T).pvalue)
    pvals = {}
    b = configs.index(base)
    for j, c in enumerate(configs):
        if c == base or len(complete) < 2:
            continue
        d = complete[:, j] - complete[:, b]
        pvals[c] = float(stats.wilcoxon(complete[:, j], complete[:, b]).pvalue) if np.any(d != 0) else 1.0
    out["wilcoxon_p"] = pvals
    out["wilcoxon_p_holm"] = dict(zip(pvals, holm(list(pvals.values()))))
    return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.3g}"
    return str(v)


def _count(v: Any) -> str:
    """Evaluations: whole numbers as written, up to ten million."""
    if isinstance(v, float) and math.isfinite(v) and v < 1e7:
        return f"{v:.0f}"
    return _fmt(v)


def _markdown(study: Study, rows, overall, configs, problems, base, targets, bbob=frozenset(),
              known=frozenset()) -> str:
    what = ("final precision f - f_opt (BBOB: COCO's problems, function x dimension; instances are the runs)"
            if bbob and set(problems) <= bbob else "final precision f - f_opt (the optimum is known)"
            if set(problems) <= known else "final best fitness")
    lines = [f"# Study {study.name}: {what} (lower is better)", "",
             f"Baseline: **{base}**. Evaluations: the median a run used. Tests: two-sided Wilcoxon rank-sum "
             f"against the baseline on each problem, Holm-corrected over {sum('p' in r for r in rows)} comparisons; "
             f"better/worse at alpha = {ALPHA}. ERT: expected evaluations to reach the target.", ""]
    for p in problems:
        t = targets[p]
        goal = "" if t is None else f" (target f - f_opt <= {t:g})" if p in known else f" (target {t:g})"
        lines += [f"## {p}{goal}", "",
                  "| configuration | n | evaluations | median | q1 - q3 | best | success | ERT | p (Holm) | vs baseline |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["problem"] != p:
                continue
            success = f"{r['successes']}/{r['n']}" if "successes" in r else "-"
            lines.append(f"| {r['configuration']} | {r['n']} | {_count(r.get('evaluations'))} | "
                         f"{_fmt(r.get('median'))} | "
                         f"{_fmt(r.get('q1'))} - {_fmt(r.get('q3'))} | {_fmt(r.get('best'))} | {success} | "
                         f"{_count(r.get('ert'))} | {_fmt(r.get('p_holm'))} | "
                         f"{r.get('verdict', 'baseline' if r['configuration'] == base else '-')} |")
        lines.append("")
    lines += ["## Over all problems", "",
              f"Mean rank of the median final best over {overall['problems']} problem(s) (1 = best)"
              + (f"; Friedman p = {_fmt(overall['friedman_p'])}" if "friedman_p" in overall else "") + ". "
              "Wilcoxon signed-rank against the baseline over the problems, Holm-corrected.", "",
              "| configuration | mean rank | p (Holm) |", "|---|---|---|"]
    for c in configs:
        rank = overall.get("mean_rank", {}).get(c)
        p = overall["wilcoxon_p_holm"].get(c)
        lines.append(f"| {c} | {_fmt(rank)} | {'baseline' if c == base else _fmt(p)} |")
    return "\n".join(lines)


def _csv(rows: list[dict[str, Any]]) -> str:
    fields = ["problem", "configuration", "n", "evaluations", "median", "q1", "q3", "best", "target", "successes",
              "success_rate", "ert", "p", "p_holm", "verdict"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def _json(v: Any) -> Any:
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return repr(v)


# -- figures ------------------------------------------------------------------------------------
def _figures(runs: list[RunData], configs: list[str], problems: list[str], out: Path, name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(configs)}
    made = []
    for fname, draw in (("convergence.png", _convergence), ("ecdf.png", _ecdf), ("final.png", _boxes)):
        fig = draw(plt, runs, configs, problems, colors, name)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        write_new(out / fname, buf.getvalue())
        made.append(out / fname)
    return made


def _grid(plt, n: int, title: str):
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.6), squeeze=False,
                             constrained_layout=True)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, list(axes.flat[:n])


def _log_if_decades(ax, values: np.ndarray) -> None:
    v = values[np.isfinite(values)]
    if v.size and v.min() > 0 and v.max() / v.min() > 100:
        ax.set_yscale("log")
    elif v.size and v.min() <= 0 < v.max() and v.max() / max(abs(v[v != 0]).min(), 1e-300) > 100:
        ax.set_yscale("symlog", linthresh=float(max(abs(v[v != 0]).min(), v.max() * 1e-12)))


def _convergence(plt, runs, configs, problems, colors, name):
    fig, axes = _grid(plt, len(problems), f"{name}: best so far (median and quartiles over the runs)")
    for ax, p in zip(axes, problems):
        shown = []
        for c in configs:
            mine = [r for r in runs if r.problem == p and r.configuration == c]
            if not mine:
                continue
            if any(r.bbob for r in mine):  # (steps at each run's own improvements: one grid for all)
                evals = np.unique(np.concatenate([r.evals for r in mine]))
                curves = np.vstack([_step_at(r, evals) for r in mine])
            else:
                n = max(len(r.best) for r in mine)
                curves = np.vstack([np.pad(r.best, (0, n - len(r.best)), mode="edge") for r in mine])
                evals = max(mine, key=lambda r: len(r.evals)).evals
            q1, med, q3 = np.nanpercentile(curves, [25, 50, 75], axis=0)
            ax.plot(evals, med, color=colors[c], label=f"{c} (n={len(mine)})", lw=1.6)
            ax.fill_between(evals, q1, q3, color=colors[c], alpha=0.2, lw=0)
            shown.append(curves)
        ax.set_title(p)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best f - f_opt so far" if any(r.known for r in runs if r.problem == p) else "best so far")
        if shown:
            _log_if_decades(ax, np.concatenate([s.ravel() for s in shown]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _step_at(r: RunData, evals: np.ndarray) -> np.ndarray:
    """The run's best so far at ``evals`` (NaN before its first value; its last value after its end)."""
    i = np.searchsorted(r.evals, evals, side="right") - 1
    return np.where(i >= 0, r.best[np.clip(i, 0, None)], np.nan)


def problem_targets(runs: list[RunData]) -> np.ndarray:
    """51 targets for one problem's runs: log-spaced precisions above its optimum (0 where the
    values are precisions f - f_opt; else the best value any run found, the stand-in for an
    optimum no one gave), from the median first best down to 1e-8 of that range, as COCO's
    1e2 .. 1e-8."""
    lo = 0.0 if all(r.known for r in runs) else min(float(np.nanmin(r.best)) for r in runs)
    first = float(np.nanmedian([r.best[0] for r in runs]))
    span = max(first - lo, 1e-300)
    return lo + span * np.logspace(0, -8, TARGETS)


def _ecdf(plt, runs, configs, problems, colors, name):
    fig, ax = plt.subplots(figsize=(7.5, 4.6), constrained_layout=True)
    bbob = {r.problem for r in runs if r.bbob}
    targets = {p: COCO_TARGETS if p in bbob else problem_targets([r for r in runs if r.problem == p])
               for p in problems}
    top = max(float(r.evals[-1]) for r in runs if r.evals.size)
    low = min(float(r.evals[0]) for r in runs if r.evals.size)
    grid = np.logspace(math.log10(max(low / 2, 1.0)), math.log10(max(top, 2 * low, 10.0)), 200)
    for c in configs:
        hits, pairs, budget = [], 0, 0.0
        for r in (r for r in runs if r.configuration == c):
            budget = max(budget, float(r.evals[-1]) if r.evals.size else 0.0)
            for t in targets[r.problem]:
                pairs += 1
                reached = np.flatnonzero(r.best <= t)
                if reached.size:
                    hits.append(float(r.evals[reached[0]]))
        if not pairs:
            continue
        x = np.append(grid[grid < budget], budget)  # (a curve ends where its runs' budget ends: the cross)
        share = np.searchsorted(np.sort(hits), x, side="right") / pairs
        ax.step(x, share, where="post", color=colors[c], lw=1.8, label=f"{c}")
        ax.plot([budget], [share[-1]], marker="x", color=colors[c], ms=9, mew=2)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("evaluations")
    ax.set_ylabel("share of (run, target) pairs reached")
    ax.set_title(f"{name}: runtime distribution over {len(problems)} problem(s), {TARGETS} targets each "
                 "(x: the runs' budget)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9, loc="lower right")
    return fig


def _boxes(plt, runs, configs, problems, colors, name):
    fig, axes = _grid(plt, len(problems), f"{name}: final best per configuration")
    for ax, p in zip(axes, problems):
        data, labels = [], []
        for c in configs:
            x = [r.final for r in runs if r.problem == p and r.configuration == c]
            if x:
                data.append(x)
                labels.append(c)
        parts = ax.boxplot(data, patch_artist=True, widths=0.6, showfliers=False,  # (every run is a dot)
                           medianprops={"color": "k"})
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=8)
        for patch, c in zip(parts["boxes"], labels):
            patch.set_facecolor(colors[c])
            patch.set_alpha(0.5)
        for i, x in enumerate(data, start=1):
            ax.scatter(np.full(len(x), i) + np.linspace(-0.12, 0.12, len(x)), x, s=8, color="k", alpha=0.6,
                       zorder=3)
        ax.set_title(p)
        ax.set_ylabel("final f - f_opt" if any(r.known for r in runs if r.problem == p) else "final best")
        _log_if_decades(ax, np.concatenate([np.asarray(x, float) for x in data]))
        ax.grid(alpha=0.3, axis="y")
    return fig
