"""The rooms stay rooms: no import cycle, no function that needs a scroll bar, MPI only in
parallel/, HDF5 only in checkpoint/, algorithms and problems free of both, config free of
everything but errors and the schema, and the offline tools importable on a login node without MPI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.single_process

PACKAGE = Path(__file__).resolve().parents[1] / "hpcevo"
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every hpcevo module ``name`` imports, at the top or inside a function (not under ``if
    TYPE_CHECKING:``, which only type checkers read: hpcevo/__init__.py names its lazy API there)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", "") == "TYPE_CHECKING" for n in block.body}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from pkg import mod` depends on pkg.mod; `from mod import name`, on mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def external_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
    return out


def test_no_import_cycle():
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return False

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))
    assert cycles == [], f"modules that import each other (directly or around a circle): {cycles}"


def test_no_function_over_80_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_mpi_and_hdf5_stay_in_their_rooms():
    for name, path in modules().items():
        ext = external_imports(path)
        room = name.split(".")[1] if "." in name else ""
        if room not in ("parallel", "checkpoint") and name != "hpcevo.provenance":  # (versions only)
            assert not ext & {"mpi4py", "mpi4jax"}, f"{name} imports MPI"
        if room != "checkpoint" and name != "hpcevo.provenance":
            assert "h5py" not in ext, f"{name} imports h5py"
        if room in ("algorithms", "problems"):
            assert not ext & {"mpi4py", "mpi4jax", "h5py"}, f"{name}: algorithms and problems are pure"
        if room not in ("parallel", "checkpoint"):
            text = path.read_text()
            assert "comm_ctl" not in text and "comm_jax" not in text, f"{name} touches a communicator"
        if room != "parallel":
            # a given communicator (parallel.init(comm=...)) is the only one hpcevo uses: nothing
            # but the parallel room names the whole job's (launcher variables like OMPI_COMM_WORLD_RANK aside)
            assert not re.search(r"(?<![A-Z_])COMM_WORLD(?![A-Z_])", path.read_text()), f"{name} names COMM_WORLD"
    known = modules()
    # a schema builds nothing: the config and the field types it shares with the API's objects
    assert imports("hpcevo.config", known["hpcevo.config"], known) <= {"hpcevo.errors", "hpcevo.schema"}
    assert imports("hpcevo.schema", known["hpcevo.schema"], known) <= {"hpcevo.errors"}


def test_offline_tools_import_without_starting_mpi():
    code = ("import sys\n"
            "import hpcevo, hpcevo.api, hpcevo.jobs, hpcevo.tools.inspection, hpcevo.tools.model\n"
            "cfg = hpcevo.load_config('examples/cso.toml')\n"
            "assert 'mpi4py.MPI' not in sys.modules, 'MPI was initialised'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=PACKAGE.parent)
    assert r.returncode == 0, r.stderr
