"""Looking at runs after the fact: ``hpcevo inspect`` and ``hpcevo plot``. One process, no MPI."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint
from .errors import UsageError


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _config_line(cfg: dict[str, Any]) -> str:
    run, algo, prob = cfg.get("run", {}), cfg.get("algorithm", {}), cfg.get("problem", {})
    return (f"{algo.get('name')} (pop {algo.get('pop_size')}) on {prob.get('name')} (dim {prob.get('dim')}), "
            f"seed {run.get('seed')}, {run.get('generations')} generations, {run.get('dtype', 'float32')}")


def _checkpoint_rows(paths: list[Path]) -> tuple[list[str], list[bool]]:
    """One line per checkpoint, and whether each is damaged (in the order of ``paths``)."""
    rows, damaged = [], []
    for p in paths:
        r = checkpoint.verify_file(p)
        h = r.header
        damaged.append(r.problem is not None)
        if h is None:
            rows.append(f"  {p.name:<18} {_mb(r.size_bytes):>10}  DAMAGED: {r.problem}")
            continue
        state = f"valid (state {_mb(r.state_bytes)})" if r.problem is None else f"DAMAGED: {r.problem}"
        best = f"{r.best:.6e}" if r.best is not None else "-"
        rows.append(f"  {p.name:<18} {_mb(r.size_bytes):>10}  gen {h.generation:>8}  evals {h.evaluations:>11}  "
                    f"best {best:>13}  {h.ranks:>3} rank(s)  {h.created}  {state}")
    return rows, damaged


def inspect_path(path: str | Path) -> str:
    """A human-readable account of a run directory, a checkpoint directory or one checkpoint."""
    return inspect(path)[0]


def inspect(path: str | Path) -> tuple[str, bool]:
    """(``inspect_path``'s account, whether the file or the directory's newest checkpoint is
    damaged: what a resume would have to skip, so ``hpcevo inspect`` exits non-zero for it)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"'{path}' not found")
    if path.is_file():
        r = checkpoint.verify_file(path)
        lines = [f"checkpoint  {path}  ({_mb(r.size_bytes)})"]
        if r.header is not None:
            h = r.header
            cfg = tomllib.loads(h.config_text)
            lines += [
                f"generation  {h.generation} ({h.evaluations} evaluations)",
                f"best        {r.best:.10e}" if r.best is not None else "best        -",
                f"written by  {h.ranks} rank(s), {h.created}, hpcevo {h.hpcevo_version}",
                f"config      {_config_line(cfg)}",
                f"state       {_mb(r.state_bytes)}",
            ]
        lines.append("status      " + ("valid: every checksum matches" if r.problem is None else f"DAMAGED: {r.problem}"))
        return "\n".join(lines), r.problem is not None

    lines = []
    ckdir = path
    cfg_file = path / "config.toml"
    if cfg_file.is_file():
        cfg = tomllib.loads(cfg_file.read_text())
        ckdir = Path(cfg.get("checkpoint", {}).get("dir") or path / "checkpoints")
        lines += [f"run         {path}", f"config      {_config_line(cfg)}"]
        summary = path / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            lines.append(f"finished    generation {s['generations']}, {_outcome(s)}, "
                         f"{s['evaluations']} evaluations, {s['ranks']} rank(s), {s['wall_s']:.1f} s, "
                         f"digest {s['state_digest'][:16]}")
        else:
            last = _last_metric(path / "metrics.jsonl")
            lines.append("status      not finished" + (
                f"; last logged generation {last['generation']}, {_outcome(last)}" if last else ""))
    paths = checkpoint.list_checkpoints(ckdir)
    partial = sorted(p.name for p in ckdir.glob(".gen-*.partial")) if ckdir.is_dir() else []
    if not paths and not lines:
        raise UsageError(f"'{path}' holds neither a run (config.toml) nor checkpoints (gen-*.h5)")
    lines.append(f"checkpoints {ckdir}: {len(paths)}" + (f" (+ unfinished: {', '.join(partial)})" if partial else ""))
    rows, damaged = _checkpoint_rows(paths)
    lines += rows
    return "\n".join(lines), bool(damaged) and damaged[0]


