"""The README as a script that works: its commands, run in the order shown on a fresh copy of the
examples, and its config snippets, each a complete config or marked with the example it extends.

What the command test changes, so that it runs in minutes on a laptop (and nothing else):
- runs get 10 generations (the external-command example 3: each evaluation is a process), and
  an explicit ``run.generations=N`` becomes at most 20 (so ``resume ... --set
  run.generations=5000`` still continues a run); the API scripts get
  ``--generations 10``; a study, 2 seeds of 20 generations;
- ``mpiexec -n K`` runs at most 2 ranks (the 1-4-rank equalities are other tests' work);
- it skips what needs something this suite does not have: ``sbatch``/``qsub`` (a scheduler: see
  tests/test_slurm.py), ``scripts/*.sh`` (the set-up; the first command of "Using it" is the
  main example's run), the benchmarks (minutes each) and ``pip install`` (the network).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hpcevo

from test_launcher import clean_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def blocks() -> list[list[str]]:
    """The README's indented code blocks (4 spaces), each as its lines, and the text before it."""
    out, current, fenced = [], [], False
    for line in README.read_text().splitlines() + ["(end)"]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and (line.startswith("    ") or (current and not line.strip())):
            current.append(line[4:])
        elif current:
            out.append(current)
            current = []
    return out


def commands() -> list[str]:
    found = []
    for block in blocks():
        text = "\n".join(block).replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if re.match(r"(\.venv/bin/python|mpiexec|for )", line) and not _skipped(line):
                found.append(line)
    return found


def _skipped(line: str) -> bool:
    return bool(re.search(r"-m benchmarks|benchmarks/|pip install", line))


def shorten(line: str) -> str:
    line = re.sub(r"mpiexec -n (\d+)", lambda m: f"mpiexec -n {min(int(m.group(1)), 2)}", line)
    line = re.sub(r"run\.generations=(\d+)", lambda m: f"run.generations={min(int(m.group(1)), 20)}", line)
    if "run.generations" not in line:
        # (3 for the external-command example: each evaluation starts a Python process)
        n = 3 if "host_command" in line else 10
        line = line.replace("-m hpcevo run ", f"-m hpcevo run --set run.generations={n} ")
    line = re.sub(r"(examples/api_\w+\.py)", r"\1 --generations 10", line)
    # a study: 2 seeds of 20 generations (every command on it says so, or they would disagree on its runs)
    line = re.sub(r"(-m hpcevo study (?:(?:plan|status|report|run) )?\S+)",
                  r"\1 --set study.seeds=2 --set base.run.generations=20", line)
    return line


@pytest.mark.single_process
def test_the_readme_has_the_commands_a_newcomer_types():
    cmds = commands()
    assert len(cmds) >= 15
    first = cmds[0]
    assert "run examples/cso.toml" in first  # the main example first, then the rest in order
    assert any("--resume" in c for c in cmds) and any("plot" in c for c in cmds)


@pytest.mark.single_process
def test_every_toml_snippet_is_a_config_or_names_what_it_extends():
    text = README.read_text()
    checked = 0
    for block in blocks():
        if not block[0].startswith("["):
            continue
        toml_lines = []
        for ln in block:  # the snippet, up to a command that follows it in the same block
            if re.match(r"(\.venv/bin/python|mpiexec)", ln):
                break
            toml_lines.append(ln)
        body = "\n".join(toml_lines)
        before = text[: text.index("\n".join("    " + ln if ln else ln for ln in block).rstrip())]
        context = before.rstrip().rsplit("\n\n", 1)[-1]
        extends = re.findall(r"examples/\w+\.toml", context)
        data = tomllib.loads(body)
        if extends:
            base = tomllib.loads((ROOT / extends[-1]).read_text())
            data = _merge(base, data)
        hpcevo.load_config(data)  # raises ConfigError with the key if the snippet is not complete
        checked += 1
    assert checked >= 5


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


@pytest.mark.launcher
@pytest.mark.timeout(1200)  # (15+ commands, each its own launch: 90 s warm; cold, every program compiled, over 300)
def test_the_readme_commands_run_in_order_on_a_fresh_copy(tmp_path):
    for d in ("examples", "jobs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = clean_env()
    env["PYTHONPATH"] = str(ROOT)  # hpcevo from this checkout, whatever the venv was installed from
    ran = []
    for line in map(shorten, commands()):
        r = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, (line, ran, r.stdout[-2000:], r.stderr[-3000:])
        assert "Traceback" not in r.stderr, (line, r.stderr)
        ran.append(line)
    assert (tmp_path / "runs" / "cso-ackley" / "convergence.png").is_file()
    assert (tmp_path / "runs" / "cso-seeds.png").is_file()
    assert len(ran) >= 15
