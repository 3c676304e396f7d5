"""Looking at runs after the fact: ``hpcevo inspect``, and the histories ``hpcevo plot`` draws
(``tools.plotting``). One process, no MPI.

Everything here reads through ``hpcevo.open_run`` (``driver.result.RunRecord``), the owner of
the run directory's layout, and ``hpcevo.checkpoint``'s one-process readers.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from .. import checkpoint
from ..driver.recording import history_kind
from ..driver.result import RunRecord
from ..errors import UsageError


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _config_line(cfg: dict[str, Any]) -> str:
    try:
        return _describe_config(cfg)
    except (AttributeError, TypeError, KeyError, ValueError) as e:
        return f"(damaged: not a config hpcevo wrote: {e})"


def _stored_config_line(text: str) -> str:
    if not text:
        return "-"
    try:
        return _config_line(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        return f"(damaged: not TOML: {e})"


def _describe_config(cfg: dict[str, Any]) -> str:
    run, algo, prob = cfg.get("run"), cfg.get("algorithm"), cfg.get("problem")
    if not all(isinstance(t, dict) for t in (run, algo, prob)) or not all(
            isinstance(t.get(k), (str, int)) for t, k in ((algo, "name"), (algo, "pop_size"), (prob, "name"),
                                                          (run, "seed"), (run, "generations"))):
        raise KeyError("a resolved config has [run], [algorithm] and [problem] with their keys")
    what = f"{algo.get('name')} (pop {algo.get('pop_size')})"
    isl = cfg.get("islands")
    if isinstance(isl, dict):
        changed = sorted({str(e.get("algorithm", {}).get("name", algo.get("name"))) for e in isl.get("island", [])}
                         - {algo.get("name")})
        what = (f"{isl.get('count')} islands of {'+'.join([str(algo.get('name')), *changed])} (pop "
                f"{algo.get('pop_size')} each unless changed), {isl.get('migrants')} migrants every "
                f"{isl.get('migrate_every')} generations, {isl.get('topology')}")
    return (f"{what} on {prob.get('name')} (dim {prob.get('dim')}), "
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


def inspect(path: str | Path) -> tuple[str, bool]:
    """A human-readable account of a run directory, a checkpoint directory or one checkpoint,
    and whether the file or the directory's newest checkpoint is damaged: what a resume would
    have to skip, so ``hpcevo inspect`` exits non-zero for it."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"'{path}' not found")
    if path.is_file():
        return _inspect_file(path)
    run = RunRecord(path)
    lines = []
    cfg = run.config
    if cfg is not None:
        lines += [f"run         {path}", f"config      {_config_line(cfg)}"]
        summary = run.summary
        if summary is not None:
            lines += _summary_lines(summary, run.paths.summary)
        else:
            recs = run.records
            lines.append("status      not finished" + (
                f"; last logged generation {recs[-1]['generation']}, {_outcome(recs[-1])}" if recs else ""))
    ckdir = run.paths.checkpoints
    paths = checkpoint.list_checkpoints(ckdir)
    partial = [p.name for p in run.partial_checkpoints]
    lines.append(f"checkpoints {ckdir}: {len(paths)}" + (f" (+ unfinished: {', '.join(partial)})" if partial else ""))
    rows, damaged = _checkpoint_rows(paths)
    lines += rows
    return "\n".join(lines), bool(damaged) and damaged[0]


def _summary_lines(summary: dict[str, Any], path: Path) -> list[str]:
    try:
        lines = [f"finished    generation {summary['generations']}, {_outcome(summary)}, "
                 f"{summary['evaluations']} evaluations, {summary['ranks']} rank(s), "
                 f"{summary['wall_s']:.1f} s, digest {summary['state_digest'][:16]}"]
        return lines + [f"  island {r['island']:>3}  {r['algorithm']:<8} pop {r['pop_size']:>6}  best "
                        f"{r['best_fitness']:.10e}" for r in summary.get("islands", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return [f"finished    ? ('{path}' is damaged: {type(e).__name__} {e}; the checkpoints below still "
                "tell what the run reached)"]


def _inspect_file(path: Path) -> tuple[str, bool]:
    r = checkpoint.verify_file(path)
    lines = [f"checkpoint  {path}  ({_mb(r.size_bytes)})"]
    if r.header is not None:
        h = r.header
        lines += [
            f"generation  {h.generation} ({h.evaluations} evaluations)",
            f"best        {r.best:.10e}" if r.best is not None else "best        -",
            f"written by  {h.writers}, {h.created}, hpcevo {h.hpcevo_version}",
            f"config      {_stored_config_line(h.config_text)}",
            f"state       {_mb(r.state_bytes)}",
        ]
    lines.append("status      " + ("valid: every checksum matches" if r.problem is None else f"DAMAGED: {r.problem}"))
    return "\n".join(lines), r.problem is not None


def _outcome(rec: dict[str, Any]) -> str:
    """The headline of a summary or metrics record: best fitness, or the front's indicators."""
    if "best_fitness" in rec or "best" in rec:
        return f"best {rec.get('best_fitness', rec.get('best')):.10e}"
    hv, igd = rec.get("hypervolume", rec.get("hv")), rec.get("igd")
    return (f"front of {rec['front_size']}" + ("" if hv is None else f", hypervolume {hv:.6e}")
            + ("" if igd is None else f", IGD {igd:.6e}"))


def history_of(path: Path) -> tuple[dict[str, np.ndarray], np.ndarray, str, str]:
    """Per-generation history, evaluations, where they came from and the run's kind: from the
    newest valid checkpoint, else the per-boundary records of metrics.jsonl."""
    if path.is_file():
        r = checkpoint.verify_file(path)
        if r.problem is not None:
            raise UsageError(f"'{path}' cannot be plotted: {r.problem}")
        found = checkpoint.read_history(path), r.header
    else:
        run = RunRecord(path)
        found = run.history()
        if found is None:
            return _metrics_history(run, path)
    hist, header = found
    n = len(next(iter(hist.values())))
    if "evaluations" in hist:  # rows used per generation (IPOP and BIPOP use fewer than they ask)
        evals = np.cumsum(np.asarray(hist.pop("evaluations"), np.int64))
    else:  # (written before the series existed)
        evals = header.num_init + header.num_ask * np.arange(n)
    return hist, evals, header.path.name, history_kind(hist)


def _metrics_history(run: RunRecord, path: Path) -> tuple[dict[str, np.ndarray], np.ndarray, str, str]:
    m = run.metrics
    if not m:
        raise UsageError(f"'{path}' has no valid checkpoint and no metrics.jsonl to plot")
    kind = run.kind
    keep = ("hv", "igd") if kind == "multi-objective" else ("best", "gen_best", "gen_mean")
    missing = [k for k in (*keep, "generation", "evaluations") if k not in m]
    if missing:
        raise UsageError(f"'{run.paths.metrics}' lacks the field(s) {', '.join(missing)}: the file is damaged")
    return {k: m[k] for k in (*keep, "gen_std", "generation") if k in m}, m["evaluations"], "metrics.jsonl", kind
