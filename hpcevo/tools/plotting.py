"""``hpcevo plot``: pictures of one run, or of several side by side. One process, no MPI.

One single-objective run: best so far (the headline), the generation's best, mean and spread
(what the population does), and best so far against evaluations with wall-clock time on the top
axis (what it cost). One multi-objective run: the final front, hypervolume and IGD over time.
Several runs (seeds, a sweep's job array): runs that differ only in seed form one group, drawn
as its median and quartiles; runs whose configs differ in anything else are groups of their own,
labelled with what differs.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np

from ..driver.result import RunRecord
from ..driver.rundir import write_new
from ..errors import UsageError
from .inspection import history_of

# Config keys that do not make two runs different experiments.
_SAME_EXPERIMENT = ("run.seed", "run.name", "run.out", "checkpoint.", "log.", "parallel.")


@dataclasses.dataclass
class Curves:
    """What a picture needs of one run."""

    path: Path
    kind: str
    gens: np.ndarray
    evals: np.ndarray
    hist: dict[str, np.ndarray]
    source: str
    config: dict[str, Any]
    wall: tuple[np.ndarray, np.ndarray]  # (evaluations, seconds) at each log boundary
    front: np.ndarray | None  # the final front's objectives (multi-objective)


def load(path: str | Path) -> Curves:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"'{path}' not found")
    hist, evals, source, kind = history_of(path)
    gens = hist.get("generation", np.arange(1, len(evals) + 1))
    config, wall, front = {}, (np.zeros(0), np.zeros(0)), None
    if path.is_dir():
        run = RunRecord(path)
        config = run.config or {}
        m = run.metrics
        if "wall_s" in m and "evaluations" in m:
            wall = (m["evaluations"], m["wall_s"])
        summary = run.summary or {}
        if summary.get("front_f"):
            front = np.asarray(summary["front_f"], dtype=float)
    return Curves(path, kind, np.asarray(gens), np.asarray(evals), hist, source, config, wall, front)


def plot(paths: list[str | Path], output: str | Path | None = None) -> Path:
    """Draw one run (``len(paths) == 1``) or a comparison; write a PNG and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load(p) for p in paths]
    kinds = {r.kind for r in runs}
    if len(kinds) > 1:
        raise UsageError("cannot compare single- and multi-objective runs in one picture: "
                         + ", ".join(f"{r.path} ({r.kind})" for r in runs))
    first = runs[0].path
    default = (first.parent if first.is_file() else first) / "convergence.png"
    if len(runs) > 1:
        default = first.parent / "comparison.png"
    out = Path(output) if output else default
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: directory '{out.parent}' does not exist")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    if len(runs) > 1:
        _comparison(axes, runs)
        fig.suptitle(f"{len(runs)} runs: median and quartiles per group")
    elif runs[0].kind == "multi-objective":
        _one_front(axes, runs[0])
        fig.suptitle(f"{runs[0].path.name}  (from {runs[0].source})")
    else:
        _one_run(axes, runs[0])
        fig.suptitle(f"{runs[0].path.name}  (from {runs[0].source})")
    if output:
        fig.savefig(out, dpi=110)  # (a path of the user's choosing, link or not)
    else:  # inside the run directory: never written through a link planted there
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        write_new(out, buf.getvalue())
    plt.close(fig)
    return out


# -- axes ---------------------------------------------------------------------------------------
def scale_for(values: np.ndarray) -> tuple[str, dict[str, float]]:
    """A y scale under which values spanning decades stay readable: log when all are positive,
    symlog when some are zero or negative (linear near zero, logarithmic beyond), else linear."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "linear", {}
    mag = np.abs(v)
    nonzero = mag[mag > 0]
    if nonzero.size == 0 or nonzero.max() / nonzero.min() < 100:
        return "linear", {}
    if v.min() > 0:
        return "log", {}
    return "symlog", {"linthresh": float(max(nonzero.min(), nonzero.max() * 1e-15))}


def _set_scale(ax, *series: np.ndarray) -> None:
    name, kw = scale_for(np.concatenate([np.ravel(s) for s in series]))
    ax.set_yscale(name, **kw)


def _finish(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3, which="both" if ax.get_yscale() != "linear" else "major")


def _time_axis(ax, run: Curves) -> None:
    """Wall-clock seconds on the top axis of a panel whose x axis is evaluations."""
    ev, t = run.wall
    if len(ev) < 2 or not np.all(np.diff(ev) > 0) or not np.all(np.diff(t) >= 0):
        return
    top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, ev, t), lambda s: np.interp(s, t, ev)))
    top.set_xlabel("wall-clock seconds (this run's log boundaries)")


# -- one run --------------------------------------------------------------------------------------
def island_series(hist: dict[str, np.ndarray]) -> list[str]:
    """The per-island best-so-far series of an archipelago's history ("island3.best"), in island order."""
    keys = [k for k in hist if k.startswith("island") and k.endswith(".best")]
    return sorted(keys, key=lambda k: int(k[6:].split(".")[0]))


