#!/usr/bin/env python3
"""Does the suite still catch the bugs it once caught? Re-introduce each one on a scratch copy of
this checkout and run the suite there (CTest, as scripts/test.sh runs it, stopping at the first
failing tier): a mutant is "caught" when the suite fails, and the failing tier and tests are
named. Not part of the suite (each mutant costs up to one suite run); its result goes into the
notes of any change that trims the suite.

    scripts/mutation-check.py                      # every mutant, the whole suite each
    scripts/mutation-check.py x64-leak romio       # some of them
    scripts/mutation-check.py --label quick        # only CTest's tests with this label (-L)
    scripts/mutation-check.py --exclude 'nodes|slurm|gpu_kit'   # leave these out (-LE): faster, and
                                                   # a part of the suite that fails means the whole fails
    scripts/mutation-check.py uneven-split --label np3   # one mutant against one tier (-L)
    scripts/mutation-check.py --list               # what each mutant re-introduces

Needs the set-up of scripts/test.sh (.venv) and writes build/mutation-check.json. The scratch
copies live under $TMPDIR/hpcevo-mutants and share the suite's JAX compilation cache.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the bug, as it was found
    path: str
    old: str
    new: str


MUTANTS = [
    Mutant("fused-slice",
           "one evaluation call per rank at several ranks: XLA fused the ask into the share's slice "
           "(CSO pop 30 dim 6 Ackley at 2 ranks: one row's fitness differed in the last bit)",
           "hpcevo/parallel/evaluate.py",
           "self.whole = (block_invariant and ctx.size == 1\n",
           "self.whole = (block_invariant\n"),
    Mutant("avx512",
           "CPU ranks compile for the machine's own instruction set: with AVX-512 CMA-ES's "
           "ask/evaluate/tell gave other last bits than advance(1)",
           "hpcevo/parallel/binding.py",
           '    if me.machine.lower() not in ("x86_64", "amd64") or "xla_cpu_max_isa" in me.xla_flags:\n',
           "    if True:\n"),
    Mutant("x64-leak",
           "JAX's 64-bit mode of a float64 run leaks into the next run of the process (a float32 "
           "run's integer draws become 64-bit: other digests)",
           "hpcevo/driver/build.py",
           '    return jax.enable_x64(cfg.run.dtype == "float64")\n',
           '    import contextlib\n\n    if cfg.run.dtype == "float64":\n'
           '        jax.config.update("jax_enable_x64", True)\n    return contextlib.nullcontext()\n'),
    Mutant("romio",
           "checkpoint errors in ROMIO's words: a read-only disk reported as 'Read-only file or "
           "filesystem name' instead of the OS's 'Read-only file system'",
           "hpcevo/checkpoint/format.py",
           "    for words, reason in _ROMIO_WORDS.items():\n        if words in lowered:\n            return reason\n",
           ""),
    Mutant("uneven-split",
           "an uneven split of the population over the ranks drops one micro-batch (every rank "
           "count that divides the micro-batches evenly is unaffected)",
           "hpcevo/parallel/evaluate.py",
           "    return rank * q + min(rank, rem), q + (1 if rank < rem else 0)\n",
           "    return rank * q + min(rank, rem), q + (1 if rank < rem - 1 else 0)\n"),
    Mutant("watchdog-deaf",
           "the watchdog's limit for a dispatch 1,000 times too generous: a rank that stopped "
           "answering, or a sudden 20x slowdown, is never taken for one",
           "hpcevo/driver/policy.py",
           "        scaled = f.slowdown * expected\n",
           "        scaled = f.slowdown * expected * 1000\n"),
]


def copy_tree(dst: Path) -> None:
    """The checkout as git sees it (tracked files and untracked ones it does not ignore)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    shutil.rmtree(dst, ignore_errors=True)
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
        elif src.is_symlink():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dst / name)


