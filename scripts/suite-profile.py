#!/usr/bin/env python3
"""The suite's profile: seconds per test file and rank count, from the records a CTest run
leaves in build/profile (tests/profile_plugin.py).

    python3 scripts/suite-profile.py [build/profile] [--json OUT] [--tests N]

Prints, per test file, wall seconds at each rank count (pure tests as "pure", the launcher,
Slurm and nodes tiers under their own names), then the totals of compile, sleep and idle
seconds; --tests N also lists the N slowest single tests. Needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def _column(pass_name: str, ranks: int) -> str:
    tail = pass_name.split("-", 1)[1] if "-" in pass_name else pass_name
    for tier in ("launcher", "slurm", "nodes", "gpu_kit", "gpu-kit"):
        if tail == tier or tail.startswith(tier + "-"):
            return tier.replace("-", "_")
    if tail.startswith("single_process") or tail.startswith("single-process"):
        return "pure"
    return f"np{ranks}"


def load(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                r["column"] = _column(path.stem, r["ranks"])
                rows.append(r)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", default="build/profile")
    ap.add_argument("--json", help="write the aggregated table here")
    ap.add_argument("--tests", type=int, default=0, help="also list the N slowest tests")
    args = ap.parse_args(argv)
    rows = load(Path(args.directory))
    if not rows:
        print(f"no records under {args.directory}")
        return 1
    order = ["pure", "np1", "np2", "np3", "np4", "launcher", "slurm", "nodes", "gpu_kit"]
    columns = [c for c in order if any(r["column"] == c for r in rows)]
    table: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for r in rows:
        cell = table[r["file"]][r["column"]]
        for k in ("wall", "cpu", "compile", "cache_load", "sleep", "idle"):
            cell[k] += r[k]
        cell["tests"] += 1
        if r.get("busy") is not None:
            cell["busy_wall"] += r["busy"] * r["wall"]
    files = sorted(table, key=lambda f: -sum(c["wall"] for c in table[f].values()))
    width = max(len(f) for f in files) - len("tests/")
    head = (f"{'file':<{width}} " + " ".join(f"{c:>8}" for c in columns)
            + f" {'total':>8} {'compile':>8} {'sleep':>7} {'idle':>7} {'busy':>5}")
    print("wall seconds per test file and pass (compile, sleep, idle: totals over the passes; busy: the "
          "machine's CPU in use meanwhile, by anything)")
    print(head)
    print("-" * len(head))
    totals: dict[str, float] = defaultdict(float)
    for f in files:
        cells = table[f]
        walls = [cells[c]["wall"] if c in cells else None for c in columns]
        total = sum(w for w in walls if w)
        comp = sum(c["compile"] for c in cells.values())
        sleep = sum(c["sleep"] for c in cells.values())
        idle = sum(c["idle"] for c in cells.values())
        busy_wall = sum(c["busy_wall"] for c in cells.values())
        for c, w in zip(columns, walls):
            totals[c] += w or 0
        totals["compile"] += comp
        totals["sleep"] += sleep
        totals["idle"] += idle
        totals["busy_wall"] += busy_wall
        name = f.removeprefix("tests/")
        busy = f"{busy_wall / total:5.0%}" if total and busy_wall else f"{'':>5}"
        print(f"{name:<{width}} " + " ".join(f"{w:8.1f}" if w is not None else f"{'':>8}" for w in walls)
              + f" {total:8.1f} {comp:8.1f} {sleep:7.1f} {idle:7.1f} {busy}")
    print("-" * len(head))
    grand = sum(totals[c] for c in columns)
    busy = f"{totals['busy_wall'] / grand:5.0%}" if grand and totals["busy_wall"] else ""
    print(f"{'all':<{width}} " + " ".join(f"{totals[c]:8.1f}" for c in columns)
          + f" {grand:8.1f} {totals['compile']:8.1f} {totals['sleep']:7.1f} {totals['idle']:7.1f} {busy}")
    if args.tests:
        print(f"\nthe {args.tests} slowest tests (wall, compile, sleep, idle, busy; pass)")
        for r in sorted(rows, key=lambda r: -r["wall"])[: args.tests]:
            busy = f"{r['busy']:4.0%}" if r.get("busy") is not None else "    "
            print(f"{r['wall']:8.1f} {r['compile']:7.1f} {r['sleep']:6.1f} {r['idle']:6.1f} {busy}  {r['column']:<8} "
                  f"{r['test']}")
    if args.json:
        out = {f: {c: dict(v) for c, v in table[f].items()} for f in files}
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
