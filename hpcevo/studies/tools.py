"""``hpcevo study plan | status | report``: what a study holds and where it stands, as text. One
process, no MPI (a login node)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import UsageError
from .journal import STATES, states
from .spec import Study, batch_size, load_study


def parse_slice(text: str | None) -> tuple[int, int] | None:
    """``I/K`` (0 <= I < K) as (I, K); None for None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not int(m[1]) < int(m[2]):
        raise UsageError(f"--slice {text!r}: expected I/K with 0 <= I < K (slice I of K, e.g. 0/8 .. 7/8)")
    return int(m[1]), int(m[2])


def main(args: Any) -> int:
    study = load_study(args.study, args.overrides)
    if args.verb == "plan":
        print(plan_text(study, as_json=args.json))
        return 0
    if args.verb == "status":
        text, code = status_text(study)
        print(text)
        return code
    from .report import report

    made = report(study, args.output, baseline=args.baseline, target=args.target)
    print(made.markdown)
    print("\n" + "\n".join(f"wrote {p}" for p in made.files))
    return 0


def _batching(setting: int | str) -> str:
    n = batch_size(setting)
    how = "one run at a time" if n == 1 else f"up to {n} runs of a program advanced together"
    return how + (" (study.batch = \"auto\")" if setting == "auto" else "")


def plan_text(study: Study, as_json: bool = False) -> str:
    if as_json:
        return "\n".join(json.dumps({"index": r.index, "name": r.name, "configuration": r.configuration,
                                     "problem": r.problem, "seed": r.seed, "settings": dict(r.settings),
                                     "out": str(r.out)}) for r in study.runs)
    head = (f"study {study.name}: {len(study.runs)} runs = {len(study.configurations)} configuration(s) x "
            f"{len(study.problems)} problem(s) x {len(study.seeds)} seed(s); {study.ranks_per_run} rank(s) per run; "
            f"{len({r.program for r in study.runs})} program(s), {_batching(study.batch)} -> {study.out}")
    lines = [head, ""]
    width = max(len(r.name) for r in study.runs)
    lines.append(f"{'#':>5}  {'run':<{width}}  settings")
    for r in study.runs:
        settings = ", ".join(f"{k}={_short(v)}" for k, v in r.settings) or "(the base config)"
        lines.append(f"{r.index:>5}  {r.name:<{width}}  {settings}, seed {r.seed}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def status_text(study: Study) -> tuple[str, int]:
    """The counts by state, then the runs that are not done and why; exit code 0 when every run
    is done, 1 otherwise (scripts can wait on it)."""
    found = states(study)
    counts = {st: sum(s.state == st for s in found) for st in STATES}
    lines = [f"study {study.name}: {len(found)} runs: " + ", ".join(f"{counts[st]} {st}" for st in STATES)
             + f"  ({study.out})"]
    for st in ("failed", "stopped", "running"):
        some = [s for s in found if s.state == st]
        if some:
            lines += ["", f"{st}:"] + [f"  {s.run.name}: {s.detail.splitlines()[0] if s.detail else ''}"
                                       for s in some[:50]]
            if len(some) > 50:
                lines.append(f"  ... and {len(some) - 50} more")
    if counts["done"] < len(found):
        lines += ["", f"continue with: hpcevo study run {study.path or 'FILE'} --resume"
                  + (" --retry-failed" if counts["failed"] else "")]
    return "\n".join(lines), 0 if counts["done"] == len(found) else 1