def _one_run(axes, run: Curves) -> None:
    h, g = run.hist, run.gens
    islands = island_series(h)
    for i, key in enumerate(islands):  # under the overall curve, one thin line per island
        axes[0].plot(g, h[key], "-", linewidth=0.7, alpha=0.6, color=f"C{1 + i % 9}",
                     label="island " + key[6:].split(".")[0] if len(islands) <= 8 else None)
    axes[0].plot(g, h["best"], "-", linewidth=1.8, color="C0", label="all islands" if islands else None)
    _set_scale(axes[0], h["best"], *(h[k] for k in islands))
    if islands:
        axes[0].legend(fontsize=7, ncol=2)
    _finish(axes[0], "generation", "best fitness so far (minimised)", "best so far")

    ax = axes[1]
    ax.plot(g, h["gen_best"], "-", linewidth=1.0, color="C2", label="generation best")
    ax.plot(g, h["gen_mean"], "-", linewidth=1.0, color="C1", label="generation mean")
    if "gen_std" in h:
        lo, hi = h["gen_mean"] - h["gen_std"], h["gen_mean"] + h["gen_std"]
        ax.fill_between(g, lo, hi, color="C1", alpha=0.2, linewidth=0, label="mean +- std (spread)")
    _set_scale(ax, h["gen_best"], h["gen_mean"])
    ax.legend(fontsize=8)
    _finish(ax, "generation", "fitness", "the population: each generation")

    ax = axes[2]
    ax.plot(run.evals, h["best"], "-", linewidth=1.5, color="C0")
    _set_scale(ax, h["best"])
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    _time_axis(ax, run)
    _finish(ax, "evaluations", "best fitness so far", "cost: evaluations and time")


def _one_front(axes, run: Curves) -> None:
    ax = axes[0]
    if run.front is not None and run.front.ndim == 2 and run.front.shape[1] >= 2:
        f = run.front
        colour = {"c": f[:, 2], "cmap": "viridis"} if f.shape[1] > 2 else {"color": "C0"}
        points = ax.scatter(f[:, 0], f[:, 1], s=12, **colour)
        if f.shape[1] > 2:
            axes[0].figure.colorbar(points, ax=ax, label="objective 3")
        _finish(ax, "objective 1", "objective 2", f"final front ({len(f)} points)")
    else:
        ax.text(0.5, 0.5, "no front recorded\n(summary.json missing: run not finished)", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
    for ax, key, label in ((axes[1], "hv", "hypervolume (maximised)"), (axes[2], "igd", "IGD (minimised)")):
        y = run.hist[key]
        ax.plot(run.gens, y, "-", linewidth=1.3)
        if key == "igd":
            _set_scale(ax, y)
        _finish(ax, "generation", label, label.split(" (")[0] + " over time")


# -- several runs ---------------------------------------------------------------------------------
def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: repr(v)})
    return out


def groups(runs: list[Curves]) -> dict[str, list[Curves]]:
    """Runs keyed by what sets them apart (config keys other than seed, name, output...)."""
    flats = [{k: v for k, v in _flat(r.config).items() if not k.startswith(_SAME_EXPERIMENT)} for r in runs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({f.get(k) for f in flats}) > 1]
    out: dict[str, list[Curves]] = {}
    for run, f in zip(runs, flats):
        label = ", ".join(f"{k.split('.')[-1]}={f.get(k, '-')}".replace("'", "") for k in differ) or "all runs"
        out.setdefault(label, []).append(run)
    return out


def _on_grid(run: Curves, key: str, grid: np.ndarray) -> np.ndarray:
    """The run's value at each evaluation count of ``grid``: the last value logged at or before it."""
    i = np.searchsorted(run.evals, grid, side="right") - 1
    return np.asarray(run.hist[key], dtype=float)[np.clip(i, 0, len(run.evals) - 1)]


def _comparison(axes, runs: list[Curves]) -> None:
    multi = runs[0].kind == "multi-objective"
    panels = (("hv", "hypervolume (maximised)"), ("igd", "IGD (minimised)")) if multi else \
        (("best", "best fitness so far"), ("gen_mean", "generation mean"))
    finals = {}
    for n, (label, members) in enumerate(groups(runs).items()):
        color = f"C{n % 10}"
        start = max(float(r.evals[0]) for r in members)
        stop = min(float(r.evals[-1]) for r in members)  # where every run of the group has data
        grid = np.linspace(start, stop, 200) if stop > start else np.asarray([stop])
        for ax, (key, _) in zip(axes[:2], panels):
            ys = np.stack([_on_grid(r, key, grid) for r in members])
            for y in ys:
                ax.plot(grid, y, "-", color=color, alpha=0.25, linewidth=0.7)
            q1, med, q3 = np.nanpercentile(ys, [25, 50, 75], axis=0)
            ax.plot(grid, med, "-", color=color, linewidth=1.8, label=f"{label} (n={len(members)})")
            ax.fill_between(grid, q1, q3, color=color, alpha=0.2, linewidth=0)
        finals[label] = [float(np.asarray(r.hist[panels[0][0]])[-1]) for r in members]
    for ax, (key, ylabel) in zip(axes[:2], panels):
        ys = np.concatenate([np.asarray(r.hist[key], dtype=float) for r in runs])
        if key != "hv":
            _set_scale(ax, ys)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
        _finish(ax, "evaluations", ylabel, f"{ylabel}: median, quartiles (band), each run (thin)")
    axes[0].legend(fontsize=8)
    _final_box(axes[2], finals, panels[0][1])


def _final_box(ax, finals: dict[str, list[float]], ylabel: str) -> None:
    labels = list(finals)
    ax.boxplot([finals[k] for k in labels], showfliers=False, medianprops={"color": "black"})
    for i, k in enumerate(labels, 1):
        ax.plot(np.full(len(finals[k]), i), finals[k], "o", color=f"C{(i - 1) % 10}", alpha=0.7, markersize=4)
    ax.set_xticks(range(1, len(labels) + 1), [k if len(k) < 30 else k[:27] + "..." for k in labels],
                  fontsize=8, rotation=15)
    _set_scale(ax, np.concatenate([np.asarray(v) for v in finals.values()]))
    _finish(ax, "", f"final {ylabel}", "end of run: each run, and quartiles")
