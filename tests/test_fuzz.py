"""A property-based sweep of bad input through the command line, in process, on every rank of
the job: whatever the config, its bytes, the --set overrides or the flags, `hpcevo run` ends
with exit 0 (the input was fine), 75 (a deadline it was given), or 2 with exactly one message
from rank 0 and none from the others; never a traceback, never a hang (a rank left behind would
hang the collective that follows, and the CTest timeout would fail the pass).

The cases come from a seeded generator, the same on every rank (the command is collective):
mutations of a small valid config (a value replaced by one from a pool of awkward TOML values,
a key deleted or misspelt, a section added), damaged bytes (cut, a stray byte, another
encoding), malformed overrides and flags. 360 cases (over 300 distinct) at 1 rank; every sixth
of them at 3 ranks (uneven splits, one message from rank 0 of three) and every eighth at 2 and 4:
the valid cases among them are whole runs, and the suite's time is counted.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from hpcevo.cli import _main

# The rank matrix: what these MPI tests check (an error or an input on some ranks reaching
# every rank) needs a last rank and a middle one: 2 and 3 ranks have them, 4 repeats them.
pytestmark = pytest.mark.ranks(1, 2, 3)

BASE = {
    "run": {"name": '"fz"', "seed": "1", "generations": "2"},
    "algorithm": {"name": '"cso"', "pop_size": "8"},
    "problem": {"name": '"sphere"', "dim": "3"},
    "log": {"every": "1", "progress": '"lines"'},
    "checkpoint": {"every": "0", "every_seconds": "0", "final": "false"},
}
# Keys a mutation may set, beyond BASE's (paths on disk are left alone: run.out, checkpoint.dir).
OPTIONAL = ["run.dtype", "algorithm.phi", "problem.lb", "problem.ub", "problem.args", "problem.batched",
            "problem.objectives", "problem.ref_point", "problem.host", "evaluation.batch_size",
            "evaluation.concurrency", "evaluation.schedule", "evaluation.penalty", "parallel.microbatch",
            "parallel.share_gpus", "checkpoint.keep", "checkpoint.deadline", "checkpoint.margin_seconds",
            "checkpoint.keep_every", "checkpoint.stuck_seconds", "islands.count", "islands.migrants",
            "islands.topology"]
VALUES = ["-1", "0", "1", "7", "2147483648", "9223372036854775807", "-9223372036854775808", "1.5", "-0.0",
          "1e39", "-1e300", "inf", "-inf", "nan", '""', '"x"', '"é中"', '"' + "a" * 300 + '"', "true", "false",
          "[]", '[1, "a"]', "[1.0, 2.0, 3.0]", "[[1]]", "{}", "{a = 1}", "1979-05-27", "07:32:00",
          '"sphere"', '"de"', '"float64"', '"cso"', '"dynamic"', '"90m"']
JUNK_LINES = ["[run", "= 1", "key = ", 'x = "unterminated', "[[algorithm]]", "run = 5", "a.b.c = 1",
              "\x00", "name = 'fz'\nname = 'again'"]
SETS = ["run.generations", "=5", "a..b=1", "run.generations=[", "run=1", "problem.dim.x=1",
        "algorithm.pop_size=0x10", "algorithm.pop_size=1e3", "run.seed=-5", "nosuch.key=1", "run.name=a/b",
        "problem.name=ackley", "log.every=0"]
FLAGS = [["--deadline", "soon"], ["--deadline", "0"], ["--deadline", "-5m"], ["--bogus"], ["--resume", "--overwrite"],
         ["--deadline", "25:99"], ["--set"], ["-q", "-q"]]
CASES = 360


def render(sections: dict[str, dict[str, str]]) -> str:
    return "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) + "\n"
                   for s, keys in sections.items())


def case(rng: random.Random) -> tuple[bytes, list[str]]:
    """One input: the config file's bytes and the arguments after it."""
    sections = {s: dict(keys) for s, keys in BASE.items()}
    args: list[str] = []
    kind = rng.randrange(8)
    if kind <= 2:  # a value from the pool
        path = rng.choice([f"{s}.{k}" for s, keys in BASE.items() for k in keys] + OPTIONAL)
        section, key = path.split(".")
        sections.setdefault(section, {})[key] = rng.choice(VALUES)
    elif kind == 3:  # a key deleted, or misspelt
        section = rng.choice(list(sections))
        key = rng.choice(list(sections[section]))
        value = sections[section].pop(key)
        if rng.random() < 0.5:
            sections[section][key[:-1] + rng.choice("xyz_")] = value
    elif kind == 4:  # an unknown section or a whole section of the wrong type
        sections[rng.choice(["runn", "island", "problems", "Run", "algorithm.x"])] = {
            rng.choice(["x", "name", "dim", "évé"]): rng.choice(VALUES)}
    text = render(sections)
    if kind == 5:  # a junk line somewhere
        lines = text.splitlines()
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(JUNK_LINES))
        text = "\n".join(lines)
    data = text.encode()
    if kind == 6:  # damaged bytes: cut short, a stray byte, another encoding
        how = rng.randrange(3)
        if how == 0:
            data = data[: rng.randrange(len(data))]
        elif how == 1:
            i = rng.randrange(len(data))
            data = data[:i] + bytes([rng.randrange(128, 256)]) + data[i:]
        else:
            data = text.encode(rng.choice(["utf-16", "utf-32"]))
    if kind == 7:  # overrides and flags
        for _ in range(rng.randrange(1, 3)):
            args += ["--set", rng.choice(SETS)] if rng.random() < 0.6 else rng.choice(FLAGS)
    return data, args


def all_cases() -> list[tuple[bytes, list[str]]]:
    rng = random.Random(20261124)
    return [case(rng) for _ in range(CASES)]


@pytest.mark.single_process
def test_generator_covers_every_kind_of_damage():
    """The sweep is only as good as its inputs: check what the generator makes (a pure check)."""
    cases = all_cases()
    texts = [d for d, _ in cases]
    assert len(cases) == CASES and len(set((d, tuple(a)) for d, a in cases)) > 300
    assert sum(1 for d in texts if not _utf8(d)) >= 10
    assert sum(1 for _, a in cases if a) >= 25
    assert sum(1 for d in texts if b"inf" in d or b"nan" in d) >= 5


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.slow
def test_no_input_ends_in_a_traceback_a_hang_or_two_messages(ctx, shared_tmp, capfd):
    cases = all_cases()
    if ctx.size > 1:  # every sixth at 3 ranks; every eighth, others, at 2 and 4
        cases = cases[::6] if ctx.size == 3 else cases[3::8]
    outcomes = {0: 0, 2: 0, 75: 0}
    for i, (data, args) in enumerate(cases):
        config = shared_tmp / f"case{i}.toml"
        if ctx.is_root:
            config.write_bytes(data)
        ctx.comm_ctl.Barrier()
        argv = ["run", str(config), "-q", *args, "--set", f"run.out={str(shared_tmp / f'out{i}')!r}"]
        code = _main(ctx, argv)
        out, err = capfd.readouterr()
        where = f"case {i}: {argv} {data[:300]!r}"
        assert code in outcomes, (where, code, err)
        assert "Traceback" not in out + err, (where, err)
        messages = len(re.findall(r"^hpcevo: error:", err, re.M))
        assert messages == (int(code == 2) if ctx.is_root else 0), (where, err)
        outcomes[code] += 1
    # Most inputs are bad by construction; some are fine and run.
    print("outcomes by exit code:", outcomes)
    assert outcomes[2] >= len(cases) // 2 and outcomes[0] >= 1, outcomes
