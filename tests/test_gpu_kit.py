"""The GPU kit without a GPU: the wheelhouse, the offline install on a node with no registry, and
the one command that runs every GPU check (its CPU smoke mode).

The offline install is tried as it happens on a GPU node: an "image" interpreter that holds JAX,
numpy, a serial h5py and the build tools but no MPI and no mpi4jax (like the lent H200's image),
and scripts/gpu-node-setup.sh run in a network namespace with no network at all, from a
wheelhouse scripts/gpu-wheelhouse.sh gathered for this Python. Nothing here needs the package
registry: what comes from it (the wheels of requirements/gpu-node.txt for Python 3.12 and for
this one, the image) is fetched once by scripts/gpu-kit-cache.sh, which scripts/test.sh runs
with the set-up, and the tests gather their wheelhouses from that copy, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu_kit

LIMIT_MIB = 64


def sh(cmd, timeout=900, env=None, cwd=ROOT, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       env={**os.environ, **(env or {})}, shell=isinstance(cmd, str))
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


NO_NETWORK = _can_unshare()  # root (CI); elsewhere pip's own --no-index is what keeps it offline


def offline(cmd: str) -> str:
    """``cmd`` in a network namespace whose only interface is loopback: nothing can be fetched."""
    if not NO_NETWORK:
        return f"PIP_NO_INDEX=1 {cmd}"
    return f"unshare -n sh -c {json.dumps('ip link set lo up && ' + cmd)}"


@pytest.fixture(scope="module")
def kit() -> dict[str, Path]:
    """What scripts/gpu-kit-cache.sh keeps: {"node": wheelhouse for Python 3.12, "here": for this
    Python, "image": the image's interpreter}. Up to date after scripts/test.sh's set-up (then
    offline); fetched here when it is not (someone running this file alone)."""
    out = sh(["scripts/gpu-kit-cache.sh"], env={"HPCEVO_VENV": str(Path(sys.prefix))}).stdout
    return {k: Path(v) for k, v in (line.split("=", 1) for line in out.splitlines() if "=" in line)}


@pytest.fixture(scope="module")
def image(kit):
    return kit["image"]


def _base_python() -> str:
    """The interpreter below this venv (an image's Python is not hpcevo's venv)."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


def gather(into: Path, source: Path, python_version: str, **env) -> subprocess.CompletedProcess:
    """scripts/gpu-wheelhouse.sh as a developer runs it, but from the cached copy, offline."""
    cmd = f"scripts/gpu-wheelhouse.sh {into}"
    return sh(offline(cmd), env={"HPCEVO_NODE_PYTHON": python_version, "HPCEVO_PYTHON": sys.executable,
                                 "HPCEVO_WHEELHOUSE_FROM": str(source), **env}, check=False)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory, kit):
    out = tmp_path_factory.mktemp("wheelhouse")
    r = gather(out, kit["here"], f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert r.returncode == 0, r.stderr
    return out


def manifest(folder: Path) -> list[tuple[str, int]]:
    return [(line.split()[0], int(line.split()[1])) for line in (folder / "MANIFEST").read_text().splitlines()]


def pins() -> list[str]:
    lines = (ROOT / "requirements" / "gpu-node.txt").read_text().splitlines()
    return [x.split("#")[0].strip() for x in lines if x.split("#")[0].strip()]


def test_the_gpu_nodes_wheelhouse_holds_every_pin_and_fits_the_transfer(tmp_path, kit):
    """The folder for the GPU node's Python 3.12: one file per pin, within what can be carried.
    (Gathered from the cached copy, offline; the registry's own gather made that copy.)"""
    r = gather(tmp_path, kit["node"], "3.12")
    assert r.returncode == 0, r.stderr
    files = manifest(tmp_path)
    assert len(files) == len(pins())
    assert all("cp312" in f or "py3-none" in f or "-py2.py3-" in f or f.endswith(".tar.gz") for f, _ in files), files
    total = sum(n for _, n in files)
    assert total <= LIMIT_MIB * 2**20
    print(f"wheelhouse for CPython 3.12: {len(files)} files, {total / 2**20:.1f} MiB")
    # a folder over the limit is refused, with the size named
    r = gather(tmp_path, kit["node"], "3.12", HPCEVO_WHEELHOUSE_MIB="1")
    assert r.returncode != 0 and "over the 1 MiB" in r.stderr
    # a pin the source lacks is an error naming it, not a smaller folder
    (tmp_path / "partial").mkdir()
    for f in kit["node"].iterdir():
        if not f.name.startswith("tomli_w"):
            os.symlink(f, tmp_path / "partial" / f.name)
    r = gather(tmp_path / "out", tmp_path / "partial", "3.12")
    assert r.returncode != 0 and "tomli-w" in r.stderr.lower().replace("_", "-"), r.stderr


def test_offline_install_beside_the_images_jax_then_a_run_and_its_resume(image, wheelhouse, tmp_path):
    venv = tmp_path / "venv-gpu"
    env = {"HPCEVO_PYTHON": str(image), "HPCEVO_VENV": str(venv), "PIP_CONFIG_FILE": os.devnull}
    r = sh(offline(f"scripts/gpu-node-setup.sh {wheelhouse}"), env=env)
    log = r.stderr
    assert "MPI: MPICH" in log and "h5py" in log and "MPI: no" in log, log
    # no GPU here: no CUDA bridge, even where a toolkit lies in /usr/local/cuda (mpi4jax's own
    # fallback, which built and compiled one on this project's machines)
    assert "CUDA bridge: no" in log and not list(venv.glob("lib/python*/site-packages/mpi4jax/_src/xla_bridge/*cuda*")), log
    py = venv / "bin" / "python"
    # the image's jax is used, not a copy; MPI is the wheel's, and mpi4jax calls that same library
    out = sh([str(py), "-c", "import jax, mpi4py, mpi4jax, h5py; from mpi4py import MPI; "
              "print(jax.__file__); print(MPI.Get_library_version().split()[0]); print(h5py.get_config().mpi)"]).stdout
    jax_file, mpi, h5mpi = out.split()
    assert jax_file.startswith(str(image.parent.parent)) and mpi == "MPICH" and h5mpi == "False"
    libs = sh(f"ldd {venv}/lib/python*/site-packages/mpi4jax/_src/xla_bridge/mpi_xla_bridge_cpu*.so").stdout
    assert f"{venv}/lib/libmpi.so.12" in libs
    # idempotent: a second call finds nothing to do
    assert "up to date" in sh(offline(f"scripts/gpu-node-setup.sh {wheelhouse}"), env=env).stderr

    # a 2-rank run with checkpoints (rank 0 writes them: this h5py has no MPI), resumed at 3
    # ranks, equals one run at 1 rank; all offline, with the wheel's mpiexec
    mpiexec = venv / "bin" / "mpiexec"
    cfg = ROOT / "examples" / "cso.toml"
    common = f"-m hpcevo run {cfg} --set algorithm.pop_size=64 --set problem.dim=10 --set checkpoint.every=10"
    sh(offline(f"{mpiexec} -n 2 {py} {common} --set run.generations=20 --set run.out={tmp_path}/a"))
    r = sh(offline(f"{mpiexec} -n 3 {py} {common} --set run.generations=40 --set run.out={tmp_path}/a --resume"))
    sh(offline(f"{py} {common} --set run.generations=40 --set run.out={tmp_path}/b"))
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert a["generations"] == b["generations"] == 40 and a["resumed_from"]
    assert a["state_digest"] == b["state_digest"]
    first = sh(offline(f"{mpiexec} -n 2 {py} {common} --set run.generations=10 --set run.out={tmp_path}/c")).stdout
    assert "rank 0 writes the checkpoints alone" in first


def test_an_image_whose_h5py_runs_on_its_own_mpi_keeps_that_mpi(wheelhouse, tmp_path):
    """An image with an MPI of its own that its h5py (parallel) and mpi4py run on, like a site's
    software stack: the set-up builds mpi4jax against that MPI, installs neither MPI wheel, and
    checkpoints are written by every rank. The image here is this suite's own environment (its
    MPICH and parallel h5py), seen through a .pth file as the set-up sees an image."""
    import sysconfig

    from mpi4py import MPI

    img = tmp_path / "image"
    sh([_base_python(), "-m", "venv", "--without-pip", str(img)])
    purelib = Path(sysconfig.get_paths(vars={"base": str(img), "platbase": str(img)})["purelib"])
    (purelib / "suite.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    venv = tmp_path / "venv-gpu"
    r = sh(offline(f"scripts/gpu-node-setup.sh {wheelhouse}"),
           env={"HPCEVO_PYTHON": str(img / "bin" / "python"), "HPCEVO_VENV": str(venv), "PIP_CONFIG_FILE": os.devnull})
    assert "ready (system MPI)" in r.stderr and "MPI: yes" in r.stderr and "CUDA bridge: no" in r.stderr, r.stderr
    py = venv / "bin" / "python"
    lib = sh([str(py), "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"]).stdout.strip()
    assert lib == MPI.Get_library_version().splitlines()[0].strip()
    assert not list(venv.glob("lib/python*/site-packages/mpich*")) and not (venv / "bin" / "mpicc").exists()
    mpiexec = venv / "bin" / "mpiexec"
    assert mpiexec.read_text().startswith("#!/bin/sh\nexec /")  # the image's, started by its own path
    cfg = ROOT / "examples" / "cso.toml"
    common = f"-m hpcevo run {cfg} --set algorithm.pop_size=64 --set problem.dim=10 --set checkpoint.every=10 --set run.generations=20"
    two = sh(offline(f"{mpiexec} -n 2 {py} {common} --set run.out={tmp_path}/a")).stdout
    assert "writes the checkpoints alone" not in two
    sh(offline(f"{py} {common} --set run.out={tmp_path}/b"))
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert a["state_digest"] == b["state_digest"]


def test_a_wheelhouse_for_another_python_is_refused_with_one_message(image, tmp_path):
    (tmp_path / "mpi4py-4.1.2-cp39-cp39-manylinux1_x86_64.whl").write_bytes(b"")
    (tmp_path / "MANIFEST").write_text("")
    r = sh(["scripts/gpu-node-setup.sh", str(tmp_path)], env={"HPCEVO_PYTHON": str(image),
                                                             "HPCEVO_VENV": str(tmp_path / "v")}, check=False)
    assert r.returncode == 1 and "is not for Python" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "v").exists()


def test_the_gpu_command_runs_every_part_in_its_cpu_smoke_mode(tmp_path):
    """python -m benchmarks gpu --smoke: what a GPU node runs, at toy sizes on the CPU; every part
    completes, the digests agree at 1 and 2 ranks and after a resume, and the report is written."""
    r = sh([sys.executable, "-m", "benchmarks", "gpu", "--smoke", "--out", str(tmp_path), "--budget", "400"],
           timeout=900)
    (report,) = tmp_path.glob("gpu-smoke-*.json")
    rep = json.loads(report.read_text())
    assert set(rep["parts"]) == {"env", "info", "digests", "speed", "allgather", "command_buffers"}
    assert not [k for k, v in rep["parts"].items() if "error" in v], rep["parts"]
    d = rep["parts"]["digests"]
    assert d["all_equal"] and len({x["digest"] for x in d["rows"] if x["algorithm"] == "cso"}) == 2  # + half way
    speed = rep["parts"]["speed"]
    assert {(x["algorithm"], x["pop"]) for x in speed["rows"]} == {(a, p) for a in ("cso", "pso", "openes")
                                                                  for p in (64, 256)}
    assert all(x["ms"]["bare step"]["median"] > 0 and "hpcevo" in x["ms"] for x in speed["rows"])
    assert [x["fitness_values"] for x in rep["parts"]["allgather"]["rows"]] == [1024, 16384, 262144]
    md = report.with_suffix(".md").read_text()
    assert "| cso | 64 | 10 |" in md and "equal: cso yes, pso yes, openes yes" in md
    assert "equal: cso yes" in r.stdout
