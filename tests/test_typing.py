"""hpcevo as a user's type checker sees it: the package is marked typed (``py.typed``, shipped),
the lazily loaded public names have their real types (not Any), and a call with a wrong type is
an error. mypy is a test dependency: without it this test fails, it does not skip."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import hpcevo

pytestmark = [pytest.mark.single_process, pytest.mark.slow]  # mypy takes 8 s: not the inner loop's

ROOT = Path(__file__).resolve().parents[1]

# Each reveal_type is on its own line; what mypy must reveal there (a substring, or a regex).
USER_SCRIPT = '''
import hpcevo
from hpcevo.algorithms import CSO

cfg = hpcevo.load_config({"algorithm": {"name": "cso"}, "problem": {"name": "sphere", "dim": 3}})
result = hpcevo.run(cfg, quiet=True, problem_name=None, deadline=3600)
reveal_type(hpcevo.run)
reveal_type(hpcevo.load_config)
reveal_type(hpcevo.open_run)
reveal_type(hpcevo.Loop)
reveal_type(cfg)
reveal_type(result)
reveal_type(result.best_fitness)
reveal_type(result.best_solution)
reveal_type(result.digest)
reveal_type(result.status)
reveal_type(hpcevo.open_run(result.run_dir).summary)
loop = hpcevo.Loop(CSO(pop_size=8, dim=3, lb=(-1.0,) * 3, ub=(1.0,) * 3), lambda x: x)
reveal_type(loop.init(0).advance(3))
reveal_type(loop.best_fitness)
reveal_type(loop.save("ck"))
reveal_type(hpcevo.UsageError("x"))
hpcevo.run(cfg, overwrite="yes")
hpcevo.run(cfg, problem_name=3)
hpcevo.run(cfg, no_such_argument=1)
total = result.best_fitness + 1.0
'''
REVEALED = [
    "def (config: hpcevo.config.RunConfig | str | os.PathLike[Any] | typing.Mapping[str, Any], *, problem: Any =, "
    "problem_name: str | None =",
    "def (source: str | os.PathLike[Any] | typing.Mapping[str, Any], overrides: typing.Sequence[str] =) -> "
    "hpcevo.config.RunConfig",
    "-> hpcevo.driver.result.RunRecord",
    "def (algorithm: hpcevo.algorithms.base.Algorithm, problem: Any, ",
    "hpcevo.config.RunConfig",
    "hpcevo.driver.result.Result",
    "float | None",
    re.compile(r"numpy\.ndarray\[.*\] \| None"),
    "str",
    "str",
    "dict[str, Any] | None",
    "hpcevo.driver.loop.Loop",
    "float",
    "pathlib.Path",
    "hpcevo.errors.UsageError",
]
ERRORS = [
    'Argument "overwrite" to "run" has incompatible type "str"; expected "bool"',
    'Argument "problem_name" to "run" has incompatible type "int"; expected "str | None"',
    'Unexpected keyword argument "no_such_argument" for "run"',
    'Unsupported operand types for + ("None" and "float")',
]


def mypy(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    (tmp_path / "user.py").write_text(textwrap.dedent(script))
    # hpcevo is found through PYTHONPATH as an installed package is through site-packages: mypy
    # reads it only when it is marked typed. (The editable install's import hook is invisible to
    # mypy.)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                           "--show-error-codes", "--no-color-output", "--no-error-summary", "user.py"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)


def test_mypy_sees_the_real_types_of_the_public_api(tmp_path):
    version = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True, text=True)
    assert version.returncode == 0, f"mypy is a test dependency (pip install -e '.[test]'): {version.stderr}"
    r = mypy(tmp_path, USER_SCRIPT)
    assert r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert not any("import-untyped" in line or "import-not-found" in line for line in lines), r.stdout
    revealed = [m.group(1) for m in (re.match(r'user\.py:\d+: note: Revealed type is "(.*)"', line) for line in lines)
                if m]
    assert len(revealed) == len(REVEALED), r.stdout
    for got, want in zip(revealed, REVEALED):
        assert "Any" != got and (want.search(got) if isinstance(want, re.Pattern) else want in got), (got, want)
    assert revealed[0].endswith("-> hpcevo.driver.result.Result") and "overwrite: bool =" in revealed[0]
    assert revealed[3].endswith("-> hpcevo.driver.loop.Loop")
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == len(ERRORS), r.stdout  # the well-typed lines give none
    for line, want in zip(errors, ERRORS):
        assert want in line, (line, want)


def test_the_type_checkers_view_of_hpcevo_lists_every_public_name(tmp_path):
    """The ``if TYPE_CHECKING:`` block of hpcevo/__init__.py imports every lazily loaded name from
    the module it loads from (re-exported by name), and ``import hpcevo`` stays lazy."""
    tree = ast.parse((ROOT / "hpcevo" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself ('as {alias.name}')"
            seen[alias.name] = "hpcevo" + (f".{node.module}" if node.module else "")
    assert seen == {**hpcevo._NAMES, **{m: "hpcevo" for m in hpcevo._SUBMODULES}}
    code = "import sys, hpcevo; print(sorted(m for m in sys.modules if m.startswith('hpcevo')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "['hpcevo']", (r.stdout, r.stderr)


def test_py_typed_is_in_the_package_and_shipped():
    assert (ROOT / "hpcevo" / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["hpcevo"]
    assert any(d.startswith("mypy") for d in project["project"]["optional-dependencies"]["test"])