def _outcome(rec: dict[str, Any]) -> str:
    """The headline of a summary or metrics record: best fitness, or the front's indicators."""
    if "best_fitness" in rec or "best" in rec:
        return f"best {rec.get('best_fitness', rec.get('best')):.10e}"
    hv, igd = rec.get("hypervolume", rec.get("hv")), rec.get("igd")
    return (f"front of {rec['front_size']}" + ("" if hv is None else f", hypervolume {hv:.6e}")
            + ("" if igd is None else f", IGD {igd:.6e}"))


def _last_metric(path: Path) -> dict[str, Any] | None:
    last = None
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                last = json.loads(line)
            except ValueError:
                break
    return last


def _history(run: Path) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    """Per-generation history and evaluations from the newest valid checkpoint, else the
    per-boundary records of metrics.jsonl."""
    if run.is_file():
        candidates = [run]
        metrics = None
    else:
        cfg_file = run / "config.toml"
        ckdir = run / "checkpoints"
        if cfg_file.is_file():
            ckdir = Path(tomllib.loads(cfg_file.read_text()).get("checkpoint", {}).get("dir") or ckdir)
        candidates = checkpoint.list_checkpoints(ckdir)
        metrics = run / "metrics.jsonl"
    for p in candidates:
        r = checkpoint.verify_file(p)
        if r.problem is None:
            h = checkpoint.read_history(p)
            n = len(next(iter(h.values())))
            first, per = r.header.num_init, r.header.num_ask
            evals = first + per * np.arange(n)
            return h, evals, p.name
    if metrics is not None and metrics.is_file():
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        if recs and "best" not in recs[0]:  # multi-objective
            h = {k: np.array([np.nan if r[k] is None else r[k] for r in recs]) for k in ("hv", "igd", "generation")}
            return h, np.array([r["evaluations"] for r in recs]), "metrics.jsonl"
        if recs:
            h = {"best": np.array([r["best"] for r in recs]), "gen_best": np.array([r["gen_best"] for r in recs]),
                 "gen_mean": np.array([r["gen_mean"] for r in recs]),
                 "generation": np.array([r["generation"] for r in recs])}
            return h, np.array([r["evaluations"] for r in recs]), "metrics.jsonl"
    raise UsageError(f"'{run}' has no valid checkpoint and no metrics.jsonl to plot")


def plot_run(run: str | Path, output: str | Path | None = None) -> Path:
    """Best-so-far and generation mean against generations and evaluations, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run)
    if not run.exists():
        raise UsageError(f"'{run}' not found")
    hist, evals, source = _history(run)
    gens = hist.get("generation", np.arange(1, len(next(iter(hist.values()))) + 1))
    out = Path(output) if output else (run.parent if run.is_file() else run) / "convergence.png"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    if "hv" in hist:  # multi-objective: the front's indicators against generations
        for ax, key, label in ((axes[0], "hv", "hypervolume (maximised)"), (axes[1], "igd", "IGD (minimised)")):
            ax.plot(gens, hist[key], "-", linewidth=1.2)
            ax.set_xlabel("generation")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
        fig.suptitle(f"{run.name}  (from {source})")
        fig.savefig(out, dpi=120)
        plt.close(fig)
        return out
    series = [("best so far", hist["best"], "-"), ("generation best", hist["gen_best"], ":"),
              ("generation mean", hist["gen_mean"], "--")]
    for ax, x, label in ((axes[0], gens, "generation"), (axes[1], evals, "evaluations")):
        for name, y, style in series:
            ax.plot(x, y, style, label=name, linewidth=1.4 if name == "best so far" else 1.0)
        ys = np.concatenate([s[1] for s in series])
        ys = ys[np.isfinite(ys)]
        if ys.size and ys.min() > 0 and ys.max() / ys.min() > 100:
            ax.set_yscale("log")  # fitness spanning decades reads better on a log axis
        ax.set_xlabel(label)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 5))
        ax.set_ylabel("fitness (minimised)")
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{run.name}  (from {source})")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