def mutate(tree: Path, m: Mutant) -> None:
    path = tree / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutant {m.name}: the code it changes is no longer in {m.path} (update MUTANTS)")
    path.write_text(text.replace(m.old, m.new))


def run_suite(tree: Path, label: str | None, exclude: str | None, log: Path) -> tuple[int, float]:
    python = Path(os.environ.get("HPCEVO_VENV", ROOT / ".venv")) / "bin" / "python"
    build = tree / "build"
    args = ["-DPython_EXECUTABLE=" + str(python), "-DMPIEXEC_MAX_NUMPROCS=4"]
    if os.environ.get("HPCEVO_JAX_CACHE"):
        args.append("-DHPCEVO_JAX_CACHE=" + os.environ["HPCEVO_JAX_CACHE"])
    cmake = shutil.which("cmake") or str(python.parent / "cmake")
    ctest = shutil.which("ctest") or str(python.parent / "ctest")
    subprocess.run([cmake, "-S", str(tree), "-B", str(build), *args], check=True, capture_output=True)
    cmd = [ctest, "--output-on-failure", "-j", os.environ.get("HPCEVO_TEST_JOBS", "3"), "--stop-on-failure"]
    if label:
        cmd += ["-L", label]
    if exclude:
        cmd += ["-LE", exclude]
    # The mutant's hpcevo, also in the processes the tests start (they run from other folders).
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=build, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.monotonic() - t0


def findings(log: Path) -> tuple[list[str], list[str]]:
    text = log.read_text(errors="replace")
    tiers = re.findall(r"\d+/\d+ Test +#\d+: (\S+) \.+\*+(?:Failed|Timeout)", text)
    tests = sorted(set(re.findall(r"^(?:FAILED|ERROR) (tests/\S+)", text, re.M)))
    return tiers, tests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mutants", nargs="*", help="names (default: all)")
    ap.add_argument("--label", help="only CTest's tests with this label")
    ap.add_argument("--exclude", help="leave out CTest's tests with this label (a regex, as ctest -LE)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:16} {m.path}: {m.what}")
        return 0
    unknown = [n for n in args.mutants if n not in by_name]
    if unknown:
        print(f"unknown mutants: {', '.join(unknown)} (known: {', '.join(by_name)})", file=sys.stderr)
        return 2
    chosen = [by_name[n] for n in args.mutants] if args.mutants else MUTANTS
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / "hpcevo-mutants"
    results = []
    for m in chosen:
        tree = scratch / m.name
        copy_tree(tree)
        mutate(tree, m)
        log = scratch / f"{m.name}.log"
        rc, seconds = run_suite(tree, args.label, args.exclude, log)
        tiers, tests = findings(log)
        caught = rc != 0 and bool(tiers)
        results.append({"mutant": m.name, "bug": m.what, "caught": caught, "ctest_exit": rc, "seconds": round(seconds),
                        "failed_tiers": tiers, "failed_tests": tests, "log": str(log)})
        print(f"{m.name:16} {'CAUGHT' if caught else 'MISSED'} in {seconds:6.0f} s  tiers: {', '.join(tiers) or '-'}"
              f"  tests: {', '.join(tests[:4]) or '-'}{' ...' if len(tests) > 4 else ''}", flush=True)
    out = ROOT / "build" / "mutation-check.json"
    out.parent.mkdir(exist_ok=True)
    # One record per mutant, kept across invocations (each may choose its own tiers).
    kept = {}
    if out.is_file():
        try:
            kept = {r["mutant"]: r for r in json.loads(out.read_text()).get("results", [])}
        except (ValueError, KeyError, TypeError):
            kept = {}
    for r in results:
        kept[r["mutant"]] = {**r, "label": args.label, "exclude": args.exclude}
    out.write_text(json.dumps({"results": [kept[m.name] for m in MUTANTS if m.name in kept]}, indent=1))
    missed = [r["mutant"] for r in results if not r["caught"]]
    print(f"\n{len(results) - len(missed)} of {len(results)} caught" + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
